// libhora_cuda.so: the GPU plugin ABI (ops/gpu/hora_gpu_plugin.h) over the
// CUDA runtime (linked statically) and NCCL. The only exported symbol is
// hora_gpu_plugin_get (hora_cuda.map); everything else is hidden.
//
// Threads: every function may be called from any executor thread; comm_abort
// and last_error from any thread at all. Handles carry a magic number so a
// stale or foreign pointer is an error, not a crash (best effort).
//
// Errors: each failure writes one line to a thread-local buffer (last_error):
// the failing CUDA/NCCL call with the arguments that matter, the library's
// error name and string, and for NCCL the rank and size of the communicator
// and NCCL's own last-error text.
//
// The communicators and collectives are in nccl_comm.cc; cuda_plugin_internal.h
// holds the handle structs and the helpers the two files share.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <time.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>

#include "ops/cuda/cuda_plugin_internal.h"
#include "ops/cuda/fusion_kernels.h"
#include "ops/cuda/fusion_kernels_impl.h"
#include "ops/gpu/hora_gpu_plugin.h"

namespace hora {
namespace cuda {

// ------------------------------------------------------------------ errors

namespace {

thread_local char tlsError[1024];

void vsetError(const char* suffix, const char* fmt, va_list ap) {
  int n = std::vsnprintf(tlsError, sizeof(tlsError), fmt, ap);
  if (n < 0) n = 0;
  if (suffix != nullptr && static_cast<size_t>(n) < sizeof(tlsError)) {
    std::snprintf(tlsError + n, sizeof(tlsError) - static_cast<size_t>(n), "%s", suffix);
  }
}

}  // namespace

__attribute__((format(printf, 1, 2))) int fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsetError(nullptr, fmt, ap);
  va_end(ap);
  return 1;
}

// "<call with arguments> failed: cudaErrorX (description)"
__attribute__((format(printf, 2, 3))) int failCuda(cudaError_t e, const char* fmt, ...) {
  char suffix[256];
  std::snprintf(suffix, sizeof(suffix), " failed: %s (%s)", cudaGetErrorName(e),
                cudaGetErrorString(e));
  va_list ap;
  va_start(ap, fmt);
  vsetError(suffix, fmt, ap);
  va_end(ap);
  return 1;
}

// "<call with arguments> failed: NCCL error N (string); NCCL: <last error>"
__attribute__((format(printf, 2, 3))) int failNccl(ncclResult_t r, const char* fmt, ...) {
  char suffix[512];
  const char* last = ncclGetLastError(nullptr);
  std::snprintf(suffix, sizeof(suffix), " failed: NCCL error %d (%s)%s%s", static_cast<int>(r),
                ncclGetErrorString(r), (last != nullptr && last[0] != '\0') ? "; NCCL: " : "",
                (last != nullptr) ? last : "");
  va_list ap;
  va_start(ap, fmt);
  vsetError(suffix, fmt, ap);
  va_end(ap);
  return 1;
}

const char* dtypeName(int32_t dtype) {
  switch (dtype) {
    case HORA_GPU_DTYPE_UINT8:
      return "uint8";
    case HORA_GPU_DTYPE_INT8:
      return "int8";
    case HORA_GPU_DTYPE_INT16:
      return "int16";
    case HORA_GPU_DTYPE_INT32:
      return "int32";
    case HORA_GPU_DTYPE_INT64:
      return "int64";
    case HORA_GPU_DTYPE_FLOAT16:
      return "float16";
    case HORA_GPU_DTYPE_BFLOAT16:
      return "bfloat16";
    case HORA_GPU_DTYPE_FLOAT32:
      return "float32";
    case HORA_GPU_DTYPE_FLOAT64:
      return "float64";
    case HORA_GPU_DTYPE_BOOL:
      return "bool";
    default:
      return "unknown";
  }
}

const char* opName(int32_t op) {
  switch (op) {
    case HORA_GPU_OP_SUM:
      return "sum";
    case HORA_GPU_OP_MIN:
      return "min";
    case HORA_GPU_OP_MAX:
      return "max";
    case HORA_GPU_OP_PRODUCT:
      return "product";
    default:
      return "unknown";
  }
}

// ------------------------------------------------------------------ helpers

// Makes `device` current on this thread (cheap when it already is).
int useDevice(int device, const char* who) {
  int current = -1;
  cudaError_t e = cudaGetDevice(&current);
  if (e == cudaSuccess && current == device) return 0;
  e = cudaSetDevice(device);
  if (e != cudaSuccess) return failCuda(e, "%s: cudaSetDevice(%d)", who, device);
  return 0;
}

bool validStream(hora_gpu_stream_t s) { return s != nullptr && s->magic == kStreamMagic; }
bool validEvent(hora_gpu_event_t e) { return e != nullptr && e->magic == kEventMagic; }
bool validComm(hora_gpu_comm_t c) { return c != nullptr && c->magic == kCommMagic; }

int64_t nowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

void sleepUs(long us) {
  timespec ts{us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, nullptr);
}

namespace {

// ------------------------------------------------------------------ devices

const char* lastError() { return tlsError; }

int deviceCount(int* out) {
  if (out == nullptr) return fail("device_count: out is NULL");
  *out = 0;
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return failCuda(e, "cudaGetDeviceCount()");
  *out = n;
  return 0;
}

int devicePciBusId(int device, char* out, size_t capacity) {
  if (out == nullptr || capacity < 2) return fail("device_pci_bus_id: out is NULL or too small");
  out[0] = '\0';
  const cudaError_t e = cudaDeviceGetPCIBusId(out, static_cast<int>(capacity), device);
  if (e != cudaSuccess) return failCuda(e, "cudaDeviceGetPCIBusId(device %d)", device);
  return 0;
}

int streamCreate(int device, hora_gpu_stream_t* out) {
  if (out == nullptr) return fail("stream_create: out is NULL");
  *out = nullptr;
  if (useDevice(device, "stream_create") != 0) return 1;
  int least = 0;
  int greatest = 0;
  cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
  if (e != cudaSuccess) {
    return failCuda(e, "cudaDeviceGetStreamPriorityRange() on device %d", device);
  }
  cudaStream_t stream = nullptr;
  e = cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest);
  if (e != cudaSuccess) {
    return failCuda(e,
                    "cudaStreamCreateWithPriority(cudaStreamNonBlocking, priority=%d) on device %d",
                    greatest, device);
  }
  auto* s = new (std::nothrow) hora_gpu_stream_s;
  if (s == nullptr) {
    cudaStreamDestroy(stream);
    return fail("stream_create: out of host memory");
  }
  s->device = device;
  s->stream = stream;
  *out = s;
  return 0;
}

int streamDestroy(hora_gpu_stream_t s) {
  if (s == nullptr) return 0;
  if (!validStream(s)) return fail("stream_destroy: %p is not a stream handle", (void*)s);
  const cudaError_t e = cudaStreamDestroy(s->stream);
  const int device = s->device;
  const void* raw = s->stream;
  s->magic = kDeadMagic;
  delete s;
  if (e != cudaSuccess) return failCuda(e, "cudaStreamDestroy(%p) on device %d", raw, device);
  return 0;
}

int streamSynchronize(hora_gpu_stream_t s) {
  if (!validStream(s)) return fail("stream_synchronize: %p is not a stream handle", (void*)s);
  const cudaError_t e = cudaStreamSynchronize(s->stream);
  if (e != cudaSuccess) {
    return failCuda(e, "cudaStreamSynchronize(%p) on device %d", (void*)s->stream, s->device);
  }
  return 0;
}

int streamWaitExternalEvent(hora_gpu_stream_t s, void* externalEvent) {
  if (!validStream(s)) {
    return fail("stream_wait_external_event: %p is not a stream handle", (void*)s);
  }
  if (externalEvent == nullptr) return fail("stream_wait_external_event: event is NULL");
  const cudaError_t e = cudaStreamWaitEvent(s->stream, static_cast<cudaEvent_t>(externalEvent), 0);
  if (e != cudaSuccess) {
    return failCuda(e, "cudaStreamWaitEvent(stream=%p, event=%p) on device %d", (void*)s->stream,
                    externalEvent, s->device);
  }
  return 0;
}

int eventCreate(int device, hora_gpu_event_t* out) {
  if (out == nullptr) return fail("event_create: out is NULL");
  *out = nullptr;
  if (useDevice(device, "event_create") != 0) return 1;
  cudaEvent_t event = nullptr;
  const cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    return failCuda(e, "cudaEventCreateWithFlags(cudaEventDisableTiming) on device %d", device);
  }
  auto* ev = new (std::nothrow) hora_gpu_event_s;
  if (ev == nullptr) {
    cudaEventDestroy(event);
    return fail("event_create: out of host memory");
  }
  ev->device = device;
  ev->event = event;
  *out = ev;
  return 0;
}

