// Direct tests of controllers/control_plane.h: 1-4 ControlPlanes in one process over a MemoryStore
// and loopback TCP (framing and order, heartbeats, lost/stalled/garbling peers, goodbye), plus
// fake peers on raw sockets for stray clients and malformed frames. Every wait has a deadline.
#include "controllers/control_plane.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "controllers/coordinator_link.h"
#include "core/memory_store.h"
#include "core/wire.h"

namespace hora {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Bound for anything that should happen "soon"; a hang fails after this.
constexpr milliseconds kDeadline = 5000ms;
constexpr char kSetName[] = "cp-test";
constexpr int kGlobalBase = 100;  // set rank r is global rank 100 + r, so messages are checkable

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

long long elapsedMs(Clock::time_point since) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - since).count();
}

// How peerName() names set rank r in messages (without the address).
std::string nameOf(int r) {
  return "rank " + std::to_string(kGlobalBase + r) + " (rank " + std::to_string(r) + " of set " +
         kSetName + ")";
}

ControlPlaneOptions testOptions(int rank, int size) {
  ControlPlaneOptions o;
  o.rank = rank;
  o.size = size;
  for (int r = 0; r < size; ++r) o.globalRanks.push_back(kGlobalBase + r);
  o.hostname = "127.0.0.1";
  o.startTimeout = kDeadline;
  o.heartbeatInterval = 50ms;
  o.peerTimeout = kDeadline;  // tests about timeouts shorten it
  o.setName = kSetName;
  return o;
}

struct Frame {
  int from;
  FrameType type;
  std::string payload;
};

struct Loss {
  int peer;
  Status why;
  std::thread::id thread;  // the one that reported it
};

// What one rank's callbacks saw. Written on its control thread, read by the test thread.
class Events {
 public:
  struct Seen {
    std::vector<Frame> frames;
    std::vector<Loss> losses;
  };

  void frame(int from, FrameType type, std::string payload) {
    std::lock_guard<std::mutex> lk(mu_);
    seen_.frames.push_back({from, type, std::move(payload)});
    cv_.notify_all();
  }
  void lost(int peer, Status why) {
    std::lock_guard<std::mutex> lk(mu_);
    seen_.losses.push_back({peer, std::move(why), std::this_thread::get_id()});
    cv_.notify_all();
  }
  // Waits until pred(seen) holds; false at the deadline.
  bool waitFor(const std::function<bool(const Seen&)>& pred, milliseconds timeout = kDeadline) {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return pred(seen_); });
  }
  bool waitForLoss(int peer, milliseconds timeout = kDeadline) {
    return waitFor([peer](const Seen& s) { return lossOf(s, peer) != nullptr; }, timeout);
  }
  // The loss reported for `peer` (a copy); an kInternal status when there is none.
  Loss lossFrom(int peer) {
    std::lock_guard<std::mutex> lk(mu_);
    const Loss* l = lossOf(seen_, peer);
    return l ? *l : Loss{-1, Status(Code::kInternal, "no loss of peer reported"), {}};
  }
  Seen snapshot() {
    std::lock_guard<std::mutex> lk(mu_);
    return seen_;
  }
  static const Loss* lossOf(const Seen& s, int peer) {
    for (const auto& l : s.losses)
      if (l.peer == peer) return &l;
    return nullptr;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  Seen seen_;
};

std::vector<Frame> framesFrom(const Events::Seen& s, int from) {
  std::vector<Frame> out;
  for (const auto& f : s.frames)
    if (f.from == from) out.push_back(f);
  return out;
}

// One process set of ControlPlanes, ranks as threads: create() on a creator thread each, then
// start() and run() on a control thread each. Only the ranks a test creates exist (the others
// may be fake peers on raw sockets). The destructor stops and joins everything.
class CpSet {
 public:
  using FrameHook = std::function<void(ControlPlane&, int from, FrameType, const std::string&)>;

  explicit CpSet(int size) : store_(std::make_shared<MemoryStore>()) {
    for (int r = 0; r < size; ++r) {
      ranks_.push_back(std::make_unique<Rank>());
      ranks_.back()->opts = testOptions(r, size);
      ranks_.back()->released = ranks_.back()->release.get_future().share();
    }
  }
  ~CpSet() {
    for (size_t r = 0; r < ranks_.size(); ++r) stop(static_cast<int>(r));
    for (auto& h : ranks_)
      if (h->creator.joinable()) h->creator.join();  // bounded by startTimeout
    for (auto& h : ranks_) h->cp.reset();
  }

  int size() const { return static_cast<int>(ranks_.size()); }
  std::shared_ptr<MemoryStore> store() { return store_; }
  ControlPlaneOptions& options(int r) { return ranks_[r]->opts; }
  Events& events(int r) { return ranks_[r]->events; }
  ControlPlane* cp(int r) { return ranks_[r]->cp.get(); }
  // Runs on rank r's control thread for each frame, before it is recorded. Set before start().
  void setFrameHook(int r, FrameHook hook) { ranks_[r]->hook = std::move(hook); }
  void setAllOptions(const std::function<void(ControlPlaneOptions&)>& tweak) {
    for (auto& h : ranks_) tweak(h->opts);
  }

  void beginCreate(int r) {
    Rank* h = ranks_[r].get();
    h->creator = std::thread([this, h] {
      auto res = ControlPlane::create(store_, h->opts, Logger(LogLevel::kWarning, "[cp-test]"));
      h->createStatus = res.status();
      if (res.isOk()) h->cp = res.take();
    });
  }
  // Joins rank r's creator (create() is bounded by startTimeout) and returns its status.
  Status finishCreate(int r) {
    Rank* h = ranks_[r].get();
    if (h->creator.joinable()) h->creator.join();
    return h->createStatus;
  }
  // create() on every rank concurrently; true when all succeeded.
  bool createAll() {
    for (int r = 0; r < size(); ++r) beginCreate(r);
    bool ok = true;
    for (int r = 0; r < size(); ++r) {
      Status s = finishCreate(r);
      if (!s.isOk()) {
        ADD_FAILURE() << "create() on rank " << r << ": " << s.toString();
        ok = false;
      }
    }
    return ok;
  }

  void start(int r) {
    Rank* h = ranks_[r].get();
    ASSERT_TRUE(h->cp) << "rank " << r << " was not created";
    h->control = std::thread([h] {
      ControlPlaneCallbacks cb;
      cb.onFrame = [h](int from, FrameType type, std::string payload) {
        if (h->hook) h->hook(*h->cp, from, type, payload);
        h->events.frame(from, type, std::move(payload));
      };
      cb.onPeerLost = [h](int peer, Status why) { h->events.lost(peer, std::move(why)); };
      h->cp->start(std::move(cb));
      h->cp->run();
      std::lock_guard<std::mutex> lk(h->mu);
      h->returned = true;
      h->cv.notify_all();
    });
  }
  void startAll() {
    for (int r = 0; r < size(); ++r) start(r);
  }

  // Runs fn on rank r's control thread and waits for it; false at the deadline.
  bool onControl(int r, std::function<void(ControlPlane&)> fn) {
    ControlPlane* cp = ranks_[r]->cp.get();
    auto done = std::make_shared<std::promise<void>>();
    auto fut = done->get_future();
    boost::asio::post(cp->io(), [cp, fn = std::move(fn), done] {
      fn(*cp);
      done->set_value();
    });
    return fut.wait_for(kDeadline) == std::future_status::ready;
  }

