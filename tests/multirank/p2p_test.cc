// Point-to-point send/recv (docs/p2p.md) across ranks as threads and as
// processes: exact delivery over a sweep of sizes, dtypes and world sizes,
// the matching rules, negotiated sizes, mismatches failing both sides, a
// dead sender, a receive nobody sends to, argument checks, and sends mixed
// with collectives.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "rank_harness.h"

using namespace htest;

namespace {

const DLDataType kF32 = {kDLFloat, 32, 1};
const DLDataType kI64 = {kDLInt, 64, 1};
const DLDataType kU8 = {kDLUInt, 8, 1};

struct Buf {
  std::vector<char> bytes;
  std::vector<int64_t> shape;
  DLTensor t;
  Buf(DLDataType dt, std::vector<int64_t> s) : shape(std::move(s)) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    bytes.assign(static_cast<size_t>(n) * dt.bits / 8 + 1, 0);
    t = makeTensor(bytes.data(), dt, &shape);
  }
  size_t size() const { return bytes.size() - 1; }
};

// Deterministic content for (sender, receiver, tag).
void fill(Buf& b, int from, int to, int64_t tag) {
  for (size_t i = 0; i < b.size(); ++i)
    b.bytes[i] = static_cast<char>((i * 131 + from * 17 + to * 7 + tag * 3) & 0xff);
}
bool matches(const Buf& b, int from, int to, int64_t tag) {
  for (size_t i = 0; i < b.size(); ++i)
    if (b.bytes[i] != static_cast<char>((i * 131 + from * 17 + to * 7 + tag * 3) & 0xff))
      return false;
  return true;
}

hora_status_t sendWait(hora_runtime_t rt, Buf& b, int peer, int64_t tag,
                       std::string* msg = nullptr) {
  hora_request_t r;
  hora_status_t s = hora_send_async(rt, &b.t, peer, tag, nullptr, &r);
  if (s != HORA_SUCCESS) {
    if (msg) *msg = hora_last_error_message();
    return s;
  }
  return waitAndFree(r, 60, msg);
}
hora_status_t recvWait(hora_runtime_t rt, Buf& b, int peer, int64_t tag,
                       std::string* msg = nullptr) {
  hora_request_t r;
  hora_status_t s = hora_recv_async(rt, &b.t, peer, tag, nullptr, &r);
  if (s != HORA_SUCCESS) {
    if (msg) *msg = hora_last_error_message();
    return s;
  }
  return waitAndFree(r, 60, msg);
}

// Every rank sends to its right neighbour and receives from its left one,
// both posted in one batch (no deadlock whatever the order).
void ringExchange(int rank, int size, hora_runtime_t rt, DLDataType dt, int64_t count,
                  int64_t tag) {
  const int right = (rank + 1) % size, left = (rank + size - 1) % size;
  if (getenv("P2P_DEBUG"))
    fprintf(stderr, "size %d rank %d count %lld bits %d tag %lld\n", size, rank, (long long)count,
            dt.bits, (long long)tag);
  Buf out(dt, {count}), in(dt, {count});
  fill(out, rank, right, tag);
  hora_p2p_op_t ops[2] = {{sizeof(hora_p2p_op_t), HORA_P2P_RECV, left, tag, &in.t},
                          {sizeof(hora_p2p_op_t), HORA_P2P_SEND, right, tag, &out.t}};
  hora_request_t r;
  ASSERT_EQ(hora_p2p_batch_async(rt, 2, ops, nullptr, &r), HORA_SUCCESS)
      << hora_last_error_message();
  ASSERT_EQ(waitAndFree(r), HORA_SUCCESS) << lastMessage();
  EXPECT_TRUE(matches(in, left, rank, tag))
      << "rank " << rank << " count " << count << " bits " << int(dt.bits);
}

}  // namespace

TEST(P2p, RingExchangeSweepThreads) {
  for (int size = 2; size <= 4; ++size) {
    runThreads(size, [&](int rank, hora_runtime_t rt) {
      int64_t tag = 0;
      // 0, tiny, around the eager limit (64 KiB), larger than a ring (1 MiB).
      for (int64_t count : {0, 1, 7, 16383, 16384, 16385, 300000, 1 << 20})
        for (DLDataType dt : {kF32, kI64, kU8}) ringExchange(rank, size, rt, dt, count, tag++);
    });
  }
}

