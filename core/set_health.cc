#include "core/set_health.h"

namespace hora {

SetHealth::SetHealth(std::string setName, Logger logger, Seconds suspicionGrace)
    : setName_(std::move(setName)), logger_(std::move(logger)), grace_(suspicionGrace) {}

void SetHealth::addListener(Listener listener) { listeners_.push_back(std::move(listener)); }

void SetHealth::setSuspectHook(std::function<void(Clock::time_point)> hook) {
  suspectHook_ = std::move(hook);
}

namespace {
bool causedByMember(Code c) {
  return c == Code::kRemoteError || c == Code::kBackendError || c == Code::kTimeout ||
         c == Code::kSystemError || c == Code::kProtocolError;
}
}  // namespace

bool SetHealth::fail(Status why, bool tellPeers) {
  if (elastic_ && causedByMember(why.code()))
    why = membershipError(why.message() +
                          " [elastic: restore the last commit and re-form the job (hora_reform)]");
  const bool held = hold_ && tellPeers;
  std::vector<std::function<void(const Status&)>> deferred;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (broken_.load(std::memory_order_relaxed)) return false;
    status_ = why;
    suspicion_ = Status::ok();
    // Released together with the break, so released() is never false for a
    // failure whose listeners already failed the pending work.
    if (!held) {
      released_ = true;
      deferred.swap(deferred_);
    }
    broken_.store(true, std::memory_order_release);
  }
  if (why.code() != Code::kShutDown)
    HORA_LOG(logger_, kError) << "process set " << setName_ << " failed: " << why.message();
  for (const auto& l : listeners_) l(why, tellPeers);
  for (auto& fn : deferred) fn(why);
  return true;
}

void SetHealth::release() {
  std::vector<std::function<void(const Status&)>> deferred;
  Status why;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!broken_.load(std::memory_order_relaxed) || released_) return;
    released_ = true;
    why = status_;
    deferred.swap(deferred_);
  }
  for (auto& fn : deferred) fn(why);
}

bool SetHealth::released() const {
  std::lock_guard<std::mutex> lk(mu_);
  return released_;
}

Status SetHealth::status() const {
  std::lock_guard<std::mutex> lk(mu_);
  return status_;
}

void SetHealth::suspect(Status why) {
  Clock::time_point deadline;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (broken_.load(std::memory_order_relaxed) || !suspicion_.isOk()) return;
    suspicion_ = std::move(why);
    deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(grace_);
    deadline = deadline_;
  }
  if (suspectHook_) suspectHook_(deadline);
}

bool SetHealth::suspected() const {
  std::lock_guard<std::mutex> lk(mu_);
  return !suspicion_.isOk();
}

void SetHealth::settle(Clock::time_point now) {
  Status why;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (suspicion_.isOk() || now < deadline_) return;
    why = suspicion_;
  }
  fail(why, /*tellPeers=*/true);
}

void SetHealth::whenBroken(std::function<void(const Status&)> fn) {
  Status now;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!released_) {
      deferred_.push_back(std::move(fn));
      return;
    }
    now = status_;
  }
  fn(now);
}

}  // namespace hora
