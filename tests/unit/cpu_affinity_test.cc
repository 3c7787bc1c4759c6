// core/cpu_affinity: the executor's CPU by local rank, and binding/naming the
// calling thread.
#include "core/cpu_affinity.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <thread>

namespace hora {
namespace {

TEST(ExecutorCpuFor, DistinctCpusWhileRanksFitThenRoundRobin) {
  const std::vector<int> allowed = {2, 3, 5, 8};
  EXPECT_EQ(executorCpuFor(0, allowed), 2);
  EXPECT_EQ(executorCpuFor(1, allowed), 3);
  EXPECT_EQ(executorCpuFor(3, allowed), 8);
  EXPECT_EQ(executorCpuFor(4, allowed), 2);
  EXPECT_EQ(executorCpuFor(6, allowed), 5);
}

TEST(ExecutorCpuFor, LeavesALauncherBindingAndUnknownRanksAlone) {
  EXPECT_EQ(executorCpuFor(0, {7}), -1);  // the process was bound to one CPU
  EXPECT_EQ(executorCpuFor(1, {}), -1);   // the mask could not be read
  EXPECT_EQ(executorCpuFor(-1, {0, 1}), -1);
}

TEST(CpuList, FormatsRangesAndParsesThemBack) {
  EXPECT_EQ(formatCpuList({}), "");
  EXPECT_EQ(formatCpuList({3}), "3");
  EXPECT_EQ(formatCpuList({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  std::vector<int> cpus;
  ASSERT_TRUE(parseCpuList("0-3,8,10-11", &cpus));
  EXPECT_EQ(cpus, (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  ASSERT_TRUE(parseCpuList("5,1-2,2", &cpus));  // any order, repeats once
  EXPECT_EQ(cpus, (std::vector<int>{1, 2, 5}));
  const std::vector<int> mine = allowedCpus();
  ASSERT_TRUE(parseCpuList(formatCpuList(mine), &cpus) || mine.empty());
  if (!mine.empty()) EXPECT_EQ(cpus, mine);
}

TEST(CpuList, RefusesWhatIsNotOne) {
  std::vector<int> cpus;
  for (const char* bad : {"", ",", "1,", "a", "-1", "3-1", "1-", "1--2", "0-99999", "2 3"})
    EXPECT_FALSE(parseCpuList(bad, &cpus)) << "'" << bad << "'";
}

TEST(AllowedCpus, MatchesTheMaskAscending) {
  const std::vector<int> cpus = allowedCpus();
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  ASSERT_EQ(static_cast<int>(cpus.size()), CPU_COUNT(&set));
  for (size_t i = 0; i < cpus.size(); ++i) {
    EXPECT_TRUE(CPU_ISSET(cpus[i], &set));
    if (i > 0) EXPECT_LT(cpus[i - 1], cpus[i]);
  }
}

TEST(BindThisThread, RestrictsOnlyTheCallingThread) {
  const std::vector<int> before = allowedCpus();
  ASSERT_FALSE(before.empty());
  const int target = before.back();
  std::vector<int> inside;
  Status s;
  std::thread t([&] {
    s = bindThisThread(target);
    inside = allowedCpus();
  });
  t.join();
  ASSERT_TRUE(s.isOk()) << s.message();
  EXPECT_EQ(inside, std::vector<int>{target});
  EXPECT_EQ(allowedCpus(), before);  // this thread is untouched
}

TEST(BindThisThread, NamesTheCpuWhenItCannot) {
  Status s = bindThisThread(-3);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("CPU -3"), std::string::npos) << s.message();
  // A CPU outside the machine: the kernel refuses, the error names it.
  std::thread t([&] { s = bindThisThread(CPU_SETSIZE - 1); });
  t.join();
  EXPECT_FALSE(s.isOk());
  EXPECT_NE(s.message().find(std::to_string(CPU_SETSIZE - 1)), std::string::npos) << s.message();
}

TEST(ScopedThreadCpus, WidensForItsScopeThenRestores) {
  const std::vector<int> all = allowedCpus();
  if (all.size() < 2) GTEST_SKIP() << "one CPU";
  std::vector<int> bound, inside, after;
  std::thread t([&] {
    ASSERT_TRUE(bindThisThread(all.back()).isOk());
    bound = allowedCpus();
    {
      ScopedThreadCpus wide(all);
      inside = allowedCpus();
      ScopedThreadCpus none({});  // empty: no change
      EXPECT_EQ(allowedCpus(), all);
    }
    after = allowedCpus();
  });
  t.join();
  EXPECT_EQ(bound, std::vector<int>{all.back()});
  EXPECT_EQ(inside, all);
  EXPECT_EQ(after, std::vector<int>{all.back()});
}

TEST(NameThisThread, KeepsFifteenCharacters) {
  char name[32] = {};
  std::thread t([&] {
    nameThisThread("hora-executor-of-a-long-set");
    pthread_getname_np(pthread_self(), name, sizeof(name));
  });
  t.join();
  EXPECT_STREQ(name, "hora-executor-o");
}

}  // namespace
}  // namespace hora
