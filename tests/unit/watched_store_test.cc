// WatchedStore (core/store.h): waits that end as soon as the check says a
// peer is gone, and that pass straight through once disarmed.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

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

}  // namespace
}  // namespace hora
