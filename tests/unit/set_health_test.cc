// SetHealth alone: the first failure wins, listeners run once in order on the
// breaking thread, deferred work gets the final status, and a data-plane
// suspicion yields to a named cause within its grace period or stands after.
#include "core/set_health.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace hora {
namespace {

using namespace std::chrono_literals;

Logger quiet() { return Logger(LogLevel::kOff, "[health-test]"); }

TEST(SetHealthTest, FirstFailureWinsAndListenersRunOnceInOrder) {
  SetHealth h("global", quiet());
  std::vector<std::string> calls;
  h.addListener([&](const Status& why, bool tellPeers) {
    calls.push_back("a:" + why.message() + (tellPeers ? ":tell" : ":quiet"));
  });
  h.addListener([&](const Status& why, bool) { calls.push_back("b:" + why.message()); });
  EXPECT_FALSE(h.broken());
  EXPECT_TRUE(h.status().isOk());
  EXPECT_TRUE(h.fail(Status(Code::kRemoteError, "rank 2 lost"), false));
  EXPECT_FALSE(h.fail(Status(Code::kTimeout, "later"), true));
  EXPECT_TRUE(h.broken());
  EXPECT_EQ(h.status().code(), Code::kRemoteError);
  EXPECT_EQ(h.status().message(), "rank 2 lost");
  EXPECT_EQ(calls, (std::vector<std::string>{"a:rank 2 lost:quiet", "b:rank 2 lost"}));
}

TEST(SetHealthTest, ConcurrentFailuresBreakTheSetExactlyOnce) {
  SetHealth h("global", quiet());
  std::atomic<int> listened{0}, won{0};
  h.addListener([&](const Status&, bool) { ++listened; });
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] {
      if (h.fail(Status(Code::kRemoteError, "from " + std::to_string(i)), true)) ++won;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(won, 1);
  EXPECT_EQ(listened, 1);
}

TEST(SetHealthTest, WhenBrokenRunsAtOnceOrAfterTheListeners) {
  SetHealth h("global", quiet());
  std::vector<std::string> order;
  h.addListener([&](const Status&, bool) { order.push_back("listener"); });
  Status seen;
  h.whenBroken([&](const Status& s) {
    order.push_back("deferred");
    seen = s;
  });
  EXPECT_TRUE(order.empty());
  h.fail(Status(Code::kRemoteError, "gone"), true);
  EXPECT_EQ(order, (std::vector<std::string>{"listener", "deferred"}));
  EXPECT_EQ(seen.message(), "gone");
  Status late;
  h.whenBroken([&](const Status& s) { late = s; });
  EXPECT_EQ(late.message(), "gone") << "already broken: runs at once";
}

TEST(SetHealthTest, ASuspicionYieldsToANamedCauseWithinItsGrace) {
  SetHealth h("global", quiet(), Seconds(10));
  Clock::time_point hookDeadline{};
  h.setSuspectHook([&](Clock::time_point d) { hookDeadline = d; });
  std::vector<bool> told;
  h.addListener([&](const Status&, bool tellPeers) { told.push_back(tellPeers); });
  Status final;
  const auto before = Clock::now();
  h.suspect(Status(Code::kRemoteError, "gloo: connection closed"));
  EXPECT_TRUE(h.suspected());
  EXPECT_FALSE(h.broken()) << "a suspicion does not break the set";
  EXPECT_GE(hookDeadline, before + 9s);
  EXPECT_LE(hookDeadline, Clock::now() + 10s);
  h.whenBroken([&](const Status& s) { final = s; });
  h.suspect(Status(Code::kTimeout, "second"));  // the first suspicion counts
  h.settle(Clock::now());                       // too early: nothing happens
  EXPECT_FALSE(h.broken());
  EXPECT_TRUE(h.fail(Status(Code::kRemoteError, "rank 1 (pid 42) died"), false));
  EXPECT_EQ(final.message(), "rank 1 (pid 42) died") << "the named cause wins";
  EXPECT_FALSE(h.suspected());
  h.settle(Clock::time_point::max());
  EXPECT_EQ(h.status().message(), "rank 1 (pid 42) died");
  EXPECT_EQ(told, (std::vector<bool>{false}));
}

TEST(SetHealthTest, AnUnnamedSuspicionStandsAfterItsDeadline) {
  SetHealth h("global", quiet(), Seconds(0.05));
  bool toldPeers = false;
  h.addListener([&](const Status&, bool tellPeers) { toldPeers = tellPeers; });
  h.suspect(Status(Code::kBackendError, "allreduce \"x\": gloo failed"));
  Status final;
  h.whenBroken([&](const Status& s) { final = s; });
  std::this_thread::sleep_for(60ms);
  h.settle(Clock::now());
  EXPECT_TRUE(h.broken());
  EXPECT_EQ(final.code(), Code::kBackendError);
  EXPECT_EQ(final.message(), "allreduce \"x\": gloo failed");
  EXPECT_TRUE(toldPeers) << "this rank found it, so its peers must learn it";
}

TEST(SetHealthTest, SettleNowEndsASuspicionAndNothingIsSuspectedOnceBroken) {
  SetHealth h("global", quiet(), Seconds(3600));
  h.suspect(Status(Code::kRemoteError, "eof"));
  h.settleNow();
  EXPECT_TRUE(h.broken());
  EXPECT_EQ(h.status().message(), "eof");
  h.suspect(Status(Code::kRemoteError, "after"));
  EXPECT_FALSE(h.suspected());
  h.settleNow();
  EXPECT_EQ(h.status().message(), "eof");
}

TEST(SetHealthTest, AHeldFailureReachesTheUserOnlyWhenReleased) {
  // A rank that found the failure tells its peers first: until release(),
  // whenBroken's work waits (and so do the pending requests), so a program that exits
  // on the error cannot do so before the abort frames are out.
  SetHealth h("global", quiet());
  h.holdForPeers(true);
  Status early, late;
  h.whenBroken([&](const Status& s) { early = s; });
  EXPECT_TRUE(h.fail(Status(Code::kRemoteError, "rank 2 lost"), /*tellPeers=*/true));
  EXPECT_TRUE(h.broken());
  EXPECT_FALSE(h.released());
  EXPECT_TRUE(early.isOk()) << "ran before release";
  h.whenBroken([&](const Status& s) { late = s; });
  EXPECT_TRUE(late.isOk()) << "ran before release";
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(h.released()) << "nothing releases a held failure but release()";
  std::thread releaser([&] { h.release(); });  // the control thread, in the controller
  releaser.join();
  EXPECT_TRUE(h.released());
  EXPECT_EQ(early.message(), "rank 2 lost");
  EXPECT_EQ(late.message(), "rank 2 lost");
  h.release();  // a second release changes nothing
  EXPECT_EQ(h.status().message(), "rank 2 lost");
}

TEST(SetHealthTest, AFailureReportedToThisRankIsNotHeld) {
  // Nothing to tell the peers (the coordinator told this rank): released
  // with the break, before the listeners fail the pending work.
  SetHealth h("global", quiet());
  h.holdForPeers(true);
  bool releasedInListener = false;
  h.addListener([&](const Status&, bool) { releasedInListener = h.released(); });
  Status seen;
  h.whenBroken([&](const Status& s) { seen = s; });
  h.fail(Status(Code::kRemoteError, "the coordinator aborted"), /*tellPeers=*/false);
  EXPECT_TRUE(releasedInListener);
  EXPECT_EQ(seen.message(), "the coordinator aborted");
  EXPECT_TRUE(h.released());
}

TEST(SetHealthTest, AnUnbrokenSetHasNothingToRelease) {
  SetHealth h("global", quiet());
  h.holdForPeers(true);
  EXPECT_FALSE(h.released());
  h.release();  // not broken: no effect
  EXPECT_FALSE(h.released());
  EXPECT_FALSE(h.broken());
}

}  // namespace
}  // namespace hora
