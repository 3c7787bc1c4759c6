// The executor thread of a process set: runs negotiated groups in order
// through the backend. See process_set.h for the threading model.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/reduce.h"
#include "process_set.h"

namespace hora {

int64_t rowElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

std::vector<size_t> allgatherCounts(const Response& r, int size) {
  const int64_t row = rowElements(r.shape);
  std::vector<size_t> counts(size);
  for (int i = 0; i < size; ++i) counts[i] = static_cast<size_t>(r.sizes[i] * row);
  return counts;
}

AlltoallCounts alltoallCounts(const Response& r, int rank, int size) {
  const int64_t row = rowElements(r.shape);
  AlltoallCounts c;
  c.send.resize(size);
  c.recv.resize(size);
  c.recvRows.resize(size);
  for (int d = 0; d < size; ++d) {
    c.send[d] = r.sizes[rank * size + d] * row;
    c.recvRows[d] = r.sizes[d * size + rank];
    c.recv[d] = c.recvRows[d] * row;
    c.outRows += c.recvRows[d];
  }
  return c;
}

ScatterCounts reducescatterCounts(const Response& r, int rank, int size) {
  const int64_t dim0 = r.shape.empty() ? 0 : r.shape[0];
  const int64_t row = rowElements(r.shape);
  ScatterCounts c;
  c.counts.resize(size);
  for (int i = 0; i < size; ++i) {
    const int64_t rows = dim0 / size + (i < dim0 % size ? 1 : 0);
    c.counts[i] = static_cast<size_t>(rows * row);
    if (i < rank) c.before += c.counts[i];
    if (i == rank) c.rows = rows;
  }
  return c;
}

ReduceOp reducingOp(const Response& r) {
  return r.op == ReduceOp::kAverage ? ReduceOp::kSum : r.op;
}

double postFactor(const Response& r, int size) {
  const int contributors = size - static_cast<int>(r.joined.size());
  return r.postscale * (r.op == ReduceOp::kAverage ? 1.0 / std::max(1, contributors) : 1.0);
}

void ProcessSetImpl::executorLoop() {
  for (;;) {
    ExecGroup group;
    {
      std::unique_lock<std::mutex> lk(execMu_);
      execCv_.wait(lk, [&] { return !execQueue_.empty() || executorExit_; });
      // shutdown() drains the queue first and fails whatever is left after its deadline.
      if (executorExit_) return;
      group = std::move(execQueue_.front());
      execQueue_.pop_front();
    }
    // Runs even when the set is broken: the group was agreed by every rank
    // before the failure (a peer that said goodbye took part in it), and an
    // aborted backend fails data collectives at once with the named cause.
    execute(group);
    {
      std::lock_guard<std::mutex> lk(execMu_);
      --execInFlight_;
    }
    execIdleCv_.notify_all();
    if (coordinator_) boost::asio::post(cp_->io(), [this] { maybeEmit(); });
  }
}

Status ProcessSetImpl::backendFailure(const Status& s, const std::string& what) {
  // A data-plane failure is usually the shadow of a lost peer that the
  // control plane names precisely; give it a moment to say so.
  for (int i = 0; i < 40 && !isBroken_; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Status named = isBroken_ ? brokenStatus() : s.withContext(what);
  markBroken(named);
  return named;
}

void ProcessSetImpl::failedAfterAgreement(const Status& s) {
  // Every rank agreed to run this collective; a failure here that only this
  // rank saw (out of memory, a plugin call) leaves the others inside it, and
  // letting this rank go on would pair its next collective with their
  // current one. The set is done: tell the peers (markBroken sends the abort).
  if (!isBroken_) markBroken(s);
}

void ProcessSetImpl::execute(ExecGroup& g) {
  const Response& first = g.responses.front();
  auto& es = g.entries;
  switch (first.kind) {
    case ResponseKind::kError:
      for (size_t i = 0; i < es.size(); ++i)
        if (es[i])
          es[i]->complete(
              Status(static_cast<Code>(g.responses[i].errorCode), g.responses[i].error));
      return;
    case ResponseKind::kBarrier:
      // The response itself proves every rank arrived.
      if (es[0]) es[0]->complete(Status::ok());
      return;
    case ResponseKind::kJoin:
      if (es[0]) {
        es[0]->owner->lastJoinedRank = globalRank(first.lastJoinedRank);
        es[0]->complete(Status::ok());
      }
      return;
    case ResponseKind::kAllreduce: {
      Status s = first.device.kind == DeviceKind::kCuda ? runGpuAllreduce(g.responses, es)
                                                        : runAllreduce(g.responses, es);
      if (!s.isOk()) failedAfterAgreement(s);
      for (auto& e : es)
        if (e) e->complete(s.isOk() ? s : entryStatus(*e, s));
      return;
    }
    default:
      break;
  }
  TensorEntry* e = es[0].get();
  Status s;
  const bool gpu = first.device.kind == DeviceKind::kCuda;
  // The output could not be allocated, yet this rank took part in the
  // collective (with a stand-in), so the set stays usable.
  Status outputLost;
  switch (first.kind) {
    case ResponseKind::kAllgather:
      s = gpu ? runGpuAllgather(first, e, &outputLost) : runAllgather(first, e, &outputLost);
      break;
    case ResponseKind::kBroadcast:
      s = gpu ? runGpuBroadcast(first, e) : runBroadcast(first, e);
      break;
    case ResponseKind::kAlltoall:
      s = gpu ? runGpuAlltoall(first, e, &outputLost) : runAlltoall(first, e, &outputLost);
      break;
    case ResponseKind::kReducescatter:
      s = gpu ? runGpuReducescatter(first, e, &outputLost)
              : runReducescatter(first, e, &outputLost);
      break;
    default:
      s = internalError("unexpected response kind");
      break;
  }
  // Any other failure may be this rank's alone (a plugin call, memory for a
  // stand-in buffer) while the peers are inside the collective: the set is
  // done (a backend failure has broken it already).
  if (!s.isOk()) failedAfterAgreement(s);
  if (s.isOk()) s = outputLost;
  if (e) e->complete(s.isOk() ? s : entryStatus(*e, s));
}

Status ProcessSetImpl::runAllreduce(std::vector<Response>& group,
                                    std::vector<std::shared_ptr<TensorEntry>>& es) {
  const Response& r0 = group.front();
  DataType dt = r0.dtype;
  size_t esz = dataTypeSize(dt);
  ReduceOp op = reducingOp(r0);
  double post = postFactor(r0, size());
  double pre = r0.prescale;
  std::string what =
      "allreduce \"" + r0.name + "\"" +
      (group.size() > 1 ? " (fused with " + std::to_string(group.size() - 1) + " more)" : "");

  // Every rank takes the same path for a group (chosen from the response,
  // never from whether this rank has an entry): both end in allreduceGather,
  // whose algorithm depends only on the element count.
  if (group.size() == 1) {
    // One tensor is reduced where it lies: the output buffer is the staging
    // area, so with Gloo's ring "pack" is the input->output copy (or the
    // prescale in place), done segment by segment inside the network waits;
    // a backend with its own memory (shm) packs from the input and unpacks
    // into the output instead.
    size_t n = static_cast<size_t>(r0.numElements());
    TensorEntry* e = es[0].get();
    char* data;
    if (e) {
      data = static_cast<char*>(e->out);
    } else if (backend_->needsStaging(n, dt)) {  // this rank joined: the identity goes here
      HORA_RETURN_IF_ERROR(fusion_.reserve(n * esz));
      data = fusion_.data();
    } else {  // joined, and the backend packs into its own memory
      data = nullptr;
    }
    auto pack = [&](size_t lo, size_t hi, void* dst) {
      char* d = static_cast<char*>(dst);
      if (!e) {
        fillIdentity(dt, op, d, hi - lo);
        return;
      }
      const char* src = static_cast<const char*>(e->in) + lo * esz;
      if (src != d) {
        scaleCopy(dt, d, src, hi - lo, pre);
      } else if (pre != 1.0) {
        scaleInPlace(dt, d, hi - lo, pre);
      }
    };
    auto unpack = [&](size_t lo, size_t hi, const void* src) {
      if (!e) return;
      char* d = data + lo * esz;
      if (src != d) {
        scaleCopy(dt, d, src, hi - lo, post);
      } else if (post != 1.0) {
        scaleInPlace(dt, d, hi - lo, post);
      }
    };
    Status s = backend_->allreduceGather(data, n, dt, op, pack, unpack);
    return s.isOk() ? s : backendFailure(s, what);
  }

  // Fused: the tensors share the persistent fusion buffer. start[i] is the
  // first element of tensor i in it.
  std::vector<size_t> start(group.size() + 1, 0);
  for (size_t i = 0; i < group.size(); ++i)
    start[i + 1] = start[i] + static_cast<size_t>(group[i].numElements());
  size_t total = start.back();
  // The persistent fusion buffer, unless the backend packs into memory of its
  // own (shm): then it is never allocated, let alone first-touched.
  char* buf = nullptr;
  if (backend_->needsStaging(total, dt)) {
    HORA_RETURN_IF_ERROR(fusion_.reserve(total * esz));
    buf = fusion_.data();
  }
  // Applies fn(tensor index, first element within the tensor, element count,
  // first element within the buffer) to every tensor piece overlapping
  // buffer elements [lo, hi).
  auto forPieces = [&](size_t lo, size_t hi, auto&& fn) {
    size_t i =
        static_cast<size_t>(std::upper_bound(start.begin(), start.end(), lo) - start.begin()) - 1;
    for (; i < group.size() && start[i] < hi; ++i) {
      size_t a = std::max(lo, start[i]), b = std::min(hi, start[i + 1]);
      if (b > a) fn(i, a - start[i], b - a, a);
    }
  };
  // The backend packs and unpacks range by range while it waits for the
  // network (GlooBackend's ring, dst/src inside buf), straight into and out
  // of shared memory (ShmBackend), or all at once around its allreduce.
  auto pack = [&](size_t lo, size_t hi, void* dst) {
    char* d = static_cast<char*>(dst);
    forPieces(lo, hi, [&](size_t i, size_t off, size_t n, size_t at) {
      char* to = d + (at - lo) * esz;
      if (es[i])
        scaleCopy(dt, to, static_cast<const char*>(es[i]->in) + off * esz, n, pre);
      else  // this rank joined: contribute the identity
        fillIdentity(dt, op, to, n);
    });
  };
  auto unpack = [&](size_t lo, size_t hi, const void* src) {
    const char* from0 = static_cast<const char*>(src);
    forPieces(lo, hi, [&](size_t i, size_t off, size_t n, size_t at) {
      if (es[i])
        scaleCopy(dt, static_cast<char*>(es[i]->out) + off * esz, from0 + (at - lo) * esz, n, post);
    });
  };
  Status s = backend_->allreduceGather(buf, total, dt, op, pack, unpack);
  return s.isOk() ? s : backendFailure(s, what);
}

Result<void*> ProcessSetImpl::allocateOutput(TensorEntry& e, const std::vector<int64_t>& shape) {
  RequestState& st = *e.owner;
  size_t bytes = static_cast<size_t>(numElements(shape)) * dataTypeSize(e.request.dtype);
  const Device dev = e.request.device;
  const bool onGpu = dev.kind == DeviceKind::kCuda;
  st.outShape = shape;
  void* data = nullptr;
  if (st.alloc) {
    // For a GPU input the callback returns memory on the input's device.
    int rc = st.alloc(st.allocUser, static_cast<int32_t>(shape.size()), shape.data(), e.dlType,
                      bytes, &data);
    if (rc != 0 || (!data && bytes > 0))
      return Status(Code::kSystemError, "the output allocator callback failed (returned " +
                                            std::to_string(rc) + ") for " + std::to_string(bytes) +
                                            " bytes on " + deviceName(dev));
  } else if (onGpu) {
    // gpuPrepare ran for this group: the plugin is loaded, the device known.
    const hora_gpu_plugin_v1_t* api = gpu_.api;
    const int index = gpu_.device;
    HORA_RETURN_IF_ERROR(opts_.gpu->check(
        api->device_alloc(index, std::max<size_t>(bytes, 1), &data), "device_alloc",
        "the library-owned output (" + std::to_string(bytes) + " bytes on " + deviceName(dev) +
            "; pass options.alloc to allocate it yourself)"));
    st.ownedDeviceOutput =
        std::shared_ptr<void>(data, [api, index](void* p) { api->device_free(index, p); });
  } else {
    st.ownedOutput.resize(std::max<size_t>(bytes, 1));
    data = st.ownedOutput.data();
  }
  st.outTensor = DLTensor{};
  st.outTensor.data = data;
  st.outTensor.device = onGpu ? DLDevice{kDLCUDA, dev.index} : DLDevice{kDLCPU, 0};
  st.outTensor.ndim = static_cast<int32_t>(st.outShape.size());
  st.outTensor.dtype = e.dlType;
  st.outTensor.shape = st.outShape.data();
  st.outTensor.strides = nullptr;
  st.outTensor.byte_offset = 0;
  st.hasOutput = true;
  return data;
}

Status ProcessSetImpl::runAllgather(const Response& r, TensorEntry* e, Status* outputLost) {
  DataType dt = r.dtype;
  const std::vector<size_t> counts = allgatherCounts(r, size());
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  void* out = nullptr;
  if (e) {
    auto o = allocateOutput(*e, r.shape);
    if (!o.isOk()) {
      // Every rank must still take part, or the others would hang.
      HORA_RETURN_IF_ERROR(fusion_.reserve(total * dataTypeSize(dt)));
      Status s = backend_->allgatherv(e->in, fusion_.data(), counts, dt);
      if (!s.isOk()) return backendFailure(s, "allgather \"" + r.name + "\"");
      *outputLost = o.status();
      return Status::ok();
    }
    out = o.value();
  } else {
    HORA_RETURN_IF_ERROR(fusion_.reserve(total * dataTypeSize(dt)));
    out = fusion_.data();
  }
  Status s = backend_->allgatherv(e ? e->in : nullptr, out, counts, dt);
  if (!s.isOk()) return backendFailure(s, "allgather \"" + r.name + "\"");
  return Status::ok();
}

Status ProcessSetImpl::runBroadcast(const Response& r, TensorEntry* e) {
  size_t n = static_cast<size_t>(r.numElements());
  void* data = e ? e->out : nullptr;
  if (!data) {
    HORA_RETURN_IF_ERROR(fusion_.reserve(n * dataTypeSize(r.dtype)));
    data = fusion_.data();
  }
  Status s = backend_->broadcast(data, n, r.dtype, r.root);
  if (!s.isOk()) return backendFailure(s, "broadcast \"" + r.name + "\"");
  return Status::ok();
}

Status ProcessSetImpl::runAlltoall(const Response& r, TensorEntry* e, Status* outputLost) {
  const int64_t row = rowElements(r.shape);
  const AlltoallCounts c = alltoallCounts(r, rank_, size());
  std::vector<int64_t> outShape = r.shape;
  outShape[0] = c.outRows;
  void* out = nullptr;
  Status allocFailure;
  if (e) {
    e->owner->receivedSplits = c.recvRows;
    auto o = allocateOutput(*e, outShape);
    if (o.isOk())
      out = o.value();
    else
      allocFailure = o.status();
  }
  if (!out) {
    HORA_RETURN_IF_ERROR(
        fusion_.reserve(static_cast<size_t>(c.outRows * row) * dataTypeSize(r.dtype)));
    out = fusion_.data();
  }
  Status s = backend_->alltoallv(e ? e->in : nullptr, c.send, out, c.recv, r.dtype);
  if (!s.isOk()) return backendFailure(s, "alltoall \"" + r.name + "\"");
  *outputLost = allocFailure;
  return Status::ok();
}

Status ProcessSetImpl::runReducescatter(const Response& r, TensorEntry* e, Status* outputLost) {
  DataType dt = r.dtype;
  size_t esz = dataTypeSize(dt);
  const ScatterCounts c = reducescatterCounts(r, rank_, size());
  size_t total = static_cast<size_t>(r.numElements());
  ReduceOp op = reducingOp(r);
  double post = postFactor(r, size());
  HORA_RETURN_IF_ERROR(fusion_.reserve(std::max<size_t>(total, 1) * esz));
  char* buf = fusion_.data();
  if (e)
    scaleCopy(dt, buf, e->in, total, r.prescale);
  else
    fillIdentity(dt, op, buf, total);
  Status s = backend_->reducescatter(buf, c.counts, dt, op);
  if (!s.isOk()) return backendFailure(s, "reducescatter \"" + r.name + "\"");
  if (!e) return Status::ok();
  std::vector<int64_t> outShape = r.shape;
  if (!outShape.empty()) outShape[0] = c.rows;
  auto o = allocateOutput(*e, outShape);
  if (!o.isOk()) {
    *outputLost = o.status();
    return Status::ok();
  }
  scaleCopy(dt, o.value(), buf + c.before * esz, c.counts[rank_], post);
  return Status::ok();
}

}  // namespace hora
