// Where the runtime's threads run (core/cpu_affinity.h, HORA_BIND_EXECUTOR):
// each rank's global-set executor is bound to its own CPU by local rank,
// away from CPUs another job on the host claimed, sub-sets' executors stay
// unbound, a launcher's binding is left alone, and the parameter turns it
// off; where ranks outnumber the CPUs evenly, a framework thread waiting
// away from its rank's CPU is moved back (HORA_HOME_CALLER). Every test claims in a directory of
// its own (HORA_CPU_CLAIM_DIR), so runtimes of tests running alongside do not change the picks.
// Ranks as processes (affinity is per thread, read back from /proc), each with a deadline.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/cpu_affinity.h"
#include "rank_harness.h"

namespace {

using htest::makeTensor;

// A fresh claim directory, removed with what was claimed in it.
class ClaimDir {
 public:
  ClaimDir() {
    char tmpl[] = "/tmp/hora-placement-XXXXXX";
    if (::mkdtemp(tmpl) != nullptr) path_ = tmpl;
  }
  ~ClaimDir() {
    for (int cpu : hora::allowedCpus())
      ::unlink((path_ + "/hora-cpu-" + std::to_string(cpu) + ".lock").c_str());
    ::rmdir(path_.c_str());
  }
  const std::string& path() const { return path_; }
  std::vector<std::pair<std::string, std::string>> env(
      std::vector<std::pair<std::string, std::string>> more = {}) const {
    more.emplace_back("HORA_CPU_CLAIM_DIR", path_);
    return more;
  }

 private:
  std::string path_;
};

// The CPU lists of this process's threads named `name`.
std::vector<std::vector<int>> threadMasks(const std::string& name) {
  std::vector<std::vector<int>> out;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string dir = std::string("/proc/self/task/") + e->d_name;
    std::string comm;
    std::getline(std::ifstream(dir + "/comm"), comm);
    if (comm != name) continue;
    std::ifstream status(dir + "/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("Cpus_allowed_list:", 0) == 0) {
        std::vector<int> cpus;
        if (hora::parseCpuList(line.substr(line.find_first_not_of(" \t", 18)), &cpus))
          out.push_back(cpus);
        break;
      }
    }
  }
  closedir(d);
  return out;
}

bool allreduceOnce(hora_runtime_t rt, hora_process_set_t set, int size, std::string* why) {
  std::vector<int64_t> shape{4};
  std::vector<float> in(4, 1.0f), out(4, 0.0f);
  DLTensor tin = makeTensor(in.data(), DLDataType{kDLFloat, 32, 1}, &shape);
  DLTensor tout = makeTensor(out.data(), DLDataType{kDLFloat, 32, 1}, &shape);
  hora_options_t o;
  hora_options_init(&o);
  o.name = "placement.grad";
  o.process_set = set;
  hora_request_t req = nullptr;
  if (hora_allreduce_async(rt, &tin, &tout, &o, &req) != HORA_SUCCESS) {
    *why = std::string("submit: ") + hora_last_error_message();
    return false;
  }
  std::string msg;
  if (htest::waitAndFree(req, 30, &msg) != HORA_SUCCESS) {
    *why = "allreduce: " + msg;
    return false;
  }
  if (out[0] != static_cast<float>(size)) {
    *why = "allreduce: got " + std::to_string(out[0]);
    return false;
  }
  return true;
}

