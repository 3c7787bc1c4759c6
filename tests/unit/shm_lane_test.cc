// The shared-memory negotiation lane (issue 20): ShmMailbox (core/shm_mailbox.h)
// alone, ShmLane (controllers/shm_lane.h) with both ends in one thread, and
// ControlPlanes with the lane up, ranks as threads over a MemoryStore
// (sizes 2-4): frames in order through rings smaller than the frames,
// the order of lane frames against TCP frames and a lost peer, and the
// set-up's fallback to TCP with its reason. Every wait has a deadline.
#include "controllers/shm_lane.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "controllers/control_plane.h"
#include "core/memory_store.h"
#include "core/shm_mailbox.h"

namespace hora {
namespace {

using namespace std::chrono_literals;
constexpr auto kDeadline = 5000ms;

std::string uniqueName(const std::string& what) {
  static int n = 0;
  return "hora-lane-test-" + what + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

std::string pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 31 + seed) % 251);
  return s;
}

// ---- ShmMailbox ----

TEST(ShmMailboxTest, RingsCarryBytesInOrderAcrossTheWrap) {
  auto m = ShmMailbox::create("/dev/shm", uniqueName("wrap"), 3, 4096);
  ASSERT_TRUE(m.isOk()) << m.status().toString();
  auto peer = ShmMailbox::open(m.value()->path(), 3);
  ASSERT_TRUE(peer.isOk()) << peer.status().toString();
  ShmMailbox& a = *m.value();
  ShmMailbox& b = *peer.value();
  const std::string data = pattern(3000, 1);
  std::string got;
  for (int round = 0; round < 5; ++round) {  // 15000 bytes through 4096: wraps several times
    EXPECT_EQ(a.write(ShmMailbox::downRing(2), data.data(), data.size()), data.size());
    EXPECT_EQ(b.readable(ShmMailbox::downRing(2)), data.size());
    EXPECT_EQ(b.readable(ShmMailbox::upRing(2)), 0u);  // other rings untouched
    std::string buf(data.size(), '\0');
    EXPECT_EQ(b.read(ShmMailbox::downRing(2), &buf[0], buf.size()), data.size());
    EXPECT_EQ(buf, data);
  }
  // A full ring takes only what fits.
  const std::string big = pattern(5000, 2);
  EXPECT_EQ(a.write(ShmMailbox::upRing(1), big.data(), big.size()), 4096u);
  EXPECT_EQ(a.write(ShmMailbox::upRing(1), big.data(), big.size()), 0u);
  // Polling words are shared.
  a.polling(1).store(1);
  EXPECT_EQ(b.polling(1).load(), 1u);
  EXPECT_EQ(b.polling(2).load(), 0u);
}

TEST(ShmMailboxTest, OpenChecksTheHeaderAndCreateRefusesBadSizes) {
  auto m = ShmMailbox::create("/dev/shm", uniqueName("hdr"), 2, 4096);
  ASSERT_TRUE(m.isOk());
  EXPECT_FALSE(ShmMailbox::open(m.value()->path(), 3).isOk()) << "rank count differs";
  EXPECT_FALSE(ShmMailbox::open("/dev/shm/" + uniqueName("missing"), 2).isOk());
  EXPECT_FALSE(ShmMailbox::create("/dev/shm", uniqueName("bad"), 2, 5000).isOk());
  m.value()->unlink();
  EXPECT_FALSE(ShmMailbox::open(m.value()->path(), 2).isOk()) << "unlinked";
}

// ---- ShmLane, both ends in this thread ----

struct LanePair {
  std::unique_ptr<ShmLane> coord, worker;
  std::vector<std::pair<int, std::string>> gotCoord, gotWorker;  // (type, payload)
  std::vector<Status> bad;
  std::vector<int> rungByCoord, rungByWorker;
  ShmLane::Handlers handlers(bool coordinator) {
    ShmLane::Handlers h;
    auto* got = coordinator ? &gotCoord : &gotWorker;
    auto* rung = coordinator ? &rungByCoord : &rungByWorker;
    h.deliver = [got](int, FrameType t, std::string p) {
      got->emplace_back(static_cast<int>(t), std::move(p));
    };
    h.bad = [this](int, Status why) { bad.push_back(why); };
    h.ring = [rung](int peer) { rung->push_back(peer); };
    return h;
  }
};

