// P2pEngine's endpoints and threads: the shared-memory inbox and the TCP
// listener, connecting to peers, moving bytes, the progress thread and its
// sleep, shutdown (ops/p2p/p2p_engine.h).
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/cpu_relax.h"
#include "ops/p2p/p2p_engine.h"
#include "ops/p2p/p2p_engine_internal.h"
#include "ops/p2p/p2p_socket.h"

namespace hora {

P2pEngine::P2pEngine(P2pEngineOptions options) : opts_(std::move(options)) {
  static_assert(sizeof(Frame) == 128, "frames are 128 bytes on the wire");
  const int n = static_cast<int>(opts_.globalRanks.size());
  for (int r = 0; r < n; ++r) {
    peers_.push_back(std::make_unique<Peer>());
    peers_.back()->rank = r;
  }
  watch_ = std::make_unique<Watch[]>(static_cast<size_t>(n));
}

P2pEngine::~P2pEngine() { shutdown("the process set was destroyed"); }

void P2pEngine::wake() {
  std::lock_guard<std::mutex> lk(wakeMu_);
  ++wakeups_;
  wakeCv_.notify_one();
  if (P2pInbox* in = inboxPtr_.load(std::memory_order_acquire)) in->ring();
  const int ev = wakeFd_.load(std::memory_order_acquire);
  if (ev >= 0) {
    uint64_t one = 1;
    (void)!::write(ev, &one, sizeof one);
  }
}

void P2pEngine::beginDrive() {
  drivers_.fetch_add(1, std::memory_order_acq_rel);
  // Peers need not ring our doorbell while we poll (each ring is a system
  // call on their side and a wake-up of our thread on ours). Written only
  // when set: the line is read by every peer that writes to us.
  if (P2pInbox* in = inboxPtr_.load(std::memory_order_acquire)) {
    auto& h = in->header();
    if (h.sleeping.value.load(std::memory_order_relaxed) != 0)
      h.sleeping.value.store(0, std::memory_order_seq_cst);
    const int cpu = ::sched_getcpu();  // rseq: no system call
    const uint32_t mine = cpu < 0 ? 0 : static_cast<uint32_t>(cpu) + 1;
    if (h.pollerCpu.value.load(std::memory_order_relaxed) != mine)
      h.pollerCpu.value.store(mine, std::memory_order_relaxed);
  }
}

void P2pEngine::endDrive() {
  if (drivers_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  // Posted operations are live until they complete, so this covers what
  // waits in incoming_ too.
  if (live_.load(std::memory_order_acquire) == 0)
    return;  // the thread sleeps on; a peer's frame rings it
  wake();
  if (P2pInbox* in = inboxPtr_.load(std::memory_order_acquire))
    shmFutexWakeAll(in->header().doorbell.value);  // it may sleep unannounced
}

void P2pEngine::poll(const std::atomic<bool>& done) {
  auto now = Clock::now();
  const auto until = now + std::chrono::microseconds(opts_.spinUs);
  beginDrive();
  // Ticks: a quick look counts 1, a full round (the lock, every peer, for
  // TCP peers system calls) 4, so the clock and the CPU sharing are looked
  // at every 64 looks or every 16 rounds.
  constexpr unsigned kRoundTicks = 4;
  for (unsigned ticks = 0, idle = 0, looks = 0;;) {
    if (done.load(std::memory_order_acquire)) break;
    // For a small message this loop is most of the latency: between full
    // rounds of progress it only looks at the words a peer writes when it
    // has something for us.
    unsigned cost = 1;
    if (looks < kQuickLooksPerRound && !quickLook()) {
      ++looks;
    } else {
      looks = 0;
      cost = kRoundTicks;
      if (drive(now)) {
        idle = 0;
        continue;
      }
    }
    if ((ticks += cost) >= 64) {
      ticks = 0;
      if ((now = Clock::now()) >= until) break;
    }
    cpuRelax();
    // A reply that is late may wait for a peer that polls on our CPU (more
    // ranks than cores, or the scheduler put them together): spinning would
    // keep it off the CPU until our time slice ends, so we yield to it. A
    // yield is a system call (about a microsecond here), so a rank that
    // has its own core does not.
    if ((idle += cost) >= kIdlePollsPerYieldCheck) {
      idle = 0;
      if (peerSharesCpu()) std::this_thread::yield();
    }
  }
  endDrive();
}

bool P2pEngine::peerSharesCpu() {
  const int cpu = ::sched_getcpu();
  if (cpu < 0) return true;  // cannot tell: be polite
  std::unique_lock<std::mutex> lk(mu_, std::try_to_lock);
  if (!lk.owns_lock()) return false;
  for (auto& p : peers_)
    if (p->out && p->out->header().pollerCpu.value.load(std::memory_order_relaxed) ==
                      static_cast<uint32_t>(cpu) + 1)
      return true;
  return false;
}

Status P2pEngine::ensureInbox() {
  if (inbox_ || listenFd_ >= 0) return Status();
  std::string name = "-";
  if (opts_.transport != "tcp") {
    sweepDeadP2pInboxes(opts_.dir);
    name = "hora-" + std::to_string(::getpid()) + "-p2p-" + randomHex(16);
    auto in =
        P2pInbox::create(opts_.dir, name, static_cast<uint32_t>(peers_.size()), opts_.ringBytes);
    if (!in.isOk()) return in.status();
    inbox_ = in.take();
    inboxPtr_.store(inbox_.get(), std::memory_order_release);
  }
  int port = 0;
  if (opts_.transport != "shm") {
    auto fd = p2pListen(opts_.hostname, &port);
    if (!fd.isOk()) return fd.status();
    listenFd_ = fd.value();
    token_ = randomHex(31);
    int ev = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ev >= 0) wakeFd_.store(ev, std::memory_order_release);
    scratch_.resize(64 << 10);
  }
  std::string value = name + "\n" + opts_.hostId + "\n" + std::to_string(::getpid()) + "\n" +
                      opts_.hostname + "\n" + std::to_string(port) + "\n" + token_;
  Status s = opts_.store->set("p2p/inbox/" + std::to_string(opts_.rank), value);
  if (!s.isOk()) return s.withContext("publishing this rank's point-to-point endpoint");
  return Status();
}

bool P2pEngine::connect(Peer& p, Clock::time_point now) {
  if (p.out || p.fd >= 0) return true;
  if (p.awaitingAccept || now < p.nextCheck) return false;
  p.nextCheck = now + std::chrono::milliseconds(2);
  const std::string key = "p2p/inbox/" + std::to_string(p.rank);
  auto has = opts_.store->check(key);
  if (!has.isOk()) {
    fatalLocked(
        has.status().withContext("looking up " + rankText(p.rank) + "'s point-to-point endpoint"));
    return false;
  }
  if (!has.value()) return false;  // the peer has not posted its first operation yet
  auto v = opts_.store->get(key, std::chrono::milliseconds(5000));
  if (!v.isOk()) {
    fatalLocked(
        v.status().withContext("reading " + rankText(p.rank) + "'s point-to-point endpoint"));
    return false;
  }
  std::istringstream is(v.value());
  std::string name, host, pid, addr, port, token;
  std::getline(is, name);
  std::getline(is, host);
  std::getline(is, pid);
  std::getline(is, addr);
  std::getline(is, port);
  std::getline(is, token);
  const bool sameHost = host == opts_.hostId;
  if (sameHost && name != "-" && inbox_) {
    auto in = P2pInbox::open(opts_.dir, name);
    if (!in.isOk()) {
      // Published, and gone now: the peer shut down (it removes its inbox) or
      // exited and another rank swept its inbox away. What it sent before is
      // read first (as for a closed inbox, in checkLocked).
      struct stat st;
      if (in.status().code() == Code::kSystemError &&
          ::stat((opts_.dir + "/" + name).c_str(), &st) != 0 && errno == ENOENT) {
        if (p.inPayload || p.curGot != 0 || inbox_->readable(static_cast<uint32_t>(p.rank)) != 0)
          return false;
        const long owner = std::strtol(pid.c_str(), nullptr, 10);
        if (owner > 0 && owner != ::getpid() && ::kill(static_cast<pid_t>(owner), 0) != 0 &&
            errno == ESRCH) {
          fatalLocked(Status(Code::kRemoteError,
                             rankText(p.rank) + " of process set " + opts_.setName + " (pid " +
                                 pid + ") exited before " + rankText(opts_.rank) +
                                 " reached its point-to-point inbox; check that rank's output "
                                 "for the cause"));
          return false;
        }
        failPeerLocked(
            p, Status(Code::kShutDown, rankText(p.rank) + " of process set " + opts_.setName +
                                           " shut down (hora_shutdown) while this operation waited "
                                           "for it"));
        p.peerFailure = Status();  // a later runtime of that rank publishes a new inbox
        return false;
      }
      fatalLocked(in.status().withContext("connecting to " + rankText(p.rank)));
      return false;
    }
    if (in.value()->rings() != peers_.size()) {
      fatalLocked(protocolError(rankText(p.rank) + "'s point-to-point inbox has " +
                                std::to_string(in.value()->rings()) + " rings for a set of " +
                                std::to_string(peers_.size())));
      return false;
    }
    p.out = in.take();
    return true;
  }
  if (listenFd_ < 0 || port.empty() || port == "0") {
    failPeerLocked(p, Status(Code::kNotSupported,
                             rankText(opts_.rank) + " and " + rankText(p.rank) +
                                 " cannot reach each other for point-to-point: " +
                                 (sameHost ? "one of them has no shared-memory inbox"
                                           : "they are on different hosts") +
                                 " and HORA_P2P_TRANSPORT=shm on one of them; use auto or tcp"));
    return false;
  }
  if (opts_.rank > p.rank) {  // the lower rank connects; its connection comes to acceptLocked
    p.awaitingAccept = true;
    ++awaitingAccepts_;
    return false;
  }
  P2pHello hello{};
  hello.magic = kP2pHelloMagic;
  hello.rank = opts_.rank;
  std::snprintf(hello.token, sizeof hello.token, "%s", token.c_str());
  auto fd = p2pConnect(addr, std::atoi(port.c_str()), hello, 5000);
  if (!fd.isOk()) {
    fatalLocked(
        fd.status().withContext("connecting to " + rankText(p.rank) + " for point-to-point"));
    return false;
  }
  p.fd = fd.value();
  return true;
}

void P2pEngine::acceptLocked() {
  for (;;) {
    P2pHello hello{};
    auto fd = p2pAccept(listenFd_, &hello, 500);
    if (!fd.isOk()) {  // a stranger's connection without a hello, or no descriptors left
      HORA_LOG(opts_.logger, kWarning)
          << "process set " << opts_.setName << ": " << fd.status().message();
      return;
    }
    if (fd.value() < 0) return;
    hello.token[sizeof hello.token - 1] = 0;
    const int r = hello.rank;
    const bool ok = hello.magic == kP2pHelloMagic && token_ == hello.token && r >= 0 &&
                    r < opts_.rank && peers_[r]->fd < 0;
    if (!ok) {
      HORA_LOG(opts_.logger, kWarning)
          << "process set " << opts_.setName
          << ": refused a point-to-point connection that did not "
          << "present this rank's token from the store (or came from an unexpected rank " << r
          << ")";
      p2pClose(fd.value());
      continue;
    }
    peers_[r]->fd = fd.value();
    if (peers_[r]->awaitingAccept) --awaitingAccepts_;
    peers_[r]->awaitingAccept = false;
  }
}

size_t P2pEngine::writeOut(Peer& p, const char* data, size_t n) {
  if (p.fd < 0) return p.out->write(static_cast<uint32_t>(opts_.rank), data, n);
  auto k = p2pSend(p.fd, data, n);
  if (!k.isOk()) {
    fatalLocked(Status(Code::kRemoteError, "point-to-point to " + rankText(p.rank) +
                                               " of process set " + opts_.setName + ": " +
                                               k.status().message() +
                                               "; its process probably exited"));
    return 0;
  }
  return k.value();
}

size_t P2pEngine::readIn(Peer& p, void* data, size_t n) {
  if (p.fd < 0) return inbox_ ? inbox_->read(static_cast<uint32_t>(p.rank), data, n) : 0;
  if (!data) {
    data = scratch_.data();
    n = std::min(n, scratch_.size());
  }
  bool eof = false;
  auto k = p2pRecv(p.fd, data, n, &eof);
  if (!k.isOk() || (eof && !p.closedByPeer)) {
    fatalLocked(Status(Code::kRemoteError,
                       rankText(p.rank) + " of process set " + opts_.setName +
                           " closed its point-to-point connection to " + rankText(opts_.rank) +
                           (k.isOk() ? " without a goodbye" : ": " + k.status().message()) +
                           ": its process exited or the network failed; check that rank's output"));
    return 0;
  }
  return k.value();
}

bool P2pEngine::hasWorkLocked() {
  if (!incoming_.empty()) return true;
  if (!inbox_) return false;
  for (auto& p : peers_) {
    if (p->fd >= 0) continue;  // sockets: poll() watches them
    if (inbox_->readable(static_cast<uint32_t>(p->rank)) > 0 || fastWorkLocked(*p)) return true;
    // A full ring is no work: the reader rings our doorbell when it frees room.
    if (!p->outq.empty() && p->out && p->out->writable(static_cast<uint32_t>(opts_.rank)) > 0)
      return true;
  }
  return false;
}

void P2pEngine::run() {
  auto lastMove = Clock::now();
  while (!stop_.load(std::memory_order_acquire)) {
    const bool moved = drive();
    const auto now = Clock::now();
    if (moved) {
      lastMove = now;
      continue;
    }
    if (drivers_.load(std::memory_order_acquire) > 0) {
      // A framework thread waiting on a request polls: one poller per rank.
      // Sleep briefly without announcing it, so writers do not wake us; the
      // driver wakes us when it stops (endDrive).
      std::unique_lock<std::mutex> lk(wakeMu_);
      const uint64_t seen = wakeups_;
      wakeCv_.wait_for(lk, std::chrono::milliseconds(20),
                       [&] { return wakeups_ != seen || stop_.load(); });
      lastMove = Clock::now() - std::chrono::microseconds(opts_.spinUs);
      continue;
    }
    if (now - lastMove < std::chrono::microseconds(opts_.spinUs)) {
      std::this_thread::yield();
      continue;
    }
    // Sleep until a peer rings the doorbell, a framework thread posts, or a
    // short timeout (connections being made, stall checks).
    P2pInbox* in = inboxPtr_.load(std::memory_order_acquire);
    bool connecting = false, busy = false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& p : peers_)
        if (!p->outq.empty()) {
          if (!p->out && p->fd < 0) connecting = true;
          busy = true;
        }
      if (!incoming_.empty()) busy = true;
    }
    const int timeoutMs = connecting ? 2 : (busy ? 5 : 50);
    if (sleepOnSockets(timeoutMs)) {
      // slept in poll()
    } else if (in) {
      auto& h = in->header();
      const uint32_t bell = h.doorbell.value.load(std::memory_order_seq_cst);
      h.sleeping.value.store(1, std::memory_order_seq_cst);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      bool work;
      {
        std::unique_lock<std::mutex> lk(mu_, std::try_to_lock);
        work = !lk.owns_lock() || hasWorkLocked();
      }
      if (!work && !stop_.load()) shmFutexWait(h.doorbell.value, bell, timeoutMs);
      h.sleeping.value.store(0, std::memory_order_relaxed);
    } else {
      std::unique_lock<std::mutex> lk(wakeMu_);
      const uint64_t seen = wakeups_;
      wakeCv_.wait_for(lk, std::chrono::milliseconds(timeoutMs),
                       [&] { return wakeups_ != seen || stop_.load(); });
    }
    lastMove = Clock::now() - std::chrono::microseconds(opts_.spinUs);
  }
}

