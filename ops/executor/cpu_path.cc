#include "ops/executor/cpu_path.h"

#include <algorithm>
#include <numeric>

#include "core/reduce.h"
#include "core/response_counts.h"

namespace hora {

namespace {

std::string describe(const char* op, const Response& r) {
  return std::string(op) + " \"" + r.name + "\"";
}

Result<void*> hostOutput(TensorEntry& e, const std::vector<int64_t>& shape) {
  return e.sink->allocateOutput(shape, e.request.dtype, e.request.device, nullptr);
}

}  // namespace

Status CpuPath::allreduce(const std::vector<Response>& group, const std::vector<EntryPtr>& es) {
  // Every rank takes the same path for a group (chosen from the response,
  // never from whether this rank has an entry): both end in
  // allreduceGather, whose algorithm depends only on the element count.
  packNs_ = 0;
  unpackNs_ = 0;
  return group.size() == 1 ? allreduceOne(group.front(), es[0].get()) : allreduceFused(group, es);
}

namespace {

// Adds the time `fn` takes to `sum` (only while telemetry is on: a clock read
// per range otherwise costs for nothing).
template <typename F>
void timed(bool on, std::atomic<int64_t>& sum, F&& fn) {
  if (!on) return fn();
  const auto t0 = Clock::now();
  fn();
  sum.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count(),
                std::memory_order_relaxed);
}

// Backend::CombineFn for one contiguous piece of n elements: to = op(input,
// with) (withFirst: op(with, input)), where a rank that joined (in ==
// nullptr) contributes the op's identity, so the bits equal packing first
// and reducing after. `to` may be `in`, never `with`.
void combinePiece(DataType dt, ReduceOp op, ReduceFn reduce, char* to, const char* in,
                  const void* with, size_t n, bool withFirst) {
  if (in == nullptr) {
    fillIdentity(dt, op, to, n);
    in = to;
  }
  if (withFirst) {
    reduce(to, with, in, n);
  } else {
    reduce(to, in, with, n);
  }
}

}  // namespace

Status CpuPath::allreduceOne(const Response& r, TensorEntry* e) {
  // One tensor is reduced where it lies: the output buffer is the staging
  // area, so with Gloo's ring "pack" is the input->output copy (or the
  // prescale in place), done segment by segment inside the network waits; a
  // backend with its own memory (shm) packs from the input and unpacks into
  // the output instead.
  Backend& be = *ctx_.backend;
  const Reduction x = reductionOf(r, ctx_.size());
  const DataType dt = x.dtype;
  const size_t esz = x.elementSize, n = static_cast<size_t>(r.numElements());
  char* data;
  if (e) {
    data = static_cast<char*>(e->out);
  } else if (be.needsStaging(n, dt)) {  // this rank joined: the identity goes here
    HORA_RETURN_IF_ERROR(fusion_.reserve(n * esz));
    data = fusion_.data();
  } else {  // joined, and the backend packs into its own memory
    data = nullptr;
  }
  const bool on = ctx_.telemetry != nullptr;
  auto pack = [&](size_t lo, size_t hi, void* dst) {
    timed(on, packNs_, [&] {
      char* d = static_cast<char*>(dst);
      if (!e) {
        fillIdentity(dt, x.op, d, hi - lo);
        return;
      }
      const char* src = static_cast<const char*>(e->in) + lo * esz;
      if (src != d) {
        scaleCopy(dt, d, src, hi - lo, x.pre);
      } else if (x.pre != 1.0) {
        scaleInPlace(dt, d, hi - lo, x.pre);
      }
    });
  };
  auto unpack = [&](size_t lo, size_t hi, const void* src) {
    if (!e) return;
    timed(on, unpackNs_, [&] {
      char* d = data + lo * esz;
      if (src != d) {
        scaleCopy(dt, d, src, hi - lo, x.post);
      } else if (x.post != 1.0) {
        scaleInPlace(dt, d, hi - lo, x.post);
      }
    });
  };
  // This rank's own part of a chunk, straight from the input (Backend::CombineFn);
  // with a prescale the backend packs it first instead.
  const ReduceFn reduce = reduceFunction(dt, x.op);
  auto combine = [&](size_t lo, size_t hi, void* dst, const void* other, bool otherFirst) {
    if (x.pre != 1.0 || reduce == nullptr) return false;
    timed(on, packNs_, [&] {
      const char* in = e ? static_cast<const char*>(e->in) + lo * esz : nullptr;
      combinePiece(dt, x.op, reduce, static_cast<char*>(dst), in, other, hi - lo, otherFirst);
    });
    return true;
  };
  const uint64_t token = e ? e->prepackToken : 0;
  const uint64_t usedBefore = token != 0 ? be.prepacksUsed() : 0;
  be.expectPrepacked(token);
  // Peers may have packed this very allreduce ahead under its signature.
  be.expectPeersPrepacked(r.signature);
  const uint64_t peersBefore = be.peerPrepacksRead();
  Status s = be.allreduceGatherCombine(data, n, dt, x.op, pack, unpack, combine);
  if (token != 0 && ctx_.telemetry && be.prepacksUsed() != usedBefore)
    ctx_.telemetry->packedAheadUsed();
  if (ctx_.telemetry && be.peerPrepacksRead() != peersBefore)
    ctx_.telemetry->peerPacksRead(be.peerPrepacksRead() - peersBefore);
  return s.isOk() ? s : dataPlaneFailure(ctx_, s, describe("allreduce", r));
}

