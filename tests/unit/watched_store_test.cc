// WatchedStore (core/store.h): waits that end as soon as the check says a
// peer is gone, and that pass straight through once disarmed; and
// exchangeValues, the collective every data plane's set-up agrees through.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/memory_store.h"
#include "core/store.h"

namespace hora {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Watched {
  std::shared_ptr<MemoryStore> base = std::make_shared<MemoryStore>();
  std::shared_ptr<std::atomic<bool>> armed = std::make_shared<std::atomic<bool>>(true);
  std::atomic<int> checks{0};
  std::atomic<int> failAfter{1 << 30};  // checks before the check reports a loss
  std::shared_ptr<WatchedStore> store = std::make_shared<WatchedStore>(
      base,
      [this] {
        return ++checks > failAfter ? Status(Code::kRemoteError, "rank 7 is gone") : Status::ok();
      },
      armed, 20ms);
};

TEST(WatchedStoreTest, AWaitEndsWithTheChecksErrorOnceItReportsALoss) {
  Watched w;
  w.failAfter = 3;
  const auto t0 = Clock::now();
  Status s = w.store->wait({"never"}, 30s);
  EXPECT_LT(secondsSince(t0), 5.0);
  EXPECT_EQ(s.code(), Code::kRemoteError) << s.toString();
  EXPECT_NE(s.message().find("rank 7 is gone"), std::string::npos) << s.message();
  EXPECT_EQ(w.checks.load(), 4);
  auto g = w.store->get("never", 30s);
  ASSERT_FALSE(g.isOk());
  EXPECT_EQ(g.status().code(), Code::kRemoteError) << g.status().toString();
}

// A peer that writes what the others wait for (a coordinator's reason for
// giving up) and then closes its connection: a waiter whose slice ended just
// before the write sees the closed connection first, but returns the value,
// which says more (the race ShmLaneSetUpTest.ARankLostDuringTheLaneSetUp...
// lost once in a full ctest run).
TEST(WatchedStoreTest, AValueWrittenBeforeThePeerClosedWinsOverTheLoss) {
  auto base = std::make_shared<MemoryStore>();
  auto armed = std::make_shared<std::atomic<bool>>(true);
  WatchedStore store(
      base,
      [&] {
        EXPECT_TRUE(base->set("why", "rank 2 died").isOk());
        return Status(Code::kRemoteError, "the coordinator closed its connection");
      },
      armed, 20ms);
  auto g = store.get("why", 30s);
  ASSERT_TRUE(g.isOk()) << g.status().toString();
  EXPECT_EQ(g.value(), "rank 2 died");
  // Nothing written: the loss stands.
  WatchedStore lost(
      base, [] { return Status(Code::kRemoteError, "the coordinator closed its connection"); },
      armed, 20ms);
  Status s = lost.wait({"never"}, 30s);
  EXPECT_EQ(s.code(), Code::kRemoteError) << s.toString();
}

TEST(WatchedStoreTest, KeysThatArriveMeanwhileAreReturnedAndTimeoutsKeepTheirBound) {
  Watched w;
  std::thread late([&] {
    std::this_thread::sleep_for(100ms);
    ASSERT_TRUE(w.base->set("late", "v").isOk());
  });
  auto g = w.store->get("late", 10s);
  late.join();
  ASSERT_TRUE(g.isOk()) << g.status().toString();
  EXPECT_EQ(g.value(), "v");
  // Nobody reports a loss: the wait still ends by its own bound, as a timeout.
  const auto t0 = Clock::now();
  Status s = w.store->wait({"never"}, 200ms);
  EXPECT_EQ(s.code(), Code::kTimeout) << s.toString();
  EXPECT_GE(secondsSince(t0), 0.19);
  EXPECT_LT(secondsSince(t0), 3.0);
}

TEST(WatchedStoreTest, DisarmedEveryCallPassesStraightThrough) {
  Watched w;
  w.failAfter = 0;  // would fail at the first check
  w.armed->store(false);
  Status s = w.store->wait({"never"}, 150ms);
  EXPECT_EQ(s.code(), Code::kTimeout) << s.toString();
  EXPECT_EQ(w.checks.load(), 0);
  ASSERT_TRUE(w.store->set("k", "v").isOk());
  auto g = w.store->get("k", 1s);
  ASSERT_TRUE(g.isOk());
  EXPECT_EQ(g.value(), "v");
  auto a = w.store->add("n", 2);
  ASSERT_TRUE(a.isOk());
  EXPECT_EQ(a.value(), 2);
}

TEST(ExchangeValuesTest, EveryRankGetsTheValuesOfTheRanksAskedForInTheirOrder) {
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::vector<std::string>> got(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      auto v = exchangeValues(*store, "k", r, allRanks(3), "v" + std::to_string(r), 5s, "test");
      ASSERT_TRUE(v.isOk()) << v.status().toString();
      got[r] = v.take();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(got[r], (std::vector<std::string>{"v0", "v1", "v2"})) << r;
  // A subset, in the order given.
  auto sub = exchangeValues(*store, "k", 2, {2, 0}, "v2", 5s, "test");
  ASSERT_TRUE(sub.isOk());
  EXPECT_EQ(sub.value(), (std::vector<std::string>{"v2", "v0"}));
  EXPECT_TRUE(allRanks(0).empty());
}

TEST(ExchangeValuesTest, ARankThatNeverPublishesTimesOutNamingIt) {
  auto store = std::make_shared<MemoryStore>();
  const auto t0 = Clock::now();
  auto v = exchangeValues(*store, "k", 0, allRanks(2), "mine", 200ms, "shared-memory set-up");
  EXPECT_FALSE(v.isOk());
  EXPECT_EQ(v.status().code(), Code::kTimeout) << v.status().toString();
  EXPECT_NE(v.status().message().find("shared-memory set-up: waiting for rank 1"),
            std::string::npos)
      << v.status().toString();
  EXPECT_LT(secondsSince(t0), 3.0);
}

}  // namespace
}  // namespace hora
