// A GPU plugin (ops/gpu/hora_gpu_plugin.h) whose "device memory" is host
// memory, so that libhora's GPU paths (plugin loading, device checks, the
// device fusion buffer with batched pack/unpack, the communicator path at
// world size 1, staging through the CPU data plane at any world size, error
// mapping) are tested on machines without a GPU. Streams run synchronously;
// events are always complete.
//
// Test hooks (exported, C linkage, looked up with dlsym by the tests):
//   hora_gpu_mock_calls(name)  how often the named table function was called
//   hora_gpu_mock_reset()      zeroes the counters
// HORA_GPU_MOCK_FAIL=<name> makes that function fail with an "injected"
// error; HORA_GPU_MOCK_DEVICES=<n> sets the device count (default 1).
//
// Process-wide counters are fine here: this is a test double, not hora.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>

#include "core/reduce.h"
#include "core/types.h"
#include "ops/gpu/hora_gpu_plugin.h"

#define MOCK_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

thread_local std::string tlsError;
std::mutex countMu;
std::map<std::string, long> counts;

struct Comm {
  int nranks;
  std::atomic<bool> aborted{false};
};

int fail(const std::string& msg) {
  tlsError = msg;
  return 1;
}

// Counts the call; fails it when HORA_GPU_MOCK_FAIL names it.
bool enter(const char* fn) {
  {
    std::lock_guard<std::mutex> lk(countMu);
    ++counts[fn];
  }
  const char* f = std::getenv("HORA_GPU_MOCK_FAIL");
  if (f && std::strcmp(f, fn) == 0) {
    tlsError = std::string("mock: injected failure in ") + fn;
    return false;
  }
  return true;
}

#define ENTER(fn) \
  if (!enter(fn)) return 1

const char* lastError() { return tlsError.c_str(); }

int deviceCount(int* out) {
  ENTER("device_count");
  const char* n = std::getenv("HORA_GPU_MOCK_DEVICES");
  *out = n ? std::atoi(n) : 1;
  return 0;
}

int streamCreate(int, hora_gpu_stream_t* out) {
  ENTER("stream_create");
  *out = reinterpret_cast<hora_gpu_stream_t>(new int(0));
  return 0;
}
int streamDestroy(hora_gpu_stream_t s) {
  ENTER("stream_destroy");
  delete reinterpret_cast<int*>(s);
  return 0;
}
int streamSynchronize(hora_gpu_stream_t) {
  ENTER("stream_synchronize");
  return 0;
}
int streamWaitExternalEvent(hora_gpu_stream_t, void* ev) {
  ENTER("stream_wait_external_event");
  return ev ? 0 : fail("mock: NULL external event");
}
int eventCreate(int, hora_gpu_event_t* out) {
  ENTER("event_create");
  *out = reinterpret_cast<hora_gpu_event_t>(new int(0));
  return 0;
}
int eventDestroy(hora_gpu_event_t e) {
  ENTER("event_destroy");
  delete reinterpret_cast<int*>(e);
  return 0;
}
int eventRecord(hora_gpu_event_t, hora_gpu_stream_t) {
  ENTER("event_record");
  return 0;
}
int eventQuery(hora_gpu_event_t, int* done) {
  ENTER("event_query");
  *done = 1;
  return 0;
}

int deviceAlloc(int, size_t bytes, void** out) {
  ENTER("device_alloc");
  *out = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  return *out ? 0 : fail("mock: out of memory");
}
int deviceFree(int, void* p) {
  ENTER("device_free");
  std::free(p);
  return 0;
}
int hostAllocPinned(size_t bytes, void** out) {
  ENTER("host_alloc_pinned");
  *out = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  return *out ? 0 : fail("mock: out of memory");
}
int hostFreePinned(void* p) {
  ENTER("host_free_pinned");
  std::free(p);
  return 0;
}
int memcpyAsync(void* dst, const void* src, size_t bytes, hora_gpu_stream_t) {
  ENTER("memcpy_async");
  if (bytes) std::memmove(dst, src, bytes);
  return 0;
}
int batchedScaleCopy(int32_t dtype, const hora_gpu_copy_t* copies, size_t n, double scale,
                     hora_gpu_stream_t) {
  ENTER("batched_scale_copy");
  auto dt = static_cast<hora::DataType>(dtype);
  for (size_t i = 0; i < n; ++i) {
    if (copies[i].dst == copies[i].src)
      hora::scaleInPlace(dt, copies[i].dst, copies[i].count, scale);
    else
      hora::scaleCopy(dt, copies[i].dst, copies[i].src, copies[i].count, scale);
  }
  return 0;
}

