// Elastic membership formation (core/membership) over an in-memory store,
// workers as threads; the test plays the launcher (live, min_np, dead/<id>).
// Each scenario of docs/elastic.md: everyone re-forms, a dead member is
// skipped at once, a stopped one after the settle time, newcomers follow the
// survivors and never lead, a late arrival waits for the next epoch (and the
// members see it pending), too few workers fail everywhere, a leader that
// dies mid-formation makes everyone form the next epoch.
#include "core/membership.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/memory_store.h"

namespace hora {
namespace {

using namespace std::chrono_literals;

class MembershipTest : public ::testing::Test {
 protected:
  std::shared_ptr<MemoryStore> store_ = std::make_shared<MemoryStore>();
  Logger logger_{LogLevel::kOff, "[test]"};

  // Epoch 0 of `n` workers w0..w(n-1).
  void initialEpoch(int n) {
    for (int r = 0; r < n; ++r)
      ASSERT_TRUE(recordInitialMember(*store_, "w" + std::to_string(r), r, n).isOk());
  }

  FormRequest request(const std::string& id, int64_t lastEpoch, int lastRank) {
    FormRequest req;
    req.workerId = id;
    req.host = "h";
    req.lastEpoch = lastEpoch;
    req.lastRank = lastRank;
    req.timeout = Seconds(20);
    req.settle = 300ms;
    req.poll = 2ms;
    return req;
  }