// With peers on other hosts the thread sleeps in poll() on their sockets,
// the listener and the wake-up eventfd; a shared-memory peer's doorbell
// cannot wake poll(), so with both kinds the sleep is kept to 1 ms.
bool P2pEngine::sleepOnSockets(int timeoutMs) {
  std::vector<struct pollfd> fds;
  size_t listenAt = 0;
  bool shmPeers = false;
  {
    std::unique_lock<std::mutex> lk(mu_, std::try_to_lock);
    if (!lk.owns_lock() || listenFd_ < 0) return false;
    bool tcp = false;
    for (auto& p : peers_) {
      if (p->fd >= 0 || p->awaitingAccept) tcp = true;
      if (p->out) shmPeers = true;
    }
    if (!tcp) return false;
    if (hasWorkLocked()) return true;
    const int ev = wakeFd_.load(std::memory_order_acquire);
    if (ev >= 0) fds.push_back({ev, POLLIN, 0});
    listenAt = fds.size();
    fds.push_back({listenFd_, POLLIN, 0});
    for (auto& p : peers_)
      if (p->fd >= 0)
        fds.push_back({p->fd, static_cast<short>(POLLIN | (p->outq.empty() ? 0 : POLLOUT)), 0});
  }
  ::poll(fds.data(), fds.size(), shmPeers ? 1 : timeoutMs);
  if (fds[listenAt].revents & POLLIN) listenerReady_.store(true, std::memory_order_relaxed);
  if (!fds.empty() && fds[0].fd == wakeFd_.load() && (fds[0].revents & POLLIN)) {
    uint64_t v;
    (void)!::read(fds[0].fd, &v, sizeof v);
  }
  return true;
}

