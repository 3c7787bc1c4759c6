// The executor thread's GPU allgather, alltoall and reducescatter: the
// collectives whose output size is known only after negotiation. See
// gpu_executor.cc for the set's GPU resources and the two paths:
//  - communicator: allgather and alltoall move bytes (every dtype);
//    reducescatter reduces, so int16 and bool take the staging path;
//  - staging: input device -> pinned host, the CPU data plane on pinned
//    memory, result pinned -> device.
// The output is allocated on the input's device after negotiation: through
// options.alloc (which must return memory on that device) or by the plugin,
// owned by the request. If the allocator fails, this rank still takes part
// with a stand-in buffer (the device fusion buffer), so its peers finish and
// the set stays usable; only this request fails.
#include <algorithm>
#include <numeric>

#include "core/reduce.h"
#include "process_set.h"

namespace hora {

namespace {

std::vector<size_t> toBytes(const std::vector<size_t>& counts, size_t esz) {
  std::vector<size_t> b(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) b[i] = counts[i] * esz;
  return b;
}

std::string describe(const char* op, const Response& r, const Device& dev) {
  return std::string(op) + " \"" + r.name + "\" (" + deviceName(dev) + ")";
}

}  // namespace

Status ProcessSetImpl::outputOrLost(TensorEntry& e, const std::vector<int64_t>& shape,
                                    const std::string& what, Status* outputLost) {
  auto o = allocateOutput(e, shape);
  if (!o.isOk()) *outputLost = o.status().withContext(what);
  return Status::ok();
}

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

Status ProcessSetImpl::runGpuAllgather(const Response& r, TensorEntry* e, Status* outputLost) {
  const Device dev = e ? e->request.device : localDevice(r, {});
  const std::string what = describe("allgather", r, dev);
  HORA_RETURN_IF_ERROR(gpuPrepare(dev, what));
  GpuState& g = gpu_;
  const auto* api = g.api;
  const DataType dt = r.dtype;
  const size_t esz = dataTypeSize(dt);
  const int64_t row = rowElements(r.shape);
  std::vector<size_t> counts(size());
  for (int i = 0; i < size(); ++i) counts[i] = static_cast<size_t>(r.sizes[i] * row);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  const size_t inBytes = counts[rank_] * esz, outBytes = total * esz;
  HORA_RETURN_IF_ERROR(gpuAfterReady(e, what));

  // total is the same on every rank: all skip an empty gather together.
  std::vector<int64_t> outShape = r.shape;  // the response carries the gathered shape
  if (total == 0) return e ? outputOrLost(*e, outShape, what, outputLost) : Status::ok();
  bool viaComm = false;  // these move bytes: the communicator serves every dtype
  HORA_RETURN_IF_ERROR(gpuChoosePath(true, what, &viaComm));
  char* out = nullptr;
  HORA_RETURN_IF_ERROR(gpuOutput(e, outShape, outBytes, viaComm, what, &out, outputLost));
  const void* in = e ? e->in : nullptr;

  if (viaComm) {
    const std::vector<size_t> bytes = toBytes(counts, esz);
    HORA_RETURN_IF_ERROR(
        opts_.gpu->check(api->allgatherv(in, out, bytes.data(),
                                         static_cast<int32_t>(DataType::kUint8), g.comm, g.stream),
                         "allgatherv", what));
    return gpuWait(what);
  }
  // Pinned: [this rank's part | everything gathered].
  HORA_RETURN_IF_ERROR(gpuPinned(inBytes + outBytes, what));
  if (inBytes)
    HORA_RETURN_IF_ERROR(
        opts_.gpu->check(api->memcpy_async(g.pinned, in, inBytes, g.stream), "memcpy_async", what));
  HORA_RETURN_IF_ERROR(gpuWait(what));
  Status s = backend_->allgatherv(g.pinned, g.pinned + inBytes, counts, dt);
  if (!s.isOk()) return backendFailure(s, what);
  if (!out) return Status::ok();  // joined, or no output: taking part was all
  HORA_RETURN_IF_ERROR(opts_.gpu->check(
      api->memcpy_async(out, g.pinned + inBytes, outBytes, g.stream), "memcpy_async", what));
  return gpuWait(what);
}

Status ProcessSetImpl::runGpuAlltoall(const Response& r, TensorEntry* e, Status* outputLost) {
  const Device dev = e ? e->request.device : localDevice(r, {});
  const std::string what = describe("alltoall", r, dev);
  HORA_RETURN_IF_ERROR(gpuPrepare(dev, what));
  GpuState& g = gpu_;
  const auto* api = g.api;
  const DataType dt = r.dtype;
  const size_t esz = dataTypeSize(dt);
  const int n = size();
  const int64_t row = rowElements(r.shape);
  std::vector<int64_t> send(n), recv(n), recvRows(n);
  int64_t outRows = 0;
  for (int d = 0; d < n; ++d) {
    send[d] = r.sizes[rank_ * n + d] * row;
    recvRows[d] = r.sizes[d * n + rank_];
    recv[d] = recvRows[d] * row;
    outRows += recvRows[d];
  }
  const size_t inBytes = std::accumulate(send.begin(), send.end(), int64_t{0}) * esz;
  const size_t outBytes = static_cast<size_t>(outRows * row) * esz;
  HORA_RETURN_IF_ERROR(gpuAfterReady(e, what));

  std::vector<int64_t> outShape = r.shape;
  outShape[0] = outRows;
  if (e) e->owner->receivedSplits = recvRows;
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
      sendB[d] = static_cast<size_t>(send[d]) * esz;
      recvB[d] = static_cast<size_t>(recv[d]) * esz;
    }
    HORA_RETURN_IF_ERROR(
        opts_.gpu->check(api->alltoallv(in, sendB.data(), out, recvB.data(),
                                        static_cast<int32_t>(DataType::kUint8), g.comm, g.stream),
                         "alltoallv", what));
    return gpuWait(what);
  }
  HORA_RETURN_IF_ERROR(gpuPinned(inBytes + outBytes, what));
  if (inBytes)
    HORA_RETURN_IF_ERROR(
        opts_.gpu->check(api->memcpy_async(g.pinned, in, inBytes, g.stream), "memcpy_async", what));
  HORA_RETURN_IF_ERROR(gpuWait(what));
  Status s = backend_->alltoallv(g.pinned, send, g.pinned + inBytes, recv, dt);
  if (!s.isOk()) return backendFailure(s, what);
  if (out && outBytes)
    HORA_RETURN_IF_ERROR(opts_.gpu->check(
        api->memcpy_async(out, g.pinned + inBytes, outBytes, g.stream), "memcpy_async", what));
  return gpuWait(what);
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
  const int n = size();
  const int64_t dim0 = r.shape.empty() ? 0 : r.shape[0];
  const int64_t row = rowElements(r.shape);
  std::vector<size_t> counts(n);
  size_t before = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t rows = dim0 / n + (i < dim0 % n ? 1 : 0);
    counts[i] = static_cast<size_t>(rows * row);
    if (i < rank_) before += counts[i];
  }
  const size_t total = static_cast<size_t>(r.numElements());
  const size_t bytes = total * esz;
  const ReduceOp op = r.op == ReduceOp::kAverage ? ReduceOp::kSum : r.op;
  const int contributors = n - static_cast<int>(r.joined.size());
  const double post =
      r.postscale * (r.op == ReduceOp::kAverage ? 1.0 / std::max(1, contributors) : 1.0);
  HORA_RETURN_IF_ERROR(gpuAfterReady(e, what));

  // The whole input, prescaled, in the device fusion buffer; the collective
  // leaves this rank's region reduced there.
  HORA_RETURN_IF_ERROR(gpuFusion(std::max<size_t>(bytes, 1), what));
  char* buf = g.fusion;
  if (total > 0) {
    if (e) {
      hora_gpu_copy_t c{buf, e->in, total};
      HORA_RETURN_IF_ERROR(opts_.gpu->check(
          api->batched_scale_copy(dtc, &c, 1, r.prescale, g.stream), "batched_scale_copy", what));
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
          api->reducescatter(buf, counts.data(), dtc, static_cast<int32_t>(op), g.comm, g.stream),
          "reducescatter", what));
    } else {
      HORA_RETURN_IF_ERROR(gpuPinned(bytes, what));
      HORA_RETURN_IF_ERROR(opts_.gpu->check(api->memcpy_async(g.pinned, buf, bytes, g.stream),
                                            "memcpy_async", what));
      HORA_RETURN_IF_ERROR(gpuWait(what));
      Status s = backend_->reducescatter(g.pinned, counts, dt, op);
      if (!s.isOk()) return backendFailure(s, what);
      if (counts[rank_])
        HORA_RETURN_IF_ERROR(
            opts_.gpu->check(api->memcpy_async(buf + before * esz, g.pinned + before * esz,
                                               counts[rank_] * esz, g.stream),
                             "memcpy_async", what));
    }
  }
  if (!e) return gpuWait(what);

  std::vector<int64_t> outShape = r.shape;
  if (!outShape.empty()) outShape[0] = dim0 / n + (rank_ < dim0 % n ? 1 : 0);
  auto o = allocateOutput(*e, outShape);
  if (!o.isOk()) {
    *outputLost = o.status().withContext(what);
    return gpuWait(what);
  }
  if (counts[rank_]) {
    hora_gpu_copy_t c{o.value(), buf + before * esz, counts[rank_]};
    HORA_RETURN_IF_ERROR(opts_.gpu->check(api->batched_scale_copy(dtc, &c, 1, post, g.stream),
                                          "batched_scale_copy", what));
  }
  return gpuWait(what);
}

}  // namespace hora