  // Blocks rank r's control thread (no reads, no heartbeats, sockets left open) until
  // unstall(r) or 10 s. Returns once the block has begun.
  bool stall(int r) {
    auto began = std::make_shared<std::promise<void>>();
    auto fut = began->get_future();
    std::shared_future<void> released = ranks_[r]->released;
    boost::asio::post(ranks_[r]->cp->io(), [began, released] {
      began->set_value();
      released.wait_for(10s);
    });
    return fut.wait_for(kDeadline) == std::future_status::ready;
  }
  void unstall(int r) {
    Rank* h = ranks_[r].get();
    if (!h->unstalled.exchange(true)) h->release.set_value();
  }

  // stop(), then waits for run() to return; a hang aborts the binary rather than blocking.
  void stop(int r) {
    Rank* h = ranks_[r].get();
    unstall(r);
    if (!h->control.joinable()) return;
    h->cp->stop();
    {
      std::unique_lock<std::mutex> lk(h->mu);
      if (!h->cv.wait_for(lk, kDeadline, [h] { return h->returned; })) {
        std::fprintf(stderr, "rank %d: run() did not return within 5 s of stop()\n", r);
        std::abort();
      }
    }
    h->control.join();
  }
  // Stops rank r if it runs, then destroys its ControlPlane (closing its sockets).
  void destroy(int r) {
    stop(r);
    ranks_[r]->cp.reset();
  }

  // peersDone() is a flag without a notification: polled until the deadline.
  bool waitPeersDone(int r, Clock::time_point deadline) {
    while (!ranks_[r]->cp->peersDone()) {
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(1ms);
    }
    return true;
  }
  bool waitPeersDone(int r) { return waitPeersDone(r, Clock::now() + kDeadline); }

 private:
  struct Rank {
    ControlPlaneOptions opts;
    Events events;
    FrameHook hook;
    std::unique_ptr<ControlPlane> cp;
    std::thread creator;
    Status createStatus;
    std::thread control;
    std::mutex mu;
    std::condition_variable cv;
    bool returned = false;  // guarded by mu
    std::promise<void> release;
    std::shared_future<void> released;
    std::atomic<bool> unstalled{false};
  };

  std::shared_ptr<MemoryStore> store_;
  std::vector<std::unique_ptr<Rank>> ranks_;
};

// ---- raw sockets for fake peers ----

// A loopback TCP socket; every read has a deadline.
class RawSocket {
 public:
  explicit RawSocket(int fd = -1) : fd_(fd) {}
  RawSocket(RawSocket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  RawSocket& operator=(RawSocket&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~RawSocket() {
    if (fd_ >= 0) ::close(fd_);
  }

  static RawSocket connectTo(int port) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ::close(fd);
      fd = -1;
    }
    return RawSocket(fd);
  }

  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  bool sendAll(const std::string& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }

  // Exactly n bytes before the deadline; false on EOF, error or deadline.
  bool readExact(size_t n, std::string* out, milliseconds timeout = kDeadline) {
    auto deadline = Clock::now() + timeout;
    out->clear();
    char buf[4096];
    while (out->size() < n) {
      int r = readSome(buf, std::min(sizeof(buf), n - out->size()), deadline);
      if (r <= 0) return false;
      out->append(buf, static_cast<size_t>(r));
    }
    return true;
  }

  // True once the peer has closed (EOF or reset) before the deadline; data is skipped.
  bool waitClosed(milliseconds timeout = kDeadline) {
    auto deadline = Clock::now() + timeout;
    char buf[4096];
    for (;;) {
      int r = readSome(buf, sizeof(buf), deadline);
      if (r == 0) return true;   // EOF
      if (r == -2) return true;  // reset
      if (r < 0) return false;   // deadline
    }
  }

 private:
  // >0 bytes read, 0 EOF, -1 deadline, -2 error (reset).
  int readSome(char* buf, size_t len, Clock::time_point deadline) {
    for (;;) {
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return -1;
      pollfd pfd{fd_, POLLIN, 0};
      int pr = ::poll(&pfd, 1, static_cast<int>(left));
      if (pr == 0) return -1;
      if (pr < 0) {
        if (errno == EINTR) continue;
        return -2;
      }
      ssize_t n = ::recv(fd_, buf, len, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return -2;
      return static_cast<int>(n);
    }
  }

  int fd_;
};

// A listening loopback socket on an ephemeral port.
class RawListener {
 public:
  RawListener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        ::listen(fd_, 8) == 0 && ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      port_ = ntohs(addr.sin_port);
  }
  ~RawListener() { ::close(fd_); }
  int port() const { return port_; }
  RawSocket accept(milliseconds timeout = kDeadline) {
    pollfd pfd{fd_, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(timeout.count())) != 1) return RawSocket();
    return RawSocket(::accept(fd_, nullptr, nullptr));
  }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// The wire format, spelled out independently of control_plane.cc: u32 length (type byte
// included, little-endian), u8 type, payload.
std::string header(uint32_t len, uint8_t type) {
  std::string h(5, '\0');
  std::memcpy(&h[0], &len, 4);
  h[4] = static_cast<char>(type);
  return h;
}
std::string rawFrame(FrameType type, const std::string& payload) {
  return header(static_cast<uint32_t>(payload.size() + 1), static_cast<uint8_t>(type)) + payload;
}
std::string helloPayload(int32_t rank, const std::string& token,
                         const std::string& magic = "hora-ctrl-v1") {
  ByteWriter w;
  w.str(magic);
  w.i32(rank);
  w.str(token);
  return w.take();
}

struct CtrlAddress {
  std::string host;
  int port = 0;
  std::string token;
};

// The coordinator's published "host port token" (the store key "ctrl").
bool readCtrlAddress(Store& store, CtrlAddress* out) {
  auto v = store.get("ctrl", kDeadline);
  if (!v.isOk()) return false;
  std::istringstream is(v.value());
  is >> out->host >> out->port >> out->token;
  return out->port > 0 && !out->token.empty();
}

// Reads one frame; false at EOF or the deadline.
bool readFrame(RawSocket& s, uint8_t* type, std::string* payload) {
  std::string h;
  if (!s.readExact(5, &h)) return false;
  uint32_t len = 0;
  std::memcpy(&len, h.data(), 4);
  *type = static_cast<uint8_t>(h[4]);
  if (len < 1 || len > (1u << 20)) return false;
  return s.readExact(len - 1, payload);
}

std::string bigPayload(int seed) {
  std::string s(1 << 20, '\0');
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>((i * 31 + seed) % 251);
  return s;
}

std::string tag(const std::string& prefix, int a, int b) {
  return prefix + std::to_string(a) + "-" + std::to_string(b);
}

// ---- frames ----

class ControlPlaneSizes : public ::testing::TestWithParam<int> {};