LanePair makePair(uint64_t ringBytes) {
  auto m = ShmMailbox::create("/dev/shm", uniqueName("lane"), 2, ringBytes);
  EXPECT_TRUE(m.isOk());
  auto w = ShmMailbox::open(m.value()->path(), 2);
  EXPECT_TRUE(w.isOk());
  m.value()->unlink();
  LanePair p;
  p.coord = std::make_unique<ShmLane>(m.take(), 0);
  p.worker = std::make_unique<ShmLane>(w.take(), 1);
  return p;
}

TEST(ShmLaneTest, FramesLargerThanTheRingArriveWholeAndInOrder) {
  LanePair p = makePair(4096);
  p.coord->setPolling(true);
  std::vector<std::string> sent;
  for (int i = 0; i < 20; ++i) sent.push_back(pattern(static_cast<size_t>(i * 997), i));
  for (const auto& s : sent) p.worker->send(0, FrameType::kRequests, s);
  EXPECT_TRUE(p.worker->hasPending());
  for (int i = 0; i < 1000 && p.gotCoord.size() < sent.size(); ++i) {
    p.worker->poll(p.handlers(false));
    p.coord->poll(p.handlers(true));
  }
  ASSERT_EQ(p.gotCoord.size(), sent.size());
  for (size_t i = 0; i < sent.size(); ++i) {
    EXPECT_EQ(p.gotCoord[i].first, static_cast<int>(FrameType::kRequests));
    EXPECT_TRUE(p.gotCoord[i].second == sent[i]) << "frame " << i;
  }
  EXPECT_FALSE(p.worker->hasPending());
  EXPECT_TRUE(p.bad.empty());
}

TEST(ShmLaneTest, AWriterRingsOnlyAReaderThatDoesNotPoll) {
  LanePair p = makePair(4096);
  p.worker->setPolling(true);
  EXPECT_FALSE(p.coord->send(1, FrameType::kResponses, "a")) << "the worker polls";
  p.worker->setPolling(false);
  EXPECT_TRUE(p.coord->send(1, FrameType::kResponses, "b")) << "the worker may sleep";
  EXPECT_TRUE(p.worker->hasInput());
  p.worker->poll(p.handlers(false));
  ASSERT_EQ(p.gotWorker.size(), 2u);
  EXPECT_EQ(p.gotWorker[0].second, "a");
  EXPECT_EQ(p.gotWorker[1].second, "b");
  EXPECT_FALSE(p.worker->hasInput());
}

TEST(ShmLaneTest, ARankBusyElsewhereIsSeenAliveByItsPeer) {
  LanePair p = makePair(4096);
  EXPECT_EQ(p.coord->aliveAt(1).time_since_epoch().count(), 0) << "never marked";
  const auto before = std::chrono::steady_clock::now();
  p.worker->markAlive();
  const auto seen = p.coord->aliveAt(1);
  EXPECT_GE(seen, before);
  EXPECT_LE(seen, std::chrono::steady_clock::now());
  EXPECT_EQ(p.worker->aliveAt(0).time_since_epoch().count(), 0) << "the coordinator never was";
}

TEST(ShmLaneTest, AMalformedStreamIsReportedOnceAndDropped) {
  LanePair p = makePair(4096);
  const char garbage[8] = {0, 0, 0, 0, 42, 1, 2, 3};  // length 0, type 42
  p.worker->mailbox().write(ShmMailbox::upRing(1), garbage, sizeof garbage);
  p.coord->poll(p.handlers(true));
  ASSERT_EQ(p.bad.size(), 1u);
  EXPECT_EQ(p.bad[0].code(), Code::kProtocolError);
  p.worker->send(0, FrameType::kRequests, "after");
  p.coord->poll(p.handlers(true));
  EXPECT_TRUE(p.gotCoord.empty()) << "a dropped stream delivers nothing more";
  EXPECT_EQ(p.bad.size(), 1u);
}

// ---- ControlPlanes with the lane, ranks as threads ----

