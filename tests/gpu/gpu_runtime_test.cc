// libhora end to end on a real GPU: CUDA tensors through hora_*_async with the
// built libhora_cuda.so, results checked exactly by the same sweeps the CPU
// and mock-GPU suites run (tests/multirank/sweep_support.cc), over CUDA
// managed memory (host-readable once hora completed a request).
//  - NCCL at world size 1 (one H100 on the GPU machine; NCCL refuses two
//    ranks on one GPU) and across devices when there are several;
//  - the staging path (HORA_GPU_BACKEND=gloo) with 2-4 ranks sharing GPU 0,
//    and auto mode choosing it by itself for ranks that share a GPU;
//  - a ready event: hora's stream waits for the framework's producing work;
//  - point-to-point of GPU tensors over NCCL send/recv (two devices), and a
//    clear error, not a hang, for two ranks sharing one GPU.
// Skips (with the reason) where no CUDA device is visible.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "rank_harness.h"
#include "test_memory.h"

using namespace htest;

namespace {

void* managedAlloc(size_t bytes) {
  void* p = nullptr;
  if (cudaMallocManaged(&p, bytes) != cudaSuccess) return nullptr;
  return p;
}
void managedFree(void* p) { cudaFree(p); }
void deviceToHost(void* dst, const void* src, size_t bytes) {
  cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
}

class GpuRuntime : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
      GTEST_SKIP() << "no CUDA device ("
                   << (e == cudaSuccess ? "none found" : cudaGetErrorString(e))
                   << "): the GPU runtime suite runs on the GPU machine";
    devices_ = n;
    // The sweeps write inputs and read results of managed memory from the
    // host while other ranks' GPU work may run.
    int concurrent = 0;
    cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, 0);
    if (!concurrent)
      GTEST_SKIP() << "device 0 lacks concurrent managed access, which these sweeps rely on";
    DeviceMemory m;
    m.alloc = managedAlloc;
    m.release = managedFree;
    m.toHost = deviceToHost;
    setDeviceMemory(m);
    ::setenv("HORA_GPU_PLUGIN", HORA_CUDA_PLUGIN_PATH, 1);
  }
  void TearDown() override {
    ::unsetenv("HORA_GPU_BACKEND");
    ::unsetenv("HORA_GPU_PLUGIN");
  }
  void everything(int size, bool perRankDevice) {
    runThreads(
        size,
        [size, perRankDevice](int rank, hora_runtime_t rt) {
          const int dev = perRankDevice ? rank : 0;
          cudaSetDevice(dev);
          allreduceSweep(rank, size, rt, kDLCUDA, dev);
          allgatherSweep(rank, size, rt, kDLCUDA, dev);
          alltoallCheck(rank, size, rt, kDLCUDA, dev);
          reducescatterSweep(rank, size, rt, kDLCUDA, dev);
        },
        nullptr, 240);
  }
  int devices_ = 0;
};

TEST_F(GpuRuntime, NcclAtWorldSizeOne) {
  ::setenv("HORA_GPU_BACKEND", "nccl", 1);
  everything(1, true);
}

TEST_F(GpuRuntime, NcclAcrossDevices) {
  if (devices_ < 2) GTEST_SKIP() << "needs two CUDA devices, " << devices_ << " visible";
  ::setenv("HORA_GPU_BACKEND", "nccl", 1);
  everything(std::min(devices_, 4), true);
}

TEST_F(GpuRuntime, AutoModeStagesRanksSharingOneGpu) {
  // auto notices that the ranks share GPU 0 (NCCL would refuse) and stages.
  ::setenv("HORA_GPU_BACKEND", "auto", 1);
  everything(2, false);
}

TEST_F(GpuRuntime, StagingWithRanksSharingOneGpu) {
  ::setenv("HORA_GPU_BACKEND", "gloo", 1);
  for (int size = 2; size <= 4; ++size) everything(size, false);
}

// Producing work that lands late: the stream first runs a host function that
// sleeps, then copies the values in. Without waiting for the ready event hora
// would read the old zeros.
void CUDART_CB sleepOnStream(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }

TEST_F(GpuRuntime, ReadyEventOrdersTheProducingStream) {
  for (const char* backend : {"nccl", "gloo"}) {
    ::setenv("HORA_GPU_BACKEND", backend, 1);
    runThreads(1, [](int, hora_runtime_t rt) {
      const size_t n = 1 << 20;
      float* d = nullptr;
      ASSERT_EQ(cudaMalloc(&d, n * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMemset(d, 0, n * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the legacy stream does not order
                                                        // the non-blocking one below
      cudaStream_t s;
      cudaEvent_t ev;
      ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
      ASSERT_EQ(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
      float* values = nullptr;
      ASSERT_EQ(cudaMallocHost(&values, n * sizeof(float)), cudaSuccess);
      for (size_t i = 0; i < n; ++i) values[i] = 3.0f;
      ASSERT_EQ(cudaLaunchHostFunc(s, sleepOnStream, nullptr), cudaSuccess);
      ASSERT_EQ(cudaMemcpyAsync(d, values, n * sizeof(float), cudaMemcpyHostToDevice, s),
                cudaSuccess);
      ASSERT_EQ(cudaEventRecord(ev, s), cudaSuccess);
      std::vector<int64_t> shape = {static_cast<int64_t>(n)};
      DLTensor t = makeTensor(d, dlType(kDLFloat, 32), &shape);
      t.device.device_type = kDLCUDA;
      hora_options_t o;
      hora_options_init(&o);
      o.name = "after.fill";
      o.op = HORA_OP_SUM;
      o.postscale = 2.0;
      o.ready_event = ev;
      hora_request_t req;
      ASSERT_EQ(hora_allreduce_async(rt, &t, &t, &o, &req), HORA_SUCCESS)
          << hora_last_error_message();
      ASSERT_EQ(waitAndFree(req), HORA_SUCCESS) << lastMessage();
      std::vector<float> h(n);
      ASSERT_EQ(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < n; i += 4097) ASSERT_EQ(h[i], 6.0f) << i;
      cudaStreamSynchronize(s);
      cudaFreeHost(values);
      cudaEventDestroy(ev);
      cudaStreamDestroy(s);
      cudaFree(d);
    });
  }
}

// Point-to-point between ranks on two GPUs: both directions at once, sizes
// around NCCL's buffer, every byte checked on the host.
TEST_F(GpuRuntime, SendRecvAcrossDevices) {
  if (devices_ < 2) GTEST_SKIP() << "needs two CUDA devices, " << devices_ << " visible";
  runThreads(2, [](int rank, hora_runtime_t rt) {
    cudaSetDevice(rank);
    const int peer = 1 - rank;
    int64_t tag = 0;
    for (int64_t count : {1, 1000, 1 << 20, 5 << 20}) {
      const size_t bytes = static_cast<size_t>(count) * sizeof(int32_t);
      std::vector<int32_t> h(count);
      for (int64_t i = 0; i < count; ++i) h[i] = static_cast<int32_t>(i * 7 + rank * 1000003 + tag);
      int32_t *out = nullptr, *in = nullptr;
      ASSERT_EQ(cudaMalloc(&out, bytes), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&in, bytes), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(out, h.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
      std::vector<int64_t> shape = {count};
      DLTensor to = makeTensor(out, dlType(kDLInt, 32), &shape);
      DLTensor ti = makeTensor(in, dlType(kDLInt, 32), &shape);
      to.device = ti.device = DLDevice{kDLCUDA, rank};
      hora_request_t s = nullptr, r = nullptr;
      ASSERT_EQ(hora_send_async(rt, &to, peer, tag, nullptr, &s), HORA_SUCCESS)
          << hora_last_error_message();
      ASSERT_EQ(hora_recv_async(rt, &ti, peer, tag, nullptr, &r), HORA_SUCCESS)
          << hora_last_error_message();
      ASSERT_EQ(waitAndFree(s), HORA_SUCCESS) << lastMessage();
      ASSERT_EQ(waitAndFree(r), HORA_SUCCESS) << lastMessage();
      std::vector<int32_t> got(count);
      ASSERT_EQ(cudaMemcpy(got.data(), in, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      for (int64_t i = 0; i < count; ++i)
        ASSERT_EQ(got[i], static_cast<int32_t>(i * 7 + peer * 1000003 + tag)) << i;
      cudaFree(out);
      cudaFree(in);
      ++tag;
    }
  });
}

// NCCL refuses a communicator with two ranks on one GPU: point-to-point of
// GPU tensors between ranks sharing a GPU fails on both sides with the
// plugin's reason, within the peer timeout, instead of hanging.
TEST_F(GpuRuntime, SendRecvBetweenRanksSharingAGpuFailsClearly) {
  runThreads(2, [](int rank, hora_runtime_t rt) {
    cudaSetDevice(0);
    int32_t* d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, 4096), cudaSuccess);
    std::vector<int64_t> shape = {1024};
    DLTensor t = makeTensor(d, dlType(kDLInt, 32), &shape);
    t.device = DLDevice{kDLCUDA, 0};
    hora_request_t req = nullptr;
    ASSERT_EQ(rank == 0 ? hora_send_async(rt, &t, 1, 0, nullptr, &req)
                        : hora_recv_async(rt, &t, 0, 0, nullptr, &req),
              HORA_SUCCESS)
        << hora_last_error_message();
    std::string msg;
    EXPECT_NE(waitAndFree(req, 60, &msg), HORA_SUCCESS);
    EXPECT_NE(msg.find("comm_init"), std::string::npos) << msg;
    cudaFree(d);
  });
}

}  // namespace
