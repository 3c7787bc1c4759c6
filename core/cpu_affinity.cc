#include "core/cpu_affinity.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/stat.h>
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

int callerHomeCpuFor(int localRank, int localSize, const std::vector<int>& allowed) {
  const int cpus = static_cast<int>(allowed.size());
  if (cpus < 2 || localSize <= cpus || localSize % cpus != 0) return -1;
  return executorCpuFor(localRank, allowed);
}

bool moveCallingThreadTo(int cpu) {
  const int here = ::sched_getcpu();
  if (cpu < 0 || cpu >= CPU_SETSIZE || here < 0 || here == cpu) return false;
  cpu_set_t mask, one;
  CPU_ZERO(&mask);
  if (::pthread_getaffinity_np(::pthread_self(), sizeof(mask), &mask) != 0 ||
      !CPU_ISSET(cpu, &mask))
    return false;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  // Setting a one-CPU mask migrates the thread before the call returns;
  // restoring the old one leaves it where it now runs.
  if (::pthread_setaffinity_np(::pthread_self(), sizeof(one), &one) != 0) return false;
  // Failing to restore would leave the caller's thread bound to one CPU:
  // try again (a cpuset shrinking between the two calls is what fails it);
  // report no move when it still fails, so that the caller stops trying.
  if (::pthread_setaffinity_np(::pthread_self(), sizeof(mask), &mask) == 0) return true;
  return ::pthread_setaffinity_np(::pthread_self(), sizeof(mask), &mask) == 0;
}

namespace {

// Opens `path`, creating it if needed, so that every user of the host can
// lock it: without O_CREAT first (with fs.protected_regular the kernel
// refuses O_CREAT on another user's file in a sticky directory such as
// /dev/shm), read-write where allowed (NFS emulates flock with write locks),
// read-only otherwise; a file this call creates is made 0666 whatever the
// umask. -1 with errno on failure.
int openLockFile(const std::string& path) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0 && errno == EACCES) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0 || errno != ENOENT) return fd;
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      (void)::fchmod(fd, 0666);
      return fd;
    }
    if (errno != EEXIST) return -1;  // else another runtime created it just now
  }
  return -1;
}

}  // namespace

CpuClaim::~CpuClaim() { release(); }

void CpuClaim::release() {
  if (fd_ < 0) return;
  // Unlocked explicitly, not only closed: a child forked since shares the
  // open file, and closing this descriptor alone would leave it locked.
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
  fd_ = -1;
}

CpuClaim::CpuClaim(CpuClaim&& other) noexcept
    : cpu_(std::exchange(other.cpu_, -1)),
      fd_(std::exchange(other.fd_, -1)),
      warn_(std::exchange(other.warn_, false)),
      note_(std::move(other.note_)) {}

CpuClaim& CpuClaim::operator=(CpuClaim&& other) noexcept {
  if (this != &other) {
    release();
    cpu_ = std::exchange(other.cpu_, -1);
    fd_ = std::exchange(other.fd_, -1);
    warn_ = std::exchange(other.warn_, false);
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
  const int own = executorCpuFor(localRank, allowed);
  if (dir.empty() || static_cast<size_t>(localSize) > n) {
    c.cpu_ = own;
    c.note_ = dir.empty() ? "by local rank, unclaimed (HORA_CPU_CLAIM_DIR is empty)"
                          : "by local rank, unclaimed (" + std::to_string(localSize) +
                                " local ranks share " + std::to_string(n) + " CPUs)";
    return c;
  }
  // Claiming cannot work here: the CPU by local rank while no other CPU was
  // seen held, else none (the one by local rank is another job's).
  auto cannotClaim = [&](size_t k, const std::string& what) {
    c.cpu_ = k == 0 ? own : -1;
    c.warn_ = true;
    c.note_ = (k == 0 ? "by local rank, unclaimed (" : "unbound (") + what +
              "; set HORA_CPU_CLAIM_DIR to a local directory every job on the host can write, "
              "or to empty to bind by local rank alone)";
  };
  for (size_t k = 0; k < n; ++k) {
    const int cpu = allowed[(static_cast<size_t>(localRank) + k) % n];
    const std::string path = dir + "/hora-cpu-" + std::to_string(cpu) + ".lock";
    const int fd = openLockFile(path);
    if (fd < 0) {
      cannotClaim(k, "cannot open " + path + ": " + std::strerror(errno));
      return c;
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      c.cpu_ = cpu;
      c.fd_ = fd;
      c.note_ = k == 0 ? "claimed in " + dir
                       : "claimed in " + dir + "; CPU " + std::to_string(own) +
                             " was held by another hora runtime on this host";
      return c;
    }
    const int err = errno;
    ::close(fd);
    if (err != EWOULDBLOCK) {  // ENOLCK, ENOSYS, ...: the file system cannot lock
      cannotClaim(k, "cannot lock " + path + ": " + std::strerror(err));
      return c;
    }
  }
  c.warn_ = true;
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

Status bindThisThread(int cpu) { return bindThread(::pthread_self(), cpu); }

Status bindThread(pthread_t thread, int cpu) {
  if (cpu < 0 || cpu >= CPU_SETSIZE)
    return invalidArgument("cannot bind a thread to CPU " + std::to_string(cpu));
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  const int rc = ::pthread_setaffinity_np(thread, sizeof(set), &set);
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

void nameThisThread(const std::string& name) { nameThread(::pthread_self(), name); }

void nameThread(pthread_t thread, const std::string& name) {
  ::pthread_setname_np(thread, name.substr(0, 15).c_str());
}

}  // namespace hora
