// GPU pipelining (HORA_GPU_PIPELINE, ops/executor/executor.h): collectives
// through the communicator are launched one after another on the set's
// stream, and completed in order once their events fire. Against the mock
// plugin (tests/gpu/mock), whose events can be held "running": while they
// are, the executor must go on launching GPU groups, must not complete any,
// and must hold back a host group that came after them; released, all
// complete in launch order with their results. With HORA_GPU_PIPELINE=0 the
// executor waits for each group before it starts the next. Also the fused
// allreduce through the communicator that pipelining made worth it: big
// tensors reduced in their own output, the rest packed.
#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpu_mock_util.h"
#include "gtest/gtest.h"
#include "ops/gpu/gpu_path.h"
#include "rank_harness.h"

using namespace htest;

namespace {

class GpuPipeline : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("HORA_GPU_PLUGIN", HORA_GPU_MOCK_PATH, 1);
    ::unsetenv("HORA_GPU_PIPELINE");
    mockHoldEvents(false);
  }
  void TearDown() override {
    mockHoldEvents(false);
    ::unsetenv("HORA_GPU_PLUGIN");
    ::unsetenv("HORA_GPU_PIPELINE");
  }
};

// Completion order, recorded by the requests' callbacks.
struct Order {
  std::mutex mu;
  std::vector<int> done;
};
struct Tag {
  Order* order;
  int id;
};
void recordDone(void* user, hora_request_t, hora_status_t) {
  auto* t = static_cast<Tag*>(user);
  std::lock_guard<std::mutex> lk(t->order->mu);
  t->order->done.push_back(t->id);
}

hora_status_t submitAllreduce(hora_runtime_t rt, std::vector<float>& v, bool gpu, const char* name,
                              Tag* tag, hora_request_t* req) {
  std::vector<int64_t> shape = {static_cast<int64_t>(v.size())};
  DLTensor t = gpu ? cudaTensor(v.data(), dlType(kDLFloat, 32), &shape)
                   : makeTensor(v.data(), dlType(kDLFloat, 32), &shape);
  hora_options_t o;
  hora_options_init(&o);
  o.name = name;
  o.op = HORA_OP_SUM;
  o.postscale = 2.0;  // a result that differs from the input
  o.callback = recordDone;
  o.callback_user = tag;
  return hora_allreduce_async(rt, &t, &t, &o, req);
}

// Waits (up to 10 s) until the mock saw `n` more calls of `fn` than `before`.
bool awaitCalls(const char* fn, long before, long n) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (mockCalls(fn) - before < n) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// One GPU allreduce run to the end (completion recorded as -1 in `order`):
// the communicator exists before a test holds the events.
hora_status_t warmUp(hora_runtime_t rt, Order* order) {
  std::vector<float> warm(4, 1.0f);
  Tag tag{order, -1};
  hora_request_t req;
  const hora_status_t rc = submitAllreduce(rt, warm, true, "warm", &tag, &req);
  return rc != HORA_SUCCESS ? rc : waitAndFree(req);
}

bool finished(hora_request_t req) {
  int32_t done = 0;
  hora_test(req, &done);
  return done != 0;
}

TEST_F(GpuPipeline, CollectivesAreLaunchedWhileEarlierOnesRunAndCompleteInOrder) {
  runThreads(1, [](int, hora_runtime_t rt) {
    Order order;
    ASSERT_EQ(warmUp(rt, &order), HORA_SUCCESS) << lastMessage();

    mockHoldEvents(true);
    const long before = mockCalls("allreduce");
    std::vector<std::vector<float>> v(3, std::vector<float>(16));
    std::vector<Tag> tags;
    for (int i = 0; i < 3; ++i) tags.push_back(Tag{&order, i});
    std::vector<hora_request_t> reqs(3);
    for (int i = 0; i < 3; ++i) {
      for (size_t j = 0; j < v[i].size(); ++j) v[i][j] = static_cast<float>(i * 100 + j);
      const std::string name = "pipelined." + std::to_string(i);
      ASSERT_EQ(submitAllreduce(rt, v[i], true, name.c_str(), &tags[i], &reqs[i]), HORA_SUCCESS)
          << hora_last_error_message();
      // Each its own group (submitted together they would be fused into one).
      ASSERT_TRUE(awaitCalls("allreduce", before, i + 1))
          << "the executor launched " << mockCalls("allreduce") - before << " of " << i + 1
          << " GPU allreduces while the first was still running";
    }
    for (int i = 0; i < 3; ++i) EXPECT_FALSE(finished(reqs[i])) << i << " completed while held";
    mockHoldEvents(false);
    for (int i = 0; i < 3; ++i) {
      ASSERT_EQ(waitAndFree(reqs[i]), HORA_SUCCESS) << lastMessage();
      for (size_t j = 0; j < v[i].size(); ++j)
        ASSERT_EQ(v[i][j], 2.0f * static_cast<float>(i * 100 + j)) << i << " " << j;
    }
    std::lock_guard<std::mutex> lk(order.mu);
    EXPECT_EQ(order.done, (std::vector<int>{-1, 0, 1, 2}));
  });
}

