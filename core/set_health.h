// SetHealth: whether a process set can still run collectives, and if not,
// why. The first failure wins; every thread can read it.
//
// Who breaks a set: the control thread (a peer lost or silent, an abort from
// the coordinator, a malformed message, a response that does not match), the
// executor thread (a failure after every rank agreed to run a collective),
// and shutdown (a peer's goodbye). What breaking does is up to the listeners
// registered at set-up, run in order on the thread that broke the set: tell
// the peers, abort the data plane so a collective blocked on a vanished peer
// returns at once, fail every pending request.
//
// Data-plane failures are different. A collective that fails because a peer
// vanished is usually the shadow of a loss the control plane names a moment
// later (a closed connection, missing heartbeats), and that name is what the
// user needs. So the executor only suspect()s the set: the suspicion does not
// break it, nothing waits for anyone, and whoever breaks the set within the
// grace period (normally the control thread, naming the peer) decides the
// status; past the deadline, settle() (the control thread's timer) breaks the
// set with the suspicion itself. Work that failed meanwhile is completed with
// the final status through whenBroken().
//
// Telling the peers comes before telling the user. A program that exits the
// moment it sees an error (most do) would otherwise take the news with it:
// its abort frames still queued, the peers would see only its closed
// connection and name it instead of the rank that actually failed. So with
// holdForPeers(true), a failure this rank found (tellPeers) reaches the user
// (whenBroken's work; the controller fails pending requests then) only once release() is
// called, which the set's controller does when the abort is on the wire or a
// short bound has passed. Failures reported to this rank are released at once.
//
// Thread-safe. Listeners, the hold and the suspect hook are set before any
// thread that may break the set starts, and never change afterwards.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/logging.h"
#include "core/status.h"

namespace hora {

class SetHealth {
 public:
  // `tellPeers`: this rank found the failure, so its peers must learn it (as
  // opposed to a failure the coordinator reported to this rank).
  using Listener = std::function<void(const Status& why, bool tellPeers)>;

  SetHealth(std::string setName, Logger logger, Seconds suspicionGrace = Seconds(2));

  // Set-up only.
  void addListener(Listener listener);
  // Elastic mode (docs/elastic.md): failures a lost or silent member causes
  // (remote, backend, timeout, system, protocol) break the set with
  // kMembership, which tells the caller to restore and re-form rather than
  // give up; the message stays the one that names the member.
  void setElastic(bool elastic) { elastic_ = elastic; }
  // Whether failures this rank finds wait for release(); see above.
  void holdForPeers(bool hold) { hold_ = hold; }
  // Lets the failure reach the user: runs whenBroken()'s waiters. Any
  // thread; only the first call after a failure counts.
  void release();
  // Broken and released: the failure may reach the user now.
  bool released() const;
  // Called (on the suspecting thread) with the deadline after which settle()
  // should break the set with the suspicion.
  void setSuspectHook(std::function<void(Clock::time_point deadline)> hook);

  // First failure wins: true when this call broke the set.
  bool fail(Status why, bool tellPeers);
  bool broken() const { return broken_.load(std::memory_order_acquire); }
  // OK while the set is not broken.
  Status status() const;

  // A data-plane failure of this rank; see the header comment. The first
  // suspicion counts; none is recorded once the set is broken.
  void suspect(Status why);
  // A suspicion is held and the set is not broken yet.
  bool suspected() const;
  // Breaks the set with the suspicion when its deadline has passed.
  void settle(Clock::time_point now);
  // Breaks the set with the suspicion now (shutdown: no timer will fire).
  void settleNow() { settle(Clock::time_point::max()); }

  // Runs fn(status) once the set is broken and the failure released: at once
  // when it is, else on the thread that releases it (the breaking thread
  // after the listeners, unless the failure is held for the peers).
  void whenBroken(std::function<void(const Status&)> fn);

 private:
  const std::string setName_;
  const Logger logger_;
  const Seconds grace_;
  bool elastic_ = false;
  bool hold_ = false;
  std::vector<Listener> listeners_;
  std::function<void(Clock::time_point)> suspectHook_;

  mutable std::mutex mu_;  // guards status_, suspicion_, deadline_, deferred_, released_
  std::atomic<bool> broken_{false};
  bool released_ = false;
  Status status_;
  Status suspicion_;  // OK: none
  Clock::time_point deadline_{};
  std::vector<std::function<void(const Status&)>> deferred_;
};

}  // namespace hora
