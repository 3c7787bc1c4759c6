// core/cpu_affinity: the executor's CPU by local rank, its claim against the
// host's other runtimes, the framework thread's home CPU and the move there,
// and binding/naming the calling thread.
#include "core/cpu_affinity.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
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

// A private claim directory per test: claims made by concurrently running
// tests in /dev/shm must not change these results.
class CpuClaimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/hora-claims-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (int cpu : {2, 3, 5, 8})
      ::unlink((dir_ + "/hora-cpu-" + std::to_string(cpu) + ".lock").c_str());
    ::rmdir(dir_.c_str());
  }
  std::string dir_;
  const std::vector<int> allowed_ = {2, 3, 5, 8};
};

TEST_F(CpuClaimTest, TwoJobsOnOneHostGetDisjointCpus) {
  // Job A's two ranks, then job B's two: B's ranks start from the same picks
  // and move on to the CPUs A left free.
  CpuClaim a0 = CpuClaim::pick(0, 2, allowed_, dir_);
  CpuClaim a1 = CpuClaim::pick(1, 2, allowed_, dir_);
  CpuClaim b0 = CpuClaim::pick(0, 2, allowed_, dir_);
  CpuClaim b1 = CpuClaim::pick(1, 2, allowed_, dir_);
  EXPECT_EQ(a0.cpu(), 2);
  EXPECT_EQ(a1.cpu(), 3);
  EXPECT_EQ(b0.cpu(), 5) << b0.note();
  EXPECT_EQ(b1.cpu(), 8) << b1.note();
  EXPECT_TRUE(a0.claimed() && a1.claimed() && b0.claimed() && b1.claimed());
  EXPECT_NE(b0.note().find("held by another hora runtime"), std::string::npos) << b0.note();
  // A third job finds everything held: unbound, and told why.
  CpuClaim c0 = CpuClaim::pick(0, 2, allowed_, dir_);
  EXPECT_EQ(c0.cpu(), -1);
  EXPECT_FALSE(c0.claimed());
  EXPECT_NE(c0.note().find("2-3,5,8"), std::string::npos) << c0.note();
  EXPECT_NE(c0.note().find("unbound"), std::string::npos) << c0.note();
  EXPECT_TRUE(c0.warn());
  EXPECT_FALSE(b0.warn());
}

TEST_F(CpuClaimTest, AClaimEndsWithItsOwnerAndMovesWithIt) {
  CpuClaim first = CpuClaim::pick(0, 2, allowed_, dir_);
  ASSERT_EQ(first.cpu(), 2);
  CpuClaim moved = std::move(first);
  EXPECT_EQ(first.cpu(), -1);
  EXPECT_FALSE(first.claimed());
  EXPECT_EQ(moved.cpu(), 2);
  EXPECT_EQ(CpuClaim::pick(0, 2, allowed_, dir_).cpu(), 3);  // 2 still held (by `moved`)
  moved = CpuClaim();                                        // released
  EXPECT_EQ(CpuClaim::pick(0, 2, allowed_, dir_).cpu(), 2);
}

TEST_F(CpuClaimTest, AReleasedClaimIsFreeEvenWhileAForkedChildLives) {
  // A data loader's worker forked after init shares the lock file's open
  // description; the claim must still end when the runtime's does.
  CpuClaim claim = CpuClaim::pick(0, 2, allowed_, dir_);
  ASSERT_EQ(claim.cpu(), 2);
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // holds the inherited descriptor until the parent is done
    char b;
    (void)::read(go[0], &b, 1);
    ::_exit(0);
  }
  claim = CpuClaim();
  const int again = CpuClaim::pick(0, 2, allowed_, dir_).cpu();
  (void)::write(go[1], "x", 1);
  ::close(go[0]);
  ::close(go[1]);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_EQ(again, 2) << "the released claim stayed with the forked child";
}