// Each rank: init, an allreduce in the global set and one in a sub-set of
// every rank (so both executors have run), then the masks of the executor
// threads. bound: whether the global set's executor must be on the CPU
// picked for its local rank (else every executor keeps the process's mask).
// avoidCpu >= 0 (another job holds it): the global set's executor must be on
// some other single CPU or unbound, wherever its local rank would put it.
int checkRank(int rank, int size, bool bound, int avoidCpu = -1) {
  const std::vector<int> processMask = hora::allowedCpus();
  hora_runtime_t rt = nullptr;
  CHILD_CHECK(hora_init(nullptr, &rt) == HORA_SUCCESS, "init: %s", hora_last_error_message());
  hora_process_set_t global = nullptr, sub = nullptr;
  CHILD_CHECK(hora_global_process_set(rt, &global) == HORA_SUCCESS, "global set");
  std::vector<int32_t> ranks;
  for (int r = 0; r < size; ++r) ranks.push_back(r);
  CHILD_CHECK(hora_process_set_create(rt, ranks.data(), size, &sub) == HORA_SUCCESS, "sub-set: %s",
              hora_last_error_message());
  std::string why;
  CHILD_CHECK(allreduceOnce(rt, global, size, &why), "global set: %s", why.c_str());
  CHILD_CHECK(allreduceOnce(rt, sub, size, &why), "sub-set: %s", why.c_str());
  int32_t localRank = -1;
  CHILD_CHECK(hora_local_rank(rt, &localRank) == HORA_SUCCESS, "local rank");
  const auto masks = threadMasks("hora-exec");
  CHILD_CHECK(masks.size() == 2, "%zu threads named hora-exec, want 2 (global set, sub-set)",
              masks.size());
  const int want = bound && avoidCpu < 0 ? hora::executorCpuFor(localRank, processMask) : -1;
  int onWant = 0, unbound = 0;
  for (const auto& m : masks) {
    CHILD_CHECK(avoidCpu < 0 || m != std::vector<int>{avoidCpu},
                "local rank %d: an executor is on CPU %d, which another job holds", localRank,
                avoidCpu);
    if (want >= 0 && m == std::vector<int>{want}) ++onWant;
    if (m == processMask) ++unbound;
    // For the parent, which checks that the ranks' CPUs differ.
    if (m.size() == 1 && m != processMask) std::printf("EXECUTOR_CPU=%d\n", m[0]);
  }
  std::fflush(stdout);
  if (avoidCpu >= 0) {
    int single = 0;
    for (const auto& m : masks) single += m.size() == 1 && m != processMask;
    CHILD_CHECK(unbound >= 1 && unbound + single == 2,
                "local rank %d: want the sub-set's executor unbound and the global one on one "
                "CPU or unbound; got %d unbound, %d on one CPU",
                localRank, unbound, single);
  } else if (want >= 0) {
    CHILD_CHECK(onWant == 1 && unbound == 1,
                "local rank %d: want one executor on CPU %d and one on the process's %zu CPUs; "
                "got %d and %d",
                localRank, want, processMask.size(), onWant, unbound);
  } else {
    CHILD_CHECK(unbound == 2, "local rank %d: %d of 2 executors keep the process's %zu CPUs",
                localRank, unbound, processMask.size());
  }
  CHILD_CHECK(hora_process_set_destroy(sub) == HORA_SUCCESS, "destroy");
  CHILD_CHECK(hora_shutdown(rt) == HORA_SUCCESS, "shutdown: %s", hora_last_error_message());
  return 0;
}

void expectAllPass(const std::vector<htest::ProcessResult>& results) {
  for (size_t r = 0; r < results.size(); ++r)
    EXPECT_EQ(results[r].exitCode, 0) << "rank " << r << ":\n" << results[r].output;
}

TEST(Placement, GlobalExecutorsOnDistinctCpusByLocalRankProcesses) {
  const size_t cpus = hora::allowedCpus().size();
  for (int size : {2, 3}) {
    SCOPED_TRACE("size " + std::to_string(size));
    // With one allowed CPU there is nothing to pick: the check then expects
    // every executor unbound.
    const bool canBind = cpus >= 2;
    ClaimDir claims;
    auto results = htest::runProcesses(
        size, [&](int rank) { return checkRank(rank, size, canBind); }, 60, nullptr, claims.env());
    expectAllPass(results);
    if (!canBind) continue;
    // Each rank's own check uses the library's pick; here the picks must
    // differ between ranks while they fit the CPUs (a wrong local rank would
    // put every executor on one CPU and still pass each rank's check).
    std::set<int> seen;
    for (const auto& r : results) {
      const size_t at = r.output.find("EXECUTOR_CPU=");
      ASSERT_NE(at, std::string::npos) << r.output;
      seen.insert(std::stoi(r.output.substr(at + 13)));
    }
    EXPECT_EQ(seen.size(), std::min<size_t>(static_cast<size_t>(size), cpus));
  }
}

TEST(Placement, OffLeavesEveryExecutorUnboundProcesses) {
  ClaimDir claims;
  expectAllPass(htest::runProcesses(
      2, [](int rank) { return checkRank(rank, 2, false); }, 60, nullptr,
      claims.env({{"HORA_BIND_EXECUTOR", "0"}})));
}

TEST(Placement, ALauncherBindingToOneCpuStandsProcesses) {
  // Each child binds itself to one CPU first, as mpirun --bind-to core or
  // taskset would: the runtime must not move its executor elsewhere.
  const std::vector<int> cpus = hora::allowedCpus();
  ASSERT_FALSE(cpus.empty());
  expectAllPass(htest::runProcesses(
      2,
      [&](int rank) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpus[static_cast<size_t>(rank) % cpus.size()], &one);
        CHILD_CHECK(sched_setaffinity(0, sizeof(one), &one) == 0, "sched_setaffinity");
        return checkRank(rank, 2, false);
      },
      60, nullptr, ClaimDir().env()));
}