struct Seen {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<FrameType, std::string>> frames;
  std::vector<Status> losses;
};

class LaneSet {
 public:
  LaneSet(int size, std::function<void(int, ControlPlaneOptions&)> tweak = nullptr)
      : store_(std::make_shared<MemoryStore>()), seen_(size) {
    std::vector<std::thread> creators;
    cps_.resize(size);
    for (int r = 0; r < size; ++r)
      creators.emplace_back([this, r, size, tweak] {
        ControlPlaneOptions o;
        o.rank = r;
        o.size = size;
        for (int i = 0; i < size; ++i) o.globalRanks.push_back(i);
        o.startTimeout = kDeadline;
        o.heartbeatInterval = 50ms;
        o.peerTimeout = kDeadline;
        o.setName = "lane-test";
        o.shmLane = true;
        o.hostId = "this-host";
        o.laneRingBytes = 4096;  // frames larger than the ring stream through it
        o.spin.window = 200us;
        o.spin.yield = true;
        if (tweak) tweak(r, o);
        auto cp = ControlPlane::create(store_, o, Logger(LogLevel::kError, "[lane-test]"));
        EXPECT_TRUE(cp.isOk()) << cp.status().toString();
        if (cp.isOk()) cps_[r] = cp.take();
      });
    for (auto& t : creators) t.join();
    for (int r = 0; r < size; ++r) {
      if (!cps_[r]) continue;
      threads_.emplace_back([this, r] {
        ControlPlaneCallbacks cb;
        cb.onFrame = [this, r](int, FrameType t, std::string p) {
          std::lock_guard<std::mutex> lk(seen_[r].mu);
          seen_[r].frames.emplace_back(t, std::move(p));
          seen_[r].cv.notify_all();
        };
        cb.onPeerLost = [this, r](int, Status why) {
          std::lock_guard<std::mutex> lk(seen_[r].mu);
          seen_[r].losses.push_back(why);
          seen_[r].cv.notify_all();
        };
        cps_[r]->start(std::move(cb));
        cps_[r]->run();
      });
    }
  }
  ~LaneSet() {
    for (int r = 0; r < static_cast<int>(cps_.size()); ++r) stop(r);
  }
  void stop(int r) {
    if (!cps_[r] || stopped_.count(r)) return;
    stopped_.insert(r);
    cps_[r]->stop();
    threads_[r].join();
    cps_[r].reset();
  }
  ControlPlane& cp(int r) { return *cps_[r]; }
  bool created(int r) const { return cps_[r] != nullptr; }
  bool onControl(int r, std::function<void(ControlPlane&)> fn) {
    auto done = std::make_shared<std::promise<void>>();
    auto fut = done->get_future();
    ControlPlane* cp = cps_[r].get();
    cp->post([cp, fn, done] {
      fn(*cp);
      done->set_value();
    });
    return fut.wait_for(kDeadline) == std::future_status::ready;
  }
  bool waitFrames(int r, size_t n, std::chrono::milliseconds within = kDeadline) {
    std::unique_lock<std::mutex> lk(seen_[r].mu);
    return seen_[r].cv.wait_for(lk, within, [&] { return seen_[r].frames.size() >= n; });
  }
  bool waitLoss(int r) {
    std::unique_lock<std::mutex> lk(seen_[r].mu);
    return seen_[r].cv.wait_for(lk, kDeadline, [&] { return !seen_[r].losses.empty(); });
  }
  std::vector<std::pair<FrameType, std::string>> frames(int r) {
    std::lock_guard<std::mutex> lk(seen_[r].mu);
    return seen_[r].frames;
  }

 private:
  std::shared_ptr<MemoryStore> store_;
  std::vector<std::unique_ptr<ControlPlane>> cps_;
  std::vector<std::thread> threads_;
  std::vector<Seen> seen_;
  std::set<int> stopped_;
};

class LaneSizes : public ::testing::TestWithParam<int> {};

