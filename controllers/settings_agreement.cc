#include "controllers/settings_agreement.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <thread>

namespace hora {

std::string encodeSettings(const SharedSettings& s) {
  std::string out;
  for (const auto& kv : s) out += kv.first + "=" + kv.second + "\n";
  return out;
}

namespace {

std::map<std::string, std::string> decode(const std::string& text) {
  std::map<std::string, std::string> m;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) m[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return m;
}

std::string quoted(const std::map<std::string, std::string>& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? "(unset)" : "'" + it->second + "'";
}

// Until `n` members have counted themselves in "settings/read", or `until`.
void waitForReaders(Store& store, int n, std::chrono::steady_clock::time_point until) {
  while (std::chrono::steady_clock::now() < until) {
    auto read = store.add("settings/read", 0);
    if (!read.isOk() || read.value() >= n) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace

std::string diffSettings(const SharedSettings& mine, int myRank, const std::string& coordinator,
                         int coordinatorRank) {
  const auto a = decode(encodeSettings(mine));
  const auto b = decode(coordinator);
  std::map<std::string, bool> keys;
  for (const auto& kv : a) keys[kv.first] = true;
  for (const auto& kv : b) keys[kv.first] = true;
  std::string diff;
  for (const auto& k : keys) {
    const std::string va = quoted(a, k.first), vb = quoted(b, k.first);
    if (va == vb) continue;
    if (!diff.empty()) diff += "; ";
    diff += k.first + " is " + va + " on rank " + std::to_string(myRank) + " but " + vb +
            " on rank " + std::to_string(coordinatorRank);
  }
  return diff;
}

Status agreeOnSettings(Store& store, int rank, const std::vector<int>& globalRanks,
                       const SharedSettings& mine, std::chrono::milliseconds timeout,
                       const std::string& setName) {
  const int size = static_cast<int>(globalRanks.size());
  if (size <= 1) return Status::ok();
  const std::string where = "process set " + setName + " on rank " +
                            std::to_string(globalRanks[rank]) + ": comparing settings";
  // One deadline for the whole exchange, so ranks arriving at different
  // times cannot split into some that passed and some that timed out.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now()));
  };
  // A summary starting with this marker carries rank 0's timeout, so every
  // member fails with the name of the rank that never came.
  const std::string kTimedOut = "!timeout ";
  std::string summary;
  if (rank == 0) {
    HORA_RETURN_IF_ERROR(store.set("settings/0", encodeSettings(mine)));
    for (int r = 1; r < size; ++r) {
      auto v = store.get("settings/verdict/" + std::to_string(r), left());
      if (!v.isOk()) {
        Status s = v.status().withContext("process set " + setName + ": comparing settings (rank " +
                                          std::to_string(globalRanks[r]) + " did not arrive)");
        (void)store.set("settings/summary", kTimedOut + s.message());
        // Ranks 1..r-1 are known to be there: let them read it (briefly).
        waitForReaders(store, r - 1,
                       std::chrono::steady_clock::now() + std::chrono::milliseconds(500));
        return s;
      }
      if (!v.value().empty()) summary += (summary.empty() ? "" : "; ") + v.value();
    }
    HORA_RETURN_IF_ERROR(store.set("settings/summary", summary));
    // This rank may host the store and is about to fail: let every member
    // read the summary first, or they would see only a lost store.
    if (!summary.empty()) waitForReaders(store, size - 1, deadline);
  } else {
    auto theirs = store.get("settings/0", left());
    // Rank 0 had published its settings by now, so its own deadline ends
    // within `timeout` from here: the summary is waited for until then (plus
    // a grace), whatever this rank's own deadline says.
    const auto summaryDeadline = std::chrono::steady_clock::now() + timeout;
    if (!theirs.isOk())
      return theirs.status().withContext(where + " (waiting for rank " +
                                         std::to_string(globalRanks[0]) + ")");
    HORA_RETURN_IF_ERROR(
        store.set("settings/verdict/" + std::to_string(rank),
                  diffSettings(mine, globalRanks[rank], theirs.value(), globalRanks[0])));
    const auto grace = std::min(timeout, std::chrono::milliseconds(2000));
    auto s = store.get("settings/summary",
                       std::max(std::chrono::milliseconds(1),
                                std::chrono::duration_cast<std::chrono::milliseconds>(
                                    summaryDeadline - std::chrono::steady_clock::now())) +
                           grace);
    if (!s.isOk())
      return s.status().withContext(where + " (waiting for rank " + std::to_string(globalRanks[0]) +
                                    "'s summary)");
    summary = s.take();
    (void)store.add("settings/read", 1);
    if (summary.compare(0, kTimedOut.size(), kTimedOut) == 0)
      return Status(Code::kTimeout, summary.substr(kTimedOut.size()));
  }
  if (summary.empty()) return Status::ok();
  return invalidArgument("process set " + setName + ": ranks disagree on settings that must be " +
                         "equal on every rank: " + summary +
                         "; set the same values everywhere (e.g. export them before horarun, "
                         "which passes the environment to every rank)");
}

}  // namespace hora