bool CpuPath::prepack(TensorEntry& e, const std::function<bool()>& stop) {
  const Request& q = e.request;
  if (q.kind != CollectiveKind::kAllreduce || q.device.kind != DeviceKind::kCpu || !e.in)
    return false;
  const int64_t n = numElements(q.shape);
  if (n <= 0) return false;
  const DataType dt = q.dtype;
  const size_t esz = dataTypeSize(dt);
  const double pre = q.prescale;
  // allreduceOne's pack for an entry of this rank (the response agrees with
  // the request on all of these, or it is an error and nothing runs).
  auto pack = [&](size_t lo, size_t hi, void* dst) {
    const char* src = static_cast<const char*>(e.in) + lo * esz;
    scaleCopy(dt, static_cast<char*>(dst), src, hi - lo, pre);
  };
  const ReduceOp op = q.op == ReduceOp::kAverage ? ReduceOp::kSum : q.op;
  const uint64_t token = ++lastPrepackToken_;
  if (!ctx_.backend->prepackAllreduce(token, q.signature(), static_cast<size_t>(n), dt, op, pack,
                                      stop))
    return false;
  e.prepackToken = token;
  return true;
}

Status CpuPath::allreduceFused(const std::vector<Response>& group,
                               const std::vector<EntryPtr>& es) {
  Backend& be = *ctx_.backend;
  const Response& r0 = group.front();
  const Reduction x = reductionOf(r0, ctx_.size());
  const DataType dt = x.dtype;
  const size_t esz = x.elementSize;
  // start[i] is the first element of tensor i in the fusion buffer.
  auto offsets = fusedOffsets(group);
  if (!offsets.isOk()) return offsets.status();
  const std::vector<size_t> start = offsets.take();
  const size_t total = start.back();
  // The persistent fusion buffer, unless the backend packs into memory of its
  // own (shm): then it is never allocated, let alone first-touched.
  char* buf = nullptr;
  if (be.needsStaging(total, dt)) {
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
      const size_t a = std::max(lo, start[i]), b = std::min(hi, start[i + 1]);
      if (b > a) fn(i, a - start[i], b - a, a);
    }
  };
  // The backend packs and unpacks range by range while it waits for the
  // network (GlooBackend's ring, dst/src inside buf), straight into and out
  // of shared memory (ShmBackend), or all at once around its allreduce.
  const bool on = ctx_.telemetry != nullptr;
  auto pack = [&](size_t lo, size_t hi, void* dst) {
    timed(on, packNs_, [&] {
      char* d = static_cast<char*>(dst);
      forPieces(lo, hi, [&](size_t i, size_t off, size_t n, size_t at) {
        char* to = d + (at - lo) * esz;
        if (es[i])
          scaleCopy(dt, to, static_cast<const char*>(es[i]->in) + off * esz, n, x.pre);
        else  // this rank joined: contribute the identity
          fillIdentity(dt, x.op, to, n);
      });
    });
  };
  auto unpack = [&](size_t lo, size_t hi, const void* src) {
    timed(on, unpackNs_, [&] {
      const char* from0 = static_cast<const char*>(src);
      forPieces(lo, hi, [&](size_t i, size_t off, size_t n, size_t at) {
        if (es[i])
          scaleCopy(dt, static_cast<char*>(es[i]->out) + off * esz, from0 + (at - lo) * esz, n,
                    x.post);
      });
    });
  };
  const ReduceFn reduce = reduceFunction(dt, x.op);
  auto combine = [&](size_t lo, size_t hi, void* dst, const void* other, bool otherFirst) {
    if (x.pre != 1.0 || reduce == nullptr) return false;
    timed(on, packNs_, [&] {
      char* d = static_cast<char*>(dst);
      const char* o = static_cast<const char*>(other);
      forPieces(lo, hi, [&](size_t i, size_t off, size_t n, size_t at) {
        const char* in = es[i] ? static_cast<const char*>(es[i]->in) + off * esz : nullptr;
        combinePiece(dt, x.op, reduce, d + (at - lo) * esz, in, o + (at - lo) * esz, n, otherFirst);
      });
    });
    return true;
  };
  be.expectPrepacked(0);
  Status s = be.allreduceGatherCombine(buf, total, dt, x.op, pack, unpack, combine);
  if (s.isOk()) return s;
  return dataPlaneFailure(
      ctx_, s,
      describe("allreduce", r0) + " (fused with " + std::to_string(group.size() - 1) + " more)");
}

