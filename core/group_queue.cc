#include "core/group_queue.h"

#include "core/check.h"

namespace hora {

namespace {
const char* kindName(ResponseKind k) {
  switch (k) {
    case ResponseKind::kAllreduce:
      return "allreduce";
    case ResponseKind::kAllgather:
      return "allgather";
    case ResponseKind::kBroadcast:
      return "broadcast";
    case ResponseKind::kAlltoall:
      return "alltoall";
    case ResponseKind::kReducescatter:
      return "reducescatter";
    case ResponseKind::kBarrier:
      return "barrier";
    case ResponseKind::kJoin:
      return "join";
    case ResponseKind::kError:
      return "error report";
  }
  return "collective";
}

std::string describe(const AgreedGroup& g) {
  if (g.responses.empty()) return "";
  const Response& r = g.responses.front();
  std::string s = std::string(kindName(r.kind)) + " \"" + r.name + "\"";
  if (g.responses.size() > 1) s += " and " + std::to_string(g.responses.size() - 1) + " more fused";
  return s;
}
}  // namespace

void GroupQueue::push(AgreedGroup group) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(std::move(group));
    queued_.store(static_cast<int>(queue_.size()), std::memory_order_release);
    ++inFlight_;
  }
  ready_.notify_one();
}

bool GroupQueue::tryBeginInline(const AgreedGroup* group) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!queue_.empty() || inFlight_ > 0) return false;
  ++inFlight_;
  if (group) running_ = describe(*group) + " (on the control thread)";
  return true;
}

void GroupQueue::endInline() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    running_.clear();
  }
  leave();
}

bool GroupQueue::pop(AgreedGroup* out) {
  spinUntil(spin_, [&] {
    return queued_.load(std::memory_order_acquire) > 0 ||
           closedFlag_.load(std::memory_order_acquire);
  });
  std::unique_lock<std::mutex> lk(mu_);
  ready_.wait(lk, [&] { return !queue_.empty() || closed_; });
  if (closed_) return false;
  *out = std::move(queue_.front());
  queue_.pop_front();
  queued_.store(static_cast<int>(queue_.size()), std::memory_order_release);
  running_ = describe(*out);
  return true;
}

int GroupQueue::tryPop(AgreedGroup* out) {
  if (queued_.load(std::memory_order_acquire) == 0 && !closedFlag_.load(std::memory_order_acquire))
    return 0;
  std::lock_guard<std::mutex> lk(mu_);
  if (closed_) return -1;
  if (queue_.empty()) return 0;
  *out = std::move(queue_.front());
  queue_.pop_front();
  queued_.store(static_cast<int>(queue_.size()), std::memory_order_release);
  running_ = describe(*out);
  return 1;
}

bool GroupQueue::tryTakeLone(AgreedGroup* out,
                             const std::function<bool(const AgreedGroup&)>& fits) {
  if (!loneQueued()) return false;
  std::lock_guard<std::mutex> lk(mu_);
  // One queued and one in flight: nothing runs or is launched ahead of it.
  if (closed_ || queue_.size() != 1 || inFlight_ != 1 || !fits(queue_.front())) return false;
  *out = std::move(queue_.front());
  queue_.pop_front();
  queued_.store(0, std::memory_order_release);
  running_ = describe(*out) + " (on a waiting framework thread)";
  return true;
}

void GroupQueue::giveBack(AgreedGroup group) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    running_.clear();
    queue_.push_front(std::move(group));
    queued_.store(static_cast<int>(queue_.size()), std::memory_order_release);
  }
  ready_.notify_one();
}

void GroupQueue::finished() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    running_.clear();
  }
  leave();
  if (doneHook_) doneHook_();
}

void GroupQueue::launched() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    running_.clear();
    ++launched_;
  }
  if (doneHook_) doneHook_();
}

void GroupQueue::finishedLaunched() {
  {
    // One step, so that busy() never sees the group launched but gone.
    std::lock_guard<std::mutex> lk(mu_);
    HORA_CHECK(launched_ > 0 && inFlight_ > 0)
        << "a launched group finished that was never launched";
    --launched_;
    --inFlight_;
  }
  idle_.notify_all();
  if (doneHook_) doneHook_();
}

void GroupQueue::leave() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    HORA_CHECK(inFlight_ > 0) << "a group finished that was never pushed or begun inline";
    --inFlight_;
  }
  idle_.notify_all();
}

int GroupQueue::busy() const {
  std::lock_guard<std::mutex> lk(mu_);
  return inFlight_ - launched_;
}

std::string GroupQueue::runningSummary() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::string s = running_;
  if (!s.empty() && !queue_.empty())
    s += ", " + std::to_string(queue_.size()) + " more group(s) queued";
  return s;
}

bool GroupQueue::waitIdle(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lk(mu_);
  return idle_.wait_until(lk, deadline, [&] { return queue_.empty() && inFlight_ == 0; });
}

void GroupQueue::close() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    closed_ = true;
    closedFlag_.store(true, std::memory_order_release);
  }
  ready_.notify_all();
}

std::deque<AgreedGroup> GroupQueue::takeRemaining() {
  std::lock_guard<std::mutex> lk(mu_);
  std::deque<AgreedGroup> left;
  left.swap(queue_);
  queued_.store(0, std::memory_order_release);
  return left;
}

}  // namespace hora