TEST_F(GpuPipeline, AHostGroupCompletesAfterTheGpuGroupsLaunchedBeforeIt) {
  runThreads(1, [](int, hora_runtime_t rt) {
    Order order;
    ASSERT_EQ(warmUp(rt, &order), HORA_SUCCESS) << lastMessage();

    mockHoldEvents(true);
    const long before = mockCalls("allreduce");
    std::vector<float> g(8, 3.0f), c(8, 5.0f);
    Tag gTag{&order, 0}, cTag{&order, 1};
    hora_request_t gr, cr;
    ASSERT_EQ(submitAllreduce(rt, g, true, "gpu.first", &gTag, &gr), HORA_SUCCESS);
    ASSERT_TRUE(awaitCalls("allreduce", before, 1));
    ASSERT_EQ(submitAllreduce(rt, c, false, "host.second", &cTag, &cr), HORA_SUCCESS);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_FALSE(finished(cr)) << "the host group completed before the GPU group launched first";
    EXPECT_FALSE(finished(gr));
    mockHoldEvents(false);
    ASSERT_EQ(waitAndFree(gr), HORA_SUCCESS) << lastMessage();
    ASSERT_EQ(waitAndFree(cr), HORA_SUCCESS) << lastMessage();
    EXPECT_EQ(g[0], 6.0f);
    EXPECT_EQ(c[0], 10.0f);
    std::lock_guard<std::mutex> lk(order.mu);
    EXPECT_EQ(order.done, (std::vector<int>{-1, 0, 1}));
  });
}

TEST_F(GpuPipeline, TurnedOffTheExecutorWaitsForEachGroupBeforeTheNext) {
  ::setenv("HORA_GPU_PIPELINE", "0", 1);
  runThreads(1, [](int, hora_runtime_t rt) {
    Order order;
    ASSERT_EQ(warmUp(rt, &order), HORA_SUCCESS) << lastMessage();

    mockHoldEvents(true);
    const long before = mockCalls("allreduce");
    std::vector<float> a(8, 1.0f), b(8, 2.0f);
    Tag aTag{&order, 0}, bTag{&order, 1};
    hora_request_t ar, br;
    ASSERT_EQ(submitAllreduce(rt, a, true, "a", &aTag, &ar), HORA_SUCCESS);
    ASSERT_TRUE(awaitCalls("allreduce", before, 1));
    ASSERT_EQ(submitAllreduce(rt, b, true, "b", &bTag, &br), HORA_SUCCESS);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_EQ(mockCalls("allreduce") - before, 1) << "launched the second before the first ended";
    mockHoldEvents(false);
    ASSERT_EQ(waitAndFree(ar), HORA_SUCCESS) << lastMessage();
    ASSERT_EQ(waitAndFree(br), HORA_SUCCESS) << lastMessage();
    EXPECT_EQ(a[0], 2.0f);
    EXPECT_EQ(b[0], 4.0f);
  });
}

// Launched groups whose GPU work never ends fail together once the peer
// timeout passes, naming the timeout; the set is broken afterwards.
TEST_F(GpuPipeline, LaunchedGroupsThatNeverEndAllFailAfterThePeerTimeout) {
  runThreads(
      1,
      [](int, hora_runtime_t rt) {
        Order order;
        ASSERT_EQ(warmUp(rt, &order), HORA_SUCCESS) << lastMessage();
        mockHoldEvents(true);
        const long before = mockCalls("allreduce");
        std::vector<float> a(8, 1.0f), b(8, 2.0f);
        Tag aTag{&order, 0}, bTag{&order, 1};
        hora_request_t ar, br;
        ASSERT_EQ(submitAllreduce(rt, a, true, "stuck.a", &aTag, &ar), HORA_SUCCESS);
        ASSERT_TRUE(awaitCalls("allreduce", before, 1));
        ASSERT_EQ(submitAllreduce(rt, b, true, "stuck.b", &bTag, &br), HORA_SUCCESS);
        EXPECT_TRUE(awaitCalls("allreduce", before, 2));
        std::string msg;
        EXPECT_EQ(waitAndFree(ar, 30, &msg), HORA_ERR_TIMEOUT) << msg;
        EXPECT_NE(msg.find("allreduce \"stuck.a\" (cuda:0)"), std::string::npos) << msg;
        EXPECT_NE(msg.find("HORA_PEER_TIMEOUT_S=1 s"), std::string::npos) << msg;
        EXPECT_NE(waitAndFree(br, 30, &msg), HORA_SUCCESS);
        EXPECT_NE(msg.find("HORA_PEER_TIMEOUT_S=1 s"), std::string::npos) << msg;
        mockHoldEvents(false);
        std::lock_guard<std::mutex> lk(order.mu);
        EXPECT_EQ(order.done, (std::vector<int>{-1, 0, 1}));
      },
      [](hora_config_t& c) { c.peer_timeout_s = 1; });
}

