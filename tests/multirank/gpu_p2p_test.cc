// Point-to-point with GPU tensors (docs/p2p.md "GPU tensors") on machines
// without a GPU: tensors described as CUDA memory (kDLCUDA) whose bytes are
// host memory, served by the mock GPU plugin (tests/gpu/mock), ranks as
// threads with rank i on device i (a pair communicator, like NCCL's, refuses
// two ranks on one device). Covers delivery over sizes, dtypes and world
// sizes, both directions of a pair at once, batches mixing host and GPU
// tensors, the receive without a buffer, mismatches (dtype, count, host
// against GPU) failing both sides, a plugin failure naming the operation, a
// plugin without p2p_group, and sends beside collectives on the same set.
// The real plugin (NCCL) is exercised by tests/gpu/gpu_runtime_test.cc on a
// GPU machine.
#include <dlfcn.h>

#include <cstring>
#include <string>
#include <vector>

#include "gpu_mock_util.h"
#include "gtest/gtest.h"
#include "rank_harness.h"

using namespace htest;

namespace {

class GpuP2p : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("HORA_GPU_PLUGIN", HORA_GPU_MOCK_PATH, 1);
    ::setenv("HORA_GPU_MOCK_DEVICES", "4", 1);
    ::unsetenv("HORA_GPU_MOCK_FAIL");
  }
  void TearDown() override {
    for (const char* v : {"HORA_GPU_PLUGIN", "HORA_GPU_MOCK_DEVICES", "HORA_GPU_MOCK_FAIL",
                          "HORA_GPU_MOCK_WITHOUT_P2P", "HORA_GPU_BACKEND"})
      ::unsetenv(v);
  }
};

const DLDataType kF32 = {kDLFloat, 32, 1};
const DLDataType kI64 = {kDLInt, 64, 1};
const DLDataType kU8 = {kDLUInt, 8, 1};
const DLDataType kI16 = {kDLInt, 16, 1};  // no NCCL reduction, but p2p moves bytes

// A tensor whose host bytes pose as device memory of `device` (-1: host).
struct Buf {
  std::vector<char> bytes;
  std::vector<int64_t> shape;
  DLTensor t;
  Buf(DLDataType dt, std::vector<int64_t> s, int device) : shape(std::move(s)) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    bytes.assign(static_cast<size_t>(n) * dt.bits / 8 + 1, 0);
    t = makeTensor(bytes.data(), dt, &shape);
    if (device >= 0) {
      t.device.device_type = kDLCUDA;
      t.device.device_id = device;
    }
  }
  size_t size() const { return bytes.size() - 1; }
};

char pattern(size_t i, int from, int to, int64_t tag) {
  return static_cast<char>((i * 131 + from * 17 + to * 7 + tag * 3) & 0xff);
}
void fill(Buf& b, int from, int to, int64_t tag) {
  for (size_t i = 0; i < b.size(); ++i) b.bytes[i] = pattern(i, from, to, tag);
}
bool matches(const char* p, size_t n, int from, int to, int64_t tag) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != pattern(i, from, to, tag)) return false;
  return true;
}

hora_status_t post(hora_runtime_t rt, bool send, Buf& b, int peer, int64_t tag, hora_request_t* r) {
  return send ? hora_send_async(rt, &b.t, peer, tag, nullptr, r)
              : hora_recv_async(rt, &b.t, peer, tag, nullptr, r);
}

hora_status_t postWait(hora_runtime_t rt, bool send, Buf& b, int peer, int64_t tag,
                       std::string* msg) {
  hora_request_t r;
  hora_status_t s = post(rt, send, b, peer, tag, &r);
  if (s != HORA_SUCCESS) {
    *msg = hora_last_error_message();
    return s;
  }
  return waitAndFree(r, 60, msg);
}

}  // namespace

