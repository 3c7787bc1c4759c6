// ControlPlane's event loops and the framework threads' driving: the
// shared-memory lane (shm_lane.h), its set-up through the store and the loop
// that polls it (its reads, which need the peers, are in control_plane.cc),
// and the loop over TCP that steps aside while a framework thread drives.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "controllers/control_plane.h"
#include "core/hmac.h"
#include "core/host_identity.h"

namespace hora {

namespace {
std::string laneName() { return "hora-neg-" + std::to_string(::getpid()) + "-" + randomHex(12); }
// A lane set-up value that says the coordinator gave up, and why.
constexpr const char* kSetUpFailed = "fail ";
}  // namespace

Result<std::string> ControlPlane::laneValue(Store& store, const std::string& key) {
  auto v = store.get(key, opts_.startTimeout);
  if (!v.isOk()) return v.status();
  // The coordinator gave up on the set-up and said why.
  if (v.value().rfind(kSetUpFailed, 0) == 0)
    return Status(Code::kRemoteError, "the coordinator (" + peerName(0) +
                                          ") could not set up process set " + opts_.setName + ": " +
                                          v.value().substr(std::strlen(kSetUpFailed)));
  return v;
}

Status ControlPlane::setUpLane(Store& store) {
  const int n = opts_.size;
  const std::string me = std::to_string(opts_.rank);
  // 1. Every rank says which host it is on ("-" first: it will not use the
  // lane, but its host still counts for kernel mates).
  const bool wants = opts_.shmLane && !opts_.hostId.empty();
  HORA_RETURN_IF_ERROR(store.set("lane/host/" + me, (wants ? "" : "-") + opts_.hostId));
  std::unique_ptr<ShmMailbox> mb;
  std::string final;
  if (isCoordinator()) {
    std::vector<std::string> keys;
    for (int r = 0; r < n; ++r) keys.push_back("lane/host/" + std::to_string(r));
    // Whatever stops the set-up here, the workers waiting for "lane/path"
    // learn it at once instead of after their own start timeout.
    auto tellWorkers = [&](const std::string& key, const Status& s) {
      (void)store.set(key, kSetUpFailed + s.message());
      return s;
    };
    if (Status s = store.wait(keys, opts_.startTimeout); !s.isOk())
      return tellWorkers("lane/path", s);
    std::string why;
    std::vector<std::string> hosts(n);
    for (int r = 0; r < n; ++r) {
      auto h = store.get(keys[r], opts_.startTimeout);
      if (!h.isOk()) return h.status();
      const bool refuses = !h.value().empty() && h.value()[0] == '-';
      hosts[r] = refuses ? h.value().substr(1) : h.value();
      if (!why.empty()) continue;
      if (refuses)
        why = peerName(r) + " has HORA_SHM_NEGOTIATION=0";
      else if (h.value() != opts_.hostId)
        why = "the ranks run on more than one host";
    }
    // Before "lane/path", which every worker reads next.
    const std::vector<int> mates = kernelMatesByRank(hosts);
    std::string list;
    for (int r = 0; r < n; ++r) list += (r ? "," : "") + std::to_string(mates[r]);
    // Advisory: a failed write costs the workers their count (0, unknown),
    // not the set-up.
    (void)store.set("lane/kernels", list);
    kernelMates_ = mates[0];
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
      if (!waited.isOk()) return tellWorkers("lane/final", waited);
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
    auto path = laneValue(store, "lane/path");
    if (!path.isOk()) return path.status();
    // Set before the path, unless the coordinator gave up before it (then
    // there is no count: a failed set-up).
    if (auto k = store.get("lane/kernels", std::chrono::seconds(1)); k.isOk())
      kernelMates_ = kernelMatesOf(k.value(), opts_.rank);
    if (path.value().rfind("shm ", 0) == 0) {
      auto m = ShmMailbox::open(path.value().substr(4), n);
      if (m.isOk()) mb = m.take();
      HORA_RETURN_IF_ERROR(
          store.set("lane/ack/" + me, m.isOk() ? std::string("ok") : m.status().message()));
      auto f = laneValue(store, "lane/final");
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
  // TCP from then on) and sleeps in the event loop. Each round holds the
  // drive lock; a round that finds a framework thread driving counts as
  // idle, so that in steady state this thread sleeps while the framework
  // threads do the work.
  lane_->setPolling(true);
  Clock::time_point lastWork = Clock::now();
  uint32_t rounds = 0;
  uint64_t postsSeen = posted_.load(std::memory_order_acquire);
  while (!io_.stopped()) {
    bool did = false, pending = false;
    // A framework thread polling the lane does this thread's work: racing
    // it for the lock would only pass the work back and forth (and next to
    // other busy processes each pass costs a time slice), so sleep.
    const bool driven = drivers_.load(std::memory_order_seq_cst) > 0;
    if (!driven && drive_.try_lock()) {
      did = pollLane();
      // The event loop's own poll is a system call (epoll): every few
      // rounds, or at once when post() queued a handler.
      const uint64_t posts = posted_.load(std::memory_order_acquire);
      if (did || posts != postsSeen || (++rounds & 7) == 0) {
        postsSeen = posts;
        did |= io_.poll() > 0;
      }
      runSoonQueued();
      pending = lane_->hasPending();
      drive_.unlock();
    }
    if (did) {
      lastWork = Clock::now();
      continue;
    }
    if (!driven && (pending || Clock::now() - lastWork < opts_.spin.window)) {
      if (opts_.spin.yield)
        ::sched_yield();
      else
        cpuRelax();
      continue;
    }
    lane_->setPolling(false);
    // The last look, unless a framework thread still drives: it reads what
    // came, or makes that look itself when it stops (endDriving).
    if (drivers_.load(std::memory_order_seq_cst) == 0 && lane_->hasInput()) {
      lane_->setPolling(true);
      continue;
    }
    // Handlers lock for themselves (locked()).
    io_.run_one();
    lane_->setPolling(true);
    lastWork = Clock::now();
  }
  lane_->setPolling(false);
}

std::vector<int> kernelMatesByRank(const std::vector<std::string>& hostIds) {
  // Each boot id once, counted in a map: sets of thousands of ranks.
  std::vector<std::string> boots(hostIds.size());
  std::unordered_map<std::string, int> count;
  for (size_t r = 0; r < hostIds.size(); ++r) {
    boots[r] = bootIdOf(hostIds[r]);
    if (!boots[r].empty()) ++count[boots[r]];
  }
  std::vector<int> out(hostIds.size(), 0);
  for (size_t r = 0; r < hostIds.size(); ++r)
    if (!boots[r].empty()) out[r] = count[boots[r]];
  return out;
}

int kernelMatesOf(const std::string& list, int rank) {
  size_t at = 0;
  for (int r = 0; r < rank; ++r) {
    at = list.find(',', at);
    if (at == std::string::npos) return 0;
    ++at;
  }
  const size_t end = std::min(list.find(',', at), list.size());
  int n = 0;  // 0 also where the coordinator saw no boot id
  return parseKernelCount(list.substr(at, end - at), &n) ? n : 0;
}

void ControlPlane::wakeParked() {
  if (!parked_.load(std::memory_order_seq_cst)) return;
  std::lock_guard<std::mutex> lk(parkMu_);
  parkCv_.notify_one();
}

void ControlPlane::runWithoutLane() {
  // Asio lets only one thread wait in epoll: while this one does, a
  // framework thread's io_.poll() sees no socket, and every frame wakes this
  // thread (a context switch on the critical path, often two where the ranks
  // outnumber the cores). So this thread leaves epoll when a framework thread
  // begins driving (beginDriving posts a no-op if it is inside) and sleeps
  // until the last driver ends; the drivers poll the io_context, sockets,
  // timers and posted handlers alike.
  while (!io_.stopped()) {
    if (drivers_.load(std::memory_order_seq_cst) > 0) {
      parkWhileDriven();
      continue;
    }
    inLoop_.store(true, std::memory_order_seq_cst);
    // A driver that began before the store above did not see this thread in
    // the loop and did not wake it: look again (the pair of seq_cst
    // accesses on each side makes one of the two see the other).
    if (drivers_.load(std::memory_order_seq_cst) == 0) io_.run_one();
    inLoop_.store(false, std::memory_order_seq_cst);
  }
}

void ControlPlane::parkWhileDriven() {
  parked_.store(true, std::memory_order_seq_cst);
  {
    std::unique_lock<std::mutex> lk(parkMu_);
    // The bound only backs up the wake-ups (endDriving's, and stop()'s
    // handler's, run by a driver's poll): a sleeping event loop must not be
    // the reason a set hangs.
    parkCv_.wait_for(lk, std::chrono::milliseconds(20), [this] {
      return drivers_.load(std::memory_order_seq_cst) == 0 || io_.stopped();
    });
  }
  parked_.store(false, std::memory_order_seq_cst);
}

void ControlPlane::runSoonQueued() {
  if (!drive_.outermost()) return;
  while (!soon_.empty()) {
    auto fns = std::move(soon_);
    soon_.clear();
    for (auto& f : fns) f();
  }
}

namespace {
// The lane's poller count, raised for a scope.
struct PollingScope {
  explicit PollingScope(ShmLane& lane) : lane(lane) { lane.setPolling(true); }
  ~PollingScope() { lane.setPolling(false); }
  ShmLane& lane;
};
}  // namespace

void ControlPlane::leaveLane() {
  // Bytes written while this thread still counted as a poller: nobody rang
  // for them; what comes after this look is rung.
  if (lane_->hasInput()) pollLane();
  runSoonQueued();
  if (lane_->hasPending()) post([] {});
}

bool ControlPlane::tryDrive(const std::function<void()>& fn, bool* whileDriving) {
  if (drive_.heldHere() || io_.stopped()) return false;
  // Checked again under the lock: stop() runs under it too, and once the
  // loop stopped the set is being torn down (its executor included).
  std::unique_lock<DriveLock> hold(drive_, std::try_to_lock);
  if (!hold.owns_lock() || io_.stopped()) return false;
  struct Flag {
    explicit Flag(bool* f) : f(f) {
      if (f) *f = true;
    }
    ~Flag() {
      if (f) *f = false;
    }
    bool* f;
  } flag(whileDriving);
  // Over TCP what fn sends goes into the kernel from here (flush), waking
  // no thread of this process; alone in the set there is no peer to hear
  // from and the caller's request is the whole negotiation.
  if (!lane_) {
    fn();
    runSoonQueued();
    return true;
  }
  {
    PollingScope polling(*lane_);
    pollLane();
    fn();
    runSoonQueued();
    pollLane();
    runSoonQueued();
  }
  leaveLane();
  return true;
}

void ControlPlane::beginDriving() {
  if (!drivable()) return;
  drivers_.fetch_add(1, std::memory_order_seq_cst);
  if (lane_) {
    lane_->setPolling(true);
    return;
  }
  // The control thread may wait in epoll, where this thread's polls cannot
  // see the sockets: a no-op makes it leave and sleep (runWithoutLane).
  // Not locked(): it only has to end the control thread's run_one(), and
  // must not wait there for a lock this thread takes to poll. driveOnce
  // leaves it to the control thread (run by this thread's poll, it would
  // not end the control thread's wait: Asio goes back to epoll).
  if (inLoop_.load(std::memory_order_seq_cst)) {
    try {
      boost::asio::post(io_, [] {});
    } catch (...) {
      // Not counted then: a driver the control thread sleeps for must be one
      // that ends (endDriving runs only after beginDriving returned).
      if (drivers_.fetch_sub(1, std::memory_order_seq_cst) == 1) wakeParked();
      throw;
    }
  }
}

ControlPlane::DriveRound ControlPlane::driveOnce() {
  if (!drivable() || io_.stopped()) return DriveRound::kIdle;
  // Over TCP, until the control thread has left its run_one() for the
  // no-op beginDriving posted: polling now would run the no-op here.
  if (!lane_ && inLoop_.load(std::memory_order_seq_cst)) return DriveRound::kHeldElsewhere;
  // Checked again under the lock: stop() runs under it too, and once the
  // loop stopped the set is being torn down (its executor included).
  std::unique_lock<DriveLock> hold(drive_, std::try_to_lock);
  if (!hold.owns_lock()) return DriveRound::kHeldElsewhere;
  if (io_.stopped()) return DriveRound::kIdle;
  if (!lane_) {
    // Sockets, timers and posted handlers: one epoll_wait that does not
    // block, then what it found.
    const bool did = io_.poll() > 0;
    runSoonQueued();
    return did ? DriveRound::kWorked : DriveRound::kIdle;
  }
  bool did = pollLane();
  // Handlers queued by post() (a submission's drain): run here rather than
  // wait for the control thread, which may sleep.
  const uint64_t posts = posted_.load(std::memory_order_acquire);
  if (posts != drivenPostsSeen_) {
    drivenPostsSeen_ = posts;
    did |= io_.poll() > 0;
  }
  runSoonQueued();
  return did ? DriveRound::kWorked : DriveRound::kIdle;
}

void ControlPlane::endDriving() {
  if (!drivable()) return;
  if (!lane_) {
    // The last driver hands the sockets back: what arrives from now on is
    // the control thread's to read.
    if (drivers_.fetch_sub(1, std::memory_order_seq_cst) == 1) wakeParked();
    return;
  }
  // Uncounted before the last look below: a control thread that saw this
  // thread driving and went to sleep without its own last look relies on it.
  drivers_.fetch_sub(1, std::memory_order_seq_cst);
  lane_->setPolling(false);
  std::unique_lock<DriveLock> hold(drive_, std::try_to_lock);
  if (hold.owns_lock()) {
    if (!io_.stopped()) leaveLane();
    return;
  }
  // Another thread holds the lock and may have made its own last look
  // already (a second framework thread leaving): the control thread reads
  // what this one was counted for.
  if (lane_->hasInput()) post([] {});
}

}  // namespace hora
