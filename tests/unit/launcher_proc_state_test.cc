// horarun's view of a worker's process group from /proc (launcher/proc_state.h):
// the stat line parser, and a real child stopped and continued.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "launcher/proc_state.h"

namespace horarun {
namespace {

TEST(ProcStat, ParsesStateGroupAndCommand) {
  char state = 0;
  pid_t group = 0;
  std::string comm;
  ASSERT_TRUE(parseProcStat("123 (python3) T 1 120 120 0 -1 4194560", &state, &group, &comm));
  EXPECT_EQ(state, 'T');
  EXPECT_EQ(group, 120);
  EXPECT_EQ(comm, "python3");
  // A command name may hold spaces and parentheses: it ends at the last ')'.
  ASSERT_TRUE(parseProcStat("7 (a) b (c)) S 1 7 7 0", &state, &group, &comm));
  EXPECT_EQ(state, 'S');
  EXPECT_EQ(group, 7);
  EXPECT_EQ(comm, "a) b (c)");
}

TEST(ProcStat, RefusesLinesOfAnotherForm) {
  char state = 0;
  pid_t group = 0;
  std::string comm;
  EXPECT_FALSE(parseProcStat("", &state, &group, &comm));
  EXPECT_FALSE(parseProcStat("123 python3 S 1 2", &state, &group, &comm));
  EXPECT_FALSE(parseProcStat("123 (x) SS 1 2", &state, &group, &comm));
  EXPECT_FALSE(parseProcStat("123 (x) S 1", &state, &group, &comm));
}

// Polls until the group's stopped state is `want` (the kernel applies a
// signal asynchronously) or 5 s passed.
GroupState waitFor(pid_t pgid, bool want) {
  GroupState g;
  for (int i = 0; i < 500; ++i) {
    g = processGroupState(pgid);
    if (g.known && g.stopped == want) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return g;
}

TEST(ProcessGroupState, SeesAStoppedMemberAndItsResumption) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    setpgid(0, 0);
    for (;;) pause();
  }
  setpgid(child, child);
  GroupState g = waitFor(child, false);
  EXPECT_TRUE(g.known);
  EXPECT_FALSE(g.stopped);

  kill(child, SIGSTOP);
  g = waitFor(child, true);
  EXPECT_TRUE(g.stopped);
  EXPECT_EQ(g.stoppedPid, child);
  EXPECT_FALSE(g.comm.empty());

  kill(child, SIGCONT);
  g = waitFor(child, false);
  EXPECT_TRUE(g.known);
  EXPECT_FALSE(g.stopped);

  kill(child, SIGKILL);
  int st = 0;
  waitpid(child, &st, 0);
  // Reaped: no process of the group is left.
  EXPECT_FALSE(processGroupState(child).known);
}

TEST(ProcessGroupState, AGroupWhereSomethingRunsIsActive) {
  // A group of two: a busy leader and a stopped child (a rank at work whose
  // helper process was stopped): stopped and active, so never taken for a
  // stopped rank.
  const pid_t leader = fork();
  ASSERT_GE(leader, 0);
  if (leader == 0) {
    setpgid(0, 0);
    if (fork() == 0) {
      raise(SIGSTOP);
      _exit(0);
    }
    for (volatile unsigned long i = 0;; ++i) {
    }
  }
  setpgid(leader, leader);
  GroupState g;
  for (int i = 0; i < 500; ++i) {
    g = processGroupState(leader);
    if (g.stopped && g.active) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(g.stopped);
  EXPECT_TRUE(g.active);
  kill(-leader, SIGKILL);
  int st = 0;
  waitpid(leader, &st, 0);
}

TEST(StoppedTimeout, ComesFromTheEnvironmentWithADefault) {
  unsetenv("HORARUN_STOPPED_TIMEOUT_S");
  EXPECT_EQ(stoppedTimeoutFromEnv(), 60);
}

}  // namespace
}  // namespace horarun