TEST_F(GpuP2p, RingExchangeOverSizesDtypesAndWorldSizes) {
  for (int size = 2; size <= 3; ++size) {
    runThreads(size, [size](int rank, hora_runtime_t rt) {
      const int right = (rank + 1) % size, left = (rank + size - 1) % size;
      int64_t tag = 0;
      for (int64_t count : {0, 1, 7, 16385, 300000})
        for (DLDataType dt : {kF32, kI64, kU8, kI16}) {
          Buf out(dt, {count}, rank), in(dt, {count}, rank);
          fill(out, rank, right, tag);
          hora_p2p_op_t ops[2] = {{sizeof(hora_p2p_op_t), HORA_P2P_RECV, left, tag, &in.t},
                                  {sizeof(hora_p2p_op_t), HORA_P2P_SEND, right, tag, &out.t}};
          hora_request_t r;
          ASSERT_EQ(hora_p2p_batch_async(rt, 2, ops, nullptr, &r), HORA_SUCCESS)
              << hora_last_error_message();
          ASSERT_EQ(waitAndFree(r), HORA_SUCCESS) << lastMessage();
          EXPECT_TRUE(matches(in.bytes.data(), in.size(), left, rank, tag))
              << "size " << size << " rank " << rank << " count " << count << " bits "
              << int(dt.bits);
          ++tag;
        }
    });
  }
  EXPECT_GE(mockCalls("p2p_group"), 1);
  EXPECT_GE(mockCalls("comm_init"), 2) << "a communicator per direction of a pair";
}

TEST_F(GpuP2p, BothDirectionsOfAPairAtOnceAndInOrder) {
  // Each rank posts its sends before its receives, several per tag: the two
  // directions run beside each other, same-tag messages arrive in send order.
  runThreads(2, [](int rank, hora_runtime_t rt) {
    const int peer = 1 - rank;
    const int kMsgs = 6;
    std::vector<Buf> outs, ins;
    for (int i = 0; i < kMsgs; ++i) {
      outs.emplace_back(kF32, std::vector<int64_t>{100000 + i}, rank);
      ins.emplace_back(kF32, std::vector<int64_t>{100000 + i}, rank);
      fill(outs.back(), rank, peer, i);
    }
    std::vector<hora_request_t> reqs;
    for (int i = 0; i < kMsgs; ++i) {
      hora_request_t r;
      ASSERT_EQ(post(rt, true, outs[i], peer, i % 2, &r), HORA_SUCCESS)
          << hora_last_error_message();
      reqs.push_back(r);
    }
    for (int i = 0; i < kMsgs; ++i) {
      hora_request_t r;
      ASSERT_EQ(post(rt, false, ins[i], peer, i % 2, &r), HORA_SUCCESS)
          << hora_last_error_message();
      reqs.push_back(r);
    }
    for (auto r : reqs) EXPECT_EQ(waitAndFree(r), HORA_SUCCESS) << lastMessage();
    for (int i = 0; i < kMsgs; ++i)
      EXPECT_TRUE(matches(ins[i].bytes.data(), ins[i].size(), peer, rank, i)) << "message " << i;
  });
}

TEST_F(GpuP2p, BatchMixesHostAndGpuTensors) {
  runThreads(2, [](int rank, hora_runtime_t rt) {
    const int peer = 1 - rank;
    // tag 0: GPU, tag 1: host (small, eager), tag 2: host (large), tag 3: GPU.
    const std::vector<int> dev = {rank, -1, -1, rank};
    const std::vector<int64_t> count = {1000, 10, 400000, 50000};
    std::vector<Buf> outs, ins;
    for (int i = 0; i < 4; ++i) {
      outs.emplace_back(kF32, std::vector<int64_t>{count[i]}, dev[i]);
      ins.emplace_back(kF32, std::vector<int64_t>{count[i]}, dev[i]);
      fill(outs.back(), rank, peer, i);
    }
    std::vector<hora_p2p_op_t> ops;
    for (int i = 0; i < 4; ++i) {
      ops.push_back({sizeof(hora_p2p_op_t), HORA_P2P_SEND, peer, i, &outs[i].t});
      ops.push_back({sizeof(hora_p2p_op_t), HORA_P2P_RECV, peer, i, &ins[i].t});
    }
    hora_request_t r;
    ASSERT_EQ(hora_p2p_batch_async(rt, static_cast<int32_t>(ops.size()), ops.data(), nullptr, &r),
              HORA_SUCCESS)
        << hora_last_error_message();
    ASSERT_EQ(waitAndFree(r), HORA_SUCCESS) << lastMessage();
    for (int i = 0; i < 4; ++i)
      EXPECT_TRUE(matches(ins[i].bytes.data(), ins[i].size(), peer, rank, i)) << "tag " << i;
  });
}

