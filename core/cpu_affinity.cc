#include "core/cpu_affinity.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

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

CpuClaim::~CpuClaim() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor drops the lock
}

CpuClaim::CpuClaim(CpuClaim&& other) noexcept
    : cpu_(other.cpu_), fd_(std::exchange(other.fd_, -1)), note_(std::move(other.note_)) {
  other.cpu_ = -1;
}

CpuClaim& CpuClaim::operator=(CpuClaim&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    cpu_ = std::exchange(other.cpu_, -1);
    fd_ = std::exchange(other.fd_, -1);
    note_ = std::move(other.note_);
  }
  return *this;
}

CpuClaim CpuClaim::pick(int localRank, int localSize, const std::vector<int>& allowed,
                        const std::string& dir) {
  CpuClaim c;
  if (localRank < 0 || allowed.size() < 2) {
    c.note_ = "one CPU allowed (a launcher's binding stands)";
    return c;
  }
  const size_t n = allowed.size();
  if (dir.empty() || static_cast<size_t>(localSize) > n) {
    c.cpu_ = executorCpuFor(localRank, allowed);
    c.note_ = dir.empty() ? "by local rank, unclaimed (HORA_CPU_CLAIM_DIR is empty)"
                          : "by local rank, unclaimed (" + std::to_string(localSize) +
                                " local ranks share " + std::to_string(n) + " CPUs)";
    return c;
  }
  for (size_t k = 0; k < n; ++k) {
    const int cpu = allowed[(static_cast<size_t>(localRank) + k) % n];
    const std::string path = dir + "/hora-cpu-" + std::to_string(cpu) + ".lock";
    // Read-only is enough for flock, and lets users share files another
    // user's umask made read-only to them.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
      c.cpu_ = executorCpuFor(localRank, allowed);
      c.note_ = "by local rank, unclaimed (cannot open " + path + ": " + std::strerror(errno) +
                "; set HORA_CPU_CLAIM_DIR to a writable directory shared by the host's jobs)";
      return c;
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      c.cpu_ = cpu;
      c.fd_ = fd;
      c.note_ = k == 0 ? "claimed in " + dir
                       : "claimed in " + dir + "; CPU " +
                             std::to_string(allowed[static_cast<size_t>(localRank) % n]) +
                             " was held by another hora runtime on this host";
      return c;
    }
    ::close(fd);
  }
  c.note_ = "every allowed CPU (" + formatCpuList(allowed) +
            ") is held by another hora runtime on this host (" + dir +
            "/hora-cpu-*.lock); the executor runs unbound. Give each job its own CPUs "
            "(taskset, a launcher's binding)";
  return c;
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
