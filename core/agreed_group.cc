#include "core/agreed_group.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "core/reduce.h"
#include "core/response_counts.h"

namespace hora {

bool needsDataPlane(ResponseKind kind) {
  return kind != ResponseKind::kError && kind != ResponseKind::kBarrier &&
         kind != ResponseKind::kJoin;
}

bool needsDataPlane(const Response& r) { return needsDataPlane(r.kind) && r.inlineResult.empty(); }

bool needsDataPlane(const AgreedGroup& group) {
  for (const auto& r : group.responses)
    if (needsDataPlane(r)) return true;
  return false;
}

Reduction reductionOf(const Response& r, int size) {
  Reduction x;
  x.dtype = r.dtype;
  x.elementSize = dataTypeSize(r.dtype);
  x.op = r.op == ReduceOp::kAverage ? ReduceOp::kSum : r.op;
  x.pre = r.prescale;
  const int contributors = size - static_cast<int>(r.joined.size());
  x.post = r.postscale * (r.op == ReduceOp::kAverage ? 1.0 / std::max(1, contributors) : 1.0);
  return x;
}

namespace {

// One entry of a collective the coordinator combined inline (Response::
// inlineResult, whose size validateResponse checked against the response):
// this rank's output cut from it. An output the caller's allocator could not
// give fails only this entry; its peers need nothing from it.
Status completeInline(const Response& r, TensorEntry& e, int rank, int size) {
  const char* res = r.inlineResult.data();
  const size_t esz = dataTypeSize(r.dtype);
  auto allocate = [&](int64_t rows) -> Result<void*> {
    std::vector<int64_t> shape = r.shape;
    if (!shape.empty()) shape[0] = rows;
    return e.sink->allocateOutput(shape, r.dtype, e.request.device, nullptr);
  };
  switch (r.kind) {
    case ResponseKind::kAllreduce: {
      // The coordinator's sum (or min, max, product) of every rank's
      // prescaled tensor; postscale and averaging here, as the data plane's
      // unpack does.
      const Reduction x = reductionOf(r, size);
      scaleCopy(x.dtype, e.out, res, r.inlineResult.size() / x.elementSize, x.post);
      return Status::ok();
    }
    case ResponseKind::kReducescatter: {
      const Reduction x = reductionOf(r, size);
      const ScatterCounts c = reducescatterCounts(r, rank, size);
      auto out = allocate(c.rows);
      if (!out.isOk()) return out.status();
      scaleCopy(x.dtype, out.value(), res + c.before * esz, c.counts[rank], x.post);
      return Status::ok();
    }
    case ResponseKind::kBroadcast:
      // The root's tensor already holds it (its input is its output).
      if (rank != r.root) std::memcpy(e.out, res, r.inlineResult.size());
      return Status::ok();
    case ResponseKind::kAllgather: {
      auto out = allocate(r.shape[0]);
      if (!out.isOk()) return out.status();
      std::memcpy(out.value(), res, r.inlineResult.size());
      return Status::ok();
    }
    case ResponseKind::kAlltoall: {
      // Every rank's tensor in rank order; this rank's block of each is its
      // column of the matrix.
      const AlltoallCounts c = alltoallCounts(r, rank, size);
      const size_t rowBytes = static_cast<size_t>(rowElements(r.shape)) * esz;
      e.sink->setReceivedSplits(c.recvRows);
      auto out = allocate(c.outRows);
      if (!out.isOk()) return out.status();
      char* to = static_cast<char*>(out.value());
      size_t from = 0;  // first row of sender s's tensor
      for (int s = 0; s < size; ++s) {
        size_t before = 0;  // its rows for ranks below this one
        for (int d = 0; d < size; ++d) {
          const size_t rows = static_cast<size_t>(r.sizes[s * size + d]);
          if (d < rank) before += rows;
          if (d == rank && rows > 0) {
            std::memcpy(to, res + (from + before) * rowBytes, rows * rowBytes);
            to += rows * rowBytes;
          }
        }
        for (int d = 0; d < size; ++d) from += static_cast<size_t>(r.sizes[s * size + d]);
      }
      return Status::ok();
    }
    default:
      return internalError("response kind " + std::to_string(static_cast<int>(r.kind)) +
                           " has no inline result");
  }
}

}  // namespace

void completeWithoutDataPlane(
    AgreedGroup& group, int rank, const std::vector<int>& globalRanks,
    const std::function<void(const std::vector<Status>&)>& beforeComplete) {
  HORA_CHECK(group.entries.size() == group.responses.size() && !group.responses.empty())
      << group.entries.size() << " entries for " << group.responses.size() << " responses";
  auto& es = group.entries;
  const Response& first = group.responses.front();
  const int size = static_cast<int>(globalRanks.size());
  std::vector<Status> outcomes(es.size());
  if (!first.inlineResult.empty()) {
    for (size_t i = 0; i < es.size(); ++i) {
      if (!es[i]) continue;
      const Status s = completeInline(group.responses[i], *es[i], rank, size);
      if (!s.isOk()) outcomes[i] = entryFailure(*es[i], globalRanks[rank], s);
    }
    if (beforeComplete) beforeComplete(outcomes);
    for (size_t i = 0; i < es.size(); ++i)
      if (es[i]) es[i]->complete(outcomes[i]);
    return;
  }
  if (beforeComplete) beforeComplete(outcomes);
  switch (first.kind) {
    case ResponseKind::kError:
      for (size_t i = 0; i < es.size(); ++i)
        if (es[i])
          es[i]->complete(
              Status(static_cast<Code>(group.responses[i].errorCode), group.responses[i].error));
      return;
    case ResponseKind::kBarrier:
      // The response itself proves every rank arrived.
      if (es[0]) es[0]->complete(Status::ok());
      return;
    case ResponseKind::kJoin:
      if (es[0]) {
        es[0]->sink->setLastJoinedRank(globalRanks[first.lastJoinedRank]);
        es[0]->complete(Status::ok());
      }
      return;
    default:
      HORA_CHECK(false) << "response kind " << static_cast<int>(first.kind)
                        << " needs the data plane";
  }
}

}  // namespace hora