TEST_F(GpuP2p, ReceiveWithoutABufferGetsDeviceMemory) {
  runThreads(2, [](int rank, hora_runtime_t rt) {
    for (int64_t rows : {0, 3, 40000}) {
      if (rank == 0) {
        Buf b(kI64, {rows, 5}, 0);
        fill(b, 0, 1, rows);
        std::string msg;
        EXPECT_EQ(postWait(rt, true, b, 1, 1, &msg), HORA_SUCCESS) << msg;
      } else {
        hora_request_t r;
        ASSERT_EQ(hora_recv_async(rt, nullptr, 0, 1, nullptr, &r), HORA_SUCCESS)
            << hora_last_error_message();
        ASSERT_EQ(hora_wait(r, 60), HORA_SUCCESS) << hora_last_error_message();
        const DLTensor* out = nullptr;
        ASSERT_EQ(hora_request_output(r, &out), HORA_SUCCESS);
        EXPECT_EQ(out->device.device_type, kDLCUDA);
        EXPECT_EQ(out->device.device_id, 1) << "this rank's device (local rank 1)";
        ASSERT_EQ(out->ndim, 2);
        EXPECT_EQ(out->shape[0], rows);
        EXPECT_EQ(out->dtype.bits, 64);
        EXPECT_TRUE(matches(static_cast<const char*>(out->data), rows * 5 * 8, 0, 1, rows));
        hora_request_free(r);
      }
    }
  });
}

TEST_F(GpuP2p, MismatchesFailBothSidesAndLeaveTheBufferUntouched) {
  runThreads(2, [](int rank, hora_runtime_t rt) {
    struct Case {
      DLDataType sendType, recvType;
      int64_t sendCount, recvCount;
      bool sendGpu, recvGpu;
      const char* expect;  // in both messages
    };
    const std::vector<Case> cases = {
        {kF32, kI64, 8, 4, true, true, "int64"},
        {kF32, kF32, 200000, 100000, true, true, "float32[100000]"},
        {kF32, kF32, 1000, 1000, true, false, "host memory"},
        {kF32, kF32, 1000, 1000, false, true, "GPU memory"},
    };
    int64_t tag = 0;
    for (const Case& c : cases) {
      std::string msg;
      if (rank == 0) {
        Buf b(c.sendType, {c.sendCount}, c.sendGpu ? 0 : -1);
        EXPECT_EQ(postWait(rt, true, b, 1, tag, &msg), HORA_ERR_MISMATCH) << msg;
      } else {
        Buf b(c.recvType, {c.recvCount}, c.recvGpu ? 1 : -1);
        std::memset(b.bytes.data(), 0x5a, b.bytes.size());
        EXPECT_EQ(postWait(rt, false, b, 0, tag, &msg), HORA_ERR_MISMATCH) << msg;
        for (char x : b.bytes) ASSERT_EQ(x, 0x5a) << "the receive buffer was written";
      }
      EXPECT_NE(msg.find(c.expect), std::string::npos) << "rank " << rank << ": " << msg;
      ++tag;
    }
    // The pair still works, in both memories.
    for (bool gpu : {true, false}) {
      Buf b(kF32, {5000}, gpu ? rank : -1);
      std::string msg;
      if (rank == 0) fill(b, 0, 1, tag);
      EXPECT_EQ(postWait(rt, rank == 0, b, 1 - rank, tag, &msg), HORA_SUCCESS) << msg;
      if (rank == 1) {
        EXPECT_TRUE(matches(b.bytes.data(), b.size(), 0, 1, tag));
      }
      ++tag;
    }
  });
}

TEST_F(GpuP2p, PluginFailureNamesTheOperation) {
  ::setenv("HORA_GPU_MOCK_FAIL", "p2p_group", 1);
  runThreads(2, [](int rank, hora_runtime_t rt) {
    Buf b(kF32, {1000}, rank);
    std::string msg;
    const hora_status_t s = postWait(rt, rank == 0, b, 1 - rank, 7, &msg);
    EXPECT_NE(s, HORA_SUCCESS);
    EXPECT_NE(msg.find("mock: injected failure in p2p_group"), std::string::npos) << msg;
    EXPECT_NE(msg.find(rank == 0 ? "send of float32[1000] to rank 1 (tag 7)"
                                 : "recv of float32[1000] from rank 0 (tag 7)"),
              std::string::npos)
        << msg;
  });
}