TEST(P2p, MatchingFollowsTagsInPostedOrder) {
  runThreads(2, [](int rank, hora_runtime_t rt) {
    // Rank 0 sends tags 5, 7, 5 (small) and 9, 9 (large); rank 1 receives
    // 7 first, then 5, 5, then 9, 9: same-tag messages arrive in send order,
    // different tags may be taken out of order.
    const std::vector<int64_t> tags = {5, 7, 5, 9, 9};
    if (rank == 0) {
      std::vector<Buf> bufs;
      std::vector<hora_request_t> reqs;
      for (size_t i = 0; i < tags.size(); ++i) {
        bufs.emplace_back(kF32, std::vector<int64_t>{tags[i] == 9 ? 100000 : 10});
      }
      for (size_t i = 0; i < tags.size(); ++i) {
        fill(bufs[i], 0, 1, static_cast<int64_t>(i));  // content says which send it was
        hora_request_t r;
        ASSERT_EQ(hora_send_async(rt, &bufs[i].t, 1, tags[i], nullptr, &r), HORA_SUCCESS);
        reqs.push_back(r);
      }
      for (auto r : reqs) EXPECT_EQ(waitAndFree(r), HORA_SUCCESS) << lastMessage();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // all arrive unexpected
      const std::vector<std::pair<int64_t, int>> order = {{7, 1}, {5, 0}, {5, 2}, {9, 3}, {9, 4}};
      for (auto [tag, sendIndex] : order) {
        Buf b(kF32, {tag == 9 ? 100000 : 10});
        ASSERT_EQ(recvWait(rt, b, 0, tag), HORA_SUCCESS) << lastMessage();
        EXPECT_TRUE(matches(b, 0, 1, sendIndex)) << "tag " << tag << " expected send " << sendIndex;
      }
    }
  });
}

TEST(P2p, ReceivePostedBeforeAndAfterTheSend) {
  runThreads(2, [](int rank, hora_runtime_t rt) {
    for (int64_t count : {3, 500000}) {
      for (int recvFirst = 0; recvFirst < 2; ++recvFirst) {
        const int64_t tag = count * 10 + recvFirst;
        if (rank == 0) {
          if (recvFirst) std::this_thread::sleep_for(std::chrono::milliseconds(50));
          Buf b(kF32, {count});
          fill(b, 0, 1, tag);
          EXPECT_EQ(sendWait(rt, b, 1, tag), HORA_SUCCESS) << lastMessage();
        } else {
          if (!recvFirst) std::this_thread::sleep_for(std::chrono::milliseconds(50));
          Buf b(kF32, {count});
          EXPECT_EQ(recvWait(rt, b, 0, tag), HORA_SUCCESS) << lastMessage();
          EXPECT_TRUE(matches(b, 0, 1, tag));
        }
      }
    }
  });
}

TEST(P2p, ReceiveWithoutABufferGetsTheSendersShapeAndDtype) {
  runThreads(2, [](int rank, hora_runtime_t rt) {
    for (int64_t rows : {0, 3, 40000}) {
      if (rank == 0) {
        Buf b(kI64, {rows, 5});
        fill(b, 0, 1, rows);
        EXPECT_EQ(sendWait(rt, b, 1, 1), HORA_SUCCESS) << lastMessage();
      } else {
        hora_request_t r;
        ASSERT_EQ(hora_recv_async(rt, nullptr, 0, 1, nullptr, &r), HORA_SUCCESS)
            << hora_last_error_message();
        ASSERT_EQ(hora_wait(r, 60), HORA_SUCCESS) << hora_last_error_message();
        const DLTensor* out = nullptr;
        ASSERT_EQ(hora_request_output(r, &out), HORA_SUCCESS);
        ASSERT_EQ(out->ndim, 2);
        EXPECT_EQ(out->shape[0], rows);
        EXPECT_EQ(out->shape[1], 5);
        EXPECT_EQ(out->dtype.code, kDLInt);
        EXPECT_EQ(out->dtype.bits, 64);
        Buf expect(kI64, {rows, 5});
        fill(expect, 0, 1, rows);
        EXPECT_EQ(std::memcmp(out->data, expect.bytes.data(), expect.size()), 0);
        hora_request_free(r);
      }
    }
  });
}

