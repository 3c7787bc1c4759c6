// Unit tests for elastic mode's decisions (launcher/elastic.h): parsing what a host discovery
// script prints, the blacklist and its cool-down, and how many workers to start where. Pure
// logic: times are plain numbers, the blacklist's randomness is seeded.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "launcher/elastic.h"

namespace horarun {
namespace {

using Pairs = std::vector<std::pair<std::string, int>>;

Pairs pairs(const std::vector<HostSpec>& hosts) {
  Pairs out;
  for (const auto& h : hosts) out.emplace_back(h.name, h.slots);
  return out;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// ---- parseDiscoveryOutput ----

TEST(DiscoveryParseTest, HostsWithAndWithoutSlotsInOrder) {
  std::vector<HostSpec> hosts;
  std::string error;
  ASSERT_TRUE(parseDiscoveryOutput("node1:4\nnode2\n10.0.0.3:2\n", 3, &hosts, &error)) << error;
  EXPECT_EQ(pairs(hosts), (Pairs{{"node1", 4}, {"node2", 3}, {"10.0.0.3", 2}}));
}

TEST(DiscoveryParseTest, BlankLinesCommentsWhitespaceAndNoFinalNewline) {
  std::vector<HostSpec> hosts;
  std::string error;
  ASSERT_TRUE(
      parseDiscoveryOutput("# hosts\n\n  a:2  \r\n\tb # spare\n   \nc:1", 1, &hosts, &error))
      << error;
  EXPECT_EQ(pairs(hosts), (Pairs{{"a", 2}, {"b", 1}, {"c", 1}}));
}

TEST(DiscoveryParseTest, EmptyOutputIsNoHosts) {
  std::vector<HostSpec> hosts{{"stale", 1}};
  std::string error;
  ASSERT_TRUE(parseDiscoveryOutput("", 1, &hosts, &error));
  EXPECT_TRUE(hosts.empty());
  ASSERT_TRUE(parseDiscoveryOutput("\n# nothing yet\n", 1, &hosts, &error));
  EXPECT_TRUE(hosts.empty());
}

TEST(DiscoveryParseTest, DuplicateHostKeepsItsLastLineInFirstPlace) {
  std::vector<HostSpec> hosts;
  std::string error;
  ASSERT_TRUE(parseDiscoveryOutput("a:2\nb:1\na:5\n", 1, &hosts, &error));
  EXPECT_EQ(pairs(hosts), (Pairs{{"a", 5}, {"b", 1}}));
}

TEST(DiscoveryParseTest, GarbageIsRefusedNamingTheLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a:2\nTraceback (most recent call last):\n", "line 2 'Traceback (most recent call last):'"},
      {"a:x\n", "slots 'x' is not a positive integer"},
      {"a:0\n", "between 1 and 65536"},
      {"a:-1\n", "is not a positive integer"},
      {"a:99999\n", "between 1 and 65536"},
      {"a:\n", "slots '' is not a positive integer"},
      {":4\n", "'' is not a host name"},
      {"a b\n", "'a b' is not a host name"},
      {"a:2:3\n", "is not a positive integer"},
      {"ssh: connect to host x port 22\n", "line 1"},
      {"fe80::1\n", "line 1"},
  };
  for (const auto& c : cases) {
    std::vector<HostSpec> hosts;
    std::string error;
    EXPECT_FALSE(parseDiscoveryOutput(c.first, 1, &hosts, &error)) << c.first;
    EXPECT_TRUE(contains(error, c.second)) << c.first << " -> " << error;
    EXPECT_TRUE(contains(error, "expected 'host' or 'host:slots'")) << error;
  }
}

TEST(DiscoveryParseTest, LongGarbageLineIsShortenedInTheError) {
  std::vector<HostSpec> hosts;
  std::string error;
  EXPECT_FALSE(parseDiscoveryOutput(std::string(500, 'x') + " y\n", 1, &hosts, &error));
  EXPECT_LT(error.size(), 400u) << error;
}

// ---- Blacklist ----

TEST(BlacklistTest, UnknownHostIsNotBlocked) {
  Blacklist b(1, 600, 7);
  EXPECT_FALSE(b.blocked("a", 0));
  EXPECT_EQ(b.until("a"), 0);
  EXPECT_EQ(b.describe(0), "");
}

TEST(BlacklistTest, CoolDownLiesInTheRangeAndDoublesPerFailure) {
  for (uint64_t seed = 0; seed < 50; ++seed) {
    Blacklist b(2, 20, seed);
    double now = 100;
    std::vector<double> waits;
    for (int i = 0; i < 6; ++i) {
      b.fail("a", now);
      const double wait = b.until("a") - now;
      const double eps = 1e-9;  // until - now in floating point
      EXPECT_GE(wait, 2 - eps) << "seed " << seed << " failure " << i + 1;
      EXPECT_LE(wait, 20 + eps) << "seed " << seed << " failure " << i + 1;
      // The n-th cool-down is at least lo * 2^(n-1) (capped at hi).
      EXPECT_GE(wait, std::min(20.0, 2.0 * (1 << i)) - eps) << "seed " << seed;
      EXPECT_TRUE(b.blocked("a", now + wait - 0.01));
      EXPECT_FALSE(b.blocked("a", now + wait + 0.01));
      now += wait + 1;  // fails again after it came back
    }
  }
}

TEST(BlacklistTest, FailureWhileCoolingDownDoesNotExtendIt) {
  Blacklist b(10, 100, 1);
  b.fail("a", 0);
  const double until = b.until("a");
  b.fail("a", 1);  // a second worker on the same host failed with the first
  EXPECT_EQ(b.until("a"), until);
  // After it came back, the next failure counts as the second: at least 20 s.
  b.fail("a", until + 1);
  EXPECT_GE(b.until("a") - (until + 1), 20);
}

TEST(BlacklistTest, ZeroRangeBlocksForNoTime) {
  Blacklist b(0, 0, 1);
  b.fail("a", 5);
  EXPECT_FALSE(b.blocked("a", 5.001));
}

TEST(BlacklistTest, NegativeHighMeansForGood) {
  Blacklist b(1, -1, 1);
  b.fail("a", 0);
  EXPECT_TRUE(b.blocked("a", 1e9));
  EXPECT_LT(b.until("a"), 0);
  EXPECT_EQ(b.describe(5), "a (for good)");
}

TEST(BlacklistTest, DescribeNamesBlockedHostsOnly) {
  Blacklist b(10, 10, 1);
  b.fail("a", 0);
  b.fail("b", 5);
  EXPECT_EQ(b.describe(8), "a (back in 2 s), b (back in 7 s)");
  EXPECT_EQ(b.describe(12), "b (back in 3 s)");
}

// ---- planSpawns / usableSlots ----

std::vector<HostSpec> hosts(Pairs p) {
  std::vector<HostSpec> out;
  for (auto& kv : p) out.push_back({kv.first, kv.second});
  return out;
}

TEST(PlanSpawnsTest, FillsFreeSlotsInDiscoveryOrderUpToMaxNp) {
  auto d = hosts({{"a", 2}, {"b", 2}, {"c", 2}});
  EXPECT_EQ(planSpawns(d, {{"a", 2}}, {}, 100), (std::vector<std::string>{"b", "b", "c", "c"}));
  EXPECT_EQ(planSpawns(d, {{"a", 1}}, {}, 4), (std::vector<std::string>{"a", "b", "b"}));
  EXPECT_EQ(planSpawns(d, {{"a", 1}}, {}, 3), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(planSpawns(d, {{"a", 2}, {"b", 2}}, {}, 4), (std::vector<std::string>{}));
}

TEST(PlanSpawnsTest, GrowFromTwoToFourSlotsStartsTwo) {
  EXPECT_EQ(planSpawns(hosts({{"localhost", 4}}), {{"localhost", 2}}, {}, 4),
            (std::vector<std::string>{"localhost", "localhost"}));
}

TEST(PlanSpawnsTest, ReplacesAKilledWorkerOnceTheHostIsNotBlocked) {
  auto d = hosts({{"localhost", 2}});
  EXPECT_TRUE(planSpawns(d, {{"localhost", 1}}, {"localhost"}, 2).empty());
  EXPECT_EQ(planSpawns(d, {{"localhost", 1}}, {}, 2), (std::vector<std::string>{"localhost"}));
}

TEST(PlanSpawnsTest, SkipsBlockedHostsAndCountsWorkersOnVanishedHosts) {
  auto d = hosts({{"a", 2}, {"b", 2}});
  EXPECT_EQ(planSpawns(d, {}, {"a"}, 10), (std::vector<std::string>{"b", "b"}));
  // Two workers still run on "gone", which discovery no longer lists: they count toward max.
  EXPECT_EQ(planSpawns(d, {{"gone", 2}}, {}, 3), (std::vector<std::string>{"a"}));
  // More running on a host than it now offers: nothing there, no negative count.
  EXPECT_EQ(planSpawns(d, {{"a", 5}}, {}, 10), (std::vector<std::string>{"b", "b"}));
}

TEST(PlanSpawnsTest, AtOrAboveMaxNpStartsNothing) {
  auto d = hosts({{"a", 8}});
  EXPECT_TRUE(planSpawns(d, {{"a", 4}}, {}, 4).empty());
  EXPECT_TRUE(planSpawns(d, {{"a", 4}}, {}, 3).empty());
  EXPECT_TRUE(planSpawns({}, {}, {}, 4).empty());
}

TEST(PlanSpawnsTest, UsableSlotsLeaveOutBlockedHosts) {
  auto d = hosts({{"a", 2}, {"b", 3}});
  EXPECT_EQ(usableSlots(d, {}), 5);
  EXPECT_EQ(usableSlots(d, {"b"}), 2);
  EXPECT_EQ(usableSlots(d, {"a", "b"}), 0);
}

}  // namespace
}  // namespace horarun