  std::future<Result<Membership>> form(FormRequest req) {
    return std::async(std::launch::async, [this, req] { return formEpoch(*store_, req, logger_); });
  }
};

TEST_F(MembershipTest, SurvivorsKeepTheirOrderAndSkipTheDeadAtOnce) {
  initialEpoch(4);
  ASSERT_TRUE(store_->set("live", "3").isOk());
  ASSERT_TRUE(store_->set("dead/w1", "signal 9").isOk());
  auto t0 = Clock::now();
  std::vector<std::future<Result<Membership>>> f;
  for (int r : {3, 0, 2}) f.push_back(form(request("w" + std::to_string(r), 0, r)));
  std::vector<Membership> got;
  for (auto& x : f) {
    auto m = x.get();
    ASSERT_TRUE(m.isOk()) << m.status().toString();
    got.push_back(m.value());
  }
  // Every member of epoch 0 is here or dead: no settle wait.
  EXPECT_LT(Clock::now() - t0, 250ms);
  const std::vector<std::string> expect{"w0", "w2", "w3"};
  for (const auto& m : got) {
    EXPECT_EQ(m.epoch, 1);
    EXPECT_EQ(m.workers, expect);
  }
  EXPECT_EQ(got[0].rank, 2);  // w3
  EXPECT_EQ(got[1].rank, 0);  // w0
  EXPECT_EQ(lastEpochOf(*store_, "w2").value(), 1);
  EXPECT_EQ(membersOf(*store_, 1), expect);
  EXPECT_EQ(store_->add("round", 0).value(), 1);
}

TEST_F(MembershipTest, AStoppedMemberIsLeftOutAfterTheSettleTime) {
  initialEpoch(3);  // w2 never arrives and is not dead (SIGSTOP)
  auto t0 = Clock::now();
  auto a = form(request("w0", 0, 0));
  auto b = form(request("w1", 0, 1));
  auto ma = a.get(), mb = b.get();
  ASSERT_TRUE(ma.isOk()) << ma.status().toString();
  ASSERT_TRUE(mb.isOk()) << mb.status().toString();
  EXPECT_GE(Clock::now() - t0, 300ms);
  EXPECT_EQ(ma.value().workers, (std::vector<std::string>{"w0", "w1"}));
  // Resumed later, it is a newcomer to the epoch after.
  auto late = form(request("w2", 0, 2));
  // Its request reaches the store from another thread: polled, not slept for.
  const auto pendingBy = Clock::now() + 5s;
  while (!membershipPending(*store_, 1).value() && Clock::now() < pendingBy)
    std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(membershipPending(*store_, 1).value());
  auto r0 = form(request("w0", 1, 0));
  auto r1 = form(request("w1", 1, 1));
  auto m = late.get();
  ASSERT_TRUE(m.isOk()) << m.status().toString();
  EXPECT_EQ(m.value().epoch, 2);
  EXPECT_EQ(m.value().workers, (std::vector<std::string>{"w0", "w1", "w2"}));
  EXPECT_EQ(m.value().rank, 2);
  EXPECT_TRUE(r0.get().isOk());
  EXPECT_TRUE(r1.get().isOk());
}

TEST_F(MembershipTest, ANewcomerArrivingFirstWaitsForTheMembersAndComesLast) {
  initialEpoch(2);
  ASSERT_TRUE(store_->set("live", "3").isOk());
  auto n = form(request("w9", -1, -1));
  std::this_thread::sleep_for(400ms);  // longer than the settle time: it must not lead
  EXPECT_TRUE(membershipPending(*store_, 0).value());
  auto a = form(request("w1", 0, 1));
  auto b = form(request("w0", 0, 0));
  auto mn = n.get();
  ASSERT_TRUE(mn.isOk()) << mn.status().toString();
  EXPECT_EQ(mn.value().workers, (std::vector<std::string>{"w0", "w1", "w9"}));
  EXPECT_EQ(mn.value().rank, 2);
  EXPECT_EQ(b.get().value().rank, 0);
  EXPECT_EQ(a.get().value().rank, 1);
}

TEST_F(MembershipTest, TooFewWorkersFailEveryArrivalWithTheReason) {
  initialEpoch(3);
  ASSERT_TRUE(store_->set("min_np", "3").isOk());
  ASSERT_TRUE(store_->set("dead/w2", "exit 1").isOk());
  auto shortWait = [&](const std::string& id, int rank) {
    auto req = request(id, 0, rank);
    req.timeout = Seconds(1);
    return form(req);
  };
  auto t0 = Clock::now();
  auto a = shortWait("w0", 0);
  auto b = shortWait("w1", 1);
  for (auto* f : {&a, &b}) {
    auto m = f->get();
    ASSERT_FALSE(m.isOk());
    EXPECT_EQ(m.status().code(), Code::kMembership);
    EXPECT_NE(m.status().message().find("at least 3"), std::string::npos) << m.status().message();
  }
  // They waited for a replacement, within the timeout.
  EXPECT_GE(Clock::now() - t0, 800ms);
  EXPECT_LT(Clock::now() - t0, 3s);
}

// Below min-np the survivors wait for the launcher's replacement and form
// the epoch with it.
TEST_F(MembershipTest, BelowMinNpTheSurvivorsWaitForAReplacement) {
  initialEpoch(3);
  ASSERT_TRUE(store_->set("min_np", "3").isOk());
  ASSERT_TRUE(store_->set("dead/w2", "signal 9").isOk());
  auto a = form(request("w0", 0, 0));
  auto b = form(request("w1", 0, 1));
  std::this_thread::sleep_for(600ms);  // past the settle time: still not enough
  auto c = form(request("w3", -1, -1));
  for (auto* f : {&a, &b, &c}) {
    auto m = f->get();
    ASSERT_TRUE(m.isOk()) << m.status().toString();
    EXPECT_EQ(m.value().workers, (std::vector<std::string>{"w0", "w1", "w3"}));
  }
}

TEST_F(MembershipTest, ALeaderDyingMidFormationMovesEveryoneToTheNextEpoch) {
  initialEpoch(3);
  // w0 arrived first and leads epoch 1, then dies before listing anyone.
  ASSERT_TRUE(store_->add("r1/arrivals", 1).isOk());
  ASSERT_TRUE(store_->set("r1/ticket/1", "w0 0 0 h S").isOk());
  ASSERT_TRUE(store_->add("r1/survivors", 1).isOk());
  ASSERT_TRUE(store_->set("r1/leader", "w0").isOk());
  auto a = form(request("w1", 0, 1));
  auto b = form(request("w2", 0, 2));
  std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(store_->set("dead/w0", "signal 9").isOk());
  auto ma = a.get(), mb = b.get();
  ASSERT_TRUE(ma.isOk()) << ma.status().toString();
  ASSERT_TRUE(mb.isOk()) << mb.status().toString();
  EXPECT_EQ(ma.value().epoch, 2);
  EXPECT_EQ(ma.value().workers, (std::vector<std::string>{"w1", "w2"}));
  EXPECT_EQ(mb.value().rank, 1);
}

// A newcomer built from another hora version (or started with other shared
// settings) is refused alone, with both values; the members go on.
TEST_F(MembershipTest, ANewcomerWithOtherSettingsIsRefusedAndTheMembersGoOn) {
  initialEpoch(2);
  ASSERT_TRUE(store_->set("live", "3").isOk());
  auto stranger = request("w7", -1, -1);
  stranger.settings = "hora_version=0.2.0,HORA_CACHE_CAPACITY=1024";
  auto n = form(stranger);
  std::this_thread::sleep_for(50ms);
  std::vector<std::future<Result<Membership>>> members;
  for (int r = 0; r < 2; ++r) {
    auto req = request("w" + std::to_string(r), 0, r);
    req.settings = "hora_version=0.3.0,HORA_CACHE_CAPACITY=1024";
    members.push_back(form(req));
  }
  for (auto& f : members) {
    auto m = f.get();
    ASSERT_TRUE(m.isOk()) << m.status().toString();
    EXPECT_EQ(m.value().workers, (std::vector<std::string>{"w0", "w1"}));
  }
  auto refused = n.get();
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(refused.status().code(), Code::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("hora_version=0.2.0"), std::string::npos);
  EXPECT_NE(refused.status().message().find("hora_version=0.3.0"), std::string::npos);
}

TEST_F(MembershipTest, NoMemberComingBoundsANewcomersWait) {
  initialEpoch(2);
  auto req = request("w5", -1, -1);
  req.timeout = Seconds(0.3);
  auto t0 = Clock::now();
  auto m = formEpoch(*store_, req, logger_);
  ASSERT_FALSE(m.isOk());
  EXPECT_EQ(m.status().code(), Code::kTimeout);
  EXPECT_NE(m.status().message().find("HORA_ELASTIC_TIMEOUT_S"), std::string::npos);
  EXPECT_LT(Clock::now() - t0, 3s);
}

}  // namespace
}  // namespace hora