TEST(P2p, MismatchFailsBothSidesAndLeavesTheBufferUntouched) {
  runThreads(2, [](int rank, hora_runtime_t rt) {
    // dtype differs (small), count differs (small), count differs (large);
    // then a matching pair still goes through: the stream stays in step.
    struct Case {
      DLDataType sendType, recvType;
      int64_t sendCount, recvCount;
    };
    const std::vector<Case> cases = {
        {kF32, kI64, 8, 4}, {kF32, kF32, 8, 9}, {kF32, kF32, 200000, 100000}};
    int64_t tag = 0;
    for (const Case& c : cases) {
      std::string msg;
      if (rank == 0) {
        Buf b(c.sendType, {c.sendCount});
        EXPECT_EQ(sendWait(rt, b, 1, tag, &msg), HORA_ERR_MISMATCH) << msg;
        EXPECT_NE(msg.find("rank 1's matching receive expected"), std::string::npos) << msg;
        EXPECT_NE(msg.find("tag " + std::to_string(tag)), std::string::npos) << msg;
      } else {
        Buf b(c.recvType, {c.recvCount});
        std::memset(b.bytes.data(), 0x5a, b.bytes.size());
        EXPECT_EQ(recvWait(rt, b, 0, tag, &msg), HORA_ERR_MISMATCH) << msg;
        EXPECT_NE(msg.find("the message is"), std::string::npos) << msg;
        EXPECT_NE(msg.find("from rank 0"), std::string::npos) << msg;
        for (char ch : b.bytes) ASSERT_EQ(ch, 0x5a) << "the receive buffer was written";
      }
      ++tag;
    }
    Buf b(kF32, {1000});
    if (rank == 0) {
      fill(b, 0, 1, 99);
      EXPECT_EQ(sendWait(rt, b, 1, 99), HORA_SUCCESS) << lastMessage();
    } else {
      EXPECT_EQ(recvWait(rt, b, 0, 99), HORA_SUCCESS) << lastMessage();
      EXPECT_TRUE(matches(b, 0, 1, 99));
    }
  });
}