TEST_F(CpuClaimTest, LockFilesAreLockableByEveryUser) {
  const mode_t before = ::umask(077);  // even under a strict umask
  CpuClaim claim = CpuClaim::pick(1, 2, allowed_, dir_);
  ::umask(before);
  ASSERT_TRUE(claim.claimed()) << claim.note();
  struct stat st;
  ASSERT_EQ(::stat((dir_ + "/hora-cpu-3.lock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666u);
  EXPECT_FALSE(claim.warn());
}

TEST_F(CpuClaimTest, RanksOutnumberingCpusShareThemByLocalRankUnclaimed) {
  // 6 local ranks on 4 CPUs: claims would let the ranks that start first
  // take all four; by local rank they spread evenly, whatever else holds.
  CpuClaim other = CpuClaim::pick(0, 1, allowed_, dir_);
  ASSERT_EQ(other.cpu(), 2);
  for (int r = 0; r < 6; ++r) {
    CpuClaim c = CpuClaim::pick(r, 6, allowed_, dir_);
    EXPECT_EQ(c.cpu(), executorCpuFor(r, allowed_)) << r;
    EXPECT_FALSE(c.claimed());
    EXPECT_NE(c.note().find("6 local ranks share 4 CPUs"), std::string::npos) << c.note();
  }
}

TEST_F(CpuClaimTest, NoDirectoryOrNoRoomFallsBackToLocalRank) {
  CpuClaim off = CpuClaim::pick(1, 2, allowed_, "");
  EXPECT_EQ(off.cpu(), 3);
  EXPECT_FALSE(off.claimed());
  CpuClaim missing = CpuClaim::pick(1, 2, allowed_, dir_ + "/no/such/dir");
  EXPECT_EQ(missing.cpu(), 3);
  EXPECT_FALSE(missing.claimed());
  EXPECT_NE(missing.note().find("cannot open"), std::string::npos) << missing.note();
  EXPECT_NE(missing.note().find("HORA_CPU_CLAIM_DIR"), std::string::npos) << missing.note();
  EXPECT_TRUE(missing.warn());
  EXPECT_FALSE(off.warn());
}

TEST_F(CpuClaimTest, OneAllowedCpuOrNoLocalRankClaimsNothing) {
  EXPECT_EQ(CpuClaim::pick(0, 2, {4}, dir_).cpu(), -1);
  EXPECT_EQ(CpuClaim::pick(-1, 2, allowed_, dir_).cpu(), -1);
  // Nothing was locked: a later rank still gets its own pick.
  EXPECT_EQ(CpuClaim::pick(0, 2, allowed_, dir_).cpu(), 2);
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
  if (!mine.empty()) {
    EXPECT_EQ(cpus, mine);
  }
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
    if (i > 0) {
      EXPECT_LT(cpus[i - 1], cpus[i]);
    }
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

TEST(CallerHomeCpuFor, OnlyWhereRanksOutnumberCpusEvenly) {
  const std::vector<int> allowed{2, 3};
  // 4 ranks on 2 CPUs: ranks 0 and 2 on the first, 1 and 3 on the second.
  EXPECT_EQ(callerHomeCpuFor(0, 4, allowed), 2);
  EXPECT_EQ(callerHomeCpuFor(1, 4, allowed), 3);
  EXPECT_EQ(callerHomeCpuFor(2, 4, allowed), 2);
  EXPECT_EQ(callerHomeCpuFor(3, 4, allowed), 3);
  EXPECT_EQ(callerHomeCpuFor(5, 6, allowed), 3);
  // Uneven shares, ranks that fit, a launcher's one-CPU binding, no rank.
  EXPECT_EQ(callerHomeCpuFor(0, 3, allowed), -1);
  EXPECT_EQ(callerHomeCpuFor(0, 2, allowed), -1);
  EXPECT_EQ(callerHomeCpuFor(0, 1, allowed), -1);
  EXPECT_EQ(callerHomeCpuFor(0, 4, std::vector<int>{5}), -1);
  EXPECT_EQ(callerHomeCpuFor(-1, 4, allowed), -1);
}

TEST(MoveCallingThreadTo, LandsThereAndKeepsTheMask) {
  const std::vector<int> all = allowedCpus();
  if (all.size() < 2) GTEST_SKIP() << "one CPU";
  std::thread t([&] {
    for (int cpu : all) {
      // The scheduler may move the thread again at any moment after the
      // call; right after it, it runs there in all but a rare try.
      bool landed = false;
      for (int k = 0; k < 50 && !landed; ++k) {
        moveCallingThreadTo(cpu);
        landed = ::sched_getcpu() == cpu;
      }
      EXPECT_TRUE(landed) << "CPU " << cpu;
      EXPECT_EQ(allowedCpus(), all) << "a placement, not a binding";
    }
    // Already there: nothing to do.
    bool stayed = false;
    for (int k = 0; k < 50 && !stayed; ++k) {
      const int here = ::sched_getcpu();
      stayed = !moveCallingThreadTo(here) && ::sched_getcpu() == here;
    }
    EXPECT_TRUE(stayed);
  });
  t.join();
}

TEST(MoveCallingThreadTo, LeavesAThreadWhoseMaskExcludesTheCpu) {
  const std::vector<int> all = allowedCpus();
  if (all.size() < 2) GTEST_SKIP() << "one CPU";
  std::thread t([&] {
    ASSERT_TRUE(bindThisThread(all[0]).isOk());
    EXPECT_FALSE(moveCallingThreadTo(all[1]));
    EXPECT_EQ(::sched_getcpu(), all[0]);
    EXPECT_EQ(allowedCpus(), std::vector<int>{all[0]});
    EXPECT_FALSE(moveCallingThreadTo(-1));
    EXPECT_FALSE(moveCallingThreadTo(CPU_SETSIZE));
  });
  t.join();
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