Status CpuPath::allgather(const Response& r, TensorEntry* e, Status* outputLost) {
  const DataType dt = r.dtype;
  const std::vector<size_t> counts = allgatherCounts(r, ctx_.size());
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  void* out = nullptr;
  if (e) {
    auto o = hostOutput(*e, r.shape);  // the response carries the gathered shape
    if (o.isOk())
      out = o.value();
    else
      *outputLost = o.status();  // every rank must still take part, or the others would hang
  }
  if (!out) {
    HORA_RETURN_IF_ERROR(fusion_.reserve(total * dataTypeSize(dt)));
    out = fusion_.data();
  }
  Status s = ctx_.backend->allgatherv(e ? e->in : nullptr, out, counts, dt);
  return s.isOk() ? s : dataPlaneFailure(ctx_, s, describe("allgather", r));
}

Status CpuPath::broadcast(const Response& r, TensorEntry* e) {
  const size_t n = static_cast<size_t>(r.numElements());
  void* data = e ? e->out : nullptr;
  if (!data) {
    HORA_RETURN_IF_ERROR(fusion_.reserve(n * dataTypeSize(r.dtype)));
    data = fusion_.data();
  }
  Status s = ctx_.backend->broadcast(data, n, r.dtype, r.root);
  return s.isOk() ? s : dataPlaneFailure(ctx_, s, describe("broadcast", r));
}

Status CpuPath::alltoall(const Response& r, TensorEntry* e, Status* outputLost) {
  const int64_t row = rowElements(r.shape);
  const AlltoallCounts c = alltoallCounts(r, ctx_.rank, ctx_.size());
  std::vector<int64_t> outShape = r.shape;
  outShape[0] = c.outRows;
  void* out = nullptr;
  if (e) {
    e->sink->setReceivedSplits(c.recvRows);
    auto o = hostOutput(*e, outShape);
    if (o.isOk())
      out = o.value();
    else
      *outputLost = o.status();
  }
  if (!out) {
    HORA_RETURN_IF_ERROR(
        fusion_.reserve(static_cast<size_t>(c.outRows * row) * dataTypeSize(r.dtype)));
    out = fusion_.data();
  }
  Status s = ctx_.backend->alltoallv(e ? e->in : nullptr, c.send, out, c.recv, r.dtype);
  return s.isOk() ? s : dataPlaneFailure(ctx_, s, describe("alltoall", r));
}

Status CpuPath::reducescatter(const Response& r, TensorEntry* e, Status* outputLost) {
  const Reduction x = reductionOf(r, ctx_.size());
  const DataType dt = x.dtype;
  const size_t esz = x.elementSize;
  const ScatterCounts c = reducescatterCounts(r, ctx_.rank, ctx_.size());
  const size_t total = static_cast<size_t>(r.numElements());
  HORA_RETURN_IF_ERROR(fusion_.reserve(std::max<size_t>(total, 1) * esz));
  char* buf = fusion_.data();
  if (e)
    scaleCopy(dt, buf, e->in, total, x.pre);
  else
    fillIdentity(dt, x.op, buf, total);
  Status s = ctx_.backend->reducescatter(buf, c.counts, dt, x.op);
  if (!s.isOk()) return dataPlaneFailure(ctx_, s, describe("reducescatter", r));
  if (!e) return Status::ok();
  std::vector<int64_t> outShape = r.shape;
  if (!outShape.empty()) outShape[0] = c.rows;
  auto o = hostOutput(*e, outShape);
  if (!o.isOk()) {
    *outputLost = o.status();
    return Status::ok();
  }
  scaleCopy(dt, o.value(), buf + c.before * esz, c.counts[ctx_.rank], x.post);
  return Status::ok();
}

}  // namespace hora
