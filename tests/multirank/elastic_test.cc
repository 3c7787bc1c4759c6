// Elastic shrink through the C ABI (issue 12), ranks as processes: the test
// hosts the store and plays the launcher (publishes live/dead as horarun
// does), kills workers with SIGKILL in the middle of an allreduce loop, and
// the survivors restore their last commit, re-form (hora_reform), take the
// state from the new rank 0 and go on in the same processes. Every committed
// step's parameters must equal the reference computed from the same data
// (the averaged gradient does not depend on who is in the job), identical
// on every survivor.
#include <gtest/gtest.h>
#include <hora/hora.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "rank_harness.h"

namespace {

using htest::makeTensor;
using htest::waitAndFree;
using Clock = std::chrono::steady_clock;

constexpr int kSteps = 120;
constexpr int kParams = 1024;

double sinceEpochS() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The state a training loop commits: parameters and the step they belong to.
struct State {
  std::vector<float> params = std::vector<float>(kParams, 0.f);
  float step = 0;
};

hora_status_t run(hora_runtime_t rt, std::vector<float>* buf, bool broadcast, std::string* why) {
  std::vector<int64_t> shape{static_cast<int64_t>(buf->size())};
  DLTensor t = makeTensor(buf->data(), DLDataType{kDLFloat, 32, 1}, &shape);
  hora_options_t o;
  hora_options_init(&o);
  hora_request_t req = nullptr;
  hora_status_t s;
  if (broadcast) {
    o.name = "elastic.sync";
    o.root = 0;
    s = hora_broadcast_async(rt, &t, &o, &req);
  } else {
    o.name = "elastic.grad";
    o.op = HORA_OP_AVERAGE;
    s = hora_allreduce_async(rt, &t, &t, &o, &req);
  }
  if (s != HORA_SUCCESS) {
    *why = hora_last_error_message();
    return s;
  }
  s = waitAndFree(req, 60, why);
  return s;
}

// One worker: train kSteps with commits, surviving membership changes.
int worker(int rank) {
  const std::string id = "w" + std::to_string(rank);
  setenv("HORA_WORKER_ID", id.c_str(), 1);
  hora_runtime_t rt = nullptr;
  CHILD_CHECK(hora_init(nullptr, &rt) == HORA_SUCCESS, "init: %s", hora_last_error_message());
  State committed, live;
  int reforms = 0;
  bool needSync = false;
  // Progress marks for the test's killer (see shrink): "<dir>/<id>.e<epoch>"
  // once this worker committed 5 steps in that epoch.
  const char* marks = std::getenv("ELASTIC_TEST_MARKS");
  int stepsThisEpoch = 0;
  int64_t markedEpoch = -1;
  double failedAt = 0;
  std::string why;
  while (committed.step < kSteps) {
    hora_status_t s = HORA_SUCCESS;
    if (needSync) {
      // The survivors may have failed at different points of the last step:
      // the new rank 0's commit is everyone's.
      std::vector<float> blob(committed.params);
      blob.push_back(committed.step);
      s = run(rt, &blob, true, &why);
      if (s == HORA_SUCCESS) {
        committed.step = blob.back();
        blob.pop_back();
        committed.params = blob;
        live = committed;
        needSync = false;
        int32_t size = 0;
        hora_size(rt, &size);
        std::printf("%s: resumed at step %d with %d workers %.3f s after the failure\n", id.c_str(),
                    static_cast<int>(committed.step), size, sinceEpochS() - failedAt);
      }
    } else {
      // The gradient of step k is k + 1 on every rank (plus its index), so
      // its average is known whoever is in the job.
      std::vector<float> grad(kParams);
      for (int i = 0; i < kParams; ++i) grad[i] = live.step + 1 + static_cast<float>(i % 7);
      s = run(rt, &grad, false, &why);
      if (s == HORA_SUCCESS) {
        for (int i = 0; i < kParams; ++i) live.params[i] += grad[i];
        live.step += 1;
        committed = live;
        int64_t epoch = 0;
        hora_epoch(rt, &epoch);
        if (marks && ++stepsThisEpoch >= 5 && epoch != markedEpoch) {
          std::ofstream(std::string(marks) + "/" + id + ".e" + std::to_string(epoch)) << "";
          markedEpoch = epoch;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    if (s == HORA_SUCCESS) continue;
    CHILD_CHECK(s == HORA_ERR_MEMBERSHIP, "status %d is not HORA_ERR_MEMBERSHIP: %s", s,
                why.c_str());
    failedAt = sinceEpochS();
    std::printf("%s: step %d failed: %s\n", id.c_str(), static_cast<int>(live.step), why.c_str());
    live = committed;  // restore
    stepsThisEpoch = 0;
    CHILD_CHECK(++reforms <= 5, "too many re-formations");
    CHILD_CHECK(hora_reform(&rt) == HORA_SUCCESS, "reform: %s", hora_last_error_message());
    needSync = true;
  }
  int32_t size = 0;
  int64_t epoch = 0;
  hora_size(rt, &size);
  hora_epoch(rt, &epoch);
  for (int i = 0; i < kParams; ++i) {
    const float expect = kSteps * (kSteps + 1) / 2.f + kSteps * static_cast<float>(i % 7);
    CHILD_CHECK(committed.params[i] == expect, "param %d is %g, expected %g", i,
                committed.params[i], expect);
  }
  std::printf("%s: done, epoch %lld, %d workers, %d re-formations\n", id.c_str(),
              static_cast<long long>(epoch), size, reforms);
  CHILD_CHECK(hora_shutdown(rt) == HORA_SUCCESS, "shutdown: %s", hora_last_error_message());
  return 0;
}

// Waits (30 s at most) until every worker still alive wrote its mark for
// `epoch`; a worker that never does fails the test later by its own output.
void waitForMarks(const std::string& dir, const std::vector<bool>& alive, int epoch) {
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  for (;;) {
    bool all = true;
    for (size_t w = 0; w < alive.size() && all; ++w)
      all = !alive[w] ||
            access((dir + "/w" + std::to_string(w) + ".e" + std::to_string(epoch)).c_str(), F_OK) ==
                0;
    if (all || Clock::now() > deadline) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// `n` workers; the victims are killed one after another as the launcher
// would see it: reaped, live count lowered, dead key written. Each kill waits
// until every live worker has trained a few steps in the current epoch (its
// mark), so that it lands in the allreduce loop, not in a start-up or a
// re-formation that a loaded machine made slow (a fixed 700 ms could).
std::vector<htest::ProcessResult> shrink(int n, const std::vector<int>& victims, int minNp,
                                         const std::string& elasticTimeoutS = "60") {
  // In a process of its own: the ranks are forked below (see ForkedStoreServer).
  htest::ForkedStoreServer server("test-secret");
  htest::TempDir marks;
  const int port = server.port();
  auto publish = [&](const std::string& key, const std::string& value) {
    EXPECT_TRUE(server.set(key, value)) << key;
  };
  publish("hora/el/live", std::to_string(n));
  publish("hora/el/min_np", std::to_string(minNp));
  auto results =
      htest::runProcesses(n, worker, 120,
                          [&](const std::vector<int>& pids) {
                            int live = n;
                            std::vector<bool> alive(n, true);
                            for (size_t k = 0; k < victims.size(); ++k) {
                              const int victim = victims[k];
                              waitForMarks(marks.path(), alive, static_cast<int>(k));
                              kill(pids[victim], SIGKILL);
                              alive[victim] = false;
                              publish("hora/el/live", std::to_string(--live));
                              publish("hora/el/dead/w" + std::to_string(victim), "signal 9");
                            }
                          },
                          {{"ELASTIC_TEST_MARKS", marks.path()},
                           {"HORA_ELASTIC", "1"},
                           {"HORA_STORE_EXTERNAL", "1"},
                           {"HORA_STORE_PORT", std::to_string(port)},
                           {"HORA_PEER_TIMEOUT_S", "10"},
                           {"HORA_ELASTIC_TIMEOUT_S", elasticTimeoutS}});
  for (int victim : victims) EXPECT_EQ(results[victim].signal, SIGKILL) << results[victim].output;
  return results;
}

}  // namespace

// 4 -> 3 -> 2: w1 killed, then w3 (by then rank 2 of 3), while allreducing.
TEST(Elastic, ShrinkFourToThreeToTwoWithKillNine) {
  auto results = shrink(4, {1, 3}, 2);
  for (int r : {0, 2}) {
    EXPECT_EQ(results[r].exitCode, 0) << "worker " << r << ":\n" << results[r].output;
    EXPECT_NE(results[r].output.find("done, epoch 2, 2 workers"), std::string::npos)
        << results[r].output;
    // Ranks change between epochs: errors name the lost worker by its id.
    EXPECT_NE(results[r].output.find("(worker w1)"), std::string::npos) << results[r].output;
    EXPECT_NE(results[r].output.find("(worker w3)"), std::string::npos) << results[r].output;
  }
  if (getenv("HORA_TEST_VERBOSE"))
    std::printf("%s\n%s\n", results[0].output.c_str(), results[2].output.c_str());
}

// Rank 0 (the coordinator) lost: with the store hosted outside the ranks the
// survivors re-form, the lowest surviving old rank becoming rank 0.
TEST(Elastic, RankZeroKilledSurvivorsGoOn) {
  auto results = shrink(3, {0}, 1);
  for (int r : {1, 2}) {
    EXPECT_EQ(results[r].exitCode, 0) << "worker " << r << ":\n" << results[r].output;
    EXPECT_NE(results[r].output.find("done, epoch 1, 2 workers"), std::string::npos)
        << results[r].output;
  }
}

// Fewer survivors than --min-np: the re-formation fails on the survivor
// with the reason, within the deadline, never a hang.
TEST(Elastic, BelowMinNpFailsWithTheReason) {
  // Nobody replaces the lost workers here: the survivor waits the elastic
  // timeout for a replacement, then fails.
  auto results = shrink(3, {1, 2}, 2, "3");
  EXPECT_NE(results[0].exitCode, 0) << results[0].output;
  EXPECT_NE(results[0].output.find("needs at least 2"), std::string::npos) << results[0].output;
  if (getenv("HORA_TEST_VERBOSE")) std::printf("%s\n", results[0].output.c_str());
}

// A second failure during a re-formation: a member that was admitted to the
// new epoch dies before the epoch starts. The others' start-up fails at once
// with HORA_ERR_MEMBERSHIP naming it (not after the start timeout), and the
// next re-formation goes on without it. Ranks as threads; the dying member
// is a phantom ticket the test writes, as a newcomer that crashed would.
TEST(Elastic, MemberLostBetweenFormationAndStartUpFailsFastThenReformsWithoutIt) {
  hora_store_server_t server = nullptr;
  ASSERT_EQ(hora_store_server_start("127.0.0.1", 0, "test-secret", &server), HORA_SUCCESS);
  int32_t port = 0;
  ASSERT_EQ(hora_store_server_port(server, &port), HORA_SUCCESS);
  auto publish = [&](const std::string& key, const std::string& value) {
    ASSERT_EQ(hora_store_server_set(server, key.c_str(), value.data(), value.size()), HORA_SUCCESS);
  };
  publish("hora/el/min_np", "1");
  const std::vector<std::string> ids = {"w0", "w1"};
  auto config = [&](int rank) {
    hora_config_t c = htest::testConfig(rank, 2, port);
    c.store_external = 1;
    c.elastic = 1;
    c.worker_id = ids[rank].c_str();
    return c;
  };
  std::vector<hora_runtime_t> rts(2, nullptr);
  {
    std::vector<std::thread> ts;
    for (int r = 0; r < 2; ++r)
      ts.emplace_back([&, r] {
        hora_config_t c = config(r);
        EXPECT_EQ(hora_init(&c, &rts[r]), HORA_SUCCESS) << hora_last_error_message();
      });
    for (auto& t : ts) t.join();
  }
  ASSERT_TRUE(rts[0] && rts[1]);
  // A newcomer arrived for epoch 1 with the members' settings...
  int32_t major = 0, minor = 0, patch = 0;
  hora_get_version(&major, &minor, &patch);
  const std::string settings = "hora_version=" + std::to_string(major) + "." +
                               std::to_string(minor) + "." + std::to_string(patch) +
                               ",HORA_CACHE_CAPACITY=1024,HORA_GLOO_ALGORITHM=auto,"
                               "HORA_GPU_BACKEND=auto";
  int64_t t = 0;
  ASSERT_EQ(hora_store_server_add(server, "hora/el/r1/arrivals", 1, &t), HORA_SUCCESS);
  publish("hora/el/r1/ticket/" + std::to_string(t), "wP -1 -1 127.0.0.1 N " + settings);
  int32_t pending = 0;
  ASSERT_EQ(hora_membership_pending(rts[0], &pending), HORA_SUCCESS);
  EXPECT_EQ(pending, 1);
  // ...and dies once admitted, before publishing anything for the epoch.
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    publish("hora/el/dead/wP", "signal 9");
  });
  std::vector<hora_status_t> first(2), second(2);
  std::vector<std::string> firstWhy(2);
  std::vector<double> firstS(2);
  std::vector<int32_t> sizes(2, 0);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      auto t0 = Clock::now();
      first[r] = hora_reform(&rts[r]);
      firstWhy[r] = hora_last_error_message();
      firstS[r] = std::chrono::duration<double>(Clock::now() - t0).count();
      if (first[r] == HORA_SUCCESS) return;
      hora_config_t c = config(r);
      second[r] = hora_init(&c, &rts[r]);
      if (second[r] != HORA_SUCCESS) return;
      hora_size(rts[r], &sizes[r]);
      std::string why;
      std::vector<float> v(4, static_cast<float>(r + 1));
      EXPECT_EQ(run(rts[r], &v, false, &why), HORA_SUCCESS) << why;
      EXPECT_EQ(v[0], 1.5f);
      EXPECT_EQ(hora_shutdown(rts[r]), HORA_SUCCESS);
    });
  for (auto& th : ts) th.join();
  killer.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(first[r], HORA_ERR_MEMBERSHIP) << firstWhy[r];
    EXPECT_NE(firstWhy[r].find("worker wP"), std::string::npos) << firstWhy[r];
    EXPECT_LT(firstS[r], 5.0) << "the start-up waited for a dead member";
    EXPECT_EQ(second[r], HORA_SUCCESS);
    EXPECT_EQ(sizes[r], 2);
  }
  hora_store_server_stop(server);
}