int eventDestroy(hora_gpu_event_t ev) {
  if (ev == nullptr) return 0;
  if (!validEvent(ev)) return fail("event_destroy: %p is not an event handle", (void*)ev);
  const cudaError_t e = cudaEventDestroy(ev->event);
  const int device = ev->device;
  const void* raw = ev->event;
  ev->magic = kDeadMagic;
  delete ev;
  if (e != cudaSuccess) return failCuda(e, "cudaEventDestroy(%p) on device %d", raw, device);
  return 0;
}

int eventRecord(hora_gpu_event_t ev, hora_gpu_stream_t s) {
  if (!validEvent(ev)) return fail("event_record: %p is not an event handle", (void*)ev);
  if (!validStream(s)) return fail("event_record: %p is not a stream handle", (void*)s);
  if (ev->device != s->device) {
    return fail("event_record: the event belongs to device %d, the stream to device %d", ev->device,
                s->device);
  }
  const cudaError_t e = cudaEventRecord(ev->event, s->stream);
  if (e != cudaSuccess) {
    return failCuda(e, "cudaEventRecord(event=%p, stream=%p) on device %d", (void*)ev->event,
                    (void*)s->stream, s->device);
  }
  return 0;
}

int eventQuery(hora_gpu_event_t ev, int* done) {
  if (!validEvent(ev)) return fail("event_query: %p is not an event handle", (void*)ev);
  if (done == nullptr) return fail("event_query: done is NULL");
  const cudaError_t e = cudaEventQuery(ev->event);
  if (e == cudaSuccess) {
    *done = 1;
    return 0;
  }
  if (e == cudaErrorNotReady) {
    *done = 0;
    return 0;
  }
  *done = 0;
  return failCuda(e, "cudaEventQuery(%p) on device %d", (void*)ev->event, ev->device);
}

