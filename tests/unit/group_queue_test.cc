// GroupQueue alone: order, the in-flight count, inline completion only when
// nothing is ahead, idle waits with deadlines, close and the done hook.
#include "core/group_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace hora {
namespace {

using namespace std::chrono_literals;

AgreedGroup group(const std::string& name) {
  AgreedGroup g;
  Response r;
  r.name = name;
  g.responses.push_back(r);
  g.entries.push_back(nullptr);
  return g;
}

TEST(GroupQueueTest, PopsInOrderAndCountsWhatIsInFlight) {
  GroupQueue q;
  EXPECT_EQ(q.inFlight(), 0);
  q.push(group("a"));
  q.push(group("b"));
  EXPECT_EQ(q.inFlight(), 2);
  AgreedGroup g;
  ASSERT_TRUE(q.pop(&g));
  EXPECT_EQ(g.responses[0].name, "a");
  EXPECT_EQ(q.inFlight(), 2) << "popped but still running";
  q.finished();
  EXPECT_EQ(q.inFlight(), 1);
  ASSERT_TRUE(q.pop(&g));
  EXPECT_EQ(g.responses[0].name, "b");
  q.finished();
  EXPECT_EQ(q.inFlight(), 0);
}

TEST(GroupQueueTest, InlineOnlyWhenNothingIsQueuedOrRunning) {
  GroupQueue q;
  ASSERT_TRUE(q.tryBeginInline());
  EXPECT_EQ(q.inFlight(), 1);
  EXPECT_FALSE(q.tryBeginInline()) << "an inline group is running";
  q.endInline();
  EXPECT_EQ(q.inFlight(), 0);
  q.push(group("a"));
  EXPECT_FALSE(q.tryBeginInline()) << "a group is queued ahead";
  AgreedGroup g;
  ASSERT_TRUE(q.pop(&g));
  EXPECT_FALSE(q.tryBeginInline()) << "a group is running";
  q.finished();
  EXPECT_TRUE(q.tryBeginInline());
  q.endInline();
}

TEST(GroupQueueTest, DoneHookRunsAfterPoppedGroupsOnly) {
  GroupQueue q;
  std::atomic<int> hooks{0};
  q.setGroupDoneHook([&] { ++hooks; });
  ASSERT_TRUE(q.tryBeginInline());
  q.endInline();
  EXPECT_EQ(hooks, 0) << "inline groups run on the control thread, which needs no wake-up";
  q.push(group("a"));
  AgreedGroup g;
  ASSERT_TRUE(q.pop(&g));
  q.finished();
  EXPECT_EQ(hooks, 1);
}

TEST(GroupQueueTest, PopBlocksUntilPushOrClose) {
  GroupQueue q;
  std::atomic<bool> got{false};
  std::thread consumer([&] {
    AgreedGroup g;
    got = q.pop(&g);
  });
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(got);
  q.push(group("late"));
  consumer.join();
  EXPECT_TRUE(got);
  q.finished();

  std::atomic<int> result{-1};
  std::thread waiter([&] {
    AgreedGroup g;
    result = q.pop(&g) ? 1 : 0;
  });
  q.close();
  waiter.join();
  EXPECT_EQ(result, 0) << "close wakes a waiting executor";
}

TEST(GroupQueueTest, CloseLeavesQueuedGroupsForTakeRemaining) {
  GroupQueue q;
  q.push(group("a"));
  q.push(group("b"));
  q.close();
  AgreedGroup g;
  EXPECT_FALSE(q.pop(&g)) << "a closed queue hands out nothing more";
  auto left = q.takeRemaining();
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[0].responses[0].name, "a");
  EXPECT_TRUE(q.takeRemaining().empty());
}

TEST(GroupQueueTest, WaitIdleHonoursItsDeadline) {
  GroupQueue q;
  EXPECT_TRUE(q.waitIdle(Clock::now())) << "idle already";
  q.push(group("a"));
  const auto t0 = Clock::now();
  EXPECT_FALSE(q.waitIdle(t0 + 50ms));
  EXPECT_GE(Clock::now() - t0, 45ms);
  std::thread executor([&] {
    AgreedGroup g;
    ASSERT_TRUE(q.pop(&g));
    std::this_thread::sleep_for(20ms);
    q.finished();
  });
  EXPECT_TRUE(q.waitIdle(Clock::now() + 10s));
  EXPECT_EQ(q.inFlight(), 0);
  executor.join();
}

