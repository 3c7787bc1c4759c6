#include "core/spin_wait.h"

#include <algorithm>

namespace hora {

int usableCpuCount() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

SpinPolicy spinPolicyFor(int64_t spinUs, int localRanks) {
  SpinPolicy p;
  p.window = std::chrono::microseconds(std::max<int64_t>(spinUs, 0));
  // A framework, a control and an executor thread per rank.
  p.yield = 3 * std::max(localRanks, 1) > usableCpuCount();
  return p;
}

}  // namespace hora
