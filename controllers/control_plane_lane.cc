// ControlPlane's shared-memory lane (shm_lane.h): its set-up through the
// store and the event loop that polls it (its reads, which need the peers,
// are in control_plane.cc).
#include <unistd.h>

#include <random>

#include "controllers/control_plane.h"

namespace hora {

namespace {
std::string laneName() {
  std::random_device rd;
  static const char* hex = "0123456789abcdef";
  std::string s = "hora-neg-" + std::to_string(::getpid()) + "-";
  for (int i = 0; i < 12; ++i) s += hex[rd() & 15];
  return s;
}
}  // namespace

Status ControlPlane::setUpLane(Store& store) {
  const int n = opts_.size;
  const std::string me = std::to_string(opts_.rank);
  // 1. Every rank says which host it is on ("-": it will not use the lane).
  HORA_RETURN_IF_ERROR(store.set("lane/host/" + me, opts_.hostId.empty() ? "-" : opts_.hostId));
  std::unique_ptr<ShmMailbox> mb;
  std::string final;
  if (isCoordinator()) {
    std::vector<std::string> keys;
    for (int r = 0; r < n; ++r) keys.push_back("lane/host/" + std::to_string(r));
    HORA_RETURN_IF_ERROR(store.wait(keys, opts_.startTimeout));
    std::string why;
    for (int r = 0; r < n && why.empty(); ++r) {
      auto h = store.get(keys[r], opts_.startTimeout);
      if (!h.isOk()) return h.status();
      if (h.value() == "-")
        why = peerName(r) + " has HORA_SHM_NEGOTIATION=0";
      else if (h.value() != opts_.hostId)
        why = "the ranks run on more than one host";
    }
    // 2. The coordinator creates the mailbox and names it (or says why not).
    if (why.empty()) {
      auto m = ShmMailbox::create(opts_.laneDir, laneName(), n, opts_.laneRingBytes);
      if (m.isOk())
        mb = m.take();
      else
        why = m.status().message();
    }
    HORA_RETURN_IF_ERROR(store.set("lane/path", why.empty() ? "shm " + mb->path() : "tcp " + why));
    // 3. Every worker maps it and answers; the coordinator decides.
    if (why.empty()) {
      std::vector<std::string> acks;
      for (int r = 1; r < n; ++r) acks.push_back("lane/ack/" + std::to_string(r));
      Status waited = store.wait(acks, opts_.startTimeout);
      if (!waited.isOk()) return waited;
      for (int r = 1; r < n && why.empty(); ++r) {
        auto a = store.get(acks[r - 1], opts_.startTimeout);
        if (!a.isOk()) return a.status();
        if (a.value() != "ok") why = peerName(r) + ": " + a.value();
      }
      mb->unlink();  // every worker has mapped it (or given up)
    }
    final = why.empty() ? "shm" : "tcp " + why;
    HORA_RETURN_IF_ERROR(store.set("lane/final", final));
  } else {
    auto path = store.get("lane/path", opts_.startTimeout);
    if (!path.isOk()) return path.status();
    if (path.value().rfind("shm ", 0) == 0) {
      auto m = ShmMailbox::open(path.value().substr(4), n);
      if (m.isOk()) mb = m.take();
      HORA_RETURN_IF_ERROR(
          store.set("lane/ack/" + me, m.isOk() ? std::string("ok") : m.status().message()));
      auto f = store.get("lane/final", opts_.startTimeout);
      if (!f.isOk()) return f.status();
      final = f.value();
    } else {
      final = path.value();
    }
  }
  if (final == "shm" && mb) {
    lane_ = std::make_unique<ShmLane>(std::move(mb), opts_.rank);
    laneWhyNot_.clear();
  } else {
    laneWhyNot_ = final.size() > 4 ? final.substr(4) : "the lane could not be set up";
  }
  return Status::ok();
}

void ControlPlane::runWithLane() {
  // Polls the lane and the event loop while work came within the spin
  // window; then says so in the mailbox (writers ring the doorbell over
  // TCP from then on) and sleeps in the event loop.
  lane_->setPolling(true);
  Clock::time_point lastWork = Clock::now();
  uint32_t rounds = 0;
  uint64_t postsSeen = posted_.load(std::memory_order_acquire);
  while (!io_.stopped()) {
    bool did = pollLane();
    // The event loop's own poll is a system call (epoll): every few rounds,
    // or at once when post() queued a handler.
    const uint64_t posts = posted_.load(std::memory_order_acquire);
    if (did || posts != postsSeen || (++rounds & 7) == 0) {
      postsSeen = posts;
      did |= io_.poll() > 0;
    }
    if (did) {
      lastWork = Clock::now();
      continue;
    }
    if (lane_->hasPending() || Clock::now() - lastWork < opts_.spin.window) {
      if (opts_.spin.yield)
        ::sched_yield();
      else
        cpuRelax();
      continue;
    }
    lane_->setPolling(false);
    if (lane_->hasInput()) {
      lane_->setPolling(true);
      continue;
    }
    io_.run_one();
    lane_->setPolling(true);
    lastWork = Clock::now();
  }
  lane_->setPolling(false);
}

}  // namespace hora