void P2pEngine::shutdown(const std::string& reason) {
  // GPU payloads already matched: both sides have issued (or will issue)
  // them, so they are let finish, as a large host payload being written.
  if (P2pGpu* g = gpuIfAny())
    g->shutdown(
        Status(Code::kShutDown, reason + " with this point-to-point GPU transfer pending"),
        Clock::now() + std::clamp<Clock::duration>(opts_.peerTimeout, std::chrono::seconds(1),
                                                   std::chrono::seconds(10)));
  std::thread t;
  std::vector<std::pair<OpPtr, Status>> done;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_ && !thread_.joinable()) return;
    failAllLocked(Status(Code::kShutDown, reason + " with this point-to-point operation pending"));
    stopping_ = true;
    done.swap(completions_);
    t = std::move(thread_);
  }
  stop_.store(true, std::memory_order_release);
  wake();
  if (t.joinable()) t.join();
  for (auto& d : done) d.first->p.sink->completeEntry(d.second);
  std::lock_guard<std::mutex> lk(mu_);
  if (inbox_) {
    inbox_->header().closed.value.store(1, std::memory_order_release);
    inbox_->unlink();
  }
  for (auto& p : peers_) {
    if (p->fd < 0) continue;
    // A goodbye at a frame boundary tells the peer this was no crash.
    if (p->outq.empty() || p->outq.front().done == 0) {
      Frame bye;
      bye.kind = kClose;
      size_t sent = 0;
      for (int tries = 0; sent < sizeof bye && tries < 1000; ++tries) {
        auto k = p2pSend(p->fd, reinterpret_cast<const char*>(&bye) + sent, sizeof bye - sent);
        if (!k.isOk()) break;
        sent += k.value();
        if (sent < sizeof bye) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    p2pClose(p->fd);
    p->fd = -1;
  }
  p2pClose(listenFd_);
  listenFd_ = -1;
  p2pClose(wakeFd_.exchange(-1));
}

}  // namespace hora
