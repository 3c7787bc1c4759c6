// Regression tests for defects found in review: each reproduced a wrong
// result, a hang, a misattributed error or a slow failure before its fix.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iterator>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "rank_harness.h"

using namespace htest;
using Clock = std::chrono::steady_clock;

namespace {

hora_status_t submitF32(hora_runtime_t rt, std::vector<float>& buf, std::vector<int64_t>& shape,
                        const char* name, hora_request_t* req, hora_process_set_t ps = nullptr,
                        hora_reduce_op_t op = HORA_OP_SUM) {
  DLTensor t = makeTensor(buf.data(), dlType(kDLFloat, 32), &shape);
  hora_options_t o;
  hora_options_init(&o);
  o.name = name;
  o.process_set = ps;
  o.op = op;
  return hora_allreduce_async(rt, &t, &t, &o, req);
}

// A rank shutting down right after submitting must never make a peer
// report success with a wrong result (it contributed nothing).
TEST(Regression, ShutdownRightAfterSubmitNeverYieldsAWrongResult) {
  int wrong = 0;
  for (int iter = 0; iter < 8; ++iter) {
    std::atomic<int> w{0};
    runThreads(2, [&](int rank, hora_runtime_t rt) {
      std::vector<float> buf(4, 1.0f);
      std::vector<int64_t> shape = {4};
      hora_request_t req;
      if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      ASSERT_EQ(submitF32(rt, buf, shape, "x", &req), HORA_SUCCESS);
      if (rank == 1) hora_shutdown(rt);
      hora_status_t s = waitAndFree(req, 40);
      if (rank == 0 && s == HORA_SUCCESS && buf[0] != 2.0f) w++;
    });
    wrong += w;
  }
  EXPECT_EQ(wrong, 0);
}

TEST(Regression, SubsetMismatchNamesGlobalRanks) {
  runThreads(3, [&](int rank, hora_runtime_t rt) {
    if (rank == 0) return;
    int32_t ranks[2] = {1, 2};
    hora_process_set_t ps;
    ASSERT_EQ(hora_process_set_create(rt, ranks, 2, &ps), HORA_SUCCESS)
        << hora_last_error_message();
    std::vector<float> buf(rank == 2 ? 5 : 4, 1.0f);
    std::vector<int64_t> shape = {static_cast<int64_t>(buf.size())};
    hora_request_t req;
    ASSERT_EQ(submitF32(rt, buf, shape, "mm", &req, ps), HORA_SUCCESS);
    std::string m;
    EXPECT_EQ(waitAndFree(req, 30, &m), HORA_ERR_MISMATCH);
    EXPECT_NE(m.find("rank 2 has float32[5]"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 1 has float32[4]"), std::string::npos) << m;
    hora_process_set_destroy(ps);
  });
}

TEST(Regression, WaitWithHugeOrInfiniteTimeoutWaits) {
  runThreads(2, [&](int rank, hora_runtime_t rt) {
    std::vector<float> buf(4, 1.0f);
    std::vector<int64_t> shape = {4};
    hora_request_t req;
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ASSERT_EQ(submitF32(rt, buf, shape, "w", &req), HORA_SUCCESS);
    EXPECT_EQ(hora_wait(req, 1e20), HORA_SUCCESS) << hora_last_error_message();
    EXPECT_EQ(hora_wait(req, INFINITY), HORA_SUCCESS);
    EXPECT_EQ(hora_wait(req, NAN), HORA_ERR_INVALID_ARGUMENT);
    hora_request_free(req);
  });
}

// Small (formerly control-thread-inline) allreduces: a stopped rank must be
// named by every survivor as lost, with HORA_ERR_REMOTE.
int smallLoop(int rank, int culprit, double deadlineS) {
  hora_runtime_t rt;
  if (hora_init(nullptr, &rt) != HORA_SUCCESS) return 10;
  auto start = Clock::now();
  std::vector<float> buf(16, 1.0f);
  std::vector<int64_t> shape = {16};
  for (int it = 0;; ++it) {
    hora_request_t req;
    CHILD_CHECK(submitF32(rt, buf, shape, "loop", &req) == HORA_SUCCESS, "%s",
                hora_last_error_message());
    std::string msg;
    hora_status_t s = waitAndFree(req, deadlineS, &msg);
    if (s != HORA_SUCCESS) {
      std::fprintf(stderr, "rank %d: step %d: %d %s\n", rank, it, s, msg.c_str());
      CHILD_CHECK(s == HORA_ERR_REMOTE, "status %d", s);
      std::string want = "rank " + std::to_string(culprit);
      CHILD_CHECK(msg.find(want) != std::string::npos, "does not name %s", want.c_str());
      hora_shutdown(rt);
      return 0;
    }
    if (it == 0) htest::markReady(rank);
    if (std::chrono::duration<double>(Clock::now() - start).count() > deadlineS) return 11;
  }
}

TEST(Regression, SmallAllreduceStoppedRankIsNamed) {
  htest::ReadyMarks ready;
  auto results = runProcesses(
      3, [](int rank) -> int { return smallLoop(rank, 1, 40); }, 60,
      [&](const std::vector<int>& pids) {
        ready.waitFor(3);
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        kill(pids[1], SIGSTOP);
        std::this_thread::sleep_for(std::chrono::seconds(5));
        kill(pids[1], SIGKILL);
      },
      {{"HORA_PEER_TIMEOUT_S", "2"}, ready.env()});
  for (int r : {0, 2})
    EXPECT_EQ(results[r].exitCode, 0) << "rank " << r << ":\n" << results[r].output;
}

TEST(Regression, BadGlooSettingFailsInitQuickly) {
  auto results = runProcesses(
      2,
      [](int rank) -> int {
        auto t0 = Clock::now();
        hora_runtime_t rt;
        hora_status_t s = hora_init(nullptr, &rt);
        double dt = std::chrono::duration<double>(Clock::now() - t0).count();
        CHILD_CHECK(s != HORA_SUCCESS, "init succeeded with a bogus algorithm");
        CHILD_CHECK(dt < 10, "init took %.1f s to fail", dt);
        CHILD_CHECK(std::string(hora_last_error_message()).find("bogus") != std::string::npos, "%s",
                    hora_last_error_message());
        return 0;
      },
      60, nullptr, {{"HORA_PEER_TIMEOUT_S", "20"}, {"HORA_GLOO_ALGORITHM", "bogus"}});
  for (int r = 0; r < 2; ++r) EXPECT_EQ(results[r].exitCode, 0) << results[r].output;
}

// A user tensor named like hora's join must not be confused with a join.
TEST(Regression, TensorNamedJoinWhileAnotherRankJoins) {
  runThreads(2, [&](int rank, hora_runtime_t rt) {
    if (rank == 0) {
      hora_request_t j;
      ASSERT_EQ(hora_join_async(rt, nullptr, &j), HORA_SUCCESS);
      EXPECT_EQ(waitAndFree(j, 20), HORA_SUCCESS) << lastMessage();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::vector<float> buf(4, 1.0f);
      std::vector<int64_t> shape = {4};
      hora_request_t req;
      ASSERT_EQ(submitF32(rt, buf, shape, "join", &req), HORA_SUCCESS);
      EXPECT_EQ(waitAndFree(req, 20), HORA_SUCCESS) << lastMessage();
      EXPECT_EQ(buf[0], 1.0f);  // rank 0 joined: contributes nothing
      hora_request_t j;
      ASSERT_EQ(hora_join_async(rt, nullptr, &j), HORA_SUCCESS);
      EXPECT_EQ(waitAndFree(j, 20), HORA_SUCCESS) << lastMessage();
      std::vector<float> b2(4, 1.0f);
      EXPECT_EQ(submitF32(rt, b2, shape, "__hora.join", &req), HORA_ERR_INVALID_ARGUMENT);
    }
  });
}

TEST(Regression, CacheCapacityMismatchFailsEveryRankAtStartNamingBothValues) {
  // Before the settings agreement only the differing rank failed; the others
  // waited for it until their start timeout.
  const int port = freePort();
  std::vector<hora_status_t> status(3, HORA_SUCCESS);
  std::vector<std::string> msg(3);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r)
    ranks.emplace_back([&, r] {
      hora_config_t c = testConfig(r, 3, port);
      c.cache_capacity = r == 2 ? 1 : 4;
      c.start_timeout_s = 60;
      hora_runtime_t rt;
      status[r] = hora_init(&c, &rt);
      msg[r] = hora_last_error_message();
      if (status[r] == HORA_SUCCESS) hora_shutdown(rt);
    });
  for (auto& t : ranks) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 20) << "every rank should learn of the difference at once, not at its start timeout";
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(status[r], HORA_ERR_INVALID_ARGUMENT) << "rank " << r << ": " << msg[r];
    EXPECT_NE(msg[r].find("HORA_CACHE_CAPACITY is '1' on rank 2 but '4' on rank 0"),
              std::string::npos)
        << "rank " << r << ": " << msg[r];
  }
}