TEST_F(GpuP2p, PluginWithoutP2pIsRefusedAtPostAndCollectivesStillRun) {
  ::setenv("HORA_GPU_MOCK_WITHOUT_P2P", "1", 1);
  runThreads(1, [](int, hora_runtime_t rt) {
    std::vector<float> v(4, 1.0f);
    std::vector<int64_t> shape = {4};
    DLTensor t = makeTensor(v.data(), kF32, &shape);
    t.device.device_type = kDLCUDA;
    hora_request_t r = nullptr;
    ASSERT_EQ(hora_allreduce_async(rt, &t, &t, nullptr, &r), HORA_SUCCESS)
        << hora_last_error_message();
    EXPECT_EQ(waitAndFree(r), HORA_SUCCESS) << lastMessage();
  });
  runThreads(2, [](int rank, hora_runtime_t rt) {
    Buf b(kF32, {4}, rank);
    hora_request_t r = nullptr;
    EXPECT_EQ(post(rt, rank == 0, b, 1 - rank, 0, &r), HORA_ERR_NOT_SUPPORTED);
    const std::string msg = hora_last_error_message();
    EXPECT_NE(msg.find("p2p_group"), std::string::npos) << msg;
    EXPECT_EQ(r, nullptr);
  });
}

TEST_F(GpuP2p, RunsBesideCollectivesInOppositeOrders) {
  // Rank 0: allreduce, then send; rank 1: receive, then allreduce. On one
  // communicator this would deadlock; the pair's own communicator does not.
  runThreads(2, [](int rank, hora_runtime_t rt) {
    for (int round = 0; round < 5; ++round) {
      std::vector<float> v(20000, static_cast<float>(rank + 1));
      std::vector<int64_t> shape = {20000};
      DLTensor t = makeTensor(v.data(), kF32, &shape);
      t.device.device_type = kDLCUDA;
      t.device.device_id = rank;
      hora_options_t o;
      hora_options_init(&o);
      const std::string name = "beside." + std::to_string(round);
      o.name = name.c_str();
      Buf b(kF32, {30000}, rank);
      if (rank == 0) fill(b, 0, 1, round);
      hora_request_t ar = nullptr, pr = nullptr;
      if (rank == 0) {
        ASSERT_EQ(hora_allreduce_async(rt, &t, &t, &o, &ar), HORA_SUCCESS)
            << hora_last_error_message();
        ASSERT_EQ(post(rt, true, b, 1, round, &pr), HORA_SUCCESS) << hora_last_error_message();
      } else {
        ASSERT_EQ(post(rt, false, b, 0, round, &pr), HORA_SUCCESS) << hora_last_error_message();
        ASSERT_EQ(hora_allreduce_async(rt, &t, &t, &o, &ar), HORA_SUCCESS)
            << hora_last_error_message();
      }
      EXPECT_EQ(waitAndFree(pr), HORA_SUCCESS) << lastMessage();
      EXPECT_EQ(waitAndFree(ar), HORA_SUCCESS) << lastMessage();
      EXPECT_EQ(v[0], 3.0f);
      if (rank == 1) {
        EXPECT_TRUE(matches(b.bytes.data(), b.size(), 0, 1, round));
      }
    }
  });
}

TEST_F(GpuP2p, TensorsOfOneRankMustShareADevice) {
  runThreads(2, [](int rank, hora_runtime_t rt) {
    Buf a(kF32, {4}, rank), b(kF32, {4}, rank == 0 ? 1 : 0);
    std::string msg;
    if (rank == 1) {
      EXPECT_EQ(postWait(rt, true, a, 0, 0, &msg), HORA_SUCCESS) << msg;
      return;
    }
    hora_request_t r1 = nullptr, r2 = nullptr;
    ASSERT_EQ(post(rt, false, a, 1, 0, &r1), HORA_SUCCESS) << hora_last_error_message();
    EXPECT_EQ(post(rt, false, b, 1, 1, &r2), HORA_ERR_INVALID_ARGUMENT);
    msg = hora_last_error_message();
    EXPECT_NE(msg.find("one device"), std::string::npos) << msg;
    EXPECT_EQ(waitAndFree(r1), HORA_SUCCESS) << lastMessage();
  });
}
