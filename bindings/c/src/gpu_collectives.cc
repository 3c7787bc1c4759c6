// The executor thread's GPU allgather, alltoall and reducescatter: the
// collectives whose output size is known only after negotiation. See
// gpu_executor.cc for the set's GPU resources and the two paths:
//  - communicator: allgather and alltoall move bytes (every dtype);
//    reducescatter reduces, so int16 and bool take the staging path;
//  - staging: input device -> pinned host, the CPU data plane on pinned
//    memory, result pinned -> device.
// The output is allocated on the input's device after negotiation: through
// options.alloc (which must return memory on that device) or by the plugin,
// owned by the request. If it cannot be allocated, this rank still takes part
// (see gpuOutput), so its peers finish and only this request fails.
#include <algorithm>
#include <numeric>

#include "core/reduce.h"
#include "process_set.h"

namespace hora {

namespace {

std::string describe(const char* op, const Response& r, const Device& dev) {
  return std::string(op) + " \"" + r.name + "\" (" + deviceName(dev) + ")";
}

}  // namespace

Status ProcessSetImpl::gpuOutput(TensorEntry* e, const std::vector<int64_t>& shape, size_t bytes,
                                 bool viaComm, const std::string& what, char** out,
                                 Status* outputLost) {
  *out = nullptr;
  if (e) {
    auto o = allocateOutput(*e, shape);
    if (o.isOk()) {
      *out = static_cast<char*>(o.value());
      return Status::ok();
    }
    *outputLost = o.status().withContext(what);
  }
  // Joined, or the output could not be allocated. Staging needs no device
  // buffer to take part; the communicator writes somewhere on the device:
  // the fusion buffer (if that allocation fails too, the set breaks).
  if (!viaComm || bytes == 0) return Status::ok();
  HORA_RETURN_IF_ERROR(gpuFusion(bytes, what));
  *out = gpu_.fusion;
  return Status::ok();
}

Status ProcessSetImpl::gpuStaged(const void* in, size_t inBytes, char* out, size_t outBytes,
                                 const std::function<Status(char* in, char* out)>& run,
                                 const std::string& what) {
  GpuState& g = gpu_;
  // Pinned: [this rank's input | its output].
  HORA_RETURN_IF_ERROR(gpuPinned(inBytes + outBytes, what));
  if (inBytes)
    HORA_RETURN_IF_ERROR(opts_.gpu->check(g.api->memcpy_async(g.pinned, in, inBytes, g.stream),
                                          "memcpy_async", what));
  HORA_RETURN_IF_ERROR(gpuWait(what));
  Status s = run(g.pinned, g.pinned + inBytes);
  if (!s.isOk()) return backendFailure(s, what);
  if (!out || outBytes == 0) return Status::ok();  // joined, or no output: taking part was all
  HORA_RETURN_IF_ERROR(opts_.gpu->check(
      g.api->memcpy_async(out, g.pinned + inBytes, outBytes, g.stream), "memcpy_async", what));
  return gpuWait(what);
}

Status ProcessSetImpl::runGpuAllgather(const Response& r, TensorEntry* e, Status* outputLost) {
  const Device dev = e ? e->request.device : localDevice(r, {});
  const std::string what = describe("allgather", r, dev);
  HORA_RETURN_IF_ERROR(gpuPrepare(dev, what));
  const DataType dt = r.dtype;
  const size_t esz = dataTypeSize(dt);
  const std::vector<size_t> counts = allgatherCounts(r, size());
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  const size_t inBytes = counts[rank_] * esz, outBytes = total * esz;
  HORA_RETURN_IF_ERROR(gpuAfterReady(e, what));

  // total is the same on every rank: all skip an empty gather together.
  const std::vector<int64_t>& outShape = r.shape;  // the response carries the gathered shape
  bool viaComm = false;  // these move bytes: the communicator serves every dtype
  if (total > 0) HORA_RETURN_IF_ERROR(gpuChoosePath(true, what, &viaComm));
  char* out = nullptr;
  HORA_RETURN_IF_ERROR(gpuOutput(e, outShape, outBytes, viaComm, what, &out, outputLost));
  if (total == 0) return Status::ok();
  const void* in = e ? e->in : nullptr;

  if (viaComm) {
    std::vector<size_t> bytes(counts.size());
    for (size_t i = 0; i < counts.size(); ++i) bytes[i] = counts[i] * esz;
    HORA_RETURN_IF_ERROR(opts_.gpu->check(
        gpu_.api->allgatherv(in, out, bytes.data(), static_cast<int32_t>(DataType::kUint8),
                             gpu_.comm, gpu_.stream),
        "allgatherv", what));
    return gpuWait(what);
  }
  return gpuStaged(
      in, inBytes, out, outBytes,
      [&](char* pin, char* pout) { return backend_->allgatherv(pin, pout, counts, dt); }, what);
}

Status ProcessSetImpl::runGpuAlltoall(const Response& r, TensorEntry* e, Status* outputLost) {
  const Device dev = e ? e->request.device : localDevice(r, {});
  const std::string what = describe("alltoall", r, dev);
  HORA_RETURN_IF_ERROR(gpuPrepare(dev, what));
  const DataType dt = r.dtype;
  const size_t esz = dataTypeSize(dt);
  const int n = size();
  const AlltoallCounts c = alltoallCounts(r, rank_, n);
  const size_t inBytes = std::accumulate(c.send.begin(), c.send.end(), int64_t{0}) * esz;
  const size_t outBytes = std::accumulate(c.recv.begin(), c.recv.end(), int64_t{0}) * esz;
  HORA_RETURN_IF_ERROR(gpuAfterReady(e, what));

  std::vector<int64_t> outShape = r.shape;
  outShape[0] = c.outRows;
  if (e) e->owner->receivedSplits = c.recvRows;
  // No early return when this rank sends and receives nothing: its peers are
  // in the collective (Gloo needs every rank; the first GPU group also
  // creates the communicator on every rank).
  bool viaComm = false;  // these move bytes: the communicator serves every dtype
  HORA_RETURN_IF_ERROR(gpuChoosePath(true, what, &viaComm));
  char* out = nullptr;
  HORA_RETURN_IF_ERROR(gpuOutput(e, outShape, outBytes, viaComm, what, &out, outputLost));
  const void* in = e ? e->in : nullptr;

  if (viaComm) {
    std::vector<size_t> sendB(n), recvB(n);
    for (int d = 0; d < n; ++d) {
      sendB[d] = static_cast<size_t>(c.send[d]) * esz;
      recvB[d] = static_cast<size_t>(c.recv[d]) * esz;
    }
    HORA_RETURN_IF_ERROR(opts_.gpu->check(
        gpu_.api->alltoallv(in, sendB.data(), out, recvB.data(),
                            static_cast<int32_t>(DataType::kUint8), gpu_.comm, gpu_.stream),
        "alltoallv", what));
    return gpuWait(what);
  }
  return gpuStaged(
      in, inBytes, out, outBytes,
      [&](char* pin, char* pout) { return backend_->alltoallv(pin, c.send, pout, c.recv, dt); },
      what);
}

Status ProcessSetImpl::runGpuReducescatter(const Response& r, TensorEntry* e, Status* outputLost) {
  const Device dev = e ? e->request.device : localDevice(r, {});
  const std::string what = describe("reducescatter", r, dev);
  HORA_RETURN_IF_ERROR(gpuPrepare(dev, what));
  GpuState& g = gpu_;
  const auto* api = g.api;
  const DataType dt = r.dtype;
  const auto dtc = static_cast<int32_t>(dt);
  const size_t esz = dataTypeSize(dt);
  const ScatterCounts c = reducescatterCounts(r, rank_, size());
  const size_t mine = c.counts[rank_];
  const size_t total = static_cast<size_t>(r.numElements());
  const size_t bytes = total * esz;
  const ReduceOp op = reducingOp(r);
  HORA_RETURN_IF_ERROR(gpuAfterReady(e, what));

  // The whole input, prescaled, in the device fusion buffer; the collective
  // leaves this rank's region reduced there.
  HORA_RETURN_IF_ERROR(gpuFusion(std::max<size_t>(bytes, 1), what));
  char* buf = g.fusion;
  if (total > 0) {
    if (e) {
      hora_gpu_copy_t copy{buf, e->in, total};
      HORA_RETURN_IF_ERROR(
          opts_.gpu->check(api->batched_scale_copy(dtc, &copy, 1, r.prescale, g.stream),
                           "batched_scale_copy", what));
    } else {  // joined: contribute the op's identity
      HORA_RETURN_IF_ERROR(gpuPinned(bytes, what));
      fillIdentity(dt, op, g.pinned, total);
      HORA_RETURN_IF_ERROR(opts_.gpu->check(api->memcpy_async(buf, g.pinned, bytes, g.stream),
                                            "memcpy_async", what));
    }
    bool viaComm = false;
    HORA_RETURN_IF_ERROR(gpuChoosePath(ncclHasType(dt), what, &viaComm));
    if (viaComm) {
      HORA_RETURN_IF_ERROR(opts_.gpu->check(
          api->reducescatter(buf, c.counts.data(), dtc, static_cast<int32_t>(op), g.comm, g.stream),
          "reducescatter", what));
    } else {
      HORA_RETURN_IF_ERROR(gpuPinned(bytes, what));
      HORA_RETURN_IF_ERROR(opts_.gpu->check(api->memcpy_async(g.pinned, buf, bytes, g.stream),
                                            "memcpy_async", what));
      HORA_RETURN_IF_ERROR(gpuWait(what));
      Status s = backend_->reducescatter(g.pinned, c.counts, dt, op);
      if (!s.isOk()) return backendFailure(s, what);
      if (mine)
        HORA_RETURN_IF_ERROR(
            opts_.gpu->check(api->memcpy_async(buf + c.before * esz, g.pinned + c.before * esz,
                                               mine * esz, g.stream),
                             "memcpy_async", what));
    }
  }
  if (!e) return gpuWait(what);

  std::vector<int64_t> outShape = r.shape;
  if (!outShape.empty()) outShape[0] = c.rows;
  auto o = allocateOutput(*e, outShape);
  if (!o.isOk()) {
    *outputLost = o.status().withContext(what);
    return gpuWait(what);
  }
  if (mine) {
    hora_gpu_copy_t copy{o.value(), buf + c.before * esz, mine};
    HORA_RETURN_IF_ERROR(
        opts_.gpu->check(api->batched_scale_copy(dtc, &copy, 1, postFactor(r, size()), g.stream),
                         "batched_scale_copy", what));
  }
  return gpuWait(what);
}

}  // namespace hora