TEST_P(LaneSizes, NegotiationFramesTravelTheLaneInOrderBothWays) {
  const int size = GetParam();
  LaneSet set(size);
  for (int r = 0; r < size; ++r) EXPECT_TRUE(set.cp(r).laneUp()) << set.cp(r).laneStatus();
  const int kCount = 30;
  for (int r = 1; r < size; ++r)
    ASSERT_TRUE(set.onControl(r, [r](ControlPlane& cp) {
      for (int i = 0; i < kCount; ++i)
        cp.send(0, FrameType::kRequests, std::to_string(r) + ":" + pattern(i * 300, r));
    }));
  ASSERT_TRUE(set.waitFrames(0, static_cast<size_t>((size - 1) * kCount)));
  std::vector<int> next(size, 0);
  for (const auto& f : set.frames(0)) {
    EXPECT_EQ(f.first, FrameType::kRequests);
    const int r = std::stoi(f.second.substr(0, f.second.find(':')));
    EXPECT_TRUE(f.second == std::to_string(r) + ":" + pattern(next[r] * 300, r))
        << "frame " << next[r] << " of rank " << r;
    ++next[r];
  }
  // Back: responses through the lane, then an abort over TCP: the order holds.
  ASSERT_TRUE(set.onControl(0, [](ControlPlane& cp) {
    for (int i = 0; i < kCount; ++i) cp.broadcast(FrameType::kResponses, pattern(i * 500, i));
    cp.broadcast(FrameType::kAbort, "after the responses");
  }));
  for (int r = 1; r < size; ++r) {
    ASSERT_TRUE(set.waitFrames(r, kCount + 1)) << "rank " << r;
    auto got = set.frames(r);
    ASSERT_EQ(got.size(), static_cast<size_t>(kCount + 1));
    for (int i = 0; i < kCount; ++i) {
      EXPECT_EQ(got[i].first, FrameType::kResponses);
      EXPECT_TRUE(got[i].second == pattern(i * 500, i)) << "response " << i << " on rank " << r;
    }
    EXPECT_EQ(got[kCount].first, FrameType::kAbort);
  }
}

TEST_P(LaneSizes, AWorkerLostRightAfterItsLastRequestsIsReportedAfterThem) {
  const int size = GetParam();
  LaneSet set(size, [](int, ControlPlaneOptions& o) { o.spin.window = 0us; });  // sleep at once
  const int last = size - 1;
  ASSERT_TRUE(set.onControl(last, [](ControlPlane& cp) {
    for (int i = 0; i < 5; ++i) cp.send(0, FrameType::kRequests, "last words " + std::to_string(i));
  }));
  set.stop(last);  // its sockets close: the coordinator loses it
  ASSERT_TRUE(set.waitLoss(0));
  auto got = set.frames(0);
  ASSERT_EQ(got.size(), 5u) << "every request sent before the loss arrives first";
  EXPECT_EQ(got[4].second, "last words 4");
}

// A framework thread driving the worker's set (HORA_CALLER_DRIVES) counts as
// polling its lane, so the coordinator does not ring for what it writes. If
// that thread stops driving while another thread holds the drive lock (one
// that already made its last look at the lane), the frame is nobody's but
// the control thread's, asleep: endDriving must wake it. Without that the
// frame waited for the next heartbeat (10 s here).
TEST(ShmLaneDriveTest, AFrameForADriverThatLeavesWhileTheLockIsHeldIsStillRead) {
  LaneSet set(2, [](int, ControlPlaneOptions& o) {
    o.spin.window = 0us;  // control threads sleep as soon as they are idle
    o.heartbeatInterval = 10s;
  });
  ControlPlane& worker = set.cp(1);
  std::this_thread::sleep_for(20ms);  // the worker's control thread asleep
  worker.beginDriving();
  std::promise<void> held, release;
  std::thread other([&] {
    worker.driveLock().lock();
    held.set_value();
    release.get_future().wait();
    worker.driveLock().unlock();
  });
  held.get_future().wait();
  ASSERT_TRUE(set.onControl(
      0, [](ControlPlane& cp) { cp.send(1, FrameType::kResponses, "for the driver"); }));
  worker.endDriving();
  release.set_value();
  other.join();
  EXPECT_TRUE(set.waitFrames(1, 1, 2000ms)) << "the frame was left unread";
}

INSTANTIATE_TEST_SUITE_P(Sizes, LaneSizes, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "size" + std::to_string(i.param);
                         });

