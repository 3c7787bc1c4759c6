#include "core/agreed_group.h"

#include "core/check.h"

namespace hora {

bool needsDataPlane(ResponseKind kind) {
  return kind != ResponseKind::kError && kind != ResponseKind::kBarrier &&
         kind != ResponseKind::kJoin;
}

bool needsDataPlane(const AgreedGroup& group) {
  for (const auto& r : group.responses)
    if (needsDataPlane(r.kind)) return true;
  return false;
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