int failOnRankOne(void* user, int32_t, const int64_t*, DLDataType, size_t nbytes, void** data) {
  auto* mine = static_cast<std::pair<int, std::vector<char>>*>(user);
  if (mine->first == 1) return 7;
  mine->second.assign(std::max<size_t>(nbytes, 1), 0);
  *data = mine->second.data();
  return 0;
}

TEST(Regression, CpuOutputAllocatorFailingOnOneRankFailsOnlyThatRequest) {
  // The rank whose allocator fails still takes part (its peers get their
  // results) and the set goes on; only its own request fails.
  runThreads(3, [](int rank, hora_runtime_t rt) {
    std::pair<int, std::vector<char>> mine{rank, {}};
    std::vector<int64_t> shape = {3, 2};
    std::vector<float> v(6, static_cast<float>(rank + 1));
    DLTensor t = makeTensor(v.data(), dlType(kDLFloat, 32), &shape);
    for (int kind = 0; kind < 3; ++kind) {
      hora_options_t o;
      hora_options_init(&o);
      const std::string name = "cpu.alloc." + std::to_string(kind);
      o.name = name.c_str();
      o.op = HORA_OP_SUM;
      o.alloc = failOnRankOne;
      o.alloc_user = &mine;
      hora_request_t req;
      hora_status_t rc = kind == 0   ? hora_allgather_async(rt, &t, &o, &req)
                         : kind == 1 ? hora_alltoall_async(rt, &t, nullptr, 3, &o, &req)
                                     : hora_reducescatter_async(rt, &t, &o, &req);
      ASSERT_EQ(rc, HORA_SUCCESS) << hora_last_error_message();
      std::string msg;
      EXPECT_EQ(waitAndFree(req, 30, &msg), rank == 1 ? HORA_ERR_SYSTEM : HORA_SUCCESS)
          << name << " rank " << rank << ": " << msg;
      if (rank == 1) {
        EXPECT_NE(msg.find("allocator callback failed (returned 7)"), std::string::npos) << msg;
      } else if (kind == 2) {  // reducescatter: one row each, the sum 1 + 2 + 3
        EXPECT_EQ(reinterpret_cast<const float*>(mine.second.data())[0], 6.0f);
      }
    }
    std::vector<int64_t> s1 = {1};
    std::vector<float> one(1, 1.0f);
    DLTensor t1 = makeTensor(one.data(), dlType(kDLFloat, 32), &s1);
    hora_options_t o;
    hora_options_init(&o);
    o.name = "after";
    o.op = HORA_OP_SUM;
    hora_request_t req;
    ASSERT_EQ(hora_allreduce_async(rt, &t1, &t1, &o, &req), HORA_SUCCESS);
    ASSERT_EQ(waitAndFree(req), HORA_SUCCESS) << lastMessage();
    EXPECT_EQ(one[0], 3.0f);
  });
}

