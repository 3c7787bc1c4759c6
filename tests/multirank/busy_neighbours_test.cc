// Collectives of ranks that share their cores with other busy processes
// (data-loader workers, a second job): every hand-off then competes for a
// core, a yield hands the neighbour a whole time slice, and a waiting
// framework thread runs queued groups itself (SetController::runLoneQueued,
// bench/results/2026-11-28-cpu-hogs.md). Results must stay exact and every
// step must finish; the times are the benches' business, not this test's.
// Ranks are processes; two busy-loop processes run beside them throughout.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "rank_harness.h"

using namespace htest;

namespace {

// Busy-loop children, killed and reaped when this goes out of scope.
class BusyNeighbours {
 public:
  explicit BusyNeighbours(int n) {
    for (int i = 0; i < n; ++i) {
      const pid_t pid = ::fork();
      if (pid == 0) {
        volatile unsigned long spin = 0;
        for (;;) spin = spin + 1;
      }
      if (pid > 0) pids_.push_back(pid);
    }
  }
  ~BusyNeighbours() {
    for (pid_t p : pids_) ::kill(p, SIGKILL);
    for (pid_t p : pids_) ::waitpid(p, nullptr, 0);
  }
  size_t count() const { return pids_.size(); }

 private:
  std::vector<pid_t> pids_;
};

float valueOf(int rank, int it, size_t i, int salt) {
  return static_cast<float>((rank * salt + it + i) % 9);
}

// Each rank, `iters` rounds of: one allreduce each of 1, 1 Ki, 16 Ki and
// 256 Ki floats (inline, the caller's data plane, one below and one above
// HORA_RUN_ON_CONTROL_MAX_BYTES's default), waited one at a time, then two of
// 256 Ki in flight at once; every element checked.
int mixedLoop(int rank, int size, int iters) {
  hora_runtime_t rt;
  CHILD_CHECK(hora_init(nullptr, &rt) == HORA_SUCCESS, "init: %s", hora_last_error_message());
  const std::vector<size_t> counts = {1, 1024, 16384, 262144, 524288};
  auto submit = [&](std::vector<float>& buf, const std::string& name, hora_request_t* req) {
    std::vector<int64_t> shape = {static_cast<int64_t>(buf.size())};
    DLTensor t = makeTensor(buf.data(), dlType(kDLFloat, 32), &shape);
    hora_options_t o;
    hora_options_init(&o);
    o.name = name.c_str();
    return hora_allreduce_async(rt, &t, &t, &o, req);
  };
  auto check = [&](const std::vector<float>& buf, int it, int salt, const std::string& name) {
    for (size_t i = 0; i < buf.size(); ++i) {
      float want = 0;
      for (int r = 0; r < size; ++r) want += valueOf(r, it, i, salt);
      if (buf[i] != want) {
        std::fprintf(stderr, "%s round %d element %zu: %f != %f\n", name.c_str(), it, i, buf[i],
                     want);
        return false;
      }
    }
    return true;
  };
  for (int it = 0; it < iters; ++it) {
    for (size_t n : counts) {
      const std::string name = "one." + std::to_string(n);
      std::vector<float> buf(n);
      for (size_t i = 0; i < n; ++i) buf[i] = valueOf(rank, it, i, 1);
      hora_request_t req;
      CHILD_CHECK(submit(buf, name, &req) == HORA_SUCCESS, "%s: %s", name.c_str(),
                  hora_last_error_message());
      std::string msg;
      CHILD_CHECK(waitAndFree(req, 60, &msg) == HORA_SUCCESS, "%s: %s", name.c_str(), msg.c_str());
      CHILD_CHECK(check(buf, it, 1, name), "%s wrong", name.c_str());
    }
    std::vector<float> a(262144), b(262144);
    for (size_t i = 0; i < a.size(); ++i) {
      a[i] = valueOf(rank, it, i, 2);
      b[i] = valueOf(rank, it, i, 3);
    }
    hora_request_t ra, rb;
    CHILD_CHECK(submit(a, "two.a", &ra) == HORA_SUCCESS, "a: %s", hora_last_error_message());
    CHILD_CHECK(submit(b, "two.b", &rb) == HORA_SUCCESS, "b: %s", hora_last_error_message());
    std::string msg;
    CHILD_CHECK(waitAndFree(ra, 60, &msg) == HORA_SUCCESS, "a: %s", msg.c_str());
    CHILD_CHECK(waitAndFree(rb, 60, &msg) == HORA_SUCCESS, "b: %s", msg.c_str());
    CHILD_CHECK(check(a, it, 2, "two.a") && check(b, it, 3, "two.b"), "pair wrong");
  }
  const std::string m = metrics(rt);
  const long groups = metricCount(m, "groups"), byCaller = metricCount(m, "caller_driven_groups"),
             onControl = metricCount(m, "control_thread_groups");
  std::printf("groups=%ld control=%ld caller=%ld\n", groups, onControl, byCaller);
  std::fflush(stdout);
  // What the telemetry says ran off the executor is a part of what ran.
  CHILD_CHECK(groups > 0 && byCaller >= 0 && byCaller <= onControl && onControl <= groups,
              "groups %ld, on the control thread %ld, by the caller %ld", groups, onControl,
              byCaller);
  CHILD_CHECK(hora_shutdown(rt) == HORA_SUCCESS, "shutdown: %s", hora_last_error_message());
  return 0;
}

TEST(BusyNeighbours, AllreducesBesideTwoBusyProcessesStayExact) {
  BusyNeighbours hogs(2);
  ASSERT_EQ(hogs.count(), 2u);
  for (int size : {2, 3}) {
    SCOPED_TRACE("size " + std::to_string(size));
    // 20 rounds: about a second idle, a few beside the busy loops; the
    // deadline only catches a hang.
    auto results = runProcesses(size, [&](int rank) { return mixedLoop(rank, size, 20); }, 120,
                                nullptr, {{"HORA_AUTOTUNE", "0"}});
    for (size_t r = 0; r < results.size(); ++r)
      EXPECT_EQ(results[r].exitCode, 0) << "rank " << r << ":\n" << results[r].output;
  }
}

// The same with autotune on (its default): tuning groups are never taken
// by a waiting caller (Executor::canRunHere), and their values still reach
// every rank in the same order.
TEST(BusyNeighbours, AllreducesWithAutotuneBesideBusyProcessesStayExact) {
  BusyNeighbours hogs(2);
  auto results = runProcesses(2, [](int rank) { return mixedLoop(rank, 2, 40); }, 120, nullptr,
                              {{"HORA_AUTOTUNE", "1"}});
  for (size_t r = 0; r < results.size(); ++r)
    EXPECT_EQ(results[r].exitCode, 0) << "rank " << r << ":\n" << results[r].output;
}

}  // namespace
