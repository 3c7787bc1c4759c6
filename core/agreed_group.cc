#include "core/agreed_group.h"

#include <algorithm>

#include "core/check.h"
#include "core/reduce.h"

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

void completeWithoutDataPlane(AgreedGroup& group, const std::vector<int>& globalRanks) {
  HORA_CHECK(group.entries.size() == group.responses.size() && !group.responses.empty())
      << group.entries.size() << " entries for " << group.responses.size() << " responses";
  auto& es = group.entries;
  const Response& first = group.responses.front();
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
    case ResponseKind::kAllreduce:
      // The coordinator's sum (or min, max, product) of every rank's
      // prescaled tensor; postscale and averaging here, as the data plane's
      // unpack does. The result's size was checked (validateResponse).
      for (size_t i = 0; i < es.size(); ++i) {
        if (!es[i]) continue;
        const Response& r = group.responses[i];
        const Reduction x = reductionOf(r, static_cast<int>(globalRanks.size()));
        scaleCopy(x.dtype, es[i]->out, r.inlineResult.data(), r.inlineResult.size() / x.elementSize,
                  x.post);
        es[i]->complete(Status::ok());
      }
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