// Horovod's join pattern (issue 13 reported a silent hang with it): warm the
// response cache with two named allreduces (fused), then one rank joins
// while the others allreduce the same names again, averaging; every world
// size 2-4, every rank joining first, with the cache on and off. The joined
// rank contributes nothing, so the average is over the others.
TEST(Regression, JoinWhileOthersAllreduceCachedNamesCompletesWithTheRightAverage) {
  for (int size = 2; size <= 4; ++size)
    for (int joiner = 0; joiner < size; ++joiner)
      for (int cache : {0, 1024}) {
        SCOPED_TRACE("size " + std::to_string(size) + ", joiner " + std::to_string(joiner) +
                     ", cache " + std::to_string(cache));
        runThreads(
            size,
            [&](int rank, hora_runtime_t rt) {
              auto submit = [&](std::vector<float>& v, std::vector<int64_t>& shape,
                                const char* name, hora_request_t* req) {
                return submitF32(rt, v, shape, name, req, nullptr, HORA_OP_AVERAGE);
              };
              std::vector<int64_t> sa = {5}, sb = {17};
              std::vector<float> a(5, float(rank + 1)), b(17, float(10 * (rank + 1)));
              hora_request_t ra, rb;
              ASSERT_EQ(submit(a, sa, "tensor_a", &ra), HORA_SUCCESS) << lastMessage();
              ASSERT_EQ(submit(b, sb, "tensor_b", &rb), HORA_SUCCESS) << lastMessage();
              ASSERT_EQ(waitAndFree(ra, 20), HORA_SUCCESS) << lastMessage();
              ASSERT_EQ(waitAndFree(rb, 20), HORA_SUCCESS) << lastMessage();
              const float all = (size + 1) / 2.0f;  // mean of 1..size
              EXPECT_FLOAT_EQ(a[0], all);
              if (rank != joiner) {
                // Everyone but the joiner: mean of (r+1) over the other ranks.
                const float others = (size * (size + 1) / 2.0f - (joiner + 1)) / (size - 1);
                std::fill(a.begin(), a.end(), float(rank + 1));
                std::fill(b.begin(), b.end(), float(10 * (rank + 1)));
                ASSERT_EQ(submit(a, sa, "tensor_a", &ra), HORA_SUCCESS) << lastMessage();
                ASSERT_EQ(submit(b, sb, "tensor_b", &rb), HORA_SUCCESS) << lastMessage();
                ASSERT_EQ(waitAndFree(ra, 20), HORA_SUCCESS) << lastMessage();
                ASSERT_EQ(waitAndFree(rb, 20), HORA_SUCCESS) << lastMessage();
                EXPECT_FLOAT_EQ(a[4], others);
                EXPECT_FLOAT_EQ(b[16], 10 * others);
              }
              hora_request_t j;
              ASSERT_EQ(hora_join_async(rt, nullptr, &j), HORA_SUCCESS);
              ASSERT_EQ(waitAndFree(j, 20), HORA_SUCCESS) << lastMessage();
            },
            [cache](hora_config_t& c) { c.cache_capacity = cache; }, 60);
      }
}