// One rank, the executor waiting in a GPU group whose event is held: a host
// tensor submitted meanwhile is held back by the coordinator (to fuse more).
// The event is released after `busyMs`; both requests must succeed, the
// host one exact. `*released` gets the time of the release; `*negotiated`
// how much negotiation time (the metric) both tensors added.
void holdBehindABusyExecutor(hora_runtime_t rt, int busyMs,
                             std::chrono::steady_clock::time_point* released, double* negotiated) {
  Order order;
  ASSERT_EQ(warmUp(rt, &order), HORA_SUCCESS) << lastMessage();
  const double before = metricValue(metrics(rt), "negotiation_s");
  ASSERT_GE(before, 0.0);
  mockHoldEvents(true);
  const long calls = mockCalls("allreduce");
  std::vector<float> g(8, 1.0f), c(8, 2.0f);
  Tag gTag{&order, 0}, cTag{&order, 1};
  hora_request_t gr, cr;
  ASSERT_EQ(submitAllreduce(rt, g, true, "busy.gpu", &gTag, &gr), HORA_SUCCESS);
  ASSERT_TRUE(awaitCalls("allreduce", calls, 1));
  ASSERT_EQ(submitAllreduce(rt, c, false, "held.host", &cTag, &cr), HORA_SUCCESS);
  std::this_thread::sleep_for(std::chrono::milliseconds(busyMs));
  *released = std::chrono::steady_clock::now();
  mockHoldEvents(false);
  ASSERT_EQ(waitAndFree(gr), HORA_SUCCESS) << lastMessage();
  ASSERT_EQ(waitAndFree(cr, 30), HORA_SUCCESS) << lastMessage();
  EXPECT_EQ(c[0], 4.0f);
  *negotiated = metricValue(metrics(rt), "negotiation_s") - before;
}

// The coordinator holds a tensor back while its executor is busy (to fuse
// more), for at most a cycle; when the executor finishes, its done hook must
// wake the control thread to emit it. With a cycle of 10 s, a hold left to the
// timer (or the coordinator's other periodic work) would show. (The hook wakes
// the control thread only when something is held: a wake-up after every group
// made a one-rank 4-byte allreduce take 32 us instead of 8.5 on this machine.)
TEST_F(GpuPipeline, ATensorHeldWhileTheExecutorIsBusyGoesOutWhenItFinishes) {
  ::setenv("HORA_GPU_PIPELINE", "0", 1);  // the executor waits in the GPU group
  runThreads(
      1,
      [](int, hora_runtime_t rt) {
        std::chrono::steady_clock::time_point released;
        double negotiated = 0;
        holdBehindABusyExecutor(rt, 50, &released, &negotiated);
        // At once when the hook wakes the control thread (a few ms here);
        // without that wake-up it went out only about a second later.
        EXPECT_LT(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - released).count(), 0.5)
            << "the held tensor waited for a timer";
      },
      [](hora_config_t& c) { c.cycle_time_ms = 10000; });
}

// The same hold with a 20 ms cycle and the executor kept busy for 2 s:
// the held tensor is agreed (negotiation_s stops for it) when its cycle
// ends, not when the executor becomes idle. The timer once asked again
// without force, which started a new cycle each time and held it for as
// long as the executor stayed busy.
TEST_F(GpuPipeline, ATensorHeldWhileTheExecutorIsBusyGoesOutAfterOneCycle) {
  ::setenv("HORA_GPU_PIPELINE", "0", 1);  // the executor waits in the GPU group
  runThreads(
      1,
      [](int, hora_runtime_t rt) {
        std::chrono::steady_clock::time_point released;
        double negotiated = 1e9;
        holdBehindABusyExecutor(rt, 2000, &released, &negotiated);
        // Both tensors' negotiations: about a cycle in all; 2 s or more when
        // the held one waited for the executor (a bound far from both, so
        // that a loaded machine's delays cannot cross it).
        EXPECT_LT(negotiated, 1.0) << "the held tensor outlived its cycle";
      },
      [](hora_config_t& c) { c.cycle_time_ms = 20; });
}