TEST_P(ControlPlaneSizes, WorkerFramesReachTheCoordinatorInOrderNamingTheSender) {
  const int size = GetParam();
  const int kCount = 50;
  CpSet set(size);
  ASSERT_TRUE(set.createAll());
  set.startAll();
  for (int r = 1; r < size; ++r)
    ASSERT_TRUE(set.onControl(r, [r](ControlPlane& cp) {
      EXPECT_FALSE(cp.isCoordinator());
      for (int i = 0; i < kCount; ++i) cp.send(0, FrameType::kRequests, tag("w", r, i));
      cp.send(0, FrameType::kRequests, "");  // an empty payload is a frame too
      cp.send(0, FrameType::kNack, bigPayload(r));
    }));
  const size_t want = static_cast<size_t>((size - 1) * (kCount + 2));
  ASSERT_TRUE(set.events(0).waitFor([&](const Events::Seen& s) { return s.frames.size() >= want; }))
      << "coordinator got " << set.events(0).snapshot().frames.size() << " of " << want
      << " frames";
  auto seen = set.events(0).snapshot();
  EXPECT_EQ(seen.frames.size(), want);
  for (int r = 1; r < size; ++r) {
    auto got = framesFrom(seen, r);
    ASSERT_EQ(got.size(), static_cast<size_t>(kCount + 2)) << "from rank " << r;
    for (int i = 0; i < kCount; ++i) {
      EXPECT_EQ(got[i].type, FrameType::kRequests);
      EXPECT_EQ(got[i].payload, tag("w", r, i));
    }
    EXPECT_EQ(got[kCount].type, FrameType::kRequests);
    EXPECT_EQ(got[kCount].payload, "");
    EXPECT_EQ(got[kCount + 1].type, FrameType::kNack);
    EXPECT_TRUE(got[kCount + 1].payload == bigPayload(r)) << "1 MiB payload from rank " << r;
  }
  EXPECT_TRUE(seen.losses.empty());
  for (int r = 1; r < size; ++r) {
    auto w = set.events(r).snapshot();
    EXPECT_TRUE(w.frames.empty()) << "rank " << r << " got a frame nobody sent";
    EXPECT_TRUE(w.losses.empty());
  }
}

TEST_P(ControlPlaneSizes, BroadcastReachesEveryWorkerInOrderAndSendReachesOnlyItsPeer) {
  const int size = GetParam();
  const int kCount = 50;
  const int last = size - 1;
  CpSet set(size);
  ASSERT_TRUE(set.createAll());
  set.startAll();
  ASSERT_TRUE(set.onControl(0, [last](ControlPlane& cp) {
    EXPECT_TRUE(cp.isCoordinator());
    for (int i = 0; i < kCount; ++i) cp.broadcast(FrameType::kResponses, tag("b", 0, i));
    cp.send(last, FrameType::kNack, "only-for-the-last");
    cp.broadcast(FrameType::kAbort, bigPayload(7));
  }));
  for (int r = 1; r < size; ++r) {
    const size_t want = kCount + 1 + (r == last ? 1 : 0);
    ASSERT_TRUE(set.events(r).waitFor([&](const Events::Seen& s) {
      return s.frames.size() >= want;
    })) << "rank "
        << r << " got " << set.events(r).snapshot().frames.size() << " of " << want;
    auto seen = set.events(r).snapshot();
    ASSERT_EQ(seen.frames.size(), want) << "rank " << r;
    size_t i = 0;
    for (; i < static_cast<size_t>(kCount); ++i) {
      EXPECT_EQ(seen.frames[i].from, 0);
      EXPECT_EQ(seen.frames[i].type, FrameType::kResponses);
      EXPECT_EQ(seen.frames[i].payload, tag("b", 0, static_cast<int>(i)));
    }
    if (r == last) {
      EXPECT_EQ(seen.frames[i].type, FrameType::kNack);
      EXPECT_EQ(seen.frames[i].payload, "only-for-the-last");
      ++i;
    }
    EXPECT_EQ(seen.frames[i].from, 0);
    EXPECT_EQ(seen.frames[i].type, FrameType::kAbort);
    EXPECT_TRUE(seen.frames[i].payload == bigPayload(7)) << "1 MiB broadcast to rank " << r;
    EXPECT_TRUE(seen.losses.empty());
  }
  EXPECT_TRUE(set.events(0).snapshot().frames.empty());
}

