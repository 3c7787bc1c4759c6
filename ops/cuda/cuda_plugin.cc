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
// Communicators are NCCL non-blocking communicators (config.blocking = 0):
// init, finalize and any call that reports ncclInProgress are polled with
// ncclCommGetAsyncError until done, bounded by the comm_init timeout (then
// the communicator is aborted and the call fails), so the executor thread is
// not parked inside NCCL waiting for other ranks.
//
// Abort from another thread: ncclCommAbort frees the communicator, so it must
// not run under a call that is merely in progress (a poll, an enqueue: a few
// microseconds), yet it is also what makes NCCL return from a call that is
// stuck (an enqueue waiting on a dead peer). Each NCCL call is therefore
// counted (CommCall); comm_abort marks the communicator aborted (no new call
// starts), waits up to kAbortGraceMs for the calls in flight, then aborts.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>

#include "ops/cuda/fusion_kernels.h"
#include "ops/cuda/fusion_kernels_impl.h"
#include "ops/gpu/hora_gpu_plugin.h"

namespace {

constexpr uint32_t kStreamMagic = 0x68537472;  // "hStr"
constexpr uint32_t kEventMagic = 0x68457674;   // "hEvt"
constexpr uint32_t kCommMagic = 0x68436f6d;    // "hCom"
constexpr uint32_t kDeadMagic = 0xdeadbeef;

}  // namespace

struct hora_gpu_stream_s {
  uint32_t magic = kStreamMagic;
  int device = 0;
  cudaStream_t stream = nullptr;
};

struct hora_gpu_event_s {
  uint32_t magic = kEventMagic;
  int device = 0;
  cudaEvent_t event = nullptr;
};

struct hora_gpu_comm_s {
  uint32_t magic = kCommMagic;
  int device = 0;
  int rank = 0;
  int nranks = 0;
  int64_t timeoutMs = 0;  // bound for every wait on this communicator; <= 0: none
  std::mutex mu;
  std::condition_variable idle;  // signalled when calls drops to 0
  ncclComm_t comm = nullptr;     // guarded by mu; null once aborted or destroyed
  int calls = 0;                 // guarded by mu: NCCL calls in flight on comm
  std::atomic<bool> aborted{false};
};