// ------------------------------------------------------------------- memory

int deviceAlloc(int device, size_t bytes, void** out) {
  if (out == nullptr) return fail("device_alloc: out is NULL");
  *out = nullptr;
  if (bytes == 0) return 0;
  // Point-to-point allocates a receive's output on a framework thread: leave
  // its current device as it was (as device_free does).
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
  if (useDevice(device, "device_alloc") != 0) return 1;
  const cudaError_t e = cudaMalloc(out, bytes);
  if (previous >= 0 && previous != device) cudaSetDevice(previous);
  if (e != cudaSuccess) {
    *out = nullptr;
    return failCuda(e, "cudaMalloc(%zu bytes) on device %d", bytes, device);
  }
  return 0;
}

int deviceFree(int device, void* ptr) {
  if (ptr == nullptr) return 0;
  // Any thread may free a request's output, a framework thread included:
  // leave its current device as it was.
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
  if (useDevice(device, "device_free") != 0) return 1;
  const cudaError_t e = cudaFree(ptr);
  if (previous >= 0 && previous != device) cudaSetDevice(previous);
  if (e != cudaSuccess) return failCuda(e, "cudaFree(%p) on device %d", ptr, device);
  return 0;
}

int hostAllocPinned(size_t bytes, void** out) {
  if (out == nullptr) return fail("host_alloc_pinned: out is NULL");
  *out = nullptr;
  if (bytes == 0) return 0;
  // Portable: pinned for every device's context, not only the current one.
  const cudaError_t e = cudaHostAlloc(out, bytes, cudaHostAllocPortable);
  if (e != cudaSuccess) {
    *out = nullptr;
    return failCuda(e, "cudaHostAlloc(%zu bytes, cudaHostAllocPortable)", bytes);
  }
  return 0;
}

int hostFreePinned(void* ptr) {
  if (ptr == nullptr) return 0;
  const cudaError_t e = cudaFreeHost(ptr);
  if (e != cudaSuccess) return failCuda(e, "cudaFreeHost(%p)", ptr);
  return 0;
}

int memcpyAsync(void* dst, const void* src, size_t bytes, hora_gpu_stream_t s) {
  if (!validStream(s)) return fail("memcpy_async: %p is not a stream handle", (void*)s);
  if (bytes == 0) return 0;
  if (dst == nullptr || src == nullptr) {
    return fail("memcpy_async: NULL pointer (dst=%p, src=%p, %zu bytes)", dst, src, bytes);
  }
  if (useDevice(s->device, "memcpy_async") != 0) return 1;
  const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s->stream);
  if (e != cudaSuccess) {
    return failCuda(e,
                    "cudaMemcpyAsync(dst=%p, src=%p, %zu bytes, cudaMemcpyDefault, stream=%p) "
                    "on device %d",
                    dst, src, bytes, (void*)s->stream, s->device);
  }
  return 0;
}

