// DriveLock: who runs a process set's control logic right now (issue 20).
//
// The set's control thread runs it, and so may a framework thread that waits
// on one of the set's collectives, or submits one (ControlPlane::tryDrive,
// driveOnce; through the shared-memory lane on one host, the sockets across
// hosts): a small collective then takes one thread instead of three
// hand-offs between the framework, control and executor threads, which on a
// machine whose cores the ranks' threads outnumber cost a context switch
// each. Whoever holds this lock is "the control thread" for that moment:
// every event-loop handler, the lane's polling and the controller's state
// are touched only under it.
//
// Recursive, because handlers that lock it also run from inside the control
// thread's own locked rounds (io_context::poll). Any thread.
#pragma once

#include <atomic>
#include <mutex>
#include <thread>

namespace hora {

class DriveLock {
 public:
  void lock() {
    mu_.lock();
    if (depth_++ == 0) owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  }
  bool try_lock() {
    if (!mu_.try_lock()) return false;
    if (depth_++ == 0) owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    return true;
  }
  void unlock() {
    if (--depth_ == 0) owner_.store(std::thread::id(), std::memory_order_relaxed);
    mu_.unlock();
  }
  // Held once only (by the calling thread, which must hold it).
  bool outermost() const { return depth_ == 1; }
  // Whether the calling thread holds it (only that thread can have stored
  // its own id, so the relaxed read cannot see it spuriously).
  bool heldHere() const {
    return owner_.load(std::memory_order_relaxed) == std::this_thread::get_id();
  }

 private:
  std::recursive_mutex mu_;
  std::atomic<std::thread::id> owner_{};
  int depth_ = 0;  // guarded by mu_
};

}  // namespace hora