namespace hora {
namespace cuda {
namespace {

// ------------------------------------------------------------------ errors

thread_local char tlsError[1024];

void vsetError(const char* suffix, const char* fmt, va_list ap) {
  int n = std::vsnprintf(tlsError, sizeof(tlsError), fmt, ap);
  if (n < 0) n = 0;
  if (suffix != nullptr && static_cast<size_t>(n) < sizeof(tlsError)) {
    std::snprintf(tlsError + n, sizeof(tlsError) - static_cast<size_t>(n), "%s", suffix);
  }
}

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
  if (useDevice(device, "device_alloc") != 0) return 1;
  const cudaError_t e = cudaMalloc(out, bytes);
  if (e != cudaSuccess) {
    *out = nullptr;
    return failCuda(e, "cudaMalloc(%zu bytes) on device %d", bytes, device);
  }
  return 0;
}

int deviceFree(int device, void* ptr) {
  if (ptr == nullptr) return 0;
  if (useDevice(device, "device_free") != 0) return 1;
  const cudaError_t e = cudaFree(ptr);
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

// ------------------------------------------------------------ communicators

// NCCL has no int16 or bool: reductions over those go through another
// backend (the caller routes them); data-movement collectives move bytes and
// take every dtype.
int ncclTypeOf(int32_t dtype, const char* who, ncclDataType_t* out) {
  switch (dtype) {
    case HORA_GPU_DTYPE_UINT8:
      *out = ncclUint8;
      return 0;
    case HORA_GPU_DTYPE_INT8:
      *out = ncclInt8;
      return 0;
    case HORA_GPU_DTYPE_INT32:
      *out = ncclInt32;
      return 0;
    case HORA_GPU_DTYPE_INT64:
      *out = ncclInt64;
      return 0;
    case HORA_GPU_DTYPE_FLOAT16:
      *out = ncclFloat16;
      return 0;
    case HORA_GPU_DTYPE_BFLOAT16:
      *out = ncclBfloat16;
      return 0;
    case HORA_GPU_DTYPE_FLOAT32:
      *out = ncclFloat32;
      return 0;
    case HORA_GPU_DTYPE_FLOAT64:
      *out = ncclFloat64;
      return 0;
    case HORA_GPU_DTYPE_INT16:
    case HORA_GPU_DTYPE_BOOL:
      return fail(
          "%s: dtype %s has no NCCL data type (NCCL reduces no int16 or bool); reduce "
          "it through another backend",
          who, dtypeName(dtype));
    default:
      return fail("%s: unknown dtype code %d", who, dtype);
  }
}

int ncclOpOf(int32_t op, const char* who, ncclRedOp_t* out) {
  switch (op) {
    case HORA_GPU_OP_SUM:
      *out = ncclSum;
      return 0;
    case HORA_GPU_OP_MIN:
      *out = ncclMin;
      return 0;
    case HORA_GPU_OP_MAX:
      *out = ncclMax;
      return 0;
    case HORA_GPU_OP_PRODUCT:
      *out = ncclProd;
      return 0;
    default:
      return fail(
          "%s: reduce op code %d is not supported (sum, min, max, product; average "
          "arrives as sum plus a postscale)",
          who, op);
  }
}

int failAborted(hora_gpu_comm_t c, const char* what) {
  return fail("%s: the communicator (rank %d of %d, device %d) was aborted", what, c->rank,
              c->nranks, c->device);
}

constexpr int64_t kAbortGraceMs = 200;

// One NCCL call on a communicator: holds the communicator (counted in
// c->calls) from construction to destruction; comm() is null when it was
// already aborted.
class CommCall {
 public:
  explicit CommCall(hora_gpu_comm_t c) : c_(c) {
    std::lock_guard<std::mutex> lock(c->mu);
    if (c->comm != nullptr && !c->aborted.load()) {
      comm_ = c->comm;
      ++c->calls;
    }
  }
  ~CommCall() {
    if (comm_ == nullptr) return;
    std::lock_guard<std::mutex> lock(c_->mu);
    if (--c_->calls == 0) c_->idle.notify_all();
  }
  CommCall(const CommCall&) = delete;
  CommCall& operator=(const CommCall&) = delete;
  ncclComm_t comm() const { return comm_; }

 private:
  hora_gpu_comm_t c_;
  ncclComm_t comm_ = nullptr;
};

// Marks the communicator aborted, lets the calls in flight finish (up to
// kAbortGraceMs: past that a call is stuck in NCCL and only the abort frees
// it), then ncclCommAbort. Returns NCCL's result; ncclSuccess if it was
// already aborted.
ncclResult_t abortComm(hora_gpu_comm_t c) {
  ncclComm_t victim = nullptr;
  {
    std::unique_lock<std::mutex> lock(c->mu);
    c->aborted.store(true);
    c->idle.wait_for(lock, std::chrono::milliseconds(kAbortGraceMs), [c] { return c->calls == 0; });
    victim = c->comm;
    c->comm = nullptr;
  }
  return victim != nullptr ? ncclCommAbort(victim) : ncclSuccess;
}

// Waits while the communicator reports ncclInProgress (non-blocking init,
// finalize, or an enqueue that needs connection set-up), polling with a
// growing sleep. Gives up after c->timeoutMs (aborting the communicator) or
// when another thread aborts it.
int waitReady(hora_gpu_comm_t c, const char* what) {
  const int64_t deadline = c->timeoutMs > 0 ? nowMs() + c->timeoutMs : 0;
  long pauseUs = 20;
  for (;;) {
    {
      CommCall call(c);
      if (call.comm() == nullptr) return failAborted(c, what);
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(call.comm(), &state);
      if (r != ncclSuccess) {
        return failNccl(r, "ncclCommGetAsyncError after %s (rank %d of %d)", what, c->rank,
                        c->nranks);
      }
      if (state == ncclSuccess) return 0;
      if (state != ncclInProgress) {
        return failNccl(state, "%s (rank %d of %d, asynchronous)", what, c->rank, c->nranks);
      }
    }
    if (deadline != 0 && nowMs() >= deadline) {
      abortComm(c);
      return fail(
          "%s: timed out after %lld ms on rank %d of %d (device %d) waiting for the "
          "other ranks; the communicator was aborted",
          what, static_cast<long long>(c->timeoutMs), c->rank, c->nranks, c->device);
    }
    sleepUs(pauseUs);
    if (pauseUs < 1000) pauseUs *= 2;
  }
}

// Runs call(ncclComm_t) -> ncclResult_t (one NCCL call or one group) as a
// counted call, then waits if NCCL reports ncclInProgress.
template <typename Call>
int commCall(hora_gpu_comm_t c, const char* what, Call&& call) {
  {
    CommCall held(c);
    if (held.comm() == nullptr) return failAborted(c, what);
    const ncclResult_t r = call(held.comm());
    if (r == ncclSuccess) return 0;
    if (r != ncclInProgress) return failNccl(r, "%s (rank %d of %d)", what, c->rank, c->nranks);
  }
  return waitReady(c, what);
}

// A group of `total` operations issued as consecutive groups of at most
// kGroupOps (older NCCL refuses more than 2048 operations in one group).
// op(comm, i) issues operation i and returns its result. Every rank must
// issue the same sequence, so splitting keeps matching operations in
// matching groups.
constexpr int kGroupOps = 1024;

template <typename Op>
int groupCall(hora_gpu_comm_t c, const char* what, int total, int opsPerItem, Op&& op) {
  const int perGroup = kGroupOps / opsPerItem;
  for (int first = 0; first < total; first += perGroup) {
    const int last = total - first < perGroup ? total : first + perGroup;
    const int rc = commCall(c, what, [&](ncclComm_t comm) -> ncclResult_t {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      for (int i = first; i < last && r == ncclSuccess; ++i) r = op(comm, i);
      // Always close the group: NCCL's group state is per thread.
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
    if (rc != 0) return rc;
  }
  return 0;
}

int checkCollective(hora_gpu_comm_t c, hora_gpu_stream_t s, const char* who) {
  if (!validComm(c)) return fail("%s: %p is not a communicator handle", who, (void*)c);
  if (!validStream(s)) return fail("%s: %p is not a stream handle", who, (void*)s);
  if (s->device != c->device) {
    return fail(
        "%s: the stream belongs to device %d, the communicator (rank %d of %d) to device "
        "%d",
        who, s->device, c->rank, c->nranks, c->device);
  }
  if (c->aborted.load()) return failAborted(c, who);
  return useDevice(c->device, who);
}

int commUniqueId(void* idOut) {
  if (idOut == nullptr) return fail("comm_unique_id: id_out is NULL");
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return failNccl(r, "ncclGetUniqueId()");
  std::memcpy(idOut, &id, sizeof(id));
  return 0;
}

int commInit(int device, int nranks, int rank, const void* id, int64_t timeoutMs,
             hora_gpu_comm_t* out) {
  if (out == nullptr) return fail("comm_init: out is NULL");
  *out = nullptr;
  if (id == nullptr) return fail("comm_init: id is NULL");
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return fail("comm_init: rank %d of %d is out of range", rank, nranks);
  }
  if (useDevice(device, "comm_init") != 0) return 1;
  std::unique_ptr<hora_gpu_comm_s> c(new (std::nothrow) hora_gpu_comm_s);
  if (!c) return fail("comm_init: out of host memory");
  c->device = device;
  c->rank = rank;
  c->nranks = nranks;
  c->timeoutMs = timeoutMs;
  ncclUniqueId uid;
  std::memcpy(&uid, id, sizeof(uid));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, uid, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    failNccl(r, "ncclCommInitRankConfig(nranks=%d, rank=%d, blocking=0) on device %d", nranks, rank,
             device);
    if (comm != nullptr) ncclCommAbort(comm);
    return 1;
  }
  c->comm = comm;
  char what[160];
  std::snprintf(what, sizeof(what), "ncclCommInitRankConfig(nranks=%d, rank=%d) on device %d",
                nranks, rank, device);
  if (waitReady(c.get(), what) != 0) {
    abortComm(c.get());  // no-op when the timeout already aborted it
    return 1;
  }
  *out = c.release();
  return 0;
}

int commAbort(hora_gpu_comm_t c) {
  if (!validComm(c)) return fail("comm_abort: %p is not a communicator handle", (void*)c);
  const ncclResult_t r = abortComm(c);  // aborting twice is harmless
  if (r != ncclSuccess && r != ncclInProgress) {
    return failNccl(r, "ncclCommAbort (rank %d of %d, device %d)", c->rank, c->nranks, c->device);
  }
  return 0;
}

int commDestroy(hora_gpu_comm_t c) {
  if (c == nullptr) return 0;
  if (!validComm(c)) return fail("comm_destroy: %p is not a communicator handle", (void*)c);
  // The caller guarantees no other call on c is running or will come.
  std::unique_ptr<hora_gpu_comm_s> owned(c);
  owned->magic = kDeadMagic;
  if (owned->comm == nullptr) return 0;  // aborted: NCCL already freed it
  char what[128];
  std::snprintf(what, sizeof(what), "ncclCommFinalize (rank %d of %d, device %d)", c->rank,
                c->nranks, c->device);
  // Finalize flushes outstanding work (non-blocking: poll), then destroy
  // frees what is left locally. If finalizing fails or times out, abort.
  const int rc = commCall(c, what, [](ncclComm_t comm) { return ncclCommFinalize(comm); });
  if (rc != 0) {
    abortComm(c);  // no-op when the timeout already aborted it
    return rc;
  }
  ncclComm_t comm = nullptr;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    comm = c->comm;
    c->comm = nullptr;
  }
  const ncclResult_t r = comm != nullptr ? ncclCommDestroy(comm) : ncclSuccess;
  if (r != ncclSuccess && r != ncclInProgress) {
    return failNccl(r, "ncclCommDestroy (rank %d of %d, device %d)", c->rank, c->nranks, c->device);
  }
  return 0;
}

int commAsyncError(hora_gpu_comm_t c, int* failed) {
  if (!validComm(c)) return fail("comm_async_error: %p is not a communicator handle", (void*)c);
  if (failed == nullptr) return fail("comm_async_error: failed is NULL");
  *failed = 0;
  CommCall call(c);
  if (call.comm() == nullptr) {
    *failed = 1;
    failAborted(c, "comm_async_error");
    return 0;
  }
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(call.comm(), &state);
  if (r != ncclSuccess) {
    return failNccl(r, "ncclCommGetAsyncError (rank %d of %d)", c->rank, c->nranks);
  }
  if (state == ncclSuccess || state == ncclInProgress) return 0;
  *failed = 1;
  failNccl(state, "NCCL communicator (rank %d of %d, device %d): asynchronous error", c->rank,
           c->nranks, c->device);
  return 0;
}

int allreduce(const void* in, void* out, size_t count, int32_t dtype, int32_t op, hora_gpu_comm_t c,
              hora_gpu_stream_t s) {
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t redOp = ncclSum;
  if (ncclTypeOf(dtype, "allreduce", &type) != 0 || ncclOpOf(op, "allreduce", &redOp) != 0) {
    return 1;
  }
  if (checkCollective(c, s, "allreduce") != 0) return 1;
  if (count == 0) return 0;
  char what[160];
  std::snprintf(what, sizeof(what), "ncclAllReduce(count=%zu, %s, %s)", count, dtypeName(dtype),
                opName(op));
  return commCall(c, what, [&](ncclComm_t comm) {
    return ncclAllReduce(in, out, count, type, redOp, comm, s->stream);
  });
}

int broadcast(void* data, size_t count, int32_t dtype, int root, hora_gpu_comm_t c,
              hora_gpu_stream_t s) {
  const size_t size = dtypeBytes(dtype);
  if (size == 0) return fail("broadcast: unknown dtype code %d", dtype);
  if (checkCollective(c, s, "broadcast") != 0) return 1;
  if (root < 0 || root >= c->nranks) {
    return fail("broadcast: root %d is out of range (%d ranks)", root, c->nranks);
  }
  if (count == 0) return 0;
  char what[160];
  std::snprintf(what, sizeof(what), "ncclBroadcast(count=%zu, %s, root=%d)", count,
                dtypeName(dtype), root);
  return commCall(c, what, [&](ncclComm_t comm) {
    return ncclBroadcast(data, data, count * size, ncclUint8, root, comm, s->stream);
  });
}

int allgatherv(const void* in, void* out, const size_t* counts, int32_t dtype, hora_gpu_comm_t c,
               hora_gpu_stream_t s) {
  const size_t size = dtypeBytes(dtype);
  if (size == 0) return fail("allgatherv: unknown dtype code %d", dtype);
  if (checkCollective(c, s, "allgatherv") != 0) return 1;
  if (counts == nullptr) return fail("allgatherv: counts is NULL");
  const int n = c->nranks;
  bool equal = true;
  size_t total = 0;
  for (int r = 0; r < n; ++r) {
    equal = equal && counts[r] == counts[0];
    total += counts[r];
  }
  if (total == 0) return 0;
  char what[160];
  if (equal) {
    std::snprintf(what, sizeof(what), "ncclAllGather(count=%zu per rank, %s)", counts[0],
                  dtypeName(dtype));
    return commCall(c, what, [&](ncclComm_t comm) {
      return ncclAllGather(in, out, counts[0] * size, ncclUint8, comm, s->stream);
    });
  }
  // Uneven: one broadcast per rank into its region (NCCL aggregates the
  // group). Offsets are in bytes; ranks with nothing are skipped on every rank.
  std::unique_ptr<size_t[]> offset(new (std::nothrow) size_t[n]);
  if (!offset) return fail("allgatherv: out of host memory");
  size_t at = 0;
  for (int r = 0; r < n; ++r) {
    offset[r] = at;
    at += counts[r] * size;
  }
  std::snprintf(what, sizeof(what), "allgatherv: group of ncclBroadcast (%zu elements of %s)",
                total, dtypeName(dtype));
  char* base = static_cast<char*>(out);
  return groupCall(c, what, n, 1, [&](ncclComm_t comm, int r) -> ncclResult_t {
    if (counts[r] == 0) return ncclSuccess;
    return ncclBroadcast(in, base + offset[r], counts[r] * size, ncclUint8, r, comm, s->stream);
  });
}

int alltoallv(const void* in, const size_t* send, void* out, const size_t* recv, int32_t dtype,
              hora_gpu_comm_t c, hora_gpu_stream_t s) {
  const size_t size = dtypeBytes(dtype);
  if (size == 0) return fail("alltoallv: unknown dtype code %d", dtype);
  if (checkCollective(c, s, "alltoallv") != 0) return 1;
  if (send == nullptr || recv == nullptr) return fail("alltoallv: send or recv counts is NULL");
  const int n = c->nranks;
  std::unique_ptr<size_t[]> offsets(new (std::nothrow) size_t[2 * static_cast<size_t>(n)]);
  if (!offsets) return fail("alltoallv: out of host memory");
  size_t* sendOff = offsets.get();
  size_t* recvOff = offsets.get() + n;
  size_t sendBytes = 0;
  size_t recvBytes = 0;
  for (int r = 0; r < n; ++r) {
    sendOff[r] = sendBytes;
    recvOff[r] = recvBytes;
    sendBytes += send[r] * size;
    recvBytes += recv[r] * size;
  }
  if (sendBytes == 0 && recvBytes == 0) return 0;
  const auto inAddr = reinterpret_cast<uintptr_t>(in);
  const auto outAddr = reinterpret_cast<uintptr_t>(out);
  if (sendBytes != 0 && recvBytes != 0 && inAddr < outAddr + recvBytes &&
      outAddr < inAddr + sendBytes) {
    return fail(
        "alltoallv: in (%p, %zu bytes) and out (%p, %zu bytes) overlap; NCCL send/recv "
        "cannot run in place",
        in, sendBytes, out, recvBytes);
  }
  char what[160];
  std::snprintf(what, sizeof(what), "alltoallv: group of ncclSend/ncclRecv (%s, rank %d of %d)",
                dtypeName(dtype), c->rank, n);
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  // Step i sends to rank + i and receives from rank - i: the matching
  // receive of every send is in the same step, so groups split by steps
  // still match across ranks.
  return groupCall(c, what, n, 2, [&](ncclComm_t comm, int i) -> ncclResult_t {
    const int to = (c->rank + i) % n;
    const int from = (c->rank - i + n) % n;
    if (send[to] != 0) {
      const ncclResult_t r =
          ncclSend(src + sendOff[to], send[to] * size, ncclUint8, to, comm, s->stream);
      if (r != ncclSuccess) return r;
    }
    if (recv[from] != 0) {
      return ncclRecv(dst + recvOff[from], recv[from] * size, ncclUint8, from, comm, s->stream);
    }
    return ncclSuccess;
  });
}

int reducescatter(void* inout, const size_t* counts, int32_t dtype, int32_t op, hora_gpu_comm_t c,
                  hora_gpu_stream_t s) {
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t redOp = ncclSum;
  if (ncclTypeOf(dtype, "reducescatter", &type) != 0 ||
      ncclOpOf(op, "reducescatter", &redOp) != 0) {
    return 1;
  }
  if (checkCollective(c, s, "reducescatter") != 0) return 1;
  if (counts == nullptr) return fail("reducescatter: counts is NULL");
  const size_t size = dtypeBytes(dtype);
  const int n = c->nranks;
  bool equal = true;
  size_t total = 0;
  for (int r = 0; r < n; ++r) {
    equal = equal && counts[r] == counts[0];
    total += counts[r];
  }
  if (total == 0) return 0;
  char* base = static_cast<char*>(inout);
  char what[160];
  if (equal) {
    // In place: NCCL's rule is recvbuff == sendbuff + rank * recvcount.
    std::snprintf(what, sizeof(what), "ncclReduceScatter(count=%zu per rank, %s, %s)", counts[0],
                  dtypeName(dtype), opName(op));
    return commCall(c, what, [&](ncclComm_t comm) {
      return ncclReduceScatter(inout, base + static_cast<size_t>(c->rank) * counts[0] * size,
                               counts[0], type, redOp, comm, s->stream);
    });
  }
  // Uneven: one in-place reduce per rank to the owner of each region.
  std::unique_ptr<size_t[]> offset(new (std::nothrow) size_t[n]);
  if (!offset) return fail("reducescatter: out of host memory");
  size_t at = 0;
  for (int r = 0; r < n; ++r) {
    offset[r] = at;
    at += counts[r] * size;
  }
  std::snprintf(what, sizeof(what), "reducescatter: group of ncclReduce (%zu elements of %s, %s)",
                total, dtypeName(dtype), opName(op));
  return groupCall(c, what, n, 1, [&](ncclComm_t comm, int r) -> ncclResult_t {
    if (counts[r] == 0) return ncclSuccess;
    char* region = base + offset[r];
    return ncclReduce(region, region, counts[r], type, redOp, r, comm, s->stream);
  });
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