// Failure reports say what was on the data plane when a peer vanished.
TEST(GroupQueueTest, RunningSummaryNamesThePoppedGroupUntilItFinishes) {
  GroupQueue q;
  EXPECT_EQ(q.runningSummary(), "");
  AgreedGroup fused = group("w1");
  fused.responses.push_back(fused.responses.front());
  fused.responses.back().name = "w2";
  q.push(std::move(fused));
  q.push(group("later"));
  AgreedGroup g;
  ASSERT_TRUE(q.pop(&g));
  EXPECT_EQ(q.runningSummary(), "allreduce \"w1\" and 1 more fused, 1 more group(s) queued");
  q.finished();
  EXPECT_EQ(q.runningSummary(), "");
}

TEST(GroupQueueTest, RunningSummaryNamesAGroupTheControlThreadRuns) {
  GroupQueue q;
  AgreedGroup g = group("small");
  ASSERT_TRUE(q.tryBeginInline(&g));
  EXPECT_EQ(q.runningSummary(), "allreduce \"small\" (on the control thread)");
  EXPECT_FALSE(q.tryBeginInline()) << "one at a time";
  q.endInline();
  EXPECT_EQ(q.runningSummary(), "");
  EXPECT_EQ(q.inFlight(), 0);
}

TEST(GroupQueueTest, ALoneQueuedGroupMayBeTakenByAnotherThreadOnly) {
  GroupQueue q;
  auto any = [](const AgreedGroup&) { return true; };
  AgreedGroup g;
  EXPECT_FALSE(q.tryTakeLone(&g, any)) << "nothing queued";
  q.push(group("a"));
  EXPECT_FALSE(q.tryTakeLone(&g, [](const AgreedGroup&) { return false; })) << "does not fit";
  q.push(group("b"));
  EXPECT_FALSE(q.tryTakeLone(&g, any)) << "two queued";
  ASSERT_TRUE(q.pop(&g));
  EXPECT_FALSE(q.tryTakeLone(&g, any)) << "one queued behind a running one";
  q.finished();
  ASSERT_TRUE(q.tryTakeLone(&g, any));
  EXPECT_EQ(g.responses[0].name, "b");
  EXPECT_EQ(q.inFlight(), 1) << "taken, still running";
  EXPECT_EQ(q.busy(), 1);
  EXPECT_FALSE(q.tryBeginInline()) << "the taken group runs";
  EXPECT_NE(q.runningSummary().find("waiting framework thread"), std::string::npos)
      << q.runningSummary();
  q.finished();
  EXPECT_EQ(q.inFlight(), 0);
}

TEST(GroupQueueTest, ATakenGroupGivenBackIsPoppedFirst) {
  GroupQueue q;
  q.push(group("a"));
  AgreedGroup g;
  ASSERT_TRUE(q.tryTakeLone(&g, [](const AgreedGroup&) { return true; }));
  q.push(group("b"));  // agreed while "a" was out
  q.giveBack(std::move(g));
  EXPECT_EQ(q.inFlight(), 2);
  ASSERT_TRUE(q.pop(&g));
  EXPECT_EQ(g.responses[0].name, "a");
  q.finished();
  ASSERT_TRUE(q.pop(&g));
  EXPECT_EQ(g.responses[0].name, "b");
  q.finished();
  EXPECT_EQ(q.inFlight(), 0);
}

TEST(GroupQueueTest, NothingIsTakenBehindALaunchedGroup) {
  GroupQueue q;
  q.push(group("a"));
  AgreedGroup g;
  ASSERT_TRUE(q.pop(&g));
  q.launched();  // left running on the GPU: the executor is free, "a" is not done
  q.push(group("b"));
  EXPECT_FALSE(q.loneQueued());
  EXPECT_FALSE(q.tryTakeLone(&g, [](const AgreedGroup&) { return true; }));
  q.finishedLaunched();
  EXPECT_TRUE(q.loneQueued());
  EXPECT_TRUE(q.tryTakeLone(&g, [](const AgreedGroup&) { return true; }));
  q.finished();
}

TEST(GroupQueueTest, NothingIsTakenFromAClosedQueue) {
  GroupQueue q;
  q.push(group("a"));
  q.close();
  AgreedGroup g;
  EXPECT_FALSE(q.tryTakeLone(&g, [](const AgreedGroup&) { return true; }));
  EXPECT_EQ(q.takeRemaining().size(), 1u) << "left for shutdown";
}

}  // namespace
}  // namespace hora
