#include "core/cpu_affinity.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
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

std::string formatCpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

bool parseCpuList(const std::string& text, std::vector<int>* cpus) {
  cpus->clear();
  if (text.empty()) return false;
  const char* p = text.c_str();
  const char* const end = p + text.size();
  while (p < end) {
    char* after = nullptr;
    const long lo = std::strtol(p, &after, 10);
    if (after == p || lo < 0) return false;
    long hi = lo;
    p = after;
    if (p < end && *p == '-') {
      hi = std::strtol(p + 1, &after, 10);
      if (after == p + 1 || hi < lo || hi >= CPU_SETSIZE) return false;
      p = after;
    }
    if (lo >= CPU_SETSIZE) return false;
    for (long c = lo; c <= hi; ++c) cpus->push_back(static_cast<int>(c));
    if (p == end) break;
    if (*p++ != ',' || p == end) return false;  // "1,": a list does not end in a comma
  }
  std::sort(cpus->begin(), cpus->end());
  cpus->erase(std::unique(cpus->begin(), cpus->end()), cpus->end());
  return true;
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