TEST(Placement, ExecutorsAvoidACpuAnotherJobHoldsProcesses) {
  // This process stands for another hora job on the host: it holds the CPU
  // local rank 0 would take. The job's ranks must bind elsewhere (each to a
  // CPU of its own) or, with no CPU left, run unbound.
  const std::vector<int> cpus = hora::allowedCpus();
  if (cpus.size() < 2) GTEST_SKIP() << "one allowed CPU: nothing is bound";
  ClaimDir claims;
  hora::CpuClaim other = hora::CpuClaim::pick(0, 1, cpus, claims.path());
  ASSERT_TRUE(other.claimed()) << other.note();
  ASSERT_EQ(other.cpu(), cpus[0]);
  auto results = htest::runProcesses(
      2, [&](int rank) { return checkRank(rank, 2, true, other.cpu()); }, 60, nullptr,
      claims.env());
  expectAllPass(results);
  std::vector<int> bound;
  for (const auto& r : results) {
    const size_t at = r.output.find("EXECUTOR_CPU=");
    if (at != std::string::npos) bound.push_back(std::stoi(r.output.substr(at + 13)));
  }
  // Every CPU but the held one is free for the job: as many bound as fit.
  EXPECT_EQ(bound.size(), std::min<size_t>(2, cpus.size() - 1));
  EXPECT_EQ(std::set<int>(bound.begin(), bound.end()).size(), bound.size());
}

// Each rank, confined to `two` CPUs, runs `rounds` small allreduces and
// enters each hora_wait from the CPU that is not its home (moved there
// without changing its mask). Prints the homings the metrics counted and
// fails if its mask changed.
int homingRank(int size, const std::vector<int>& two, int rounds) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  for (int c : two) CPU_SET(c, &mask);
  CHILD_CHECK(sched_setaffinity(0, sizeof(mask), &mask) == 0, "sched_setaffinity");
  hora_runtime_t rt = nullptr;
  CHILD_CHECK(hora_init(nullptr, &rt) == HORA_SUCCESS, "init: %s", hora_last_error_message());
  int32_t localRank = -1;
  CHILD_CHECK(hora_local_rank(rt, &localRank) == HORA_SUCCESS, "local rank");
  const int away = two[static_cast<size_t>(localRank + 1) % 2];
  hora_process_set_t global = nullptr;
  CHILD_CHECK(hora_global_process_set(rt, &global) == HORA_SUCCESS, "global set");
  for (int i = 0; i < rounds; ++i) {
    hora::moveCallingThreadTo(away);
    std::string why;
    CHILD_CHECK(allreduceOnce(rt, global, size, &why), "round %d: %s", i, why.c_str());
    // Past the rate limit (one move per 10 ms per set).
    usleep(12000);
  }
  CHILD_CHECK(hora::allowedCpus() == two, "the waiting thread's mask changed: a binding");
  std::printf("HOMINGS=%ld\n", htest::metricCount(htest::metrics(rt), "caller_homings"));
  std::fflush(stdout);
  CHILD_CHECK(hora_shutdown(rt) == HORA_SUCCESS, "shutdown: %s", hora_last_error_message());
  return 0;
}

std::vector<long> homings(const std::vector<htest::ProcessResult>& results) {
  std::vector<long> out;
  for (const auto& r : results) {
    const size_t at = r.output.find("HOMINGS=");
    out.push_back(at == std::string::npos ? -1 : std::stol(r.output.substr(at + 8)));
  }
  return out;
}

TEST(Placement, AWaiterAwayFromItsCpuIsMovedBackWhereRanksOutnumberCpusProcesses) {
  // 4 ranks on 2 CPUs (HORA_HOME_CALLER): every rank's hora_wait finds its
  // thread on the other CPU and moves it back; with the parameter off, or 3
  // ranks (uneven shares: the scheduler's placement stays), none does.
  const std::vector<int> cpus = hora::allowedCpus();
  if (cpus.size() < 2) GTEST_SKIP() << "one allowed CPU";
  const std::vector<int> two{cpus[0], cpus[1]};
  constexpr int kRounds = 12;
  struct Case {
    int size;
    const char* param;
    bool moved;
  };
  for (const Case& c : {Case{4, "1", true}, Case{4, "0", false}, Case{3, "1", false}}) {
    SCOPED_TRACE("size " + std::to_string(c.size) + ", HORA_HOME_CALLER=" + c.param);
    auto results = htest::runProcesses(
        c.size, [&](int) { return homingRank(c.size, two, kRounds); }, 60, nullptr,
        ClaimDir().env({{"HORA_HOME_CALLER", c.param}}));
    expectAllPass(results);
    const std::vector<long> counts = homings(results);
    std::string seen;
    long total = 0;
    for (long h : counts) {
      seen += " " + std::to_string(h);
      total += h;
    }
    SCOPED_TRACE("homings per rank:" + seen);
    for (long h : counts) {
      if (c.moved) {
        // Every round starts away, but a round does not count where the
        // scheduler moved the thread home itself, or the allreduce finished
        // before hora_wait looked (a rank that submits last, on a loaded
        // machine: 2 of 6 was seen in CI). Hence at least one per rank and
        // half of all rounds, not every round.
        EXPECT_GE(h, 1);
        EXPECT_LE(h, kRounds);
      } else {
        EXPECT_EQ(h, 0);
      }
    }
    if (c.moved) EXPECT_GE(total, c.size * kRounds / 2);
  }
}

}  // namespace
