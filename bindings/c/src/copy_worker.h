// CopyWorker: a helper thread that packs and unpacks fusion-buffer chunks
// while the executor thread runs the collective on other chunks, so a large
// fused allreduce costs about one pack chunk + the reduction + one unpack
// chunk instead of pack + reduction + unpack in sequence.
//
// Owned by one process set's executor; tasks run in submission order on the
// worker thread. wait() blocks the executor until every submitted task is done.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace hora {

class CopyWorker {
 public:
  CopyWorker() : thread_([this] { loop(); }) {}
  ~CopyWorker() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      exit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void submit(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      tasks_.push_back(std::move(task));
      ++submitted_;
    }
    cv_.notify_all();
  }
  // Waits until at least `n` tasks (counted since construction) have finished.
  void waitFor(uint64_t n) {
    std::unique_lock<std::mutex> lk(mu_);
    doneCv_.wait(lk, [&] { return finished_ >= n; });
  }
  uint64_t submitted() {
    std::lock_guard<std::mutex> lk(mu_);
    return submitted_;
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return exit_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
      {
        std::lock_guard<std::mutex> lk(mu_);
        ++finished_;
      }
      doneCv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, doneCv_;
  std::deque<std::function<void()>> tasks_;
  uint64_t submitted_ = 0, finished_ = 0;
  bool exit_ = false;
  std::thread thread_;
};

}  // namespace hora
