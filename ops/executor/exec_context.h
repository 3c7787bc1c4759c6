// ExecContext: what the executor thread's paths (CPU, GPU) share about their
// process set, and the one rule for a failing data plane.
//
// Built by the process set's assembly, owned by its Executor, read by the
// paths on the executor thread only.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/logging.h"
#include "core/set_health.h"
#include "core/spin_wait.h"
#include "core/status.h"
#include "core/telemetry.h"

namespace hora {

struct ExecContext {
  std::string setName;
  int rank = 0;                  // within the set
  std::vector<int> globalRanks;  // set rank -> global rank
  Backend* backend = nullptr;    // the set's CPU data plane (shm + Gloo, or Gloo)
  SetHealth* health = nullptr;
  Telemetry* telemetry = nullptr;  // null in tests that do not need it
  Logger logger;
  // Bounds every wait of the data plane (HORA_PEER_TIMEOUT_S).
  std::chrono::milliseconds peerTimeout{30000};
  // The CPU the executor thread binds itself to (core/cpu_affinity.h); -1:
  // it stays where the scheduler puts it.
  int cpu = -1;
  // With cpu >= 0 the process's CPUs (else empty), which the GPU path takes
  // back around the calls that start driver or NCCL threads (plugin load,
  // context and stream creation, comm_init), so they do not inherit the one
  // CPU.
  std::vector<int> processCpus;
  // The set's HORA_SPIN_US policy: whether waits poll before they sleep
  // (window 0: never), and whether each poll gives the core away.
  SpinPolicy spin;

  int size() const { return static_cast<int>(globalRanks.size()); }
  int globalRank(int setRank) const { return globalRanks[setRank]; }
  int myGlobalRank() const { return globalRanks[rank]; }
};

// A data-plane call failed while running `what`. Such a failure is usually
// the shadow of a lost peer that the control thread names a moment later, so
// the set is only suspected here (SetHealth::suspect), without waiting; the
// executor completes the group once the set's status is final. Returns the
// failure to report: the set's status if it is already broken (it names the
// cause), else `s` with `what` as context.
Status dataPlaneFailure(const ExecContext& ctx, const Status& s, const std::string& what);

}  // namespace hora
