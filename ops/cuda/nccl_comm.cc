// libhora_cuda.so's communicators and collectives: the comm_* entries and the
// collectives (allreduce, broadcast, allgatherv, alltoallv, reducescatter) of
// the GPU plugin ABI (ops/gpu/hora_gpu_plugin.h) over NCCL, and p2p_group
// (ncclSend/ncclRecv). Called through the table that cuda_plugin.cc builds
// (hora_gpu_plugin_get), on libhora's executor threads (p2p_group: on the
// point-to-point GPU thread, on its own two-rank communicators); comm_abort
// from any thread. Errors go through the helpers declared
// in cuda_plugin_internal.h.
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
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>

#include "ops/cuda/cuda_plugin_internal.h"
#include "ops/cuda/fusion_kernels_impl.h"
#include "ops/gpu/hora_gpu_plugin.h"

namespace hora {
namespace cuda {

// ------------------------------------------------------------ communicators

namespace {

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

}  // namespace

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

int p2pGroup(const hora_gpu_p2p_op_t* ops, size_t n, hora_gpu_comm_t c, hora_gpu_stream_t s) {
  if (checkCollective(c, s, "p2p_group") != 0) return 1;
  if (n == 0) return 0;
  if (ops == nullptr) return fail("p2p_group: ops is NULL");
  if (n > static_cast<size_t>(1) << 20) return fail("p2p_group: %zu operations", n);
  size_t bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    const hora_gpu_p2p_op_t& op = ops[i];
    if (op.kind != HORA_GPU_P2P_SEND && op.kind != HORA_GPU_P2P_RECV)
      return fail("p2p_group: ops[%zu] has kind %d (send 0, recv 1)", i, op.kind);
    // A peer equal to this rank is accepted (NCCL pairs a send to itself with
    // the receive from itself in the same group): libhora's two-rank channels
    // never issue one, but it lets the plugin's own test run ncclSend/ncclRecv
    // on a one-GPU machine, where NCCL refuses two ranks.
    if (op.peer < 0 || op.peer >= c->nranks)
      return fail("p2p_group: ops[%zu] names peer %d on rank %d of %d", i, op.peer, c->rank,
                  c->nranks);
    if (op.bytes != 0 && op.data == nullptr)
      return fail("p2p_group: ops[%zu] has %zu bytes at NULL", i, op.bytes);
    bytes += op.bytes;
  }
  char what[160];
  std::snprintf(what, sizeof(what),
                "p2p_group: group of %zu ncclSend/ncclRecv (%zu bytes, rank %d of %d, device %d)",
                n, bytes, c->rank, c->nranks, c->device);
  // Bytes as ncclUint8: every hora dtype moves, int16 and bool included.
  // groupCall splits above kGroupOps; both ranks split the same sequence.
  return groupCall(c, what, static_cast<int>(n), 1, [&](ncclComm_t comm, int i) -> ncclResult_t {
    const hora_gpu_p2p_op_t& op = ops[i];
    if (op.bytes == 0) return ncclSuccess;
    if (op.kind == HORA_GPU_P2P_SEND)
      return ncclSend(op.data, op.bytes, ncclUint8, op.peer, comm, s->stream);
    return ncclRecv(op.data, op.bytes, ncclUint8, op.peer, comm, s->stream);
  });
}

}  // namespace cuda
}  // namespace hora
