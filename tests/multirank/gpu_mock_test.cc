// libhora's GPU paths on machines without a GPU: tensors described as CUDA
// memory (DLPack kDLCUDA) whose bytes are host memory, served by the mock
// GPU plugin (tests/gpu_mock; "device" memory is host memory, streams are
// synchronous). Covers plugin loading and its errors, device checks, the
// communicator path at world sizes 1-4 with the device fusion buffer packed
// and unpacked by one batched copy per group, the staging path (device ->
// pinned host -> the CPU data plane -> device) at world sizes 1-4 over every
// dtype and op, broadcast, ready events, mixed CPU/GPU steps, and plugin
// failures surfacing as errors that name the tensor; allgather, alltoall and
// reducescatter over both paths with outputs in "device" memory (library-owned
// or from the caller's allocator, whose failure costs only that request). The
// mock's communicator spans ranks that are threads of this process, one
// device each, as NCCL needs. The real plugin's
// kernels and NCCL are tested on a GPU machine (tests/gpu).
#include <dlfcn.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/cpu_affinity.h"
#include "gpu_mock_util.h"
#include "gtest/gtest.h"
#include "rank_harness.h"
#include "tensor_util.h"

using namespace htest;
using hora::DataType;
using hora::ReduceOp;

namespace {

class GpuMock : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("HORA_GPU_PLUGIN", HORA_GPU_MOCK_PATH, 1);
    ::unsetenv("HORA_GPU_BACKEND");
    ::unsetenv("HORA_GPU_MOCK_FAIL");
  }
  void TearDown() override {
    ::unsetenv("HORA_GPU_PLUGIN");
    ::unsetenv("HORA_GPU_BACKEND");
    ::unsetenv("HORA_GPU_MOCK_FAIL");
    ::unsetenv("HORA_GPU_MOCK_DEVICES");
    ::unsetenv("HORA_GPU_MOCK_REFUSE_ABI");
    ::unsetenv("HORA_GPU_MOCK_STUCK");
  }
};

// Submits an in-place allreduce of `v`, described as CUDA memory on `device`
// (v must outlive the request; the shape is copied at submission).
hora_status_t gpuAllreduce(hora_runtime_t rt, std::vector<float>& v, const char* name,
                           hora_request_t* req, int device = 0, hora_reduce_op_t op = HORA_OP_SUM) {
  std::vector<int64_t> shape = {static_cast<int64_t>(v.size())};
  DLTensor t = cudaTensor(v.data(), dlType(kDLFloat, 32), &shape, device);
  hora_options_t o;
  hora_options_init(&o);
  o.name = name;
  o.op = op;
  return hora_allreduce_async(rt, &t, &t, &o, req);
}

TEST_F(GpuMock, MissingPluginIsAClearErrorAndCpuWorkContinues) {
  ::setenv("HORA_GPU_PLUGIN", "/nonexistent/libhora_cuda.so", 1);
  runThreads(1, [](int, hora_runtime_t rt) {
    std::vector<float> v(4, 1.0f);
    std::vector<int64_t> shape = {4};
    DLTensor t = cudaTensor(v.data(), dlType(kDLFloat, 32), &shape);
    hora_request_t req = nullptr;
    EXPECT_EQ(hora_allreduce_async(rt, &t, &t, nullptr, &req), HORA_ERR_NOT_SUPPORTED);
    std::string msg = hora_last_error_message();
    EXPECT_NE(msg.find("allreduce"), std::string::npos) << msg;
    EXPECT_NE(msg.find("/nonexistent/libhora_cuda.so"), std::string::npos) << msg;
    EXPECT_NE(msg.find("HORA_WITH_CUDA"), std::string::npos) << msg;
    EXPECT_EQ(req, nullptr);
    DLTensor c = makeTensor(v.data(), dlType(kDLFloat, 32), &shape);
    ASSERT_EQ(hora_allreduce_async(rt, &c, &c, nullptr, &req), HORA_SUCCESS);
    EXPECT_EQ(waitAndFree(req), HORA_SUCCESS);
  });
}

TEST_F(GpuMock, CommunicatorPathAtWorldSizeOne) {
  runThreads(1, [](int rank, hora_runtime_t rt) { allreduceSweep(rank, 1, rt, kDLCUDA); });
  EXPECT_GE(mockCalls("comm_init"), 1);
  EXPECT_GE(mockCalls("allreduce"), 1);
}

TEST_F(GpuMock, FusedGroupIsPackedAndUnpackedByOneBatchedCopyEach) {
  runThreads(1, [](int, hora_runtime_t rt) {
    const int kTensors = 50;
    std::vector<std::vector<float>> in(kTensors), out(kTensors);
    std::vector<std::vector<int64_t>> shapes(kTensors);
    std::vector<DLTensor> ti(kTensors), to(kTensors);
    std::vector<const DLTensor*> pin(kTensors);
    std::vector<DLTensor*> pout(kTensors);
    for (int k = 0; k < kTensors; ++k) {
      shapes[k] = {1 + k * 13};
      in[k].assign(shapes[k][0], static_cast<float>(k));
      out[k].assign(shapes[k][0], -1.0f);
      ti[k] = cudaTensor(in[k].data(), dlType(kDLFloat, 32), &shapes[k]);
      to[k] = cudaTensor(out[k].data(), dlType(kDLFloat, 32), &shapes[k]);
      pin[k] = &ti[k];
      pout[k] = &to[k];
    }
    hora_options_t o;
    hora_options_init(&o);
    o.name = "fused";
    o.prescale = 3.0;
    o.postscale = 0.5;
    const long before = mockCalls("batched_scale_copy");
    hora_request_t req;
    ASSERT_EQ(hora_grouped_allreduce_async(rt, kTensors, pin.data(), pout.data(), &o, &req),
              HORA_SUCCESS)
        << hora_last_error_message();
    ASSERT_EQ(waitAndFree(req), HORA_SUCCESS) << lastMessage();
    EXPECT_EQ(mockCalls("batched_scale_copy") - before, 2) << "one pack and one unpack";
    for (int k = 0; k < kTensors; ++k)
      for (float x : out[k]) ASSERT_FLOAT_EQ(x, k * 1.5f) << "tensor " << k;
  });
}