// A fused group through the communicator: tensors of kGpuDirectBytes or more
// are reduced one by one from their input into their output, the rest packed
// and reduced together; a joined rank makes the same calls with stand-ins.
TEST_F(GpuPipeline, AFusedGroupReducesBigTensorsInTheirOwnOutputAndPacksTheRest) {
  const int64_t big = static_cast<int64_t>(hora::kGpuDirectBytes / 4);
  const std::vector<int64_t> counts = {big + 5, 7, big, 100};
  for (int size : {1, 2, 3}) {
    for (bool withJoined : {false, true}) {
      if (withJoined && size < 2) continue;
      SCOPED_TRACE(std::to_string(size) + " ranks" + (withJoined ? ", the last joined" : ""));
      ::setenv("HORA_GPU_MOCK_DEVICES", std::to_string(size).c_str(), 1);
      const long calls = mockCalls("allreduce"), copies = mockCalls("batched_scale_copy");
      runThreads(size, [&](int rank, hora_runtime_t rt) {
        const bool joined = withJoined && rank == size - 1;
        const int contributors = withJoined ? size - 1 : size;
        // Every rank runs one group first: the joined one then knows its GPU.
        std::vector<float> warm(4, 1.0f);
        std::vector<int64_t> ws = {4};
        DLTensor wt = cudaTensor(warm.data(), dlType(kDLFloat, 32), &ws, rank);
        hora_options_t o;
        hora_options_init(&o);
        o.name = "warm";
        hora_request_t req;
        ASSERT_EQ(hora_allreduce_async(rt, &wt, &wt, &o, &req), HORA_SUCCESS);
        ASSERT_EQ(waitAndFree(req), HORA_SUCCESS) << lastMessage();
        if (joined) {
          hora_request_t j;
          ASSERT_EQ(hora_join_async(rt, nullptr, &j), HORA_SUCCESS);
          ASSERT_EQ(waitAndFree(j), HORA_SUCCESS) << lastMessage();
          return;
        }
        std::vector<std::vector<float>> in(4), out(4);
        std::vector<std::vector<int64_t>> shapes(4);
        std::vector<DLTensor> ti(4), to(4);
        std::vector<const DLTensor*> pin(4);
        std::vector<DLTensor*> pout(4);
        for (int k = 0; k < 4; ++k) {
          shapes[k] = {counts[k]};
          in[k].resize(counts[k]);
          for (int64_t i = 0; i < counts[k]; ++i) in[k][i] = (rank + 1.0f) * (k + 1) + i % 3;
          ti[k] = cudaTensor(in[k].data(), dlType(kDLFloat, 32), &shapes[k], rank);
          if (k % 2 == 0) {  // out of place
            out[k].assign(counts[k], -1.0f);
            to[k] = cudaTensor(out[k].data(), dlType(kDLFloat, 32), &shapes[k], rank);
          } else {
            to[k] = ti[k];
          }
          pin[k] = &ti[k];
          pout[k] = &to[k];
        }
        o.name = "mixed";
        o.prescale = 2.0;
        o.postscale = 0.25;
        ASSERT_EQ(hora_grouped_allreduce_async(rt, 4, pin.data(), pout.data(), &o, &req),
                  HORA_SUCCESS)
            << hora_last_error_message();
        ASSERT_EQ(waitAndFree(req), HORA_SUCCESS) << lastMessage();
        double rankSum = 0;
        for (int r = 0; r < contributors; ++r) rankSum += r + 1.0;
        for (int k = 0; k < 4; ++k) {
          const std::vector<float>& got = k % 2 == 0 ? out[k] : in[k];
          for (int64_t i = 0; i < counts[k]; ++i) {
            const double want = (rankSum * (k + 1) + contributors * (i % 3)) * 2.0 * 0.25;
            ASSERT_FLOAT_EQ(got[i], static_cast<float>(want)) << "tensor " << k << " at " << i;
          }
        }
        hora_request_t j;
        ASSERT_EQ(hora_join_async(rt, nullptr, &j), HORA_SUCCESS);
        ASSERT_EQ(waitAndFree(j), HORA_SUCCESS) << lastMessage();
      });
      // Per rank: the warm-up, then both big tensors alone and one packed call.
      EXPECT_EQ(mockCalls("allreduce") - calls, size * 4);
      if (!withJoined) {  // pack, prescale, unpack, postscale (the in-place warm-up needs none)
        EXPECT_EQ(mockCalls("batched_scale_copy") - copies, size * 4);
      }
    }
  }
}

}  // namespace
