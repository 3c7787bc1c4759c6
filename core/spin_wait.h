// SpinPolicy and spinUntil(): the bounded polling a thread of the runtime does
// before it sleeps on a hand-off (issue 20).
//
// A hand-off between two threads costs a sleep and a wake-up (a futex, an
// epoll wake, and on a VM often an inter-processor interrupt) when the
// receiving thread sleeps; a thread that is still polling sees the work a
// few hundred nanoseconds after it is published. So each waiting side polls
// for a short window (HORA_SPIN_US) after its last work and only then sleeps:
//  - the control thread, between negotiation rounds (controllers/
//    control_plane.h, ControlPlane::run);
//  - the executor, for the next agreed group (core/group_queue.h);
//  - a framework thread in hora_wait, for its request.
// When the runtime's threads outnumber the cores (every rank of a set has a
// framework, a control and an executor thread), a poller that kept its core
// would keep the very thread it waits for off it: then each poll round gives
// the core away (sched_yield) and the waiter still never sleeps inside the
// window. With the window at 0 every wait sleeps at once (the old behaviour).
//
// Giving the core away is not free: next to a CPU-bound process of someone
// else's (a data loader, a second job) sched_yield hands that process a whole
// time slice, 1.5-3 ms, and a 4 KiB allreduce at 2 ranks took 4-8 ms instead
// of 6 us (bench/results/2026-11-28-cpu-hogs.md). So a poller yields only
// when the thread it waits for may need its core: always when the ranks
// alone outnumber the cores (a peer rank's thread), and otherwise only while
// it waits for a thread of its own process (`yield`; the caller knows which).
// The ranks counted are the host's, or more where ranks on other "hosts"
// share this kernel (emulated or container hosts on one machine: the lane's
// set-up counts them, ControlPlane::kernelMates).
// spinPolicyFor judges by this process's own mask; a process set whose
// shared-memory set-up finds no other rank on this rank's CPUs (a launcher's
// core per rank) clears yieldToPeers afterwards (bindings/c process_set.cc).
//
// Any thread; no state of its own.
#pragma once

#include <sched.h>

#include <chrono>
#include <cstdint>

#include "core/clock.h"
#include "core/cpu_relax.h"

namespace hora {

struct SpinPolicy {
  std::chrono::nanoseconds window{0};  // 0: never poll, sleep at once
  // Give the core away between polls while waiting for a thread of this
  // process (the ranks' threads outnumber the cores).
  bool yield = false;
  // Give it away while waiting for another rank too (the ranks alone
  // outnumber the cores).
  bool yieldToPeers = false;
  bool enabled() const { return window.count() > 0; }
};

// The CPUs this process may run on (its affinity mask), at least 1.
int usableCpuCount();

// HORA_SPIN_US for a set whose `localRanks` ranks share this host: polls
// for this process's threads yield the core unless every rank's three
// threads fit the usable CPUs, polls for peers unless the ranks fit them.
SpinPolicy spinPolicyFor(int64_t spinUs, int localRanks);

// Polls `ready` (a thread of this process's work) until it returns true
// (true) or the policy's window has passed (false). The clock is read every
// 32 polls only.
template <typename Ready>
bool spinUntil(const SpinPolicy& p, Ready&& ready) {
  if (ready()) return true;
  if (!p.enabled()) return false;
  const Clock::time_point until = Clock::now() + p.window;
  for (uint32_t i = 1;; ++i) {
    if (p.yield)
      ::sched_yield();
    else
      cpuRelax();
    if (ready()) return true;
    if ((i & 31) == 0 && Clock::now() >= until) return false;
  }
}

}  // namespace hora
