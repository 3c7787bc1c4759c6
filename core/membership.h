// Membership formation for elastic mode (docs/elastic.md): the workers that
// arrive agree, through the rendezvous store alone, on the next epoch's
// members and their ranks. No thread of a runtime is involved: the framework
// thread calls formEpoch from hora_init / hora_reform before any process set
// exists, and membershipPending from a member at a commit boundary.
//
// The store passed in is already prefixed with "hora/el". The launcher
// writes "live", "min_np" and "dead/<worker>"; everything else is written here.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/store.h"

namespace hora {

struct FormRequest {
  std::string workerId;  // stable for the life of the process
  std::string host;      // published with the ticket, for messages
  // The epoch this worker was last a member of, with its rank there; -1 for
  // a newcomer (it targets the newest formed epoch + 1).
  int64_t lastEpoch = -1;
  int lastRank = -1;
  // The settings every member must share (version, cache capacity, ...),
  // without spaces. The leader refuses a newcomer whose settings differ
  // instead of letting it fail the whole job at the next set-up.
  std::string settings;
  Seconds timeout{600};  // the whole formation, arrival to members list
  std::chrono::milliseconds settle{2000};
  std::chrono::milliseconds poll{10};
};

struct Membership {
  int64_t epoch = 0;
  int rank = 0;
  std::vector<std::string> workers;  // index = rank
  int size() const { return static_cast<int>(workers.size()); }
};

// Epoch 0: the launcher's first batch, whose ranks come from HORA_RANK.
// Records the worker's epoch and its rank so the next formation knows whom
// to expect.
Status recordInitialMember(Store& el, const std::string& workerId, int rank, int size);

// The members of a formed epoch (index = rank); empty when unknown.
std::vector<std::string> membersOf(Store& el, int64_t epoch);

// The last epoch `workerId` was a member of, or -1 if none (a newcomer).
Result<int64_t> lastEpochOf(Store& el, const std::string& workerId);

// Arrives for the epoch after req.lastEpoch (newcomers: after the newest
// formed one) and waits until its members are known. A worker left out (it
// arrived after the list closed, or the leader died) tries the next epoch.
// Errors: fewer than min_np workers arrived (kMembership), the worker's
// settings differ from the members' (kInvalidArgument), the timeout passed
// (kTimeout), the store failed.
Result<Membership> formEpoch(Store& el, const FormRequest& req, const Logger& logger);

// True when some worker waits to join the epoch after `epoch`.
Result<bool> membershipPending(Store& el, int64_t epoch);

}  // namespace hora