// A second request with a name still in flight fails at once on the rank that
// submits it (HORA_ERR_INVALID_USAGE, no request created), the same for every
// collective kind, as Horovod raises at enqueue; the first request and the
// peers are unaffected. Issue 13: Horovod's *_duplicate_name_error tests.
TEST(Regression, SecondRequestWithANameInFlightFailsAtOnceForEveryKind) {
  const char* kinds[] = {"allreduce", "grouped_allreduce", "allgather", "broadcast",
                         "alltoall",  "reducescatter",     "barrier",   "join"};
  std::atomic<int> checked{0};  // kinds rank 0 has checked
  runThreads(2, [&](int rank, hora_runtime_t rt) {
    std::vector<int64_t> shape = {2, 3};
    std::vector<float> in(6, float(rank + 1)), in2(6, 0.0f);
    DLTensor t = makeTensor(in.data(), dlType(kDLFloat, 32), &shape);
    DLTensor t2 = makeTensor(in2.data(), dlType(kDLFloat, 32), &shape);
    for (const char* const* kind = kinds; kind != std::end(kinds); ++kind) {
      SCOPED_TRACE(*kind);
      const std::string k = *kind;
      const std::string name = "dup." + k;
      hora_options_t o;
      hora_options_init(&o);
      o.name = name.c_str();
      auto submit = [&](DLTensor* x, hora_request_t* req) {
        if (k == "allreduce") return hora_allreduce_async(rt, x, x, &o, req);
        if (k == "grouped_allreduce") {
          const DLTensor* ins[1] = {x};
          DLTensor* outs[1] = {x};
          return hora_grouped_allreduce_async(rt, 1, ins, outs, &o, req);
        }
        if (k == "allgather") return hora_allgather_async(rt, x, &o, req);
        if (k == "broadcast") return hora_broadcast_async(rt, x, &o, req);
        if (k == "alltoall") return hora_alltoall_async(rt, x, nullptr, 2, &o, req);
        if (k == "reducescatter") return hora_reducescatter_async(rt, x, &o, req);
        if (k == "barrier") return hora_barrier_async(rt, &o, req);
        return hora_join_async(rt, &o, req);
      };
      // Rank 0 first, alone: its request cannot complete before rank 1's.
      hora_request_t first = nullptr, again = nullptr;
      if (rank == 0) {
        ASSERT_EQ(submit(&t, &first), HORA_SUCCESS) << hora_last_error_message();
        const auto t0 = Clock::now();
        EXPECT_EQ(submit(&t2, &again), HORA_ERR_INVALID_USAGE);
        const std::string msg = hora_last_error_message();
        EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.0);
        EXPECT_EQ(again, nullptr);
        EXPECT_NE(msg.find("already in flight"), std::string::npos) << msg;
        EXPECT_NE(msg.find(k == "join" ? "join" : "\"" + name), std::string::npos) << msg;
        EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
      }
      // Not a barrier: it would not wait for rank 0 once rank 0 has joined.
      if (rank == 0) checked.fetch_add(1);
      while (rank == 1 && checked.load() <= kind - kinds)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (rank == 1) {
        ASSERT_EQ(submit(&t, &first), HORA_SUCCESS) << hora_last_error_message();
      }
      EXPECT_EQ(waitAndFree(first, 20), HORA_SUCCESS) << k << ": " << lastMessage();
    }
  });
}

}  // namespace