TEST_F(GpuMock, StagingPathEveryWorldSize) {
  ::setenv("HORA_GPU_BACKEND", "gloo", 1);
  for (int size = 1; size <= 4; ++size) {
    runThreads(size,
               [size](int rank, hora_runtime_t rt) { allreduceSweep(rank, size, rt, kDLCUDA); });
  }
}

TEST_F(GpuMock, BroadcastFromEveryRootBothPaths) {
  for (const char* backend : {"auto", "gloo"}) {
    ::setenv("HORA_GPU_BACKEND", backend, 1);
    const int size = std::string(backend) == "auto" ? 1 : 3;
    runThreads(size, [size](int rank, hora_runtime_t rt) {
      for (int root = 0; root < size; ++root) {
        std::vector<int64_t> shape = {1001};
        std::vector<int32_t> v(1001);
        for (int i = 0; i < 1001; ++i) v[i] = rank * 10000 + i;
        DLTensor t = cudaTensor(v.data(), dlType(kDLInt, 32), &shape);
        hora_options_t o;
        hora_options_init(&o);
        std::string name = "bcast." + std::to_string(root);
        o.name = name.c_str();
        o.root = root;
        hora_request_t req;
        ASSERT_EQ(hora_broadcast_async(rt, &t, &o, &req), HORA_SUCCESS)
            << hora_last_error_message();
        ASSERT_EQ(waitAndFree(req), HORA_SUCCESS) << lastMessage();
        for (int i = 0; i < 1001; ++i) ASSERT_EQ(v[i], root * 10000 + i);
      }
    });
  }
}

TEST_F(GpuMock, ReadyEventIsWaitedForAndCpuAndGpuTensorsMix) {
  runThreads(1, [](int, hora_runtime_t rt) {
    std::vector<int64_t> shape = {8};
    std::vector<float> g(8, 2.0f), c(8, 3.0f);
    DLTensor tg = cudaTensor(g.data(), dlType(kDLFloat, 32), &shape);
    DLTensor tc = makeTensor(c.data(), dlType(kDLFloat, 32), &shape);
    int fakeEvent = 0;
    hora_options_t og, oc;
    hora_options_init(&og);
    hora_options_init(&oc);
    og.name = "gpu.one";
    og.ready_event = &fakeEvent;
    oc.name = "cpu.one";
    const long before = mockCalls("stream_wait_external_event");
    hora_request_t rg, rc;
    ASSERT_EQ(hora_allreduce_async(rt, &tg, &tg, &og, &rg), HORA_SUCCESS);
    ASSERT_EQ(hora_allreduce_async(rt, &tc, &tc, &oc, &rc), HORA_SUCCESS);
    ASSERT_EQ(waitAndFree(rg), HORA_SUCCESS) << lastMessage();
    ASSERT_EQ(waitAndFree(rc), HORA_SUCCESS) << lastMessage();
    EXPECT_EQ(mockCalls("stream_wait_external_event") - before, 1);
    EXPECT_EQ(g[0], 2.0f);
    EXPECT_EQ(c[0], 3.0f);
  });
}

TEST_F(GpuMock, DeviceChecksAtSubmission) {
  runThreads(1, [](int, hora_runtime_t rt) {
    std::vector<int64_t> shape = {4};
    std::vector<float> a(4), b(4);
    DLTensor g = cudaTensor(a.data(), dlType(kDLFloat, 32), &shape);
    DLTensor g7 = cudaTensor(b.data(), dlType(kDLFloat, 32), &shape, 7);
    DLTensor c = makeTensor(b.data(), dlType(kDLFloat, 32), &shape);
    hora_request_t req = nullptr;
    EXPECT_EQ(hora_allreduce_async(rt, &g, &c, nullptr, &req), HORA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(hora_last_error_message()).find("input is on cuda:0 but output on cpu"),
              std::string::npos)
        << hora_last_error_message();
    EXPECT_EQ(hora_allreduce_async(rt, &g7, &g7, nullptr, &req), HORA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(hora_last_error_message()).find("cuda:7 but 1 GPU(s) are visible"),
              std::string::npos)
        << hora_last_error_message();
    EXPECT_EQ(hora_allgather_async(rt, &g7, nullptr, &req), HORA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(hora_last_error_message()).find("allgather"), std::string::npos)
        << hora_last_error_message();
    EXPECT_EQ(req, nullptr);
  });
}

