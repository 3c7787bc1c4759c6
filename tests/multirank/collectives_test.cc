// Correctness sweep of every collective, ranks as threads, world sizes 1-4,
// every dtype and op, element counts 0, 1, odd, not divisible by the world
// size and above the fusion threshold, checked exactly against a locally
// computed reference.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include "gtest/gtest.h"
#include "rank_harness.h"
#include "tensor_util.h"

using namespace htest;
using hora::DataType;
using hora::ReduceOp;

namespace {

const int64_t kCounts[] = {0, 1, 7, 1001};

// Every collective runs over both CPU data planes: allreduce through shared
// memory (the default on one host) and everything through Gloo (HORA_SHM=0,
// what a multi-host job uses). The variable is set before any runtime of
// the test starts and read once by each runtime's init.
// Allreduces up to HORA_INLINE_MAX_BYTES (4 KiB by default) are reduced by
// the coordinator inside the negotiation; `dataPlane` turns that off, so the
// small sizes go through the data planes' own small-message paths too.
struct Plane {
  int size;
  bool shm;
  bool dataPlane = false;
};

class Collectives : public ::testing::TestWithParam<Plane> {
 protected:
  void SetUp() override {
    ::setenv("HORA_SHM", GetParam().shm ? "1" : "0", 1);
    if (GetParam().dataPlane) ::setenv("HORA_INLINE_MAX_BYTES", "0", 1);
  }
  void TearDown() override {
    ::unsetenv("HORA_SHM");
    ::unsetenv("HORA_INLINE_MAX_BYTES");
  }
};

TEST_P(Collectives, AllreduceEveryDtypeOpCount) {
  int size = GetParam().size;
  runThreads(size, [&](int rank, hora_runtime_t rt) { allreduceSweep(rank, size, rt, kDLCPU); });
}

TEST_P(Collectives, FusionScalesAndOutOfPlace) {
  int size = GetParam().size;
  // A small fusion threshold: many tensors fuse, the 3000-element ones exceed it.
  auto tweak = [](hora_config_t& c) { c.fusion_threshold_bytes = 4096; };
  runThreads(
      size,
      [&](int rank, hora_runtime_t rt) {
        for (int step = 0; step < 5;
             ++step) {  // repeated: later steps go through the response cache
          const int kTensors = 40;
          std::vector<std::vector<float>> in(kTensors), out(kTensors);
          std::vector<std::vector<int64_t>> shapes(kTensors);
          std::vector<hora_request_t> reqs(kTensors);
          for (int k = 0; k < kTensors; ++k) {
            int64_t n = k % 10 == 9 ? 3000 : 1 + (k * 37) % 300;
            shapes[k] = {n};
            in[k].resize(n);
            out[k].assign(n, -1.f);
            for (int64_t i = 0; i < n; ++i) in[k][i] = static_cast<float>((i + k + rank) % 9);
            DLTensor ti = makeTensor(in[k].data(), dlType(kDLFloat, 32), &shapes[k]);
            DLTensor to = makeTensor(out[k].data(), dlType(kDLFloat, 32), &shapes[k]);
            std::string name = "fused." + std::to_string(k);
            hora_options_t o;
            hora_options_init(&o);
            o.name = name.c_str();
            o.prescale = 2.0;
            o.postscale = 0.5;
            o.op = k % 2 ? HORA_OP_SUM : HORA_OP_AVERAGE;
            ASSERT_EQ(hora_allreduce_async(rt, &ti, &to, &o, &reqs[k]), HORA_SUCCESS)
                << hora_last_error_message();
          }
          for (int k = 0; k < kTensors; ++k) {
            std::string msg;
            ASSERT_EQ(waitAndFree(reqs[k], 60, &msg), HORA_SUCCESS) << msg;
            for (size_t i = 0; i < in[k].size(); ++i) {
              double sum = 0;
              for (int r = 0; r < size; ++r) sum += (i + k + r) % 9;
              double want = sum * (k % 2 ? 1.0 : 1.0 / size);
              ASSERT_NEAR(out[k][i], want, 1e-4 * std::max(1.0, want))
                  << "tensor " << k << " [" << i << "] step " << step;
              ASSERT_EQ(in[k][i], static_cast<float>((i + k + rank) % 9)) << "input modified";
            }
          }
        }
      },
      tweak);
}

// Large single tensors go through the backend's own ring with the output as
// staging: out of place, in place, with scale factors and a joined rank.
TEST_P(Collectives, LargeSingleTensorRing) {
  int size = GetParam().size;
  runThreads(size, [&](int rank, hora_runtime_t rt) {
    const int64_t n = 3 * 1000 * 1000 + 7;  // 12 MB, odd
    std::vector<int64_t> shape = {n};
    std::vector<float> in(n), out(n, -1.f);
    for (int64_t i = 0; i < n; ++i) in[i] = static_cast<float>((i + rank) % 11);
    for (int variant = 0; variant < 2; ++variant) {
      DLTensor ti = makeTensor(in.data(), dlType(kDLFloat, 32), &shape);
      DLTensor to = makeTensor(out.data(), dlType(kDLFloat, 32), &shape);
      hora_options_t o;
      hora_options_init(&o);
      std::string name = "big." + std::to_string(variant);
      o.name = name.c_str();
      o.prescale = variant ? 1.0 : 4.0;
      o.postscale = variant ? 1.0 : 0.25;
      o.op = variant ? HORA_OP_SUM : HORA_OP_AVERAGE;
      hora_request_t req;
      // Variant 1 runs in place on a copy of the input.
      std::vector<float> inplace(in);
      DLTensor tp = makeTensor(inplace.data(), dlType(kDLFloat, 32), &shape);
      ASSERT_EQ(variant ? hora_allreduce_async(rt, &tp, &tp, &o, &req)
                        : hora_allreduce_async(rt, &ti, &to, &o, &req),
                HORA_SUCCESS)
          << hora_last_error_message();
      ASSERT_EQ(waitAndFree(req, 120), HORA_SUCCESS) << lastMessage();
      const std::vector<float>& got = variant ? inplace : out;
      for (int64_t i = 0; i < n; i += 997) {
        double sum = 0;
        for (int r = 0; r < size; ++r) sum += (i + r) % 11;
        double want = variant ? sum : sum / size;
        ASSERT_NEAR(got[i], want, 1e-4 * std::max(1.0, want)) << name << " [" << i << "]";
      }
      ASSERT_NEAR(got[n - 1], variant ? [&] { double t = 0; for (int r = 0; r < size; ++r) t += (n - 1 + r) % 11; return t; }()
                                      : [&] { double t = 0; for (int r = 0; r < size; ++r) t += (n - 1 + r) % 11; return t / size; }(), 1e-3);
    }
  });
}

TEST_P(Collectives, GroupedAllreduce) {
  int size = GetParam().size;
  runThreads(size, [&](int rank, hora_runtime_t rt) {
    const int n = 6;
    std::vector<std::vector<int32_t>> bufs(n);
    std::vector<std::vector<int64_t>> shapes(n);
    std::vector<DLTensor> ts(n);
    std::vector<const DLTensor*> ins(n);
    std::vector<DLTensor*> outs(n);
    for (int k = 0; k < n; ++k) {
      shapes[k] = {k * 5 + 1};
      bufs[k].assign(k * 5 + 1, rank + k);
      ts[k] = makeTensor(bufs[k].data(), dlType(kDLInt, 32), &shapes[k]);
      ins[k] = &ts[k];
      outs[k] = &ts[k];
    }
    hora_options_t o;
    hora_options_init(&o);
    o.name = "group";
    hora_request_t req;
    ASSERT_EQ(hora_grouped_allreduce_async(rt, n, ins.data(), outs.data(), &o, &req), HORA_SUCCESS)
        << hora_last_error_message();
    ASSERT_EQ(waitAndFree(req), HORA_SUCCESS) << lastMessage();
    for (int k = 0; k < n; ++k)
      for (int32_t v : bufs[k]) ASSERT_EQ(v, size * (size - 1) / 2 + size * k);
  });
}

TEST_P(Collectives, AllgatherUnevenFirstDim) {
  int size = GetParam().size;
  runThreads(size, [&](int rank, hora_runtime_t rt) { allgatherSweep(rank, size, rt, kDLCPU, 0); });
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  int size = GetParam().size;
  runThreads(size, [&](int rank, hora_runtime_t rt) {
    for (int root = 0; root < size; ++root) {
      for (int64_t n : kCounts) {
        std::vector<double> buf(std::max<int64_t>(n, 1), rank == root ? 0.0 : -1.0);
        for (int64_t i = 0; i < n && rank == root; ++i) buf[i] = i * 0.5 + root;
        std::vector<int64_t> shape = {n};
        DLTensor t = makeTensor(buf.data(), dlType(kDLFloat, 64), &shape);
        hora_options_t o;
        hora_options_init(&o);
        std::string name = "bc." + std::to_string(root) + "." + std::to_string(n);
        o.name = name.c_str();
        o.root = root;
        hora_request_t req;
        ASSERT_EQ(hora_broadcast_async(rt, &t, &o, &req), HORA_SUCCESS)
            << hora_last_error_message();
        ASSERT_EQ(waitAndFree(req), HORA_SUCCESS) << lastMessage();
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(buf[i], i * 0.5 + root);
      }
    }
  });
}

TEST_P(Collectives, AlltoallUnevenSplits) {
  int size = GetParam().size;
  runThreads(size, [&](int rank, hora_runtime_t rt) { alltoallCheck(rank, size, rt, kDLCPU, 0); });
}

TEST_P(Collectives, ReducescatterUneven) {
  int size = GetParam().size;
  runThreads(size,
             [&](int rank, hora_runtime_t rt) { reducescatterSweep(rank, size, rt, kDLCPU, 0); });
}

TEST_P(Collectives, BarrierAndResponseCacheSteadyState) {
  int size = GetParam().size;
  // Capacity 3 with 5 rotating names forces evictions while hits are in flight.
  auto tweak = [](hora_config_t& c) { c.cache_capacity = 3; };
  runThreads(
      size,
      [&](int rank, hora_runtime_t rt) {
        for (int it = 0; it < 40; ++it) {
          int k = it % 5;
          int64_t n = (it >= 20 && k == 0) ? 9 : 4;  // a name whose shape changes mid-run
          std::vector<int64_t> shape = {n};
          std::vector<int32_t> buf(n, rank + it);
          DLTensor t = makeTensor(buf.data(), dlType(kDLInt, 32), &shape);
          hora_options_t o;
          hora_options_init(&o);
          std::string name = "cached." + std::to_string(k);
          o.name = name.c_str();
          hora_request_t req;
          ASSERT_EQ(hora_allreduce_async(rt, &t, &t, &o, &req), HORA_SUCCESS);
          ASSERT_EQ(waitAndFree(req), HORA_SUCCESS) << lastMessage();
          for (int32_t v : buf) ASSERT_EQ(v, size * (size - 1) / 2 + size * it);
          if (it % 10 == 0) {
            hora_request_t b;
            ASSERT_EQ(hora_barrier_async(rt, nullptr, &b), HORA_SUCCESS);
            ASSERT_EQ(waitAndFree(b), HORA_SUCCESS) << lastMessage();
          }
        }
      },
      tweak);
}

TEST_P(Collectives, JoinWithUnevenSteps) {
  int size = GetParam().size;
  runThreads(size, [&](int rank, hora_runtime_t rt) {
    // Rank r runs r + 2 steps, then joins; the others keep reducing.
    for (int step = 0; step < rank + 2; ++step) {
      std::vector<int64_t> shape = {5};
      std::vector<float> buf(5, 1.0f + rank);
      DLTensor t = makeTensor(buf.data(), dlType(kDLFloat, 32), &shape);
      hora_options_t o;
      hora_options_init(&o);
      o.name = "step";
      o.op = step % 2 ? HORA_OP_SUM : HORA_OP_AVERAGE;
      hora_request_t req;
      ASSERT_EQ(hora_allreduce_async(rt, &t, &t, &o, &req), HORA_SUCCESS)
          << hora_last_error_message();
      ASSERT_EQ(waitAndFree(req), HORA_SUCCESS) << lastMessage();
      // Ranks that have joined (those with fewer steps) contribute nothing.
      double sum = 0;
      int contributors = 0;
      for (int r = 0; r < size; ++r)
        if (step < r + 2) sum += 1.0 + r, ++contributors;
      double want = step % 2 ? sum : sum / contributors;
      for (float v : buf) ASSERT_NEAR(v, want, 1e-5) << "step " << step;
    }
    hora_request_t j;
    ASSERT_EQ(hora_join_async(rt, nullptr, &j), HORA_SUCCESS) << hora_last_error_message();
    ASSERT_EQ(hora_wait(j, 60), HORA_SUCCESS) << hora_last_error_message();
    int32_t last = -1;
    ASSERT_EQ(hora_request_join_last_rank(j, &last), HORA_SUCCESS);
    EXPECT_EQ(last, size - 1);
    hora_request_free(j);
  });
}

TEST_P(Collectives, ProcessSetsConcurrentWithGlobal) {
  int size = GetParam().size;
  if (size < 2) GTEST_SKIP() << "needs two ranks";
  runThreads(size, [&](int rank, hora_runtime_t rt) {
    // Set A: even ranks; set B: ranks 1..size-1.
    std::vector<int32_t> even, tail;
    for (int r = 0; r < size; ++r) {
      if (r % 2 == 0) even.push_back(r);
      if (r >= 1) tail.push_back(r);
    }
    hora_process_set_t a = nullptr, b = nullptr;
    if (rank % 2 == 0) {
      ASSERT_EQ(hora_process_set_create(rt, even.data(), even.size(), &a), HORA_SUCCESS)
          << hora_last_error_message();
    }
    if (rank >= 1) {
      ASSERT_EQ(hora_process_set_create(rt, tail.data(), tail.size(), &b), HORA_SUCCESS)
          << hora_last_error_message();
    }
    for (int it = 0; it < 10; ++it) {
      std::vector<int64_t> shape = {3};
      std::vector<int32_t> g(3, rank), va(3, rank), vb(3, rank);
      DLTensor tg = makeTensor(g.data(), dlType(kDLInt, 32), &shape);
      DLTensor ta = makeTensor(va.data(), dlType(kDLInt, 32), &shape);
      DLTensor tb = makeTensor(vb.data(), dlType(kDLInt, 32), &shape);
      hora_options_t o;
      hora_options_init(&o);
      o.name = "x";  // the same name in every set: sets are independent namespaces
      hora_request_t rg = nullptr, ra = nullptr, rb = nullptr;
      ASSERT_EQ(hora_allreduce_async(rt, &tg, &tg, &o, &rg), HORA_SUCCESS);
      if (a) {
        o.process_set = a;
        ASSERT_EQ(hora_allreduce_async(rt, &ta, &ta, &o, &ra), HORA_SUCCESS)
            << hora_last_error_message();
      }
      if (b) {
        o.process_set = b;
        ASSERT_EQ(hora_allreduce_async(rt, &tb, &tb, &o, &rb), HORA_SUCCESS)
            << hora_last_error_message();
      }
      ASSERT_EQ(waitAndFree(rg), HORA_SUCCESS) << lastMessage();
      ASSERT_EQ(g[0], size * (size - 1) / 2);
      if (ra) {
        ASSERT_EQ(waitAndFree(ra), HORA_SUCCESS) << lastMessage();
        ASSERT_EQ(va[0], std::accumulate(even.begin(), even.end(), 0));
      }
      if (rb) {
        ASSERT_EQ(waitAndFree(rb), HORA_SUCCESS) << lastMessage();
        ASSERT_EQ(vb[0], std::accumulate(tail.begin(), tail.end(), 0));
      }
    }
    if (a) {
      int32_t sr = -1, ss = -1;
      ASSERT_EQ(hora_process_set_rank(a, &sr), HORA_SUCCESS);
      ASSERT_EQ(hora_process_set_size(a, &ss), HORA_SUCCESS);
      EXPECT_EQ(sr, rank / 2);
      EXPECT_EQ(ss, static_cast<int32_t>(even.size()));
      EXPECT_EQ(hora_process_set_destroy(a), HORA_SUCCESS);
    }
    if (b) {
      EXPECT_EQ(hora_process_set_destroy(b), HORA_SUCCESS);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSize, Collectives,
                         ::testing::Values(Plane{1, true}, Plane{2, true}, Plane{3, true},
                                           Plane{4, true}, Plane{2, false}, Plane{3, false},
                                           Plane{4, false}, Plane{2, true, true},
                                           Plane{3, true, true}, Plane{4, false, true}),
                         [](const auto& info) {
                           return "np" + std::to_string(info.param.size) +
                                  (info.param.shm ? "_shm" : "_gloo") +
                                  (info.param.dataPlane ? "_noinline" : "");
                         });

}  // namespace
