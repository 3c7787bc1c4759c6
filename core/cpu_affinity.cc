#include "core/cpu_affinity.h"

#include <pthread.h>
#include <sched.h>

#include <cstring>

namespace hora {

std::vector<int> allowedCpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

int executorCpuFor(int localRank, const std::vector<int>& allowed) {
  if (localRank < 0 || allowed.size() < 2) return -1;
  return allowed[static_cast<size_t>(localRank) % allowed.size()];
}

Status bindThisThread(int cpu) {
  if (cpu < 0 || cpu >= CPU_SETSIZE)
    return invalidArgument("cannot bind a thread to CPU " + std::to_string(cpu));
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  const int rc = ::pthread_setaffinity_np(::pthread_self(), sizeof(set), &set);
  if (rc != 0)
    return Status(Code::kSystemError,
                  "binding the thread to CPU " + std::to_string(cpu) + ": " + std::strerror(rc));
  return Status::ok();
}

namespace {

bool setThreadCpus(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  return ::pthread_setaffinity_np(::pthread_self(), sizeof(set), &set) == 0;
}

}  // namespace

ScopedThreadCpus::ScopedThreadCpus(const std::vector<int>& cpus) {
  if (cpus.empty()) return;
  std::vector<int> before = allowedCpus();
  if (before.empty() || before == cpus) return;
  if (setThreadCpus(cpus)) saved_ = std::move(before);
}

ScopedThreadCpus::~ScopedThreadCpus() {
  if (!saved_.empty()) setThreadCpus(saved_);
}

void nameThisThread(const std::string& name) {
  ::pthread_setname_np(::pthread_self(), name.substr(0, 15).c_str());
}

}  // namespace hora