// The runtime's pattern: the coordinator answers from inside onFrame (on the control thread).
TEST_P(ControlPlaneSizes, CoordinatorRepliesFromInsideOnFrame) {
  const int size = GetParam();
  const int kCount = 20;
  CpSet set(size);
  set.setFrameHook(0, [](ControlPlane& cp, int from, FrameType type, const std::string& p) {
    cp.send(from, FrameType::kResponses, "re:" + p);
  });
  ASSERT_TRUE(set.createAll());
  set.startAll();
  for (int r = 1; r < size; ++r)
    ASSERT_TRUE(set.onControl(r, [r](ControlPlane& cp) {
      for (int i = 0; i < kCount; ++i) cp.send(0, FrameType::kRequests, tag("q", r, i));
    }));
  for (int r = 1; r < size; ++r) {
    ASSERT_TRUE(set.events(r).waitFor([&](const Events::Seen& s) {
      return s.frames.size() >= static_cast<size_t>(kCount);
    })) << "rank "
        << r;
    auto seen = set.events(r).snapshot();
    ASSERT_EQ(seen.frames.size(), static_cast<size_t>(kCount));
    for (int i = 0; i < kCount; ++i) {
      EXPECT_EQ(seen.frames[i].from, 0);
      EXPECT_EQ(seen.frames[i].payload, "re:" + tag("q", r, i));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, ControlPlaneSizes, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "size" + std::to_string(i.param);
                         });

TEST(ControlPlaneTest, SizeOneHasNoPeersAndNeedsNoStore) {
  CpSet set(1);
  ASSERT_TRUE(set.createAll());
  auto published = set.store()->check("ctrl");
  ASSERT_TRUE(published.isOk());
  EXPECT_FALSE(published.value()) << "a set of one should not listen or publish an address";
  set.startAll();
  ASSERT_TRUE(set.onControl(0, [](ControlPlane& cp) {
    EXPECT_TRUE(cp.isCoordinator());
    cp.broadcast(FrameType::kResponses, "nobody");  // no peers: nothing happens
    cp.send(0, FrameType::kResponses, "self");
    cp.send(3, FrameType::kResponses, "out of range");
    cp.closeGracefully();
  }));
  EXPECT_TRUE(set.cp(0)->peersDone());
  auto seen = set.events(0).snapshot();
  EXPECT_TRUE(seen.frames.empty());
  EXPECT_TRUE(seen.losses.empty());
}

// Alone in its set, a submitting thread does the control thread's work
// itself (HORA_CALLER_DRIVES without a lane): there is no peer to hear from.
// Not while another thread drives, nor from inside a handler of this plane.
TEST(ControlPlaneTest, SizeOneLetsTheCallerDriveWithoutALane) {
  CpSet set(1);
  ASSERT_TRUE(set.createAll());
  set.startAll();
  ControlPlane& cp = *set.cp(0);
  const auto me = std::this_thread::get_id();
  std::thread::id ranOn;
  bool whileDriving = false, sawFlag = false;
  EXPECT_TRUE(cp.tryDrive(
      [&] {
        ranOn = std::this_thread::get_id();
        sawFlag = whileDriving;
        EXPECT_TRUE(cp.drivenHere());
      },
      &whileDriving));
  EXPECT_EQ(ranOn, me) << "ran on the calling thread";
  EXPECT_TRUE(sawFlag);
  EXPECT_FALSE(whileDriving);
  EXPECT_FALSE(cp.drivenHere());
  // Inside one of the plane's handlers (they run under the drive lock): not again.
  auto nested = std::make_shared<std::promise<bool>>();
  auto nestedResult = nested->get_future();
  cp.post([&cp, nested] { nested->set_value(cp.tryDrive([] {})); });
  ASSERT_EQ(nestedResult.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_FALSE(nestedResult.get());
  // Another thread holding the lock: refused, running nothing.
  std::unique_lock<DriveLock> held(cp.driveLock());
  bool ran = false;
  std::thread other([&] { EXPECT_FALSE(cp.tryDrive([&] { ran = true; })); });
  other.join();
  EXPECT_FALSE(ran);
}

// beginDriving()/endDriving() for a scope (a failed assertion must not
// leave the control thread asleep for a driver that is gone).
struct Driving {
  explicit Driving(ControlPlane& cp) : cp(cp) { cp.beginDriving(); }
  ~Driving() { cp.endDriving(); }
  ControlPlane& cp;
};

// Over TCP a framework thread waiting for an answer reads the sockets itself
// (HORA_CALLER_DRIVES): the control thread leaves its epoll wait when the
// thread begins driving, so the answers wake no other thread; once it ends,
// the control thread reads again. Without the hand-over the control thread
// would take every frame (it waits in epoll, where the driver's polls
// cannot see the sockets).
TEST(ControlPlaneTest, AFrameworkThreadDrivingOverTcpReadsTheAnswersItself) {
  CpSet set(2);
  set.setFrameHook(0, [](ControlPlane& cp, int from, FrameType type, const std::string& p) {
    if (type == FrameType::kRequests) cp.send(from, FrameType::kResponses, "re:" + p);
  });
  std::mutex mu;
  std::vector<std::thread::id> readOn;  // the thread that handled each answer on rank 1
  set.setFrameHook(1, [&](ControlPlane&, int, FrameType, const std::string&) {
    std::lock_guard<std::mutex> lk(mu);
    readOn.push_back(std::this_thread::get_id());
  });
  ASSERT_TRUE(set.createAll());
  set.startAll();
  // start() runs on CpSet's control thread: done once that thread runs handlers.
  ASSERT_TRUE(set.onControl(1, [](ControlPlane&) {}));
  ControlPlane& cp = *set.cp(1);
  ASSERT_FALSE(cp.laneUp());
  ASSERT_TRUE(cp.drivable());
  const auto me = std::this_thread::get_id();
  auto answers = [&] {
    std::lock_guard<std::mutex> lk(mu);
    return readOn.size();
  };
  // Each round as a collective between two training steps: the control
  // thread is back in epoll when the wait begins (1 ms after the last one
  // ended), and must hand the sockets over for the answer.
  const int kRounds = 30;
  for (int i = 0; i < kRounds; ++i) {
    std::this_thread::sleep_for(1ms);
    Driving driving(cp);
    const auto deadline = Clock::now() + kDeadline;
    // The request goes out from this thread, as hora_*_async sends it (a
    // control thread still inside a handler refuses: then once more).
    while (!cp.tryDrive([&] { cp.send(0, FrameType::kRequests, tag("q", 1, i)); })) {
      ASSERT_LT(Clock::now(), deadline) << "tryDrive refused request " << i;
      std::this_thread::yield();
    }
    while (answers() < static_cast<size_t>(i + 1)) {
      ASSERT_LT(Clock::now(), deadline) << "no answer to request " << i;
      if (cp.driveOnce() != ControlPlane::DriveRound::kWorked) std::this_thread::yield();
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    const auto here = std::count(readOn.begin(), readOn.end(), me);
    // Every one, however slow the control thread is to wake: the no-op that
    // ends its wait is queued before the request goes out, its run_one()
    // runs one handler (the queue's head, the no-op or one before it), and
    // the answer's completion is queued behind.
    EXPECT_EQ(here, kRounds) << "answers read by the driving thread";
  }
  // The control thread reads again once the driver has gone.
  ASSERT_TRUE(set.onControl(1, [](ControlPlane& cp) { cp.send(0, FrameType::kRequests, "last"); }));
  ASSERT_TRUE(set.events(1).waitFor(
      [&](const Events::Seen& s) { return s.frames.size() == static_cast<size_t>(kRounds + 1); }));
  std::lock_guard<std::mutex> lk(mu);
  EXPECT_NE(readOn.back(), me) << "the last answer came after the driver ended";
}

// A driving thread is the one that sees the coordinator go, and a stop
// posted meanwhile ends the control thread's loop even though it sleeps
// while the thread drives.
TEST(ControlPlaneTest, ADriverOverTcpSeesAPeerLostAndLetsTheLoopStop) {
  CpSet set(2);
  ASSERT_TRUE(set.createAll());
  set.startAll();
  ASSERT_TRUE(set.onControl(1, [](ControlPlane&) {}));  // start() has run
  ControlPlane& cp = *set.cp(1);
  // Ended before the stopper is joined whatever happens (a control thread
  // asleep for it would never return from run()).
  std::optional<Driving> driving(std::in_place, cp);
  set.destroy(0);
  auto deadline = Clock::now() + kDeadline;
  while (!set.events(1).waitForLoss(0, 0ms)) {
    ASSERT_LT(Clock::now(), deadline) << "the driver did not see the coordinator go";
    if (cp.driveOnce() != ControlPlane::DriveRound::kWorked) std::this_thread::yield();
  }
  EXPECT_TRUE(contains(set.events(1).lossFrom(0).why.message(), nameOf(0)));
  EXPECT_EQ(set.events(1).lossFrom(0).thread, std::this_thread::get_id())
      << "the loss was read by the driving thread";
  // stop() posts to the loop; the driver's next rounds run it.
  std::thread stopper([&] { set.stop(1); });
  deadline = Clock::now() + kDeadline;
  while (!cp.io().stopped() && Clock::now() < deadline) {
    cp.driveOnce();
    std::this_thread::yield();
  }
  EXPECT_TRUE(cp.io().stopped()) << "stop() did not reach the driven loop";
  driving.reset();
  stopper.join();  // run() returned (CpSet::stop aborts the binary after 5 s otherwise)
}

TEST(ControlPlaneTest, HeartbeatsKeepAnIdleSetAliveAndAreNotDelivered) {
  CpSet set(3);
  // A timeout of 10 heartbeats, so that a control thread starved for a
  // while on a loaded machine (three share this process) is not taken for a
  // silent peer (300 ms against 50 ms heartbeats was too tight for CI).
  set.setAllOptions([](ControlPlaneOptions& o) {
    o.heartbeatInterval = 100ms;
    o.peerTimeout = 1000ms;
  });
  ASSERT_TRUE(set.createAll());
  set.startAll();
  // 2.5 peer timeouts without traffic: only heartbeats keep the peers from being lost.
  for (int r = 0; r < 3; ++r)
    EXPECT_FALSE(set.events(r).waitFor([](const Events::Seen& s) { return !s.losses.empty(); },
                                       r == 0 ? 2500ms : 0ms))
        << "rank " << r << " lost a peer: " << set.events(r).snapshot().losses[0].why.toString();
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(set.events(r).snapshot().frames.empty()) << "rank " << r;
  // The connections still carry frames.
  ASSERT_TRUE(set.onControl(0, [](ControlPlane& cp) { cp.broadcast(FrameType::kResponses, "x"); }));
  for (int r = 1; r < 3; ++r)
    EXPECT_TRUE(set.events(r).waitFor([](const Events::Seen& s) { return s.frames.size() == 1; }));
}

// ---- peer loss ----

TEST(ControlPlaneTest, StoppedWorkerIsReportedToTheCoordinatorByName) {
  CpSet set(3);
  ASSERT_TRUE(set.createAll());
  set.startAll();
  auto t0 = Clock::now();
  set.stop(2);
  ASSERT_TRUE(set.events(0).waitForLoss(2)) << "coordinator did not notice rank 2 stopping";
  EXPECT_LT(elapsedMs(t0), 2000) << "a closed connection should be seen in milliseconds";
  auto seen = set.events(0).snapshot();
  const Loss* l = Events::lossOf(seen, 2);
  EXPECT_EQ(l->why.code(), Code::kRemoteError);
  EXPECT_TRUE(contains(l->why.message(), nameOf(2) + " at 127.0.0.1:")) << l->why.message();
  // Seen by the pending read (closed) or, rarely, by a heartbeat's write (cannot send).
  EXPECT_TRUE(contains(l->why.message(), "closed its control connection") ||
              contains(l->why.message(), "cannot send to"))
      << l->why.message();
  // The rest of the set is unaffected, and the lost rank is reported only once.
  ASSERT_TRUE(set.onControl(0, [](ControlPlane& cp) {
    cp.broadcast(FrameType::kResponses, "still here");
    cp.send(2, FrameType::kResponses, "to the lost rank: dropped");
  }));
  ASSERT_TRUE(set.events(1).waitFor([](const Events::Seen& s) { return s.frames.size() == 1; }));
  ASSERT_TRUE(set.onControl(1, [](ControlPlane& cp) { cp.send(0, FrameType::kRequests, "r1"); }));
  ASSERT_TRUE(set.events(0).waitFor([](const Events::Seen& s) { return s.frames.size() == 1; }));
  seen = set.events(0).snapshot();
  EXPECT_EQ(seen.losses.size(), 1u);
  EXPECT_EQ(seen.frames[0].from, 1);
  EXPECT_TRUE(set.events(1).snapshot().losses.empty());
  EXPECT_FALSE(set.cp(0)->peersDone()) << "rank 1 is still connected";
}

// A worker still setting the set up (connected, control thread not started)
// asks peersStillConnected() while it waits for the others. A coordinator
// that ended the set (an abort carrying kShutDown, sent after a peer's
// goodbye) does not fail that set-up; one that gave up on it does, at once.
TEST(ControlPlaneTest, ASetUpInProgressFailsOnTheCoordinatorsAbortButNotOnItsGoodbye) {
  CpSet set(2);
  ASSERT_TRUE(set.createAll());
  set.start(0);
  EXPECT_TRUE(set.cp(1)->peersStillConnected().isOk());
  ASSERT_TRUE(set.onControl(0, [](ControlPlane& cp) {
    cp.send(1, FrameType::kAbort, encodeAbort(Status(Code::kShutDown, "rank 2 said goodbye")));
  }));
  std::this_thread::sleep_for(300ms);  // on loopback the frame is there in microseconds
  Status s = set.cp(1)->peersStillConnected();
  EXPECT_TRUE(s.isOk()) << "a set that ends is not a set-up that failed: " << s.toString();
  ASSERT_TRUE(set.onControl(0, [](ControlPlane& cp) {
    cp.send(1, FrameType::kAbort, encodeAbort(Status(Code::kRemoteError, "rank 3 was lost")));
  }));
  const auto t0 = Clock::now();
  while ((s = set.cp(1)->peersStillConnected()).isOk() && elapsedMs(t0) < kDeadline.count())
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(s.code(), Code::kRemoteError) << s.toString();
  EXPECT_TRUE(contains(s.message(), "gave up on process set " + std::string(kSetName)))
      << s.message();
}

TEST(ControlPlaneTest, WorkerDestroyedBeforeItStartedIsReportedToTheCoordinator) {
  CpSet set(2);
  ASSERT_TRUE(set.createAll());
  set.start(0);
  set.destroy(1);  // created, never started: the destructor closes its socket
  ASSERT_TRUE(set.events(0).waitForLoss(1));
  Loss l = set.events(0).lossFrom(1);
  EXPECT_EQ(l.why.code(), Code::kRemoteError);
  EXPECT_TRUE(contains(l.why.message(), nameOf(1))) << l.why.message();
  // Every worker is gone: from the coordinator's view the set is over.
  EXPECT_TRUE(set.waitPeersDone(0));
}

TEST(ControlPlaneTest, StoppedCoordinatorIsReportedToEveryWorker) {
  CpSet set(4);
  ASSERT_TRUE(set.createAll());
  set.startAll();
  set.stop(0);
  auto deadline = Clock::now() + kDeadline;
  for (int r = 1; r < 4; ++r) {
    ASSERT_TRUE(set.events(r).waitForLoss(0)) << "rank " << r;
    auto seen = set.events(r).snapshot();
    ASSERT_EQ(seen.losses.size(), 1u);
    EXPECT_EQ(seen.losses[0].why.code(), Code::kRemoteError);
    EXPECT_TRUE(contains(seen.losses[0].why.message(), nameOf(0))) << seen.losses[0].why.message();
    EXPECT_TRUE(set.waitPeersDone(r, deadline)) << "rank " << r;
  }
}

TEST(ControlPlaneTest, StalledWorkerIsLostAfterThePeerTimeout) {
  CpSet set(3);
  // 10 heartbeats per timeout: rank 1, which keeps heartbeating, must not
  // be lost even if its control thread is starved for a while.
  set.setAllOptions([](ControlPlaneOptions& o) {
    o.heartbeatInterval = 100ms;
    o.peerTimeout = 1000ms;
  });
  ASSERT_TRUE(set.createAll());
  set.startAll();
  ASSERT_TRUE(set.stall(2));  // its sockets stay open: only silence gives it away
  auto t0 = Clock::now();
  ASSERT_TRUE(set.events(0).waitForLoss(2)) << "a silent rank 2 was never declared lost";
  long long ms = elapsedMs(t0);
  // Its last heartbeat may predate the stall by one interval.
  EXPECT_GE(ms, 1000 - 100 - 20) << "declared lost before the peer timeout";
  EXPECT_LT(ms, 5000);
  auto seen = set.events(0).snapshot();
  const Loss* l = Events::lossOf(seen, 2);
  EXPECT_EQ(l->why.code(), Code::kRemoteError);
  EXPECT_TRUE(contains(l->why.message(), nameOf(2))) << l->why.message();
  EXPECT_TRUE(contains(l->why.message(), "sent nothing on the control plane")) << l->why.message();
  EXPECT_EQ(seen.losses.size(), 1u) << "rank 1 kept heartbeating and must not be lost";
  EXPECT_TRUE(set.events(1).snapshot().losses.empty());
  // Woken up, the stalled rank finds its coordinator gone.
  set.unstall(2);
  ASSERT_TRUE(set.events(2).waitForLoss(0));
  EXPECT_EQ(set.events(2).lossFrom(0).why.code(), Code::kRemoteError);
}

TEST(ControlPlaneTest, StalledCoordinatorIsLostByWorkersAfterThePeerTimeout) {
  CpSet set(3);
  set.setAllOptions([](ControlPlaneOptions& o) {
    o.heartbeatInterval = 50ms;
    o.peerTimeout = 300ms;
  });
  ASSERT_TRUE(set.createAll());
  set.startAll();
  ASSERT_TRUE(set.stall(0));
  auto t0 = Clock::now();
  for (int r = 1; r < 3; ++r) {
    ASSERT_TRUE(set.events(r).waitForLoss(0)) << "rank " << r;
    Loss l = set.events(r).lossFrom(0);
    EXPECT_EQ(l.why.code(), Code::kRemoteError);
    EXPECT_TRUE(contains(l.why.message(), "sent nothing")) << l.why.message();
  }
  EXPECT_GE(elapsedMs(t0), 300 - 50 - 20);
}

// ---- graceful goodbye ----

TEST(ControlPlaneTest, WorkersSayGoodbyeFirstThenTheCoordinatorClosesTheSet) {
  CpSet set(4);
  ASSERT_TRUE(set.createAll());
  set.startAll();
  for (int r = 1; r < 4; ++r)
    ASSERT_TRUE(set.onControl(r, [](ControlPlane& cp) { cp.closeGracefully(); }));
  for (int r = 1; r < 4; ++r) ASSERT_TRUE(set.events(0).waitForLoss(r)) << "goodbye of rank " << r;
  auto seen = set.events(0).snapshot();
  ASSERT_EQ(seen.losses.size(), 3u);
  for (const auto& l : seen.losses) {
    EXPECT_EQ(l.why.code(), Code::kShutDown) << l.why.toString();
    EXPECT_TRUE(contains(l.why.message(), nameOf(l.peer) + " at 127.0.0.1:")) << l.why.message();
    EXPECT_TRUE(contains(l.why.message(), "has shut down")) << l.why.message();
  }
  // Every worker said goodbye: over for the coordinator; the workers wait for it to close.
  EXPECT_TRUE(set.waitPeersDone(0));
  for (int r = 1; r < 4; ++r) EXPECT_FALSE(set.cp(r)->peersDone()) << "rank " << r;
  ASSERT_TRUE(set.onControl(0, [](ControlPlane& cp) { cp.closeGracefully(); }));
  auto deadline = Clock::now() + kDeadline;
  for (int r = 1; r < 4; ++r) {
    EXPECT_TRUE(set.waitPeersDone(r, deadline)) << "rank " << r;
    // A closing rank does not report the close it asked for.
    EXPECT_TRUE(set.events(r).snapshot().losses.empty()) << "rank " << r;
  }
  EXPECT_EQ(set.events(0).snapshot().losses.size(), 3u) << "each peer is reported once";
}

TEST(ControlPlaneTest, CoordinatorSaysGoodbyeFirstThenTheWorkers) {
  CpSet set(3);
  ASSERT_TRUE(set.createAll());
  set.startAll();
  ASSERT_TRUE(set.onControl(0, [](ControlPlane& cp) { cp.closeGracefully(); }));
  for (int r = 1; r < 3; ++r) {
    ASSERT_TRUE(set.events(r).waitForLoss(0)) << "rank " << r;
    Loss l = set.events(r).lossFrom(0);
    EXPECT_EQ(l.why.code(), Code::kShutDown) << l.why.toString();
    EXPECT_TRUE(contains(l.why.message(), nameOf(0))) << l.why.message();
  }
  // The coordinator keeps the connections open until every worker said goodbye.
  EXPECT_FALSE(set.cp(0)->peersDone());
  for (int r = 1; r < 3; ++r) EXPECT_FALSE(set.cp(r)->peersDone());
  // Work already agreed can still reach the coordinator after its goodbye.
  ASSERT_TRUE(set.onControl(1, [](ControlPlane& cp) { cp.send(0, FrameType::kRequests, "late"); }));
  ASSERT_TRUE(set.events(0).waitFor([](const Events::Seen& s) { return s.frames.size() == 1; }));
  EXPECT_EQ(set.events(0).snapshot().frames[0].payload, "late");
  for (int r = 1; r < 3; ++r)
    ASSERT_TRUE(set.onControl(r, [](ControlPlane& cp) { cp.closeGracefully(); }));
  auto deadline = Clock::now() + kDeadline;
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(set.waitPeersDone(r, deadline)) << "rank " << r;
  EXPECT_TRUE(set.events(0).snapshot().losses.empty()) << "the coordinator was closing";
  for (int r = 1; r < 3; ++r) EXPECT_EQ(set.events(r).snapshot().losses.size(), 1u);
}

TEST(ControlPlaneTest, EveryRankClosingAtOnceEndsWithPeersDoneEverywhere) {
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    CpSet set(4);
    ASSERT_TRUE(set.createAll());
    set.startAll();
    for (int r = 0; r < 4; ++r)
      boost::asio::post(set.cp(r)->io(), [cp = set.cp(r)] { cp->closeGracefully(); });
    auto deadline = Clock::now() + kDeadline;
    for (int r = 0; r < 4; ++r) EXPECT_TRUE(set.waitPeersDone(r, deadline)) << "rank " << r;
    // Whatever the interleaving, a peer is only ever reported as shut down, at most once.
    for (int r = 0; r < 4; ++r) {
      auto seen = set.events(r).snapshot();
      EXPECT_LE(seen.losses.size(), r == 0 ? 3u : 1u);
      for (const auto& l : seen.losses)
        EXPECT_EQ(l.why.code(), Code::kShutDown) << l.why.toString();
    }
  }
}

// ---- rendezvous ----

TEST(ControlPlaneTest, StrayClientsAtTheRendezvousPortAreDroppedWithoutHarm) {
  CpSet set(3);
  set.beginCreate(0);
  CtrlAddress ctrl;
  ASSERT_TRUE(readCtrlAddress(*set.store(), &ctrl));
  EXPECT_EQ(ctrl.host, "127.0.0.1");
  EXPECT_EQ(ctrl.token.size(), 32u);

  // Rejected at once (closed while the coordinator still waits for its ranks).
  std::vector<std::pair<std::string, std::string>> closedNow = {
      {"junk hello", rawFrame(FrameType::kHello, "definitely not a hello")},
      {"wrong token", rawFrame(FrameType::kHello, helloPayload(1, std::string(32, '0')))},
      {"wrong magic", rawFrame(FrameType::kHello, helloPayload(1, ctrl.token, "hora-ctrl-v0"))},
      {"rank 0", rawFrame(FrameType::kHello, helloPayload(0, ctrl.token))},
      {"rank out of range", rawFrame(FrameType::kHello, helloPayload(3, ctrl.token))},
  };
  for (const auto& c : closedNow) {
    SCOPED_TRACE(c.first);
    RawSocket s = RawSocket::connectTo(ctrl.port);
    ASSERT_TRUE(s.valid());
    ASSERT_TRUE(s.sendAll(c.second));
    EXPECT_TRUE(s.waitClosed()) << "the coordinator kept a bad hello's connection open";
  }
  // Ignored until the rendezvous ends, then closed.
  std::vector<std::pair<std::string, std::string>> closedAtEnd = {
      {"silent", ""},
      {"http", "GET / HTTP/1.1\r\nHost: x\r\n\r\n"},
      {"huge hello", header(5000, static_cast<uint8_t>(FrameType::kHello)) + "x"},
      {"half a header", std::string("\x05\x00", 2)},
  };
  std::vector<RawSocket> lingering;
  for (const auto& c : closedAtEnd) {
    lingering.push_back(RawSocket::connectTo(ctrl.port));
    ASSERT_TRUE(lingering.back().valid()) << c.first;
    ASSERT_TRUE(lingering.back().sendAll(c.second)) << c.first;
  }
  // A stray that hangs up at once.
  { RawSocket gone = RawSocket::connectTo(ctrl.port); }

  set.beginCreate(1);
  set.beginCreate(2);
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(set.finishCreate(r).isOk()) << "rank " << r;
  for (size_t i = 0; i < lingering.size(); ++i)
    EXPECT_TRUE(lingering[i].waitClosed()) << closedAtEnd[i].first << " left open after rendezvous";

  set.startAll();
  for (int r = 1; r < 3; ++r)
    ASSERT_TRUE(set.onControl(
        r, [r](ControlPlane& cp) { cp.send(0, FrameType::kRequests, tag("w", r, 0)); }));
  ASSERT_TRUE(
      set.onControl(0, [](ControlPlane& cp) { cp.broadcast(FrameType::kResponses, "ok"); }));
  ASSERT_TRUE(set.events(0).waitFor([](const Events::Seen& s) { return s.frames.size() == 2; }));
  auto seen = set.events(0).snapshot();
  EXPECT_EQ(framesFrom(seen, 1).at(0).payload, "w1-0");
  EXPECT_EQ(framesFrom(seen, 2).at(0).payload, "w2-0");
  for (int r = 1; r < 3; ++r)
    EXPECT_TRUE(set.events(r).waitFor([](const Events::Seen& s) { return s.frames.size() == 1; }));
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(set.events(r).snapshot().losses.empty()) << "rank " << r;
}

TEST(ControlPlaneTest, MissingWorkerTimesOutNamingIt) {
  CpSet set(3);
  set.setAllOptions([](ControlPlaneOptions& o) { o.startTimeout = 400ms; });
  auto t0 = Clock::now();
  set.beginCreate(0);
  set.beginCreate(1);  // rank 2 never comes
  Status co = set.finishCreate(0);
  Status w1 = set.finishCreate(1);
  EXPECT_LT(elapsedMs(t0), 3000);
  EXPECT_EQ(co.code(), Code::kTimeout) << co.toString();
  EXPECT_TRUE(
      contains(co.message(), "ranks " + std::to_string(kGlobalBase + 2) + " did not connect"))
      << co.message();
  // Rank 1 was accepted but never welcomed: it fails too, by its own deadline or when the
  // failed coordinator closes its connection, whichever comes first.
  EXPECT_FALSE(w1.isOk());
  EXPECT_TRUE(contains(w1.message(), "rank 1")) << w1.message();
}

TEST(ControlPlaneTest, WorkerWithoutCoordinatorTimesOut) {
  CpSet set(2);
  set.options(1).startTimeout = 300ms;
  set.beginCreate(1);
  Status s = set.finishCreate(1);
  EXPECT_EQ(s.code(), Code::kTimeout) << s.toString();
  EXPECT_TRUE(contains(s.message(), "waiting for the coordinator's address")) << s.message();
}

TEST(ControlPlaneTest, MalformedCoordinatorAddressInTheStoreIsAProtocolError) {
  CpSet set(2);
  ASSERT_TRUE(set.store()->set("ctrl", "127.0.0.1 notaport").isOk());
  set.beginCreate(1);
  Status s = set.finishCreate(1);
  EXPECT_EQ(s.code(), Code::kProtocolError) << s.toString();
  EXPECT_TRUE(contains(s.message(), "malformed coordinator address")) << s.message();
}

// ---- fake peers on raw sockets ----

// Rank 1 is played by a raw socket that says a correct hello; returns it
// welcomed. It also answers the lane's set-up exchange, which every rank
// runs after the welcome (lane off: "-").
RawSocket fakeWorker(CpSet& set) {
  CtrlAddress ctrl;
  if (!readCtrlAddress(*set.store(), &ctrl)) return RawSocket();
  RawSocket s = RawSocket::connectTo(ctrl.port);
  if (!s.valid() || !s.sendAll(rawFrame(FrameType::kHello, helloPayload(1, ctrl.token))))
    return RawSocket();
  uint8_t type = 0;
  std::string payload;
  if (!readFrame(s, &type, &payload) || type != static_cast<uint8_t>(FrameType::kWelcome))
    return RawSocket();
  if (!set.store()->set("lane/host/1", "-").isOk()) return RawSocket();
  return s;
}

// whenSent: a rank that found a failure tells its peers before its user can
// exit on it. Frames a peer does not read keep it waiting up to its bound,
// never longer; once the peer reads, it comes as soon as the last byte is out.
TEST(ControlPlaneTest, WhenSentWaitsForQueuedFramesButNotPastItsBound) {
  CpSet set(2);
  set.beginCreate(0);
  RawSocket fake = fakeWorker(set);
  ASSERT_TRUE(fake.valid()) << "the fake worker was not welcomed";
  ASSERT_TRUE(set.finishCreate(0).isOk());
  set.start(0);
  // 16 MiB the fake does not read: more than loopback's socket buffers hold.
  constexpr int kFrames = 32;
  const std::string payload(512 * 1024, 'x');
  auto firstDone = std::make_shared<std::promise<void>>();
  auto first = firstDone->get_future();
  const auto began = Clock::now();
  ASSERT_TRUE(set.onControl(0, [&](ControlPlane& cp) {
    for (int i = 0; i < kFrames; ++i) cp.send(1, FrameType::kResponses, payload);
    cp.whenSent(300ms, [firstDone] { firstDone->set_value(); });
  }));
  ASSERT_EQ(first.wait_for(kDeadline), std::future_status::ready) << "whenSent ignored its bound";
  EXPECT_GE(elapsedMs(began), 290) << "called back with frames still queued for a silent peer";

  // Now the peer reads: the next whenSent comes once everything is out.
  auto secondDone = std::make_shared<std::promise<void>>();
  auto second = secondDone->get_future();
  std::atomic<int> read{0};
  ASSERT_TRUE(set.onControl(0, [&](ControlPlane& cp) {
    cp.whenSent(std::chrono::milliseconds(60000), [secondDone] { secondDone->set_value(); });
  }));
  std::thread reader([&] {
    uint8_t type = 0;
    std::string got;
    while (read.load() < kFrames && readFrame(fake, &type, &got))
      if (type == static_cast<uint8_t>(FrameType::kResponses)) ++read;
  });
  ASSERT_EQ(second.wait_for(kDeadline), std::future_status::ready)
      << "whenSent never came after the peer read everything";
  reader.join();
  EXPECT_EQ(read.load(), kFrames);
}

struct BadFrame {
  const char* name;
  std::string bytes;
};

void PrintTo(const BadFrame& f, std::ostream* os) { *os << f.name; }

class MalformedFrameTest : public ::testing::TestWithParam<BadFrame> {};

TEST_P(MalformedFrameTest, FromAWorkerMakesTheCoordinatorLoseIt) {
  CpSet set(2);
  set.beginCreate(0);
  RawSocket fake = fakeWorker(set);
  ASSERT_TRUE(fake.valid()) << "the fake worker was not welcomed";
  ASSERT_TRUE(set.finishCreate(0).isOk());
  set.start(0);
  // A good frame first: the connection works until the bad one.
  ASSERT_TRUE(fake.sendAll(rawFrame(FrameType::kRequests, "fine")));
  ASSERT_TRUE(set.events(0).waitFor([](const Events::Seen& s) { return s.frames.size() == 1; }));
  EXPECT_EQ(set.events(0).snapshot().frames[0].payload, "fine");
  ASSERT_TRUE(fake.sendAll(GetParam().bytes));
  ASSERT_TRUE(set.events(0).waitForLoss(1));
  auto seen = set.events(0).snapshot();
  ASSERT_EQ(seen.losses.size(), 1u);
  EXPECT_EQ(seen.losses[0].why.code(), Code::kProtocolError) << seen.losses[0].why.toString();
  EXPECT_TRUE(contains(seen.losses[0].why.message(), "malformed control frame from " + nameOf(1)))
      << seen.losses[0].why.message();
  EXPECT_EQ(seen.frames.size(), 1u) << "nothing after the bad header may be delivered";
  EXPECT_TRUE(fake.waitClosed()) << "the coordinator kept the garbling peer's socket open";
  EXPECT_TRUE(set.waitPeersDone(0));
}

TEST_P(MalformedFrameTest, FromTheCoordinatorMakesAWorkerLoseIt) {
  CpSet set(2);
  RawListener listener;
  ASSERT_GT(listener.port(), 0);
  ASSERT_TRUE(
      set.store()->set("ctrl", "127.0.0.1 " + std::to_string(listener.port()) + " tok3n").isOk());
  set.beginCreate(1);
  RawSocket fake = listener.accept();
  ASSERT_TRUE(fake.valid()) << "rank 1 never connected to the published address";
  // The worker's hello: magic, its rank, the published token.
  uint8_t type = 0;
  std::string hello;
  ASSERT_TRUE(readFrame(fake, &type, &hello));
  EXPECT_EQ(type, static_cast<uint8_t>(FrameType::kHello));
  ByteReader rd(hello);
  std::string magic, token;
  int32_t rank = -1;
  ASSERT_TRUE(rd.str(&magic, "magic").isOk());
  ASSERT_TRUE(rd.i32(&rank, "rank").isOk());
  ASSERT_TRUE(rd.str(&token, "token").isOk());
  EXPECT_EQ(magic, "hora-ctrl-v1");
  EXPECT_EQ(rank, 1);
  EXPECT_EQ(token, "tok3n");
  ASSERT_TRUE(fake.sendAll(rawFrame(FrameType::kWelcome, "")));
  // The lane's set-up, as a coordinator says it stays off.
  ASSERT_TRUE(set.store()->set("lane/kernels", "0,0").isOk());
  ASSERT_TRUE(set.store()->set("lane/path", "tcp the fake coordinator has no lane").isOk());
  ASSERT_TRUE(set.finishCreate(1).isOk());
  set.start(1);
  // Started, the worker heartbeats: empty frames of type heartbeat.
  std::string payload;
  ASSERT_TRUE(readFrame(fake, &type, &payload));
  EXPECT_EQ(type, static_cast<uint8_t>(FrameType::kHeartbeat));
  EXPECT_EQ(payload, "");
  ASSERT_TRUE(fake.sendAll(rawFrame(FrameType::kResponses, "fine")));
  ASSERT_TRUE(set.events(1).waitFor([](const Events::Seen& s) { return s.frames.size() == 1; }));
  ASSERT_TRUE(fake.sendAll(GetParam().bytes));
  ASSERT_TRUE(set.events(1).waitForLoss(0));
  auto seen = set.events(1).snapshot();
  ASSERT_EQ(seen.losses.size(), 1u);
  EXPECT_EQ(seen.losses[0].why.code(), Code::kProtocolError) << seen.losses[0].why.toString();
  EXPECT_TRUE(contains(seen.losses[0].why.message(), "malformed control frame from " + nameOf(0)))
      << seen.losses[0].why.message();
  EXPECT_TRUE(fake.waitClosed());
  EXPECT_TRUE(set.waitPeersDone(1));
}

INSTANTIATE_TEST_SUITE_P(Frames, MalformedFrameTest,
                         ::testing::Values(BadFrame{"AbsurdLength", header(0xFFFFFFFFu, 3) + "xyz"},
                                           BadFrame{"JustOver64MiB", header((64u << 20) + 1, 3)},
                                           BadFrame{"ZeroLength", header(0, 3)},
                                           BadFrame{"TypeZero", header(1, 0)},
                                           BadFrame{"UnknownType", header(4, 10) + "abc"},
                                           BadFrame{"HttpRequest", "GET / HTTP/1.1\r\n\r\n"}),
                         [](const ::testing::TestParamInfo<BadFrame>& i) { return i.param.name; });

TEST(ControlPlaneTest, WorkerClosingMidFrameIsLost) {
  CpSet set(2);
  set.beginCreate(0);
  RawSocket fake = fakeWorker(set);
  ASSERT_TRUE(fake.valid());
  ASSERT_TRUE(set.finishCreate(0).isOk());
  set.start(0);
  ASSERT_TRUE(fake.sendAll(header(100, static_cast<uint8_t>(FrameType::kRequests)) + "partial"));
  fake.close();
  ASSERT_TRUE(set.events(0).waitForLoss(1));
  Loss l = set.events(0).lossFrom(1);
  EXPECT_EQ(l.why.code(), Code::kRemoteError) << l.why.toString();
  EXPECT_TRUE(contains(l.why.message(), "mid-message")) << l.why.message();
  EXPECT_TRUE(set.events(0).snapshot().frames.empty());
}

TEST(ControlPlaneTest, CoordinatorThatDoesNotWelcomeFailsTheWorkersCreate) {
  CpSet set(2);
  RawListener listener;
  ASSERT_TRUE(
      set.store()->set("ctrl", "127.0.0.1 " + std::to_string(listener.port()) + " t").isOk());
  set.beginCreate(1);
  RawSocket fake = listener.accept();
  ASSERT_TRUE(fake.valid());
  uint8_t type = 0;
  std::string hello;
  ASSERT_TRUE(readFrame(fake, &type, &hello));
  ASSERT_TRUE(fake.sendAll(rawFrame(FrameType::kAbort, "")));
  Status s = set.finishCreate(1);
  EXPECT_EQ(s.code(), Code::kProtocolError) << s.toString();
  EXPECT_TRUE(contains(s.message(), "refused rank 1")) << s.message();
}

}  // namespace
}  // namespace hora