int batchedScaleCopyEntry(int32_t dtype, const hora_gpu_copy_t* copies, size_t n, double scale,
                          hora_gpu_stream_t s) {
  if (!validStream(s)) return fail("batched_scale_copy: %p is not a stream handle", (void*)s);
  if (dtypeBytes(dtype) == 0) return fail("batched_scale_copy: unknown dtype code %d", dtype);
  if (n == 0) return 0;
  if (copies == nullptr) return fail("batched_scale_copy: copies is NULL (n=%zu)", n);
  for (size_t i = 0; i < n; ++i) {
    if (copies[i].count != 0 && (copies[i].dst == nullptr || copies[i].src == nullptr)) {
      return fail(
          "batched_scale_copy: copy %zu of %zu has a NULL pointer (dst=%p, src=%p, "
          "count=%zu)",
          i, n, copies[i].dst, copies[i].src, copies[i].count);
    }
  }
  if (useDevice(s->device, "batched_scale_copy") != 0) return 1;
  const int rc = batchedScaleCopy(dtype, copies, n, scale, s->stream);
  if (rc == 0) return 0;
  if (rc == kPlanCountOverflow) {
    return fail("batched_scale_copy: a count of %s elements overflows 64-bit byte counts",
                dtypeName(dtype));
  }
  if (rc < 0) return fail("batched_scale_copy: unknown dtype code %d", dtype);
  return failCuda(static_cast<cudaError_t>(rc),
                  "cudaLaunchKernel(batched scale-copy, dtype=%s, %zu copies, scale=%.17g, "
                  "stream=%p) on device %d",
                  dtypeName(dtype), n, scale, (void*)s->stream, s->device);
}

// ------------------------------------------------------------------- table

hora_gpu_plugin_v1_t makeTable() {
  static char name[96];
  int cudaVersion = 0;
  int ncclVersion = 0;
  cudaRuntimeGetVersion(&cudaVersion);
  ncclGetVersion(&ncclVersion);
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  std::snprintf(name, sizeof(name), "cuda %d.%d + nccl %d.%d.%d", cudaVersion / 1000,
                (cudaVersion % 1000) / 10, ncclVersion / 10000, (ncclVersion % 10000) / 100,
                ncclVersion % 100);
  hora_gpu_plugin_v1_t t;
  std::memset(&t, 0, sizeof(t));
  t.abi_version = HORA_GPU_PLUGIN_ABI_VERSION;
  t.struct_size = sizeof(hora_gpu_plugin_v1_t);
  t.name = name;
  t.last_error = lastError;
  t.device_count = deviceCount;
  t.stream_create = streamCreate;
  t.stream_destroy = streamDestroy;
  t.stream_synchronize = streamSynchronize;
  t.stream_wait_external_event = streamWaitExternalEvent;
  t.event_create = eventCreate;
  t.event_destroy = eventDestroy;
  t.event_record = eventRecord;
  t.event_query = eventQuery;
  t.device_alloc = deviceAlloc;
  t.device_free = deviceFree;
  t.host_alloc_pinned = hostAllocPinned;
  t.host_free_pinned = hostFreePinned;
  t.memcpy_async = memcpyAsync;
  t.batched_scale_copy = batchedScaleCopyEntry;
  t.unique_id_bytes = sizeof(ncclUniqueId);
  t.comm_unique_id = commUniqueId;
  t.comm_init = commInit;
  t.comm_destroy = commDestroy;
  t.comm_abort = commAbort;
  t.comm_async_error = commAsyncError;
  t.allreduce = allreduce;
  t.broadcast = broadcast;
  t.allgatherv = allgatherv;
  t.alltoallv = alltoallv;
  t.reducescatter = reducescatter;
  t.device_pci_bus_id = devicePciBusId;
  t.p2p_group = p2pGroup;
  return t;
}

}  // namespace
}  // namespace cuda
}  // namespace hora

extern "C" __attribute__((visibility("default"))) const hora_gpu_plugin_v1_t* hora_gpu_plugin_get(
    uint32_t abi_version) {
  if (abi_version != HORA_GPU_PLUGIN_ABI_VERSION) return nullptr;
  static const hora_gpu_plugin_v1_t table = hora::cuda::makeTable();
  return &table;
}