TEST(ShmLaneSetUpTest, RanksOnDifferentHostsNegotiateOverTcpAndSayWhy) {
  LaneSet set(3, [](int r, ControlPlaneOptions& o) {
    if (r == 2) o.hostId = "another-host";
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(set.cp(r).laneUp());
    EXPECT_NE(set.cp(r).laneStatus().find("more than one host"), std::string::npos)
        << set.cp(r).laneStatus();
  }
  ASSERT_TRUE(set.onControl(1, [](ControlPlane& cp) { cp.send(0, FrameType::kRequests, "tcp"); }));
  ASSERT_TRUE(set.waitFrames(0, 1));
  EXPECT_EQ(set.frames(0)[0].second, "tcp");
}

// Ranks on "hosts" of their own that share one kernel (network and UTS
// namespaces, containers: one boot id) share its cores: every rank learns
// how many of the set do, whether or not the lane comes up.
TEST(ShmLaneSetUpTest, EveryRankLearnsHowManyRanksShareItsKernel) {
  LaneSet set(4, [](int r, ControlPlaneOptions& o) {
    o.hostId = std::string(r < 2 ? "host-a" : "host-b") + "/" + (r == 3 ? "boot-2" : "boot-1");
  });
  const int want[4] = {3, 3, 3, 1};
  for (int r = 0; r < 4; ++r) {
    EXPECT_FALSE(set.cp(r).laneUp()) << "rank " << r;
    EXPECT_EQ(set.cp(r).kernelMates(), want[r]) << "rank " << r;
  }
}

TEST(ShmLaneSetUpTest, KernelMatesCountBootIdsAndReadTheirListSafely) {
  EXPECT_EQ(kernelMatesByRank({"h0/a", "h1/a", "h2/b", "-", "id:x", "address:10.0.0.1", "h3/a"}),
            (std::vector<int>{3, 3, 1, 0, 0, 0, 3}));
  EXPECT_EQ(kernelMatesOf("3,3,1,0", 0), 3);
  EXPECT_EQ(kernelMatesOf("3,3,1,0", 2), 1);
  EXPECT_EQ(kernelMatesOf("3,3,1,0", 3), 0);
  EXPECT_EQ(kernelMatesOf("3,3,1,0", 4), 0);  // past the list
  EXPECT_EQ(kernelMatesOf("3,x,1", 1), 0);    // malformed
  EXPECT_EQ(kernelMatesOf("3,,1", 1), 0);
  EXPECT_EQ(kernelMatesOf("", 0), 0);
  EXPECT_EQ(kernelMatesOf("12345678901", 0), 0);  // too long for a count
}

TEST(ShmLaneSetUpTest, ARankWithTheLaneOffKeepsTheWholeSetOnTcp) {
  LaneSet set(2, [](int r, ControlPlaneOptions& o) {
    if (r == 1) o.hostId.clear();
  });
  EXPECT_FALSE(set.cp(0).laneUp());
  EXPECT_NE(set.cp(0).laneStatus().find("HORA_SHM_NEGOTIATION=0"), std::string::npos)
      << set.cp(0).laneStatus();
  ASSERT_TRUE(set.onControl(0, [](ControlPlane& cp) { cp.send(1, FrameType::kResponses, "x"); }));
  ASSERT_TRUE(set.waitFrames(1, 1));
}

// HORA_SHM_NEGOTIATION=0 on one rank only: the set still decides together,
// at once (that rank once skipped the exchange, and the others waited their
// start timeout for it), and names the rank; with it off everywhere the
// ranks still learn their kernel mates.
TEST(ShmLaneSetUpTest, NegotiationOffOnSomeRanksKeepsTheSetOnTcpAtOnceAndCountsKernelMates) {
  for (const bool offEverywhere : {false, true}) {
    const auto t0 = std::chrono::steady_clock::now();
    LaneSet set(3, [&](int r, ControlPlaneOptions& o) {
      o.startTimeout = 3s;
      o.hostId = "host-a/boot-1";
      if (r == 1 || offEverywhere) o.shmLane = false;
    });
    const auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_LT(took, 2s) << "the set-up waited for a rank";
    for (int r = 0; r < 3; ++r) ASSERT_TRUE(set.created(r)) << "rank " << r;
    for (int r = 0; r < 3; ++r) {
      EXPECT_FALSE(set.cp(r).laneUp()) << "rank " << r;
      EXPECT_NE(set.cp(r).laneStatus().find("HORA_SHM_NEGOTIATION=0"), std::string::npos)
          << "rank " << r << ": " << set.cp(r).laneStatus();
      EXPECT_EQ(set.cp(r).kernelMates(), 3) << "rank " << r;
    }
    ASSERT_TRUE(
        set.onControl(2, [](ControlPlane& cp) { cp.send(0, FrameType::kRequests, "tcp"); }));
    ASSERT_TRUE(set.waitFrames(0, 1));
  }
}

// A store for a rank that dies during the lane's set-up: its first write
// there fails, so its create() returns and its control connections close.
class DiesAtLaneSetUp : public Store {
 public:
  explicit DiesAtLaneSetUp(std::shared_ptr<Store> base) : base_(std::move(base)) {}
  Status set(const std::string& key, const std::string& value) override {
    if (key.rfind("lane/", 0) == 0) return Status(Code::kSystemError, "this rank died here");
    return base_->set(key, value);
  }
  Result<std::string> get(const std::string& key, std::chrono::milliseconds timeout) override {
    return base_->get(key, timeout);
  }
  Result<int64_t> add(const std::string& key, int64_t delta) override {
    return base_->add(key, delta);
  }
  Status wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    return base_->wait(keys, timeout);
  }
  Result<bool> check(const std::string& key) override { return base_->check(key); }
  Status remove(const std::string& key) override { return base_->remove(key); }

 private:
  std::shared_ptr<Store> base_;
};

