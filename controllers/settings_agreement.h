// Settings agreement: the settings that every member of a process set must
// share (the hora version, response-cache capacity, Gloo algorithm, GPU
// backend, ...) are compared once, at set-up, before anything connects.
//
// Why: a rank with a different value does not fail on its own; it pairs its
// collectives differently (bcube vs ring, NCCL vs staging, a cache that evicts
// other entries) and the job hangs or computes garbage much later. Here every
// member learns the difference at once, and each error names the setting, the
// ranks and both values.
//
// Protocol over the set's rendezvous store (called by every member on the
// thread creating the set): the coordinator (set rank 0) publishes its
// settings; every other member compares its own with them and publishes its
// verdict; the coordinator gathers the verdicts and publishes the summary,
// which every member waits for. One failing member therefore fails all of
// them with the same message, within one round trip per member (a failing
// coordinator waits until every member has read the summary: it may host the
// store).
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/store.h"

namespace hora {

// A (name, value) list; names are the HORA_* parameters users set.
using SharedSettings = std::vector<std::pair<std::string, std::string>>;

// Encoding for the store (name=value lines; names and values without '\n').
std::string encodeSettings(const SharedSettings& s);

// "" when equal, else one clause per difference, e.g. "HORA_GPU_BACKEND is
// 'gloo' on rank 3 but 'auto' on rank 0". Settings one side lacks (another
// hora version) are reported as "(unset)". Ranks are global ranks.
std::string diffSettings(const SharedSettings& mine, int myRank, const std::string& coordinator,
                         int coordinatorRank);

// Runs the protocol above. globalRanks[i] is set rank i's global rank.
// kInvalidArgument naming every difference when they disagree, kTimeout
// when a member does not arrive within `timeout`.
Status agreeOnSettings(Store& store, int rank, const std::vector<int>& globalRanks,
                       const SharedSettings& mine, std::chrono::milliseconds timeout,
                       const std::string& setName);

}  // namespace hora
