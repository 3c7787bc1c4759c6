// AgreedGroup: what every rank of a process set agreed to run next (one
// response, or several fused allreduces), with this rank's entries for it.
// The control thread builds it from the coordinator's response list, claiming
// the entries from its tensor table, so that a later failure of the set cannot
// fail work every rank already agreed to run; the executor thread runs it.
//
// Groups that need no data plane (barrier, join, an error response, a
// collective the coordinator combined inline) are completed by
// completeWithoutDataPlane on whichever thread holds them: the control thread
// when nothing is queued ahead, else the executor in order.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "core/message.h"
#include "core/tensor_entry.h"

namespace hora {

struct AgreedGroup {
  std::vector<Response> responses;
  std::vector<EntryPtr> entries;  // one per response; null where this rank joined
  // Autotune values the executor applies to the data plane before running
  // this group (every rank attaches them to the same group: the first that
  // needs the data plane at or after the response list that carried them).
  std::optional<TuningValues> tuning;
};

bool needsDataPlane(ResponseKind kind);
// False for inline collectives (Response::inlineResult) too.
bool needsDataPlane(const Response& r);
bool needsDataPlane(const AgreedGroup& group);

// The arithmetic of a reducing response (allreduce, reducescatter): the
// element type and its size, the op the data plane runs (average is a sum),
// and the factors applied before it (prescale) and after it (postscale,
// divided by the ranks that contributed for average).
struct Reduction {
  DataType dtype = DataType::kFloat32;
  size_t elementSize = 4;
  ReduceOp op = ReduceOp::kSum;
  double pre = 1.0;
  double post = 1.0;
};
Reduction reductionOf(const Response& r, int size);

// Completes a barrier, join, error or inline group (outputs of an inline
// allgather, alltoall or reducescatter through the entry's sink). `rank` is
// this rank's set rank; `globalRanks` maps set ranks to global ranks (the
// last rank to join is reported as a global rank; its size is the set's).
// `beforeComplete`, if given, is called with each entry's outcome (ok, or
// the failure of an output the allocator refused) after the outputs are
// written and before any entry completes: telemetry counts them there, so
// that a caller reading the metrics the moment its request completes sees it.
void completeWithoutDataPlane(
    AgreedGroup& group, int rank, const std::vector<int>& globalRanks,
    const std::function<void(const std::vector<Status>&)>& beforeComplete = nullptr);

}  // namespace hora