TEST_F(GpuMock, CpuOnOneRankGpuOnAnotherIsAMismatch) {
  ::setenv("HORA_GPU_BACKEND", "gloo", 1);
  runThreads(2, [](int rank, hora_runtime_t rt) {
    std::vector<int64_t> shape = {4};
    std::vector<float> v(4, 1.0f);
    DLTensor t = rank == 0 ? cudaTensor(v.data(), dlType(kDLFloat, 32), &shape)
                           : makeTensor(v.data(), dlType(kDLFloat, 32), &shape);
    hora_options_t o;
    hora_options_init(&o);
    o.name = "where.am.i";
    hora_request_t req;
    ASSERT_EQ(hora_allreduce_async(rt, &t, &t, &o, &req), HORA_SUCCESS);
    std::string msg;
    EXPECT_EQ(waitAndFree(req, 30, &msg), HORA_ERR_MISMATCH) << msg;
    EXPECT_NE(msg.find("\"where.am.i\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("mismatched device"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cuda"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cpu"), std::string::npos) << msg;
  });
}

TEST_F(GpuMock, RankIOnDeviceIIsNotAMismatch) {
  // The usual layout: each rank's tensors on its own GPU index.
  ::setenv("HORA_GPU_BACKEND", "gloo", 1);
  ::setenv("HORA_GPU_MOCK_DEVICES", "2", 1);
  runThreads(2, [](int rank, hora_runtime_t rt) {
    std::vector<float> v(5, static_cast<float>(rank + 1));
    hora_request_t req;
    ASSERT_EQ(gpuAllreduce(rt, v, "per.rank.device", &req, rank, HORA_OP_SUM), HORA_SUCCESS)
        << hora_last_error_message();
    ASSERT_EQ(waitAndFree(req), HORA_SUCCESS) << lastMessage();
    for (float x : v) EXPECT_EQ(x, 3.0f);
  });
  ::unsetenv("HORA_GPU_MOCK_DEVICES");
}

TEST_F(GpuMock, PluginFailureNamesTheTensorAndTheCall) {
  ::setenv("HORA_GPU_MOCK_FAIL", "allreduce", 1);
  runThreads(1, [](int, hora_runtime_t rt) {
    std::vector<float> v(16, 1.0f);
    hora_request_t req;
    ASSERT_EQ(gpuAllreduce(rt, v, "layer1.grad", &req), HORA_SUCCESS);
    std::string msg;
    EXPECT_EQ(waitAndFree(req, 30, &msg), HORA_ERR_BACKEND) << msg;
    EXPECT_NE(msg.find("allreduce \"layer1.grad\" (cuda:0)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("mock: injected failure in allreduce"), std::string::npos) << msg;
  });
}

TEST_F(GpuMock, CommunicatorThatCannotFormFailsEveryRankWithAHint) {
  // nccl insists on the communicator: with both ranks on one GPU the mock
  // refuses it (as NCCL does), and every rank fails, naming itself.
  ::setenv("HORA_GPU_BACKEND", "nccl", 1);
  runThreads(2, [](int rank, hora_runtime_t rt) {
    std::vector<float> v(4, 1.0f);
    hora_request_t req;
    ASSERT_EQ(gpuAllreduce(rt, v, "needs.comm", &req), HORA_SUCCESS);
    std::string msg;
    EXPECT_EQ(waitAndFree(req, 30, &msg), HORA_ERR_BACKEND) << msg;
    EXPECT_NE(msg.find("rank " + std::to_string(rank) + " of 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("HORA_GPU_BACKEND=nccl: ranks that share a GPU need auto or gloo"),
              std::string::npos)
        << msg;
  });
}

// The communicator path across ranks: rank i on device i, as with NCCL.
TEST_F(GpuMock, CommunicatorPathEveryWorldSize) {
  for (int size = 2; size <= 4; ++size) {
    ::setenv("HORA_GPU_MOCK_DEVICES", std::to_string(size).c_str(), 1);
    const long before = mockCalls("allreduce");
    runThreads(size, [size](int rank, hora_runtime_t rt) {
      allreduceSweep(rank, size, rt, kDLCUDA, rank);
    });
    EXPECT_GT(mockCalls("allreduce"), before) << "size " << size;
  }
}

int fewestInitCpus() {
  void* h = ::dlopen(HORA_GPU_MOCK_PATH, RTLD_NOW | RTLD_LOCAL);
  if (!h) return -1;
  auto f = reinterpret_cast<int (*)()>(::dlsym(h, "hora_gpu_mock_fewest_init_cpus"));
  return f ? f() : -1;
}

TEST_F(GpuMock, CommunicatorIsCreatedWithTheProcessCpusNotTheBoundExecutors) {
  // The global set's executor is bound to one CPU (HORA_BIND_EXECUTOR); the
  // threads a real plugin starts in comm_init (NCCL's proxies) would inherit
  // that one CPU unless the executor widens its mask for the call.
  const int cpus = static_cast<int>(hora::allowedCpus().size());
  if (cpus < 2) GTEST_SKIP() << "one CPU: nothing is bound";
  ::setenv("HORA_GPU_MOCK_DEVICES", "2", 1);
  fewestInitCpus();  // forget earlier tests' calls
  runThreads(2, [](int rank, hora_runtime_t rt) {
    std::vector<float> v(1000, 1.0f + rank);
    hora_request_t req = nullptr;
    ASSERT_EQ(gpuAllreduce(rt, v, "bound.grad", &req, rank), HORA_SUCCESS);
    ASSERT_EQ(waitAndFree(req), HORA_SUCCESS) << lastMessage();
    EXPECT_EQ(v[0], 3.0f);
  });
  EXPECT_EQ(fewestInitCpus(), cpus);
}

TEST_F(GpuMock, AllgatherAlltoallReducescatterBothPathsEveryWorldSize) {
  for (const char* backend : {"auto", "gloo"}) {
    ::setenv("HORA_GPU_BACKEND", backend, 1);
    const bool comm = std::string(backend) == "auto";
    for (int size = 1; size <= 4; ++size) {
      // The communicator needs a device per rank; staging lets ranks share one.
      ::setenv("HORA_GPU_MOCK_DEVICES", std::to_string(comm ? size : 1).c_str(), 1);
      const long ag = mockCalls("allgatherv"), a2a = mockCalls("alltoallv"),
                 rs = mockCalls("reducescatter");
      runThreads(size, [size, comm](int rank, hora_runtime_t rt) {
        const int dev = comm ? rank : 0;
        allgatherSweep(rank, size, rt, kDLCUDA, dev);
        alltoallCheck(rank, size, rt, kDLCUDA, dev);
        reducescatterSweep(rank, size, rt, kDLCUDA, dev);
      });
      SCOPED_TRACE(std::string(backend) + " size " + std::to_string(size));
      // Through the communicator only on the communicator path (int16
      // reducescatter is staged even there; at one rank the allgather moves
      // nothing, the same on every rank, so nothing is called).
      EXPECT_EQ(mockCalls("allgatherv") > ag, comm && size > 1);
      EXPECT_EQ(mockCalls("alltoallv") > a2a, comm);
      EXPECT_EQ(mockCalls("reducescatter") > rs, comm);
    }
  }
}

TEST_F(GpuMock, LibraryOwnedOutputIsDeviceMemoryFreedWithTheRequest) {
  runThreads(1, [](int, hora_runtime_t rt) {
    std::vector<int64_t> shape = {6, 2};
    std::vector<float> v(12, 1.5f);
    DLTensor t = cudaTensor(v.data(), dlType(kDLFloat, 32), &shape);
    const long allocs = mockCalls("device_alloc"), frees = mockCalls("device_free");
    hora_request_t req;
    ASSERT_EQ(hora_allgather_async(rt, &t, nullptr, &req), HORA_SUCCESS)
        << hora_last_error_message();
    ASSERT_EQ(hora_wait(req, 60), HORA_SUCCESS) << hora_last_error_message();
    const DLTensor* out = nullptr;
    ASSERT_EQ(hora_request_output(req, &out), HORA_SUCCESS);
    EXPECT_EQ(out->device.device_type, kDLCUDA);
    EXPECT_EQ(mockCalls("device_alloc") - allocs, 1);
    EXPECT_EQ(mockCalls("device_free") - frees, 0) << "freed while the request holds it";
    EXPECT_EQ(static_cast<const float*>(out->data)[11], 1.5f);
    hora_request_free(req);
    EXPECT_EQ(mockCalls("device_free") - frees, 1);
  });
}

// An allocator that hands out "device" memory, failing on one rank.
struct Allocs {
  int failOnRank = -1;
  int rank = 0;
  std::vector<std::vector<char>> blocks;
  size_t lastBytes = 0;
  long seqAtAlloc = 0;  // the mock's call count when the callback ran
};
int testAlloc(void* user, int32_t, const int64_t*, DLDataType, size_t nbytes, void** data) {
  auto* a = static_cast<Allocs*>(user);
  a->lastBytes = nbytes;
  a->seqAtAlloc = mockSeq();
  if (a->rank == a->failOnRank) return 42;
  a->blocks.emplace_back(std::max<size_t>(nbytes, 1));
  *data = a->blocks.back().data();
  return 0;
}

TEST_F(GpuMock, AllocatorFailureFailsOnlyThatRankRequestAndTheSetGoesOn) {
  for (const char* backend : {"auto", "gloo"}) {
    ::setenv("HORA_GPU_BACKEND", backend, 1);
    const bool comm = std::string(backend) == "auto";
    ::setenv("HORA_GPU_MOCK_DEVICES", comm ? "3" : "1", 1);
    runThreads(3, [comm](int rank, hora_runtime_t rt) {
      const int dev = comm ? rank : 0;
      Allocs a;
      a.rank = rank;
      a.failOnRank = 1;
      std::vector<int64_t> shape = {4, 3};
      std::vector<int32_t> v(12);
      for (int i = 0; i < 12; ++i) v[i] = rank * 100 + i;
      DLTensor t = cudaTensor(v.data(), dlType(kDLInt, 32), &shape, dev);
      const char* kinds[] = {"allgather", "alltoall", "reducescatter"};
      for (const char* kind : kinds) {
        hora_options_t o;
        hora_options_init(&o);
        std::string name = std::string("alloc.") + kind;
        o.name = name.c_str();
        o.op = HORA_OP_SUM;
        o.alloc = testAlloc;
        o.alloc_user = &a;
        hora_request_t req;
        hora_status_t rc;
        if (kind == kinds[0])
          rc = hora_allgather_async(rt, &t, &o, &req);
        else if (kind == kinds[1])
          rc = hora_alltoall_async(rt, &t, std::vector<int64_t>{2, 1, 1}.data(), 3, &o, &req);
        else
          rc = hora_reducescatter_async(rt, &t, &o, &req);
        ASSERT_EQ(rc, HORA_SUCCESS) << hora_last_error_message();
        std::string msg;
        ASSERT_EQ(hora_wait(req, 60), rank == 1 ? HORA_ERR_SYSTEM : HORA_SUCCESS)
            << name << " rank " << rank << ": " << hora_last_error_message();
        if (rank == 1) {
          msg = hora_last_error_message();
          EXPECT_NE(msg.find("allocator callback failed (returned 42)"), std::string::npos) << msg;
          EXPECT_NE(msg.find(name), std::string::npos) << msg;
          EXPECT_NE(msg.find("cuda:" + std::to_string(dev)), std::string::npos) << msg;
        } else {
          const DLTensor* out = nullptr;
          ASSERT_EQ(hora_request_output(req, &out), HORA_SUCCESS);
          EXPECT_EQ(out->data, a.blocks.back().data()) << "the caller's memory";
          EXPECT_EQ(out->device.device_type, kDLCUDA);
          EXPECT_EQ(out->device.device_id, dev);
          const int32_t* r = static_cast<const int32_t*>(out->data);
          if (kind == kinds[0]) {  // allgather: 4 rows of 3 from each rank
            EXPECT_EQ(a.lastBytes, 3 * 12 * sizeof(int32_t));
            for (int i = 0; i < 36; ++i) ASSERT_EQ(r[i], (i / 12) * 100 + i % 12);
          } else if (kind == kinds[1]) {  // alltoall: rank 0 gets 2 rows from each
            const int rows = rank == 0 ? 2 : 1;
            EXPECT_EQ(a.lastBytes, 3 * rows * 3 * sizeof(int32_t));
            const int first = rank == 0 ? 0 : rank + 1;  // row offset in each sender
            for (int s = 0; s < 3; ++s)
              for (int i = 0; i < rows * 3; ++i)
                ASSERT_EQ(r[s * rows * 3 + i], s * 100 + first * 3 + i);
          } else {  // reducescatter: 4 rows over 3 ranks: 2, 1, 1
            const int start = rank == 0 ? 0 : rank + 1;
            for (int i = 0; i < (rank == 0 ? 6 : 3); ++i)
              ASSERT_EQ(r[i], 300 + 3 * (start * 3 + i));
          }
        }
        hora_request_free(req);
      }
      // The set is still usable on every rank.
      std::vector<int64_t> s1 = {3};
      std::vector<float> f(3, 1.0f);
      DLTensor ft = cudaTensor(f.data(), dlType(kDLFloat, 32), &s1, dev);
      hora_options_t o;
      hora_options_init(&o);
      o.name = "after.alloc.failure";
      o.op = HORA_OP_SUM;
      hora_request_t req;
      ASSERT_EQ(hora_allreduce_async(rt, &ft, &ft, &o, &req), HORA_SUCCESS);
      ASSERT_EQ(waitAndFree(req), HORA_SUCCESS) << lastMessage();
      EXPECT_EQ(f[0], 3.0f);
    });
  }
}

// options.alloc_event: a caching allocator's block may still be read by
// kernels queued on the caller's stream, so hora's stream waits for the event
// the allocator recorded before anything writes the output. At one rank the
// wait is the plugin call right after the allocation; at three (ranks are
// threads sharing the mock's counters) it comes after it. Without an
// allocator the event is ignored.
TEST_F(GpuMock, OutputFromTheCallersAllocatorIsWrittenOnlyAfterItsEvent) {
  for (const char* backend : {"auto", "gloo"}) {
    for (int size : {1, 3}) {
      SCOPED_TRACE(std::string(backend) + ", " + std::to_string(size) + " ranks");
      ::setenv("HORA_GPU_BACKEND", backend, 1);
      const bool comm = std::string(backend) == "auto";
      ::setenv("HORA_GPU_MOCK_DEVICES", comm ? std::to_string(size).c_str() : "1", 1);
      runThreads(size, [comm, size](int rank, hora_runtime_t rt) {
        const int dev = comm ? rank : 0;
        std::vector<int64_t> shape = {6, 2};
        std::vector<int32_t> v(12);
        for (int i = 0; i < 12; ++i) v[i] = rank * 100 + i;
        DLTensor t = cudaTensor(v.data(), dlType(kDLInt, 32), &shape, dev);
        const char* kinds[] = {"allgather", "alltoall", "reducescatter"};
        for (const char* kind : kinds) {
          SCOPED_TRACE(kind);
          Allocs a;
          a.rank = rank;
          int event = 0;  // stands for the allocator's cudaEvent_t
          hora_options_t o;
          hora_options_init(&o);
          std::string name = std::string("alloc.event.") + kind;
          o.name = name.c_str();
          o.op = HORA_OP_SUM;
          o.alloc = testAlloc;
          o.alloc_user = &a;
          o.alloc_event = &event;
          hora_request_t req;
          hora_status_t rc;
          if (kind == kinds[0])
            rc = hora_allgather_async(rt, &t, &o, &req);
          else if (kind == kinds[1])
            rc = hora_alltoall_async(rt, &t, nullptr, 0, &o, &req);
          else
            rc = hora_reducescatter_async(rt, &t, &o, &req);
          ASSERT_EQ(rc, HORA_SUCCESS) << hora_last_error_message();
          ASSERT_EQ(waitAndFree(req), HORA_SUCCESS) << lastMessage();
          ASSERT_FALSE(a.blocks.empty());
          const long waited = mockEventWaitSeq(&event);
          if (size == 1)
            EXPECT_EQ(waited, a.seqAtAlloc + 1) << "the wait must follow the allocation at once";
          else
            EXPECT_GT(waited, a.seqAtAlloc) << "the wait must follow the allocation";
          const int32_t* r = reinterpret_cast<const int32_t*>(a.blocks.back().data());
          if (kind == kinds[0]) {
            EXPECT_EQ(r[12 * (size - 1)], (size - 1) * 100);  // the last rank's first element
          } else if (kind == kinds[1]) {
            const int rows = 6 / size;  // from each rank: its rows [rank*rows, ...)
            EXPECT_EQ(r[0], rank * rows * 2);
          } else {
            const int rows = 6 / size;
            EXPECT_EQ(r[0], 100 * (size * (size - 1) / 2) + size * rank * rows * 2);
          }
        }
        if (size != 1) return;
        // No allocator: the library's own output ignores alloc_event.
        int event = 0;
        hora_options_t o;
        hora_options_init(&o);
        o.name = "library.owned";
        o.alloc_event = &event;
        const long waits = mockCalls("stream_wait_external_event");
        hora_request_t req;
        ASSERT_EQ(hora_allgather_async(rt, &t, &o, &req), HORA_SUCCESS);
        ASSERT_EQ(waitAndFree(req), HORA_SUCCESS) << lastMessage();
        EXPECT_EQ(mockCalls("stream_wait_external_event"), waits);
      });
    }
  }
}

TEST_F(GpuMock, PluginWithoutEntryPointOrOfAnotherAbiIsRefusedWithTheReason) {
  struct Case {
    const char* plugin;
    bool refuseAbi;
    const char* expect;
  } cases[] = {{HORA_LIBRARY_PATH, false, "no symbol hora_gpu_plugin_get"},
               {HORA_GPU_MOCK_PATH, true, "does not speak GPU plugin ABI v1"}};
  for (const Case& c : cases) {
    ::setenv("HORA_GPU_PLUGIN", c.plugin, 1);
    if (c.refuseAbi) ::setenv("HORA_GPU_MOCK_REFUSE_ABI", "1", 1);
    runThreads(1, [&c](int, hora_runtime_t rt) {
      std::vector<float> v(4, 1.0f);
      std::vector<int64_t> shape = {4};
      DLTensor t = cudaTensor(v.data(), dlType(kDLFloat, 32), &shape);
      hora_request_t req = nullptr;
      EXPECT_EQ(hora_allreduce_async(rt, &t, &t, nullptr, &req), HORA_ERR_NOT_SUPPORTED);
      std::string msg = hora_last_error_message();
      EXPECT_NE(msg.find(c.plugin), std::string::npos) << msg;
      EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
      EXPECT_EQ(req, nullptr);
    });
    ::unsetenv("HORA_GPU_MOCK_REFUSE_ABI");
  }
}

TEST_F(GpuMock, JoinedRanksTakePartInGpuCollectivesWithTheIdentity) {
  // Rank r runs r + 1 steps of GPU allreduce (grouped, so fused), reducescatter
  // and allgather, then joins: the joined ranks take part through stand-in
  // device buffers (after their first step they know their device).
  for (const char* backend : {"auto", "gloo"}) {
    ::setenv("HORA_GPU_BACKEND", backend, 1);
    const bool comm = std::string(backend) == "auto";
    ::setenv("HORA_GPU_MOCK_DEVICES", comm ? "3" : "1", 1);
    runThreads(3, [comm](int rank, hora_runtime_t rt) {
      const int dev = comm ? rank : 0;
      for (int step = 0; step < rank + 1; ++step) {
        int contributors = 0;
        double sum = 0;
        for (int r = 0; r < 3; ++r)
          if (step < r + 1) ++contributors, sum += r + 1;
        std::vector<int64_t> s4 = {4}, s3 = {3, 2}, s6 = {6, 1};
        std::vector<float> a(4, rank + 1.0f), b(6, rank + 1.0f), rsIn(6, rank + 1.0f);
        std::vector<float> agIn(rank + 1, static_cast<float>(rank));
        std::vector<int64_t> sAg = {rank + 1};
        DLTensor ta = cudaTensor(a.data(), dlType(kDLFloat, 32), &s4, dev);
        DLTensor tb = cudaTensor(b.data(), dlType(kDLFloat, 32), &s3, dev);
        DLTensor trs = cudaTensor(rsIn.data(), dlType(kDLFloat, 32), &s6, dev);
        DLTensor tag = cudaTensor(agIn.data(), dlType(kDLFloat, 32), &sAg, dev);
        const DLTensor* in[] = {&ta, &tb};
        DLTensor* out[] = {&ta, &tb};
        hora_options_t o;
        hora_options_init(&o);
        const std::string n1 = "join.ar." + std::to_string(step),
                          n2 = "join.rs." + std::to_string(step),
                          n3 = "join.ag." + std::to_string(step);
        o.name = n1.c_str();
        o.op = HORA_OP_AVERAGE;
        hora_request_t ar, rs, ag;
        ASSERT_EQ(hora_grouped_allreduce_async(rt, 2, in, out, &o, &ar), HORA_SUCCESS)
            << hora_last_error_message();
        o.name = n2.c_str();
        o.op = HORA_OP_SUM;
        ASSERT_EQ(hora_reducescatter_async(rt, &trs, &o, &rs), HORA_SUCCESS)
            << hora_last_error_message();
        o.name = n3.c_str();
        ASSERT_EQ(hora_allgather_async(rt, &tag, &o, &ag), HORA_SUCCESS)
            << hora_last_error_message();
        ASSERT_EQ(waitAndFree(ar), HORA_SUCCESS) << lastMessage();
        for (float x : a) ASSERT_FLOAT_EQ(x, sum / contributors) << "step " << step;
        for (float x : b) ASSERT_FLOAT_EQ(x, sum / contributors) << "step " << step;
        ASSERT_EQ(hora_wait(rs, 60), HORA_SUCCESS) << hora_last_error_message();
        const DLTensor* r = nullptr;
        ASSERT_EQ(hora_request_output(rs, &r), HORA_SUCCESS);
        ASSERT_EQ(r->shape[0], 2);
        for (int i = 0; i < 2; ++i) ASSERT_FLOAT_EQ(static_cast<const float*>(r->data)[i], sum);
        hora_request_free(rs);
        ASSERT_EQ(hora_wait(ag, 60), HORA_SUCCESS) << hora_last_error_message();
        ASSERT_EQ(hora_request_output(ag, &r), HORA_SUCCESS);
        int64_t rows = 0;
        for (int q = 0; q < 3; ++q)
          if (step < q + 1) rows += q + 1;
        ASSERT_EQ(r->shape[0], rows) << "joined ranks contribute no rows";
        hora_request_free(ag);
      }
      hora_request_t j;
      ASSERT_EQ(hora_join_async(rt, nullptr, &j), HORA_SUCCESS) << hora_last_error_message();
      ASSERT_EQ(waitAndFree(j), HORA_SUCCESS) << lastMessage();
    });
  }
}

TEST_F(GpuMock, GpuWorkThatNeverCompletesFailsAfterThePeerTimeoutAndAbortsTheCommunicator) {
  ::setenv("HORA_GPU_MOCK_STUCK", "1", 1);
  const long aborts = mockCalls("comm_abort");
  runThreads(
      1,
      [](int, hora_runtime_t rt) {
        std::vector<float> v(8, 1.0f);
        hora_request_t req;
        const auto t0 = std::chrono::steady_clock::now();
        ASSERT_EQ(gpuAllreduce(rt, v, "never.ends", &req), HORA_SUCCESS);
        std::string msg;
        EXPECT_EQ(waitAndFree(req, 30, &msg), HORA_ERR_TIMEOUT) << msg;
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        EXPECT_GE(s, 0.9);
        EXPECT_LT(s, 10);
        EXPECT_NE(msg.find("allreduce \"never.ends\" (cuda:0)"), std::string::npos) << msg;
        EXPECT_NE(msg.find("HORA_PEER_TIMEOUT_S=1 s on rank 0"), std::string::npos) << msg;
        EXPECT_NE(msg.find("communicator was aborted"), std::string::npos) << msg;
        // The set is broken: later work fails at once with the same cause.
        ::unsetenv("HORA_GPU_MOCK_STUCK");
        hora_status_t rc = gpuAllreduce(rt, v, "after", &req);
        if (rc == HORA_SUCCESS) rc = waitAndFree(req, 30, &msg);
        EXPECT_EQ(rc, HORA_ERR_TIMEOUT);
      },
      [](hora_config_t& c) { c.peer_timeout_s = 1; });
  EXPECT_EQ(mockCalls("comm_abort") - aborts, 1);
}

TEST_F(GpuMock, CommunicatorAsyncErrorWhileWaitingFailsAtOnceNamingTheTensor) {
  // The GPU work has not completed, and the communicator reports an
  // asynchronous error (ncclCommGetAsyncError): the wait ends at once (not at
  // the peer timeout), aborts the communicator and names the op and tensor.
  ::setenv("HORA_GPU_MOCK_STUCK", "1", 1);
  ::setenv("HORA_GPU_MOCK_FAIL", "comm_async_error", 1);
  const long aborts = mockCalls("comm_abort");
  runThreads(1, [](int, hora_runtime_t rt) {
    std::vector<float> v(8, 1.0f);
    hora_request_t req;
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(gpuAllreduce(rt, v, "async.error", &req), HORA_SUCCESS);
    std::string msg;
    EXPECT_EQ(waitAndFree(req, 30, &msg), HORA_ERR_BACKEND) << msg;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5);
    EXPECT_NE(msg.find("allreduce \"async.error\" (cuda:0)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("the GPU communicator"), std::string::npos) << msg;
    EXPECT_NE(msg.find("injected failure in comm_async_error"), std::string::npos) << msg;
  });
  EXPECT_EQ(mockCalls("comm_abort") - aborts, 1);
}

TEST_F(GpuMock, RanksSharingAGpuAreStagedInAutoMode) {
  // auto: the ranks compare their physical GPUs first; sharing one, the set
  // stages everything instead of failing in NCCL's init.
  for (int size = 2; size <= 3; ++size) {
    const long inits = mockCalls("comm_init"), ids = mockCalls("device_pci_bus_id");
    runThreads(size, [size](int rank, hora_runtime_t rt) {
      allreduceSweep(rank, size, rt, kDLCUDA, 0);
      allgatherSweep(rank, size, rt, kDLCUDA, 0);
    });
    EXPECT_EQ(mockCalls("comm_init") - inits, 0) << "size " << size;
    EXPECT_EQ(mockCalls("device_pci_bus_id") - ids, size) << "asked once per rank";
  }
}

TEST_F(GpuMock, OutOfDeviceMemoryForALibraryOwnedOutputFailsOnlyThatRequest) {
  // Staging needs no device memory to take part: the request without an
  // output fails, the set goes on (the next allgather brings its own memory).
  ::setenv("HORA_GPU_BACKEND", "gloo", 1);
  ::setenv("HORA_GPU_MOCK_FAIL", "device_alloc", 1);  // staging allocates nothing else
  runThreads(2, [](int rank, hora_runtime_t rt) {
    std::vector<int64_t> shape = {2};
    std::vector<float> v(2, static_cast<float>(rank));
    DLTensor t = cudaTensor(v.data(), dlType(kDLFloat, 32), &shape);
    hora_options_t o;
    hora_options_init(&o);
    o.name = "no.device.memory";
    hora_request_t req;
    ASSERT_EQ(hora_allgather_async(rt, &t, &o, &req), HORA_SUCCESS);
    std::string msg;
    EXPECT_EQ(waitAndFree(req, 30, &msg), HORA_ERR_BACKEND) << msg;
    EXPECT_NE(msg.find("allgather \"no.device.memory\" (cuda:0)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("pass options.alloc"), std::string::npos) << msg;
    Allocs a;
    o.name = "with.own.memory";
    o.alloc = testAlloc;
    o.alloc_user = &a;
    ASSERT_EQ(hora_allgather_async(rt, &t, &o, &req), HORA_SUCCESS);
    ASSERT_EQ(waitAndFree(req), HORA_SUCCESS) << lastMessage();
    const float* r = reinterpret_cast<const float*>(a.blocks.back().data());
    EXPECT_EQ(r[0], 0.0f);
    EXPECT_EQ(r[3], 1.0f);
  });
}

TEST_F(GpuMock, RankJoinedBeforeAnyGpuWorkTakesPartOnItsLocalRanksGpu) {
  // Rank 1 joins at once; rank 0's first GPU allreduce makes the
  // communicator. Rank 1 has no GPU of its own yet: it takes cuda:<local
  // rank> (not rank 0's cuda:0, which NCCL would refuse to share).
  ::setenv("HORA_GPU_MOCK_DEVICES", "2", 1);
  const long inits = mockCalls("comm_init");
  runThreads(2, [](int rank, hora_runtime_t rt) {
    if (rank == 0) {
      std::vector<float> v(4, 5.0f);
      hora_request_t req;
      ASSERT_EQ(gpuAllreduce(rt, v, "alone", &req, 0), HORA_SUCCESS);
      ASSERT_EQ(waitAndFree(req), HORA_SUCCESS) << lastMessage();
      EXPECT_EQ(v[0], 5.0f) << "the joined rank contributes nothing";
    }
    hora_request_t j;
    ASSERT_EQ(hora_join_async(rt, nullptr, &j), HORA_SUCCESS);
    ASSERT_EQ(waitAndFree(j), HORA_SUCCESS) << lastMessage();
  });
  EXPECT_EQ(mockCalls("comm_init") - inits, 2) << "a communicator over two GPUs, not staging";
}

TEST_F(GpuMock, RankZeroUnableToMakeTheCommunicatorIdFailsEveryRankAtOnce) {
  // The id travels over the CPU data plane behind an ok byte: the other ranks
  // learn at once that rank 0 could not make it (no wait for a timeout).
  ::setenv("HORA_GPU_MOCK_DEVICES", "3", 1);
  ::setenv("HORA_GPU_MOCK_FAIL", "comm_unique_id", 1);
  const long inits = mockCalls("comm_init");
  runThreads(
      3,
      [](int rank, hora_runtime_t rt) {
        std::vector<float> v(4, 1.0f);
        hora_request_t req;
        const auto t0 = std::chrono::steady_clock::now();
        ASSERT_EQ(gpuAllreduce(rt, v, "no.id", &req, rank), HORA_SUCCESS);
        std::string msg;
        EXPECT_EQ(waitAndFree(req, 30, &msg), HORA_ERR_BACKEND) << msg;
        EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10);
        EXPECT_NE(msg.find("allreduce \"no.id\""), std::string::npos) << msg;
        if (rank == 0)
          EXPECT_NE(msg.find("comm_unique_id failed"), std::string::npos) << msg;
        else
          EXPECT_NE(msg.find("rank 0 could not create the GPU communicator's id"),
                    std::string::npos)
              << msg;
      },
      [](hora_config_t& c) { c.peer_timeout_s = 60; });  // "at once" is well inside it
  EXPECT_EQ(mockCalls("comm_init") - inits, 0);
}

TEST_F(GpuMock, GpuIdentityThatCannotBeReadFailsTheSharingCheckNamingTheCall) {
  ::setenv("HORA_GPU_MOCK_DEVICES", "2", 1);
  ::setenv("HORA_GPU_MOCK_FAIL", "device_pci_bus_id", 1);
  runThreads(2, [](int rank, hora_runtime_t rt) {
    std::vector<float> v(4, 1.0f);
    hora_request_t req;
    ASSERT_EQ(gpuAllreduce(rt, v, "who.am.i", &req, rank), HORA_SUCCESS);
    std::string msg;
    EXPECT_EQ(waitAndFree(req, 30, &msg), HORA_ERR_BACKEND) << msg;
    EXPECT_NE(msg.find("allreduce \"who.am.i\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("device_pci_bus_id failed"), std::string::npos) << msg;
  });
}

}  // namespace