int commUniqueId(void* id) {
  ENTER("comm_unique_id");
  std::random_device rd;
  for (int i = 0; i < 16; ++i) static_cast<uint8_t*>(id)[i] = static_cast<uint8_t>(rd());
  return 0;
}
int commInit(int, int nranks, int rank, const void*, int64_t, hora_gpu_comm_t* out) {
  ENTER("comm_init");
  if (nranks != 1)
    return fail("mock: communicators of " + std::to_string(nranks) + " ranks (this is rank " +
                std::to_string(rank) +
                ") need a real GPU plugin; use HORA_GPU_BACKEND=gloo with the mock");
  *out = reinterpret_cast<hora_gpu_comm_t>(new Comm{nranks});
  return 0;
}
int commDestroy(hora_gpu_comm_t c) {
  ENTER("comm_destroy");
  delete reinterpret_cast<Comm*>(c);
  return 0;
}
int commAbort(hora_gpu_comm_t c) {
  ENTER("comm_abort");
  reinterpret_cast<Comm*>(c)->aborted = true;
  return 0;
}
int commAsyncError(hora_gpu_comm_t c, int* failed) {
  ENTER("comm_async_error");
  *failed = reinterpret_cast<Comm*>(c)->aborted ? 1 : 0;
  if (*failed) tlsError = "mock: communicator aborted";
  return 0;
}
bool usable(hora_gpu_comm_t c) {
  if (!reinterpret_cast<Comm*>(c)->aborted) return true;
  tlsError = "mock: communicator aborted";
  return false;
}
int allreduce(const void* in, void* out, size_t count, int32_t dtype, int32_t, hora_gpu_comm_t c,
              hora_gpu_stream_t) {
  ENTER("allreduce");
  if (!usable(c)) return 1;
  if (in != out)
    std::memmove(out, in, count * hora::dataTypeSize(static_cast<hora::DataType>(dtype)));
  return 0;
}
int broadcast(void*, size_t, int32_t, int root, hora_gpu_comm_t c, hora_gpu_stream_t) {
  ENTER("broadcast");
  if (!usable(c)) return 1;
  return root == 0 ? 0 : fail("mock: root " + std::to_string(root) + " outside a 1-rank comm");
}
int allgatherv(const void* in, void* out, const size_t* counts, int32_t dtype, hora_gpu_comm_t c,
               hora_gpu_stream_t) {
  ENTER("allgatherv");
  if (!usable(c)) return 1;
  std::memmove(out, in, counts[0] * hora::dataTypeSize(static_cast<hora::DataType>(dtype)));
  return 0;
}
int alltoallv(const void* in, const size_t* send, void* out, const size_t*, int32_t dtype,
              hora_gpu_comm_t c, hora_gpu_stream_t) {
  ENTER("alltoallv");
  if (!usable(c)) return 1;
  std::memmove(out, in, send[0] * hora::dataTypeSize(static_cast<hora::DataType>(dtype)));
  return 0;
}
int reducescatter(void*, const size_t*, int32_t, int32_t, hora_gpu_comm_t c, hora_gpu_stream_t) {
  ENTER("reducescatter");
  return usable(c) ? 0 : 1;
}

const hora_gpu_plugin_v1_t kTable = {
    HORA_GPU_PLUGIN_ABI_VERSION,
    sizeof(hora_gpu_plugin_v1_t),
    "mock (host memory)",
    lastError,
    deviceCount,
    streamCreate,
    streamDestroy,
    streamSynchronize,
    streamWaitExternalEvent,
    eventCreate,
    eventDestroy,
    eventRecord,
    eventQuery,
    deviceAlloc,
    deviceFree,
    hostAllocPinned,
    hostFreePinned,
    memcpyAsync,
    batchedScaleCopy,
    16,
    commUniqueId,
    commInit,
    commDestroy,
    commAbort,
    commAsyncError,
    allreduce,
    broadcast,
    allgatherv,
    alltoallv,
    reducescatter,
};

}  // namespace

MOCK_EXPORT const hora_gpu_plugin_v1_t* hora_gpu_plugin_get(uint32_t abi_version) {
  return abi_version == HORA_GPU_PLUGIN_ABI_VERSION ? &kTable : nullptr;
}

MOCK_EXPORT long hora_gpu_mock_calls(const char* name) {
  std::lock_guard<std::mutex> lk(countMu);
  auto it = counts.find(name);
  return it == counts.end() ? 0 : it->second;
}

MOCK_EXPORT void hora_gpu_mock_reset() {
  std::lock_guard<std::mutex> lk(countMu);
  counts.clear();
}
