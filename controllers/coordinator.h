// Coordinator: the negotiation logic run by the lowest rank of each process
// set. It learns what every rank has submitted, checks that the ranks agree,
// decides what runs and in which order, and fuses small tensors into groups.
//
// The protocol, as implemented here and in controllers/control_plane.h:
//  1. Each rank's control thread drains newly enqueued requests and sends them
//     to the coordinator as a RequestList: full requests, or cache hits
//     (bit + signature) for tensors whose negotiated response it has cached.
//  2. onRequests() records each rank's request per tensor name. A hit whose
//     bit no longer holds that signature (an eviction raced with it) is
//     returned as a nack: that rank resends the request in full.
//  3. A tensor is ready when every rank that has not joined has submitted it.
//     constructResponse() compares the submissions (kind, dtype, device,
//     shape, op, root, scale factors); any difference becomes an error
//     response naming the tensor, the differing ranks and their values. So
//     does an allgather or alltoall whose combined rows would pass
//     kMaxTensorBytes (core/types.h).
//  4. emit() turns the ready responses into groups in readiness order,
//     fusing allreduces with the same dtype/op/scales/device/joined set up to
//     the fusion threshold, and replaces responses already in the cache by
//     their bit. Every rank applies the list to its own cache in the same
//     order (core/response_cache.h), then executes the groups in order.
//  5. Collectives of host tensors small enough to travel inside the
//     negotiation (HORA_INLINE_MAX_BYTES) carry each rank's tensor in its
//     request (a broadcast only its root's); when every rank sent its own,
//     constructResponse combines them here, in rank order (a reduction, the
//     root's tensor, or the concatenation an allgather or alltoall is cut
//     from), and the response carries the result: the tensor then needs one
//     round trip to the coordinator and no data plane (no executor hand-off,
//     no second exchange). Across hosts that is one TCP round trip instead
//     of a ring behind the negotiation.
//  6. inspectStalls() names tensors waiting on missing ranks after the
//     warning time and fails them everywhere after the shutdown time.
//
// Not thread-safe: owned by the coordinator rank's control thread. No I/O.
#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/clock.h"
#include "core/logging.h"
#include "core/message.h"
#include "core/response_cache.h"
#include "core/status.h"
#include "core/telemetry.h"

namespace hora {

struct CoordinatorOptions {
  int size = 1;
  int64_t fusionThresholdBytes = 128 << 20;
  Seconds stallWarning{60};
  Seconds stallShutdown{300};  // 0 = never
  std::string setName = "global";
  // Set rank -> global rank, for messages (empty: identity).
  std::vector<int> globalRanks;
  // Who submits each tensor last (straggler ranking); null in unit tests.
  Telemetry* telemetry = nullptr;
};

class Coordinator {
 public:
  Coordinator(CoordinatorOptions options, ResponseCache* cache, Logger logger);

  // Records one rank's submissions. Stale cache hits are appended to *nacks.
  // A malformed submission (wrong rank, duplicate, a shape whose size
  // overflows or is negative, alltoall splits that are not one per rank,
  // >= 0 and summing to dimension 0: what no correct rank sends) returns a
  // kProtocolError: the caller treats the sender as broken.
  Status onRequests(int rank, const RequestList& list, Clock::time_point now,
                    std::vector<CacheHit>* nacks);

  bool hasReady() const { return !ready_.empty(); }
  // Autotune: the threshold for the next emit().
  void setFusionThreshold(int64_t bytes) { opts_.fusionThresholdBytes = bytes; }
  size_t pendingCount() const { return table_.size(); }

  // Builds the next response list from every ready response and applies it
  // to the cache. *resolved gets the same groups with full responses.
  ResponseList emit(std::vector<std::vector<Response>>* resolved);

  // Returns one warning line per tensor that has waited longer than the
  // warning time (each reported once); tensors past the shutdown time become
  // error responses, ready for the next emit().
  std::vector<std::string> inspectStalls(Clock::time_point now);

  // A one-line summary of what is pending and who is missing (for reports
  // when a rank is lost or the job shuts down). With nothing pending after
  // the stall check failed tensors, it names the last of those and the ranks
  // that never submitted it: a rank that stalled (SIGSTOP, a hung data
  // loader) is usually lost later, and "no tensors pending" alone then read
  // as if the loss came out of nowhere.
  std::string pendingSummary(size_t maxNames = 8) const;

  // The cross-rank hang report: for every rank, the pending tensors it
  // submitted (and so waits in) and those it never submitted; for every
  // pending tensor, who submitted it and who is missing; "" when nothing is
  // pending. Plain text, read without any tool.
  std::string hangReport(Clock::time_point now, size_t maxTensors = 50) const;

 private:
  struct Pending {
    std::vector<std::optional<Request>> byRank;
    int count = 0;
    Clock::time_point first;
    bool warned = false;
  };
  // Every rank that has not joined has submitted it.
  bool complete(const Pending& p) const;
  void markReadyIfComplete(const std::string& name);
  Response constructResponse(const std::string& name, Pending& p);
  // Sets resp->inlineResult when every rank whose data it needs sent its
  // tensor with the request (Request::payload): the reduction (allreduce,
  // reducescatter; when the dtype/op pair can be reduced here), the root's
  // tensor (broadcast), or every rank's tensor in rank order (allgather,
  // alltoall).
  void combineInline(const std::vector<const Request*>& present, Response* resp) const;
  std::vector<int> missingRanks(const Pending& p) const;  // global ranks
  int global(int setRank) const {
    return setRank < static_cast<int>(opts_.globalRanks.size()) ? opts_.globalRanks[setRank]
                                                                : setRank;
  }

  CoordinatorOptions opts_;
  ResponseCache* cache_;
  Logger logger_;
  std::unordered_map<std::string, Pending> table_;
  std::deque<Response> ready_;  // constructed, in readiness order
  std::vector<bool> joined_;
  int joinedCount_ = 0;
  // The last tensor the stall check failed: '"name" (missing on ranks 1,2)'.
  std::string lastStallFailure_;
  int lastJoined_ = -1;
};

// Groups ready responses (fusion planning; exposed for unit tests). Only
// fusable responses with equal keys share a group, within `thresholdBytes`.
std::vector<std::vector<Response>> planFusion(std::deque<Response> ready, int64_t thresholdBytes);

}  // namespace hora
