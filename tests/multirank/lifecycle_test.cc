// Lifecycle (issue 12): init -> shutdown -> init any number of times, with the
// store hosted by rank 0 (by hand, mpirun, Slurm) and by a launcher
// (external), ranks as threads and as processes. Every cycle runs a checked
// allreduce; after 50 cycles the process has no more file descriptors,
// threads or /dev/shm files than after the first (nothing leaks across
// runtimes), and the epochs are what docs/elastic.md says.
#include <dirent.h>
#include <gtest/gtest.h>
#include <hora/hora.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "rank_harness.h"

namespace {

using htest::freePort;
using htest::makeTensor;
using htest::testConfig;
using htest::waitAndFree;

// Entries of `dir` whose names start with `prefix` ("" = all).
int countEntries(const char* dir, const std::string& prefix = "") {
  DIR* d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.' && std::string(e->d_name).rfind(prefix, 0) == 0) ++n;
  closedir(d);
  return n;
}

struct Resources {
  int fds = 0, threads = 0, shmFiles = 0;
};

// Only this process's segments count: under `ctest -j` another test's ranks
// create and remove theirs at the same time.
Resources sample() {
  const std::string mine = "hora-" + std::to_string(::getpid()) + "-";
  return {countEntries("/proc/self/fd"), countEntries("/proc/self/task"),
          countEntries("/dev/shm", mine)};
}

// A joined thread can stay listed in /proc/self/task for a moment (the kernel
// wakes the joiner before it reaps the task), more so on a loaded machine:
// sample again until the counts are back to `base` or a few seconds passed.
Resources settledSample(const Resources& base) {
  Resources now = sample();
  for (int i = 0; i < 100 && (now.fds > base.fds || now.threads > base.threads); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    now = sample();
  }
  return now;
}

// One checked allreduce: every rank contributes rank + 1 + cycle.
bool allreduceOnce(hora_runtime_t rt, int rank, int size, int cycle, std::string* why) {
  std::vector<int64_t> shape{8};
  std::vector<float> in(8, static_cast<float>(rank + 1 + cycle)), out(8, -1);
  DLTensor tin = makeTensor(in.data(), DLDataType{kDLFloat, 32, 1}, &shape);
  DLTensor tout = makeTensor(out.data(), DLDataType{kDLFloat, 32, 1}, &shape);
  hora_options_t o;
  hora_options_init(&o);
  o.name = "lifecycle.grad";
  hora_request_t req = nullptr;
  if (hora_allreduce_async(rt, &tin, &tout, &o, &req) != HORA_SUCCESS) {
    *why = std::string("submit: ") + hora_last_error_message();
    return false;
  }
  std::string msg;
  if (hora_status_t s = waitAndFree(req, 30, &msg); s != HORA_SUCCESS) {
    *why = "allreduce: " + msg;
    return false;
  }
  const float expect = static_cast<float>(size * (size + 1) / 2 + size * cycle);
  for (float v : out)
    if (v != expect) {
      *why = "allreduce gave " + std::to_string(v) + ", expected " + std::to_string(expect);
      return false;
    }
  return true;
}

// Cycles [first, first + n) on `size` threads, each thread its own rank.
void runCycles(int size, int first, int n, int port, bool external,
               std::vector<std::string>* failures) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank)
    threads.emplace_back([=] {
      for (int cycle = first; cycle < first + n; ++cycle) {
        hora_config_t c = testConfig(rank, size, port);
        c.store_external = external ? 1 : 0;
        hora_runtime_t rt = nullptr;
        if (hora_init(&c, &rt) != HORA_SUCCESS) {
          (*failures)[rank] =
              "cycle " + std::to_string(cycle) + ": init: " + hora_last_error_message();
          return;
        }
        int64_t epoch = -1;
        EXPECT_EQ(hora_epoch(rt, &epoch), HORA_SUCCESS);
        // A launcher's store counts every runtime; one rank 0 hosts is new each time.
        EXPECT_EQ(epoch, external ? cycle + 1 : 1) << "rank " << rank << " cycle " << cycle;
        std::string why;
        const bool ok = allreduceOnce(rt, rank, size, cycle, &why);
        EXPECT_EQ(hora_shutdown(rt), HORA_SUCCESS);
        if (!ok) {
          (*failures)[rank] = "cycle " + std::to_string(cycle) + ": " + why;
          return;
        }
      }
    });
  for (auto& t : threads) t.join();
}

void reinitThreads(int size, int cycles, bool external) {
  int port = 0;
  hora_store_server_t server = nullptr;
  if (external) {
    ASSERT_EQ(hora_store_server_start("127.0.0.1", 0, "test-secret", &server), HORA_SUCCESS);
    ASSERT_EQ(hora_store_server_port(server, &port), HORA_SUCCESS);
  } else {
    port = freePort();
  }
  std::vector<std::string> failures(size);
  // The first cycle alone sets the baseline: whatever a process creates once
  // (the io thread pools of the first sockets) exists by then.
  runCycles(size, 0, 1, port, external, &failures);
  const Resources base = sample();
  runCycles(size, 1, cycles - 1, port, external, &failures);
  const Resources end = settledSample(base);
  for (int r = 0; r < size; ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
  EXPECT_EQ(end.fds, base.fds) << "file descriptors leaked over " << cycles << " runtimes";
  EXPECT_EQ(end.threads, base.threads) << "threads leaked over " << cycles << " runtimes";
  // Fewer is fine: hora sweeps segments a killed process left behind, and a
  // killed process of an earlier test may have had this pid.
  EXPECT_LE(end.shmFiles, base.shmFiles) << "/dev/shm files leaked over " << cycles << " runtimes";
  hora_store_server_stop(server);
}

}  // namespace

TEST(Lifecycle, ReinitFiftyTimesStoreHostedByRankZeroThreads) { reinitThreads(3, 50, false); }

TEST(Lifecycle, ReinitFiftyTimesLauncherStoreThreads) { reinitThreads(3, 50, true); }

// Ranks as processes, rank 0 hosting the store (what mpirun, Slurm or a
// hand-started job does): each child counts its own descriptors and threads.
TEST(Lifecycle, ReinitFiftyTimesProcesses) {
  auto results = htest::runProcesses(
      2,
      [](int rank) -> int {
        Resources base;
        for (int cycle = 0; cycle < 50; ++cycle) {
          hora_runtime_t rt = nullptr;
          CHILD_CHECK(hora_init(nullptr, &rt) == HORA_SUCCESS, "cycle %d init: %s", cycle,
                      hora_last_error_message());
          std::string why;
          const bool ok = allreduceOnce(rt, rank, 2, cycle, &why);
          CHILD_CHECK(hora_shutdown(rt) == HORA_SUCCESS, "shutdown: %s", hora_last_error_message());
          CHILD_CHECK(ok, "cycle %d: %s", cycle, why.c_str());
          if (cycle == 0) base = sample();
        }
        const Resources end = settledSample(base);
        CHILD_CHECK(
            end.fds == base.fds && end.threads == base.threads && end.shmFiles <= base.shmFiles,
            "leak over 50 runtimes: fds %d -> %d, threads %d -> %d, /dev/shm %d -> %d", base.fds,
            end.fds, base.threads, end.threads, base.shmFiles, end.shmFiles);
        return 0;
      },
      150);
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(results[r].exitCode, 0) << "rank " << r << ":\n" << results[r].output;
}
