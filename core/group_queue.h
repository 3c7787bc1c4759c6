// GroupQueue: the hand-off of agreed groups from a process set's control
// thread to its executor thread, and the only state the two share about work
// in flight.
//
//  - control thread: push() a group; or, for a group that needs no data plane,
//    tryBeginInline() / endInline() to complete it right there when nothing is
//    queued or running ahead of it (one thread hop less, order kept);
//  - executor thread: pop() the next group (blocks; tryPop() does not), run
//    it, finished(); a framework thread waiting for its collectives may take
//    a lone queued group the executor has not picked up (tryTakeLone);
//  - any thread: inFlight(), busy() (the coordinator emits at once while its
//    executor is idle, and waits up to a cycle to fuse more while it is busy),
//    waitIdle() (shutdown lets agreed work finish), close() / takeRemaining().
//
// The "group done" hook runs after each popped or taken group, on the thread
// that ran it (the coordinator uses it to emit what became ready while it was
// busy). It is set before the executor starts. Thread-safe.
//
// pop() polls for a group for up to the spin window (core/spin_wait.h) before
// it sleeps, so a group pushed right after the last one finished costs no
// wake-up of the executor.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>

#include "core/agreed_group.h"
#include "core/clock.h"
#include "core/spin_wait.h"

namespace hora {

class GroupQueue {
 public:
  void setGroupDoneHook(std::function<void()> hook) { doneHook_ = std::move(hook); }
  // How long pop() polls before it sleeps; set before the executor starts.
  void setSpin(SpinPolicy spin) { spin_ = spin; }

  void push(AgreedGroup group);
  // True (and counted in flight) when nothing is queued or running: the
  // caller completes the group itself, then calls endInline(). `group`
  // (optional): what runningSummary() reports meanwhile.
  bool tryBeginInline(const AgreedGroup* group = nullptr);
  void endInline();

  // Blocks until a group is queued (true) or the queue is closed (false;
  // groups still queued stay for takeRemaining()).
  bool pop(AgreedGroup* out);
  // pop() without blocking: 1 when a group was taken, 0 when none is
  // queued, -1 when the queue is closed.
  int tryPop(AgreedGroup* out);
  // Another thread runs the queued group instead of the executor: true (and
  // `out` taken, still in flight until finished()) only when it is the one
  // group queued, nothing runs or is launched ahead of it, and `fits` says
  // so. A thread blocked waiting for its own collectives uses it when the
  // executor has not picked the group up yet (a wake-up less). giveBack()
  // returns a taken group that was not run, at the front.
  bool tryTakeLone(AgreedGroup* out, const std::function<bool(const AgreedGroup&)>& fits);
  void giveBack(AgreedGroup group);
  // After running a popped group: no longer in flight; runs the done hook.
  void finished();
  // A popped group left running on the GPU (pipelining): the executor is
  // free for the next group, though this one stays in flight until
  // finishedLaunched(). Runs the done hook (what became ready while the
  // executor was busy may go now).
  void launched();
  void finishedLaunched();

  // One group queued and nothing else in flight (a lock-free look; what
  // tryTakeLone asks, up to its fit).
  bool loneQueued() const {
    return queued_.load(std::memory_order_acquire) == 1 &&
           inFlight_.load(std::memory_order_acquire) == 1;
  }
  // Groups queued or running (launched ones included); a lock-free look.
  int inFlight() const { return inFlight_.load(std::memory_order_acquire); }
  // Groups queued or in the executor's hands, launched ones not counted:
  // whether the executor is busy (the coordinator fuses more meanwhile).
  int busy() const;
  // What the executor runs now, for failure reports: e.g. 'allreduce "w" and
  // 3 more fused, 1 more group queued'; "" when nothing was popped.
  std::string runningSummary() const;
  // Waits until nothing is queued or running, or the deadline; true if idle.
  bool waitIdle(Clock::time_point deadline);
  void close();
  std::deque<AgreedGroup> takeRemaining();

 private:
  void leave();

  mutable std::mutex mu_;          // guards queue_, closed_, launched_; inFlight_ changes under it
  std::condition_variable ready_;  // a group was pushed, or closed
  std::condition_variable idle_;   // inFlight_ dropped
  std::deque<AgreedGroup> queue_;
  // queue_.size() and closed_, readable without mu_ (pop()'s polling).
  std::atomic<int> queued_{0};
  std::atomic<bool> closedFlag_{false};
  SpinPolicy spin_;
  std::atomic<int> inFlight_{0};  // read without mu_ by inFlight()/loneQueued()
  int launched_ = 0;              // of inFlight_, left running on the GPU
  bool closed_ = false;
  std::string running_;  // the popped group, described; "" after finished()
  std::function<void()> doneHook_;
};

}  // namespace hora
