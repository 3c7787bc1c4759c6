#include "core/spin_wait.h"

#include <algorithm>

#include "core/cpu_affinity.h"

namespace hora {

int usableCpuCount() { return std::max<int>(1, static_cast<int>(allowedCpus().size())); }

SpinPolicy spinPolicyFor(int64_t spinUs, int localRanks) {
  SpinPolicy p;
  p.window = std::chrono::microseconds(std::max<int64_t>(spinUs, 0));
  // A framework, a control and an executor thread per rank.
  const int ranks = std::max(localRanks, 1), cpus = usableCpuCount();
  p.yield = 3 * ranks > cpus;
  p.yieldToPeers = ranks > cpus;
  return p;
}

}  // namespace hora