// A rank that dies after the TCP rendezvous, before it says which host it is
// on: the coordinator, waiting for that in the store, sees its control
// connection close and fails at once naming it, and tells the worker still
// waiting for the lane's path; neither waits for the 20 s start timeout.
TEST(ShmLaneSetUpTest, ARankLostDuringTheLaneSetUpFailsTheOthersAtOnceNamingIt) {
  auto store = std::make_shared<MemoryStore>();
  std::vector<Status> results(3);
  std::vector<std::thread> creators;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < 3; ++r)
    creators.emplace_back([&, r] {
      ControlPlaneOptions o;
      o.rank = r;
      o.size = 3;
      for (int i = 0; i < 3; ++i) o.globalRanks.push_back(i);
      o.startTimeout = 20s;
      o.heartbeatInterval = 50ms;
      o.peerTimeout = 20s;
      o.setName = "lane-test";
      o.shmLane = true;
      o.hostId = "this-host";
      std::shared_ptr<Store> s = store;
      if (r == 2) s = std::make_shared<DiesAtLaneSetUp>(store);
      auto cp = ControlPlane::create(s, o, Logger(LogLevel::kError, "[lane-test]"));
      results[r] = cp.status();
    });
  for (auto& t : creators) t.join();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  EXPECT_FALSE(results[2].isOk());
  EXPECT_EQ(results[0].code(), Code::kRemoteError) << results[0].toString();
  EXPECT_NE(results[0].message().find("rank 2"), std::string::npos) << results[0].message();
  EXPECT_NE(results[0].message().find("closed its control connection"), std::string::npos)
      << results[0].message();
  EXPECT_EQ(results[1].code(), Code::kRemoteError) << results[1].toString();
  EXPECT_NE(results[1].message().find("the coordinator"), std::string::npos)
      << results[1].message();
  EXPECT_NE(results[1].message().find("rank 2"), std::string::npos) << results[1].message();
}

TEST(ShmLaneSetUpTest, AMailboxThatCannotBeCreatedFallsBackToTcp) {
  LaneSet set(2, [](int, ControlPlaneOptions& o) { o.laneDir = "/nonexistent-dir"; });
  EXPECT_FALSE(set.cp(0).laneUp());
  EXPECT_FALSE(set.cp(1).laneUp());
  EXPECT_NE(set.cp(1).laneStatus().find("negotiation mailbox"), std::string::npos)
      << set.cp(1).laneStatus();
}

}  // namespace
}  // namespace hora
