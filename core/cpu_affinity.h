// CPU placement of the runtime's threads (issue 20).
//
// Why: on a host whose ranks are few against its cores, the data plane of a
// collective runs on each rank's executor thread, and the ranks reduce and
// copy in lockstep. The scheduler sees every waiting thread of the runtime
// (control threads, framework threads in hora_wait) as runnable, because
// they poll before they sleep (core/spin_wait.h), so it has no reason to
// spread the executors: measured on a 2-core VM, two ranks' executors shared
// one core in about one launch in four, and those launches ran 1 MiB-64 MiB
// allreduces 1.5-2.6x slower (bench/results/2026-11-27-executor-binding.md).
// Binding each rank's executor to its own CPU, picked by local rank, removes
// that mode; Open MPI binds its ranks to cores for the same reason.
//
// Several hora jobs on one host (a sweep of small jobs on a many-core box)
// would each put local rank 0's executor on the same first CPU and leave the
// rest idle; so a rank claims its CPU against every other runtime on the host
// (CpuClaim: a lock file per CPU, released when the runtime shuts down or its
// process dies) and takes the next free one when its pick is taken.
//
// Who calls it: the runtime's assembly (bindings/c, framework thread, at
// init) picks and claims the CPU and holds the claim for its lifetime; the executor binds itself on
// its own thread, and the GPU path widens it again around calls that start driver threads; the shm
// set-up exchanges the ranks' masks as CPU lists; spin policies count CPUs.
// Any thread; no state.
#pragma once

#include <pthread.h>

#include <string>
#include <vector>

#include "core/status.h"

namespace hora {

// The CPUs the calling thread may run on (its affinity mask), ascending;
// empty when the mask cannot be read.
std::vector<int> allowedCpus();

// The CPU for the executor of the rank with `localRank` among the ranks on
// this host: allowed[localRank mod allowed.size()], so that ranks on one host
// get distinct CPUs while they fit and spread evenly when they do not. -1
// (do not bind) when localRank < 0 or fewer than two CPUs are allowed (a
// launcher already bound the process: its choice stands).
int executorCpuFor(int localRank, const std::vector<int>& allowed);

// The CPU a rank's framework thread is moved back to where the host's ranks
// outnumber its CPUs (HORA_HOME_CALLER): allowed[localRank mod
// allowed.size()], the executor's pick, so that each CPU serves its share of
// the ranks. Why: polling ranks never sleep, so once the scheduler has put
// three of four ranks on one of two CPUs (after a wake-up at start or a
// balancing pass that moved a rank when a short-lived thread woke) nothing
// makes it notice, and it took 30-150 ms to undo; meanwhile a 64 KiB
// allreduce took 110-140 us instead of 65-80 (bench/results/
// 2026-11-28-caller-home.md). -1 (no home) when the ranks fit the CPUs or
// do not divide evenly among them (3 ranks on 2 CPUs: there the scheduler
// moving a rank onto the CPU another left idle wins, and 1-4 MiB allreduces
// ran up to 1.6x slower homed), fewer than two CPUs are allowed (a launcher
// bound the process) or localRank < 0.
int callerHomeCpuFor(int localRank, int localSize, const std::vector<int>& allowed);

// Moves the calling thread onto `cpu` and then gives it back its affinity
// mask: a placement, not a binding (the scheduler may move it again later,
// and threads it starts inherit the whole mask). Nothing when it runs there
// already, its CPU is unknown or its mask excludes `cpu`. True if it was
// moved and its mask restored. A change another thread makes to this
// thread's mask between the read and the restore (microseconds) is undone.
// Any thread.
bool moveCallingThreadTo(int cpu);

// A CPU claimed for one runtime's executor against the other runtimes on
// this host, or none. Owned by the runtime (its framework thread creates and
// destroys it); move-only; the claim ends when it is destroyed or the
// process exits.
//
// How: an exclusive flock(2) on `dir`/hora-cpu-<cpu>.lock, taken without
// waiting. The files stay (empty, mode 0666, one per CPU ever claimed)
// because removing a lock file races with a runtime about to lock it. flock
// belongs to the open file, so two runtimes in one process exclude each
// other as two processes do. A child forked without exec (a data loader's
// worker) shares the open file: the claim is unlocked explicitly when it
// ends, but while the parent is killed and such a child lives on, the CPU
// stays held and the next job moves on to another.
class CpuClaim {
 public:
  CpuClaim() = default;
  ~CpuClaim();
  CpuClaim(CpuClaim&& other) noexcept;
  CpuClaim& operator=(CpuClaim&& other) noexcept;
  CpuClaim(const CpuClaim&) = delete;
  CpuClaim& operator=(const CpuClaim&) = delete;

  // The CPU for the executor of local rank `localRank` of `localSize` ranks
  // on this host, from `allowed` (the process's mask):
  //  - fewer than two CPUs allowed, or localRank < 0: none (a launcher bound
  //    the process; its choice stands);
  //  - more local ranks than CPUs, or `dir` empty: executorCpuFor, unclaimed
  //    (the job shares CPUs by design; claims would let whichever ranks start
  //    first take them all and pile the rest on one);
  //  - else the first of allowed[localRank], allowed[localRank + 1], ...
  //    (cyclically) that no other runtime holds, claimed; none when every one
  //    is held (the executor then runs unbound rather than on another job's
  //    CPU). A lock file that cannot be opened or locked (a read-only or
  //    missing `dir`, a file system without flock) stops claiming:
  //    executorCpuFor, unclaimed, or none if that CPU was seen held.
  // note() says which case applied, for the init log; warn() whether it is
  // worth a warning (claiming failed, or no CPU was left).
  static CpuClaim pick(int localRank, int localSize, const std::vector<int>& allowed,
                       const std::string& dir);

  int cpu() const { return cpu_; }
  bool claimed() const { return fd_ >= 0; }
  bool warn() const { return warn_; }
  const std::string& note() const { return note_; }

 private:
  void release();

  int cpu_ = -1;
  int fd_ = -1;  // the locked file; -1: nothing claimed
  bool warn_ = false;
  std::string note_;
};

// "0-3,8" for {0, 1, 2, 3, 8} (ascending input), the format of
// /proc/<pid>/status's Cpus_allowed_list; "" for none.
std::string formatCpuList(const std::vector<int>& cpus);

// The CPUs of such a text, ascending and without repeats; false (leaving
// *cpus unspecified) for an empty or malformed one.
bool parseCpuList(const std::string& text, std::vector<int>* cpus);

// Restricts the calling thread (or `thread`) to `cpu`. The error names the
// CPU and errno.
Status bindThisThread(int cpu);
Status bindThread(pthread_t thread, int cpu);

// Runs the calling thread on `cpus` for the guard's lifetime, then restores
// the mask it had. Empty `cpus`: does nothing. For calls that create threads which
// must not inherit a bound thread's single CPU (NCCL's proxy threads when the
// executor creates a communicator). Same thread for both ends; best effort.
class ScopedThreadCpus {
 public:
  explicit ScopedThreadCpus(const std::vector<int>& cpus);
  ~ScopedThreadCpus();
  ScopedThreadCpus(const ScopedThreadCpus&) = delete;
  ScopedThreadCpus& operator=(const ScopedThreadCpus&) = delete;

 private:
  std::vector<int> saved_;  // empty: nothing to restore
};

// Names the calling thread (or `thread`; shown by top -H, perf, gdb and
// /proc/<pid>/task/<tid>/comm); at most 15 characters are kept. Best effort.
void nameThisThread(const std::string& name);
void nameThread(pthread_t thread, const std::string& name);

}  // namespace hora