TEST(P2p, BadArgumentsAreRefusedWithoutARequest) {
  runThreads(2, [](int rank, hora_runtime_t rt) {
    Buf b(kF32, {4});
    hora_request_t r = reinterpret_cast<hora_request_t>(0x1);
    EXPECT_EQ(hora_send_async(rt, &b.t, 2, 0, nullptr, &r), HORA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(r, nullptr);
    EXPECT_NE(std::string(hora_last_error_message()).find("not a rank of"), std::string::npos)
        << hora_last_error_message();
    EXPECT_EQ(hora_send_async(rt, &b.t, rank, 0, nullptr, &r), HORA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(hora_last_error_message()).find("itself"), std::string::npos);
    EXPECT_EQ(hora_recv_async(rt, &b.t, -1, 0, nullptr, &r), HORA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(hora_send_async(rt, nullptr, 1 - rank, 0, nullptr, &r), HORA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(hora_send_async(rt, &b.t, 1 - rank, 0, nullptr, nullptr), HORA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(hora_p2p_batch_async(rt, 0, nullptr, nullptr, &r), HORA_ERR_INVALID_ARGUMENT);
    hora_p2p_op_t bad = {sizeof(hora_p2p_op_t), 7, 1 - rank, 0, &b.t};
    EXPECT_EQ(hora_p2p_batch_async(rt, 1, &bad, nullptr, &r), HORA_ERR_INVALID_ARGUMENT);
    hora_p2p_op_t noBuf = {sizeof(hora_p2p_op_t), HORA_P2P_RECV, 1 - rank, 0, nullptr};
    EXPECT_EQ(hora_p2p_batch_async(rt, 1, &noBuf, nullptr, &r), HORA_ERR_INVALID_ARGUMENT);
    std::vector<int64_t> gshape = {4};
    DLTensor g = makeTensor(b.bytes.data(), kF32, &gshape);
    g.device = {kDLCUDA, 0};
    EXPECT_EQ(hora_send_async(rt, &g, 1 - rank, 0, nullptr, &r), HORA_ERR_NOT_SUPPORTED);
    // Nothing was posted: a real exchange still pairs up.
    fill(b, 0, 1, 3);
    if (rank == 0)
      EXPECT_EQ(sendWait(rt, b, 1, 3), HORA_SUCCESS) << lastMessage();
    else {
      EXPECT_EQ(recvWait(rt, b, 0, 3), HORA_SUCCESS) << lastMessage();
      EXPECT_TRUE(matches(b, 0, 1, 3));
    }
  });
}

TEST(P2p, SendsRunBesideCollectivesAndInSubsets) {
  runThreads(4, [](int rank, hora_runtime_t rt) {
    // A subset {1, 3}: its rank 0 is global 1.
    const int32_t members[2] = {1, 3};
    hora_process_set_t sub = nullptr;
    if (rank == 1 || rank == 3) {
      ASSERT_EQ(hora_process_set_create(rt, members, 2, &sub), HORA_SUCCESS)
          << hora_last_error_message();
    }
    std::vector<float> big(1 << 18, 1.0f);
    std::vector<int64_t> bigShape = {static_cast<int64_t>(big.size())};
    DLTensor bt = makeTensor(big.data(), kF32, &bigShape);
    for (int step = 0; step < 5; ++step) {
      hora_request_t ar;
      hora_options_t o;
      hora_options_init(&o);
      ASSERT_EQ(hora_allreduce_async(rt, &bt, &bt, &o, &ar), HORA_SUCCESS);
      ringExchange(rank, 4, rt, kF32, 5000, step);
      if (sub) {
        int32_t srank = -1;
        hora_process_set_rank(sub, &srank);
        Buf b(kF32, {77});
        hora_options_init(&o);
        o.process_set = sub;
        hora_request_t r;
        if (srank == 0) {
          fill(b, 1, 3, step);
          ASSERT_EQ(hora_send_async(rt, &b.t, 1, step, &o, &r), HORA_SUCCESS);
          EXPECT_EQ(waitAndFree(r), HORA_SUCCESS) << lastMessage();
        } else {
          ASSERT_EQ(hora_recv_async(rt, &b.t, 0, step, &o, &r), HORA_SUCCESS);
          EXPECT_EQ(waitAndFree(r), HORA_SUCCESS) << lastMessage();
          EXPECT_TRUE(matches(b, 1, 3, step));
        }
      }
      EXPECT_EQ(waitAndFree(ar), HORA_SUCCESS) << lastMessage();
    }
    if (sub) hora_process_set_destroy(sub);
  });
}

TEST(P2p, PingPongAsProcesses) {
  auto results = runProcesses(2, [](int rank) -> int {
    hora_runtime_t rt;
    CHILD_CHECK(hora_init(nullptr, &rt) == HORA_SUCCESS, "%s", hora_last_error_message());
    for (int64_t count : {1, 4096, 1 << 20}) {
      Buf b(kF32, {count});
      for (int it = 0; it < 200; ++it) {
        if (rank == 0) {
          fill(b, 0, 1, it);
          CHILD_CHECK(sendWait(rt, b, 1, 0) == HORA_SUCCESS, "%s", lastMessage().c_str());
          CHILD_CHECK(recvWait(rt, b, 1, 0) == HORA_SUCCESS, "%s", lastMessage().c_str());
          CHILD_CHECK(matches(b, 1, 0, it), "pong %d of %lld corrupt", it, (long long)count);
        } else {
          CHILD_CHECK(recvWait(rt, b, 0, 0) == HORA_SUCCESS, "%s", lastMessage().c_str());
          CHILD_CHECK(matches(b, 0, 1, it), "ping %d of %lld corrupt", it, (long long)count);
          fill(b, 1, 0, it);
          CHILD_CHECK(sendWait(rt, b, 0, 0) == HORA_SUCCESS, "%s", lastMessage().c_str());
        }
      }
    }
    hora_shutdown(rt);
    return 0;
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(results[r].exitCode, 0) << results[r].output;
}

// The sender's process dies before sending: the receiver fails naming it,
// long before any stall timeout.
TEST(P2p, ReceiverOfADeadSenderFailsNamingIt) {
  auto t0 = std::chrono::steady_clock::now();
  auto results = runProcesses(
      2,
      [](int rank) -> int {
        hora_runtime_t rt;
        CHILD_CHECK(hora_init(nullptr, &rt) == HORA_SUCCESS, "%s", hora_last_error_message());
        Buf b(kF32, {16});
        // One exchange first, so both inboxes are connected.
        if (rank == 0) {
          CHILD_CHECK(recvWait(rt, b, 1, 0) == HORA_SUCCESS, "%s", lastMessage().c_str());
          std::string msg;
          hora_status_t s = recvWait(rt, b, 1, 1, &msg);
          CHILD_CHECK(s != HORA_SUCCESS, "the receive from a dead rank succeeded");
          CHILD_CHECK(msg.find("rank 1") != std::string::npos, "message: %s", msg.c_str());
          std::printf("receiver error: %s\n", msg.c_str());
          hora_shutdown(rt);
          return 0;
        }
        CHILD_CHECK(sendWait(rt, b, 0, 0) == HORA_SUCCESS, "%s", lastMessage().c_str());
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        raise(SIGKILL);
        return 1;
      },
      60, nullptr, {{"HORA_PEER_TIMEOUT_S", "30"}});
  EXPECT_EQ(results[1].signal, SIGKILL) << results[1].output;
  EXPECT_EQ(results[0].exitCode, 0) << results[0].output;
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(took, 20.0) << "the receiver waited for the peer timeout instead of noticing the death";
}

// A receive nobody sends to: warned about with its peer and tag, then
// failed at the stall shutdown, on the threads' deadline.
TEST(P2p, ReceiveNobodySendsToIsReportedAndFailsAtTheStallShutdown) {
  std::atomic<int> failed{0};
  runThreads(
      2,
      [&](int rank, hora_runtime_t rt) {
        if (rank != 1) {
          // Keep the runtime alive until the stall breaks the set.
          std::this_thread::sleep_for(std::chrono::seconds(4));
          return;
        }
        Buf b(kF32, {4});
        std::string msg;
        auto t0 = std::chrono::steady_clock::now();
        EXPECT_NE(recvWait(rt, b, 0, 42, &msg), HORA_SUCCESS);
        const double took =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        EXPECT_NE(msg.find("tag 42"), std::string::npos) << msg;
        EXPECT_NE(msg.find("rank 0 has not sent"), std::string::npos) << msg;
        EXPECT_LT(took, 3.5);
        failed = 1;
      },
      [](hora_config_t& c) {
        c.stall_warning_time_s = 0.5;
        c.stall_shutdown_time_s = 1.5;
      },
      60);
  EXPECT_EQ(failed.load(), 1);
}

// A peer that shuts down cleanly: what waits for it fails with
// HORA_ERR_SHUT_DOWN naming it; the other ranks go on exchanging.
TEST(P2p, PeerShutdownFailsOnlyWhatWaitsForIt) {
  runThreads(3, [](int rank, hora_runtime_t rt) {
    Buf b(kF32, {8});
    ringExchange(rank, 3, rt, kF32, 8, 0);  // every pair connected
    if (rank == 2) return;                  // shuts down
    if (rank == 0) {
      std::string msg;
      EXPECT_EQ(recvWait(rt, b, 2, 77, &msg), HORA_ERR_SHUT_DOWN) << msg;
      EXPECT_NE(msg.find("rank 2"), std::string::npos) << msg;
      fill(b, 0, 1, 5);
      EXPECT_EQ(sendWait(rt, b, 1, 5), HORA_SUCCESS) << lastMessage();
    } else {
      EXPECT_EQ(recvWait(rt, b, 0, 5), HORA_SUCCESS) << lastMessage();
      EXPECT_TRUE(matches(b, 0, 1, 5));
    }
  });
}
