// TcpRingBackend with ranks as threads in one process: every rank its own
// backend over loopback sockets, connected through one MemoryStore. Sweeps
// ring sizes 1-4, every dtype and op, counts around the ring's segments and
// its reduce pieces, for allreduce, reducescatter, allgatherv, broadcast and
// barrier; then the failures (abort, a peer that closes, a peer that stalls,
// a stranger at the listener), each with a deadline.
#include "ops/tcp/tcp_ring.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend_check.h"
#include "core/memory_store.h"
#include "core/store.h"
#include "ops/p2p/p2p_socket.h"

namespace hora {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

World makeRing(int size, milliseconds timeout = milliseconds(10000),
               std::shared_ptr<Store> store = nullptr, bool mesh = true) {
  if (!store) store = std::make_shared<MemoryStore>();
  World world(size);
  std::vector<Status> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      TcpRingOptions o;
      o.host = "127.0.0.1";
      o.timeout = timeout;
      o.startTimeout = milliseconds(10000);
      o.mesh = mesh;
      for (int k = 0; k < size; ++k) o.rankNames.push_back("set rank " + std::to_string(10 + k));
      auto b = createTcpRingBackend(store, r, size, o);
      if (b.isOk())
        world[r] = b.take();
      else
        errors[r] = b.status();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r) EXPECT_TRUE(errors[r].isOk()) << r << ": " << errors[r].toString();
  return world;
}

class TcpRingWorld : public ::testing::TestWithParam<int> {};

TEST_P(TcpRingWorld, EveryDtypeAndOpSmallCounts) {
  World world = makeRing(GetParam());
  ASSERT_TRUE(world[0]);
  for (DataType dt : kAllTypes)
    for (ReduceOp op : kReduceOps)
      for (size_t count : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{5}, size_t{1000}})
        checkAllreduce(world, dt, op, count);
}

TEST_P(TcpRingWorld, LargeCountsCrossManyPiecesAndFullSocketBuffers) {
  World world = makeRing(GetParam());
  ASSERT_TRUE(world[0]);
  // 16385: segments that do not split evenly; (1 << 22) + 7: several 64 KiB
  // reduce pieces per segment, and more than a socket buffer holds, so that
  // sends wait for the peer to read.
  for (size_t count : {size_t{16385}, size_t{(1 << 22) + 7}})
    checkAllreduce(world, DataType::kFloat32, ReduceOp::kSum, count);
  checkAllreduce(world, DataType::kFloat64, ReduceOp::kMax, (1 << 20) + 3);
  checkAllreduce(world, DataType::kFloat16, ReduceOp::kSum, 100003);
}

TEST_P(TcpRingWorld, EveryRankGetsTheSameBitsOfAFloatSum) {
  World world = makeRing(GetParam());
  ASSERT_TRUE(world[0]);
  const int size = GetParam();
  const size_t count = 300001;
  std::vector<std::vector<float>> out(size);
  runRanks(world, [&](int r, Backend& b) {
    std::mt19937 gen(static_cast<unsigned>(r + 1));
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    out[r].resize(count);
    for (auto& x : out[r]) x = d(gen);
    ASSERT_TRUE(b.allreduce(out[r].data(), count, DataType::kFloat32, ReduceOp::kSum).isOk());
  });
  for (int r = 1; r < size; ++r)
    EXPECT_EQ(std::memcmp(out[r].data(), out[0].data(), count * sizeof(float)), 0) << r;
  // And they are a sum: recompute one element in double.
  std::vector<double> want(3, 0.0);
  for (int r = 0; r < size; ++r) {
    std::mt19937 gen(static_cast<unsigned>(r + 1));
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    for (size_t i = 0; i < 3; ++i) want[i] += d(gen);
  }
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(out[0][i], want[i], 1e-5) << i;
}

TEST_P(TcpRingWorld, ManyCallsInARowKeepTheStreamsInStep) {
  World world = makeRing(GetParam());
  ASSERT_TRUE(world[0]);
  for (int it = 0; it < 200; ++it)
    checkAllreduce(world, DataType::kInt32, ReduceOp::kSum, static_cast<size_t>(1 + it * 37));
}

TEST_P(TcpRingWorld, ReducescatterEveryDtypeAndOpUnevenCounts) {
  World world = makeRing(GetParam());
  ASSERT_TRUE(world[0]);
  const int size = GetParam();
  // Uneven, with empty regions (a rank that owns nothing still forwards).
  std::vector<size_t> small(size), large(size);
  for (int r = 0; r < size; ++r) {
    small[r] = static_cast<size_t>((r * 3 + 1) % 4);  // 1, 0, 3, 2
    large[r] = (size_t{1} << 20) + static_cast<size_t>(r) * 4099;
  }
  for (DataType dt : kAllTypes)
    for (ReduceOp op : kReduceOps) checkReducescatter(world, small, dt, op);
  checkReducescatter(world, large, DataType::kFloat32, ReduceOp::kSum);
  checkReducescatter(world, large, DataType::kFloat16, ReduceOp::kMax);
  checkReducescatter(world, std::vector<size_t>(size, 0), DataType::kInt32, ReduceOp::kSum);
}

TEST_P(TcpRingWorld, AllgathervUnevenCountsInAndOutOfPlace) {
  World world = makeRing(GetParam());
  ASSERT_TRUE(world[0]);
  const int size = GetParam();
  std::vector<size_t> uneven(size), large(size);
  for (int r = 0; r < size; ++r) {
    uneven[r] = static_cast<size_t>((r * 3 + 1) % 4);
    large[r] = (size_t{1} << 20) + static_cast<size_t>(r) * 7;
  }
  checkAllgatherv(world, uneven);
  checkAllgatherv(world, large);
  checkAllgatherv(world, std::vector<size_t>(size, 0));
  std::vector<size_t> onlyLast(size, 0);
  onlyLast[size - 1] = 5;
  checkAllgatherv(world, onlyLast);
}

TEST_P(TcpRingWorld, BroadcastFromEveryRoot) {
  World world = makeRing(GetParam());
  ASSERT_TRUE(world[0]);
  const int size = GetParam();
  // (1 << 22) + 7 bytes: more than the sockets hold, so that the chain's
  // forwarding waits for its neighbour to read.
  for (int root = 0; root < size; ++root) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{1001}, (size_t{1} << 22) + 7}) {
      runRanks(world, [&](int r, Backend& b) {
        std::vector<uint8_t> buf(count, 0xee);
        if (r == root)
          for (size_t i = 0; i < count; ++i) buf[i] = static_cast<uint8_t>(root * 37 + i % 251);
        Status s = b.broadcast(buf.empty() ? nullptr : buf.data(), count, DataType::kUint8, root);
        ASSERT_TRUE(s.isOk()) << s.toString();
        for (size_t i = 0; i < count; ++i)
          ASSERT_EQ(buf[i], static_cast<uint8_t>(root * 37 + i % 251))
              << "root " << root << " rank " << r << " i " << i;
      });
    }
  }
}

TEST_P(TcpRingWorld, BarrierWaitsForTheLastRankToArrive) {
  World world = makeRing(GetParam());
  ASSERT_TRUE(world[0]);
  const int size = GetParam();
  for (int late = 0; late < size; ++late) {
    std::atomic<int64_t> arrived{0};  // when the late rank called, in us since start
    const auto start = Clock::now();
    runRanks(world, [&](int r, Backend& b) {
      if (r == late) {
        std::this_thread::sleep_for(milliseconds(150));
        arrived =
            std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
      }
      Status s = b.barrier();
      ASSERT_TRUE(s.isOk()) << s.toString();
      // The 150 ms bound below catches a rank that leaves early (`arrived`
      // may still read 0 then); this one, a rank that left before the late
      // rank called.
      const auto left = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);
      EXPECT_GE(left.count(), arrived.load())
          << "rank " << r << " left before rank " << late << " arrived";
      if (size > 1) {
        EXPECT_GE(left, milliseconds(150)) << "rank " << r;
      }
    });
  }
}

TEST_P(TcpRingWorld, AlltoallvUnevenSplitsIncludingZeroAndLarge) {
  World world = makeRing(GetParam());
  ASSERT_TRUE(world[0]);
  checkAlltoallv(world, [](int s, int d) { return static_cast<int64_t>((s + 2 * d) % 3); });
  // 4 MiB to every peer: more than the sockets hold, every send and
  // receive at once (a rank that sent first and received after would block
  // its peers on full buffers).
  checkAlltoallv(world, [](int s, int d) { return int64_t{1 << 19} + s * 3 + d; });
  checkAlltoallv(world, [](int, int) { return int64_t{0}; });
}

TEST_P(TcpRingWorld, MixedCollectivesInARowKeepTheStreamsInStep) {
  World world = makeRing(GetParam());
  ASSERT_TRUE(world[0]);
  const int size = GetParam();
  for (int it = 0; it < 60; ++it) {
    const size_t n = static_cast<size_t>(1 + it * 53);
    switch (it % 4) {
      case 0:
        checkAllreduce(world, DataType::kInt32, ReduceOp::kSum, n);
        break;
      case 1:
        checkReducescatter(world, std::vector<size_t>(size, n), DataType::kInt64, ReduceOp::kMin);
        break;
      case 2:
        checkAllgatherv(world, std::vector<size_t>(size, n));
        checkAlltoallv(world, [n](int s, int d) { return static_cast<int64_t>(n % 7 + s + d); });
        runRanks(world, [&](int r, Backend& b) {
          std::vector<int32_t> buf(n, r == size - 1 ? 7 : -1);
          ASSERT_TRUE(b.broadcast(buf.data(), n, DataType::kInt32, size - 1).isOk());
          for (int32_t x : buf) ASSERT_EQ(x, 7) << "rank " << r;
        });
        break;
      default:
        runRanks(world, [&](int, Backend& b) { ASSERT_TRUE(b.barrier().isOk()); });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, TcpRingWorld, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "size" + std::to_string(info.param);
                         });

// ------------------------------------------------------------ failures

TEST(TcpRingTest, AbortFromAnotherThreadUnblocksACall) {
  World world = makeRing(3, milliseconds(20000));
  // Rank 1 never calls; rank 0 waits; another thread aborts it.
  // By then it sleeps in poll(2), whose slices are up to a second long: the
  // abort must wake it, not the end of a slice.
  Clock::time_point aborted;
  std::thread aborter([&] {
    std::this_thread::sleep_for(milliseconds(200));
    aborted = Clock::now();
    world[0]->abort();
  });
  std::vector<float> v(100000, 1.0f);
  Status s = world[0]->allreduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
  const auto returned = Clock::now();
  aborter.join();
  EXPECT_EQ(s.code(), Code::kRemoteError) << s.toString();
  EXPECT_NE(s.message().find("aborted"), std::string::npos) << s.toString();
  EXPECT_LT(returned - aborted, milliseconds(500));
  const auto again = Clock::now();
  EXPECT_FALSE(world[0]->allreduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum).isOk());
  EXPECT_LT(Clock::now() - again, milliseconds(100));
}

// Rank 1 of a 2-ring is lost by `lose` 200 ms into rank 0's allreduce:
// rank 0 fails at once (not after its 20 s timeout), naming it.
Status rankZeroWhenRankOneIs(const std::function<void(World&)>& lose) {
  World world = makeRing(2, milliseconds(20000));
  std::thread loser([&] {
    std::this_thread::sleep_for(milliseconds(200));
    lose(world);
  });
  std::vector<float> v(1 << 20, 1.0f);
  const auto start = Clock::now();
  Status s = world[0]->allreduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
  loser.join();
  EXPECT_EQ(s.code(), Code::kRemoteError) << s.toString();
  EXPECT_NE(s.message().find("set rank 11"), std::string::npos) << s.toString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  if (!s.isOk()) {
    // Broken for good.
    int32_t x = 1;
    Status again = world[0]->allreduce(&x, 1, DataType::kInt32, ReduceOp::kSum);
    EXPECT_EQ(again.code(), Code::kRemoteError) << again.toString();
    EXPECT_NE(again.message().find("failed before"), std::string::npos) << again.toString();
  }
  return s;
}

TEST(TcpRingTest, APeerThatClosesFailsTheCallNamingIt) {
  // Its sockets close, as a killed rank's would.
  Status s = rankZeroWhenRankOneIs([](World& w) { w[1].reset(); });
  EXPECT_NE(s.message().find("127.0.0.1:"), std::string::npos) << s.toString();
}

TEST(TcpRingTest, APeerThatAbortsFailsItsNeighboursAtOnce) {
  // Rank 1 gives up (the control plane told it a rank was lost).
  Status s = rankZeroWhenRankOneIs([](World& w) { w[1]->abort(); });
  EXPECT_NE(s.message().find("aborted"), std::string::npos) << s.toString();
}

TEST(TcpRingTest, ARankThatFailsClosesItsStreamsForItsNeighbours) {
  // Rank 2 times out on its own (1 s) waiting for rank 1, which never calls;
  // rank 0, with a 20 s timeout, waits on rank 2 and must hear of it at once.
  auto store = std::make_shared<MemoryStore>();
  World world(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      TcpRingOptions o;
      o.host = "127.0.0.1";
      o.timeout = r == 2 ? milliseconds(1000) : milliseconds(20000);
      auto b = createTcpRingBackend(store, r, 3, o);
      ASSERT_TRUE(b.isOk()) << b.status().toString();
      world[r] = b.take();
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(world[0] && world[1] && world[2]);
  Status s2;
  std::thread rank2([&] {
    std::vector<float> w(1000, 1.0f);
    s2 = world[2]->allreduce(w.data(), w.size(), DataType::kFloat32, ReduceOp::kSum);
  });
  std::vector<float> v(1000, 1.0f);
  const auto start = Clock::now();
  Status s0 = world[0]->allreduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
  const auto took = Clock::now() - start;
  rank2.join();
  EXPECT_EQ(s2.code(), Code::kTimeout) << s2.toString();
  EXPECT_EQ(s0.code(), Code::kRemoteError) << s0.toString();
  EXPECT_LT(took, std::chrono::seconds(5));
}

TEST(TcpRingTest, AStalledPeerTimesOutNamingIt) {
  World world = makeRing(3, milliseconds(600));
  std::vector<float> v(1000, 1.0f);
  const auto start = Clock::now();
  // Ranks 1 and 2 never call: rank 0 waits for rank 2 (its left neighbour).
  Status s = world[0]->allreduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
  const auto took = Clock::now() - start;
  EXPECT_EQ(s.code(), Code::kTimeout) << s.toString();
  EXPECT_NE(s.message().find("set rank 12"), std::string::npos) << s.toString();
  EXPECT_NE(s.message().find("HORA_PEER_TIMEOUT_S"), std::string::npos) << s.toString();
  EXPECT_GE(took, milliseconds(550));
  EXPECT_LT(took, std::chrono::seconds(3));
}

TEST(TcpRingTest, SharedBadArgumentsMoveNoByteAndKeepTheRing) {
  World world = makeRing(2);
  ASSERT_TRUE(world[0] && world[1]);
  // Arguments every rank shares (root, counts, op): each rank fails the call
  // before a byte moves, so the ring stays usable (rank 1 need not call).
  float x = 1;
  Backend& b = *world[0];
  EXPECT_EQ(b.broadcast(&x, 1, DataType::kFloat32, 2).code(), Code::kInvalidArgument);
  EXPECT_EQ(b.reducescatter(&x, {1}, DataType::kFloat32, ReduceOp::kSum).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(b.allgatherv(&x, &x, {1, 1, 1}, DataType::kFloat32).code(), Code::kInvalidArgument);
  int8_t flag = 1;
  EXPECT_EQ(b.allreduce(&flag, 1, DataType::kBool, ReduceOp::kCount).code(),
            Code::kInvalidArgument);
  checkReducescatter(world, {2, 3}, DataType::kFloat32, ReduceOp::kSum);
  checkAllgatherv(world, {2, 3});
}

TEST(TcpRingTest, ARankLocalBadArgumentBreaksTheRingSoItsPeerFailsAtOnce) {
  // A null buffer, or this rank's own alltoall counts: its peer goes ahead
  // with the call, so the ring must break (else the peer's bytes would be
  // read as this rank's next call's).
  float x = 1;
  const std::vector<std::pair<const char*, std::function<Status(Backend&)>>> cases = {
      {"null broadcast", [](Backend& b) { return b.broadcast(nullptr, 1, DataType::kFloat32, 0); }},
      {"null reducescatter",
       [](Backend& b) {
         return b.reducescatter(nullptr, {1, 1}, DataType::kFloat32, ReduceOp::kSum);
       }},
      {"null allgatherv",
       [&](Backend& b) {
         return b.allgatherv(nullptr, &x, {1, 1}, DataType::kFloat32);
       }},
      {"null allreduce",
       [](Backend& b) { return b.allreduce(nullptr, 4, DataType::kFloat32, ReduceOp::kSum); }},
      {"alltoall counts",
       [&](Backend& b) {
         return b.alltoallv(&x, {1, 0, 0}, &x, {1, 0, 0}, DataType::kFloat32);
       }},
      {"alltoall negative",
       [&](Backend& b) {
         return b.alltoallv(&x, {1, -1}, &x, {1, 0}, DataType::kFloat32);
       }},
      {"alltoall self", [&](Backend& b) {
         return b.alltoallv(&x, {1, 0}, &x, {0, 0}, DataType::kFloat32);  // sends itself 1, gets 0
       }}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.first);
    World world = makeRing(2, milliseconds(20000));
    ASSERT_TRUE(world[0] && world[1]);
    EXPECT_EQ(c.second(*world[0]).code(), Code::kInvalidArgument);
    float y = 1;
    EXPECT_EQ(world[0]->allreduce(&y, 1, DataType::kFloat32, ReduceOp::kSum).code(),
              Code::kInvalidArgument);  // broken: "failed before"
    const auto start = Clock::now();
    std::vector<float> v(1000, 1.0f);
    EXPECT_EQ(world[1]->allreduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum).code(),
              Code::kRemoteError);
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  }
}

// Five and six ranks: the mesh's own connections (pairs that are not ring
// neighbours) carry most of an alltoall.
TEST(TcpRingTest, AlltoallOverTheMeshAtFiveAndSixRanks) {
  for (int size : {5, 6}) {
    World world = makeRing(size);
    ASSERT_TRUE(world[0]) << size;
    checkAlltoallv(world, [](int s, int d) { return static_cast<int64_t>(1 + (s * 7 + d) % 5); });
    checkAlltoallv(world, [](int s, int d) { return int64_t{100003} + s - d; });
    checkAllreduce(world, DataType::kInt32, ReduceOp::kSum, 10007);
  }
}

TEST(TcpRingTest, WithoutTheMeshAlltoallNeedsRingNeighboursOnly) {
  // Three ranks are all each other's neighbours: no mesh needed.
  World three = makeRing(3, milliseconds(10000), nullptr, /*mesh=*/false);
  ASSERT_TRUE(three[0]);
  checkAlltoallv(three, [](int s, int d) { return static_cast<int64_t>(1 + s + d); });
  // Four ranks: 0 and 2 have no connection; the call fails before a byte
  // moves, naming the peer, and the ring stays usable.
  World four = makeRing(4, milliseconds(10000), nullptr, /*mesh=*/false);
  ASSERT_TRUE(four[0]);
  int64_t x[4] = {0, 0, 0, 0};
  Status s = four[0]->alltoallv(x, {1, 1, 1, 1}, x, {1, 1, 1, 1}, DataType::kInt64);
  EXPECT_EQ(s.code(), Code::kNotSupported) << s.toString();
  EXPECT_NE(s.message().find("set rank 12"), std::string::npos) << s.toString();
  checkAllreduce(four, DataType::kInt32, ReduceOp::kSum, 1001);
}

// Rank 1 of a 2-ring is lost 200 ms into rank 0's `op` (the rank 1 never
// calls): rank 0 fails at once, naming it, and stays broken.
void lostDuring(const char* op) {
  World world = makeRing(2, milliseconds(20000));
  std::thread loser([&] {
    std::this_thread::sleep_for(milliseconds(200));
    world[1]->abort();
  });
  std::vector<float> v(1 << 20, 1.0f), out(2 << 20);
  const std::string which = op;
  const auto start = Clock::now();
  Status s = which == "broadcast"   ? world[0]->broadcast(v.data(), v.size(), DataType::kFloat32, 1)
             : which == "allgather" ? world[0]->allgatherv(v.data(), out.data(),
                                                           {v.size(), v.size()}, DataType::kFloat32)
             : which == "barrier"   ? world[0]->barrier()
             : which == "alltoall"  ? world[0]->alltoallv(v.data(), {1 << 19, 1 << 19}, out.data(),
                                                          {1 << 19, 1 << 19}, DataType::kFloat32)
                                   : world[0]->reducescatter(v.data(), {v.size() / 2, v.size() / 2},
                                                             DataType::kFloat32, ReduceOp::kSum);
  loser.join();
  EXPECT_EQ(s.code(), Code::kRemoteError) << op << ": " << s.toString();
  EXPECT_NE(s.message().find("set rank 11"), std::string::npos) << s.toString();
  EXPECT_NE(s.message().find(which), std::string::npos) << s.toString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3)) << op;
  EXPECT_EQ(world[0]->barrier().code(), Code::kRemoteError) << op;
}

TEST(TcpRingTest, APeerLostDuringEachCollectiveFailsItAtOnce) {
  for (const char* op : {"broadcast", "allgather", "barrier", "reducescatter", "alltoall"})
    lostDuring(op);
}

TEST(TcpRingTest, ARankLostDownstreamOfAForwardingRankFailsIt) {
  // Root 0 sends 64 MiB (far more than loopback's socket buffers hold);
  // rank 1 forwards them to rank 2, which never calls and is aborted 200 ms
  // in: rank 1, stuck forwarding on full buffers, fails at once naming it.
  World world = makeRing(3, milliseconds(20000));
  std::vector<float> v(1 << 24, 1.0f), w(1 << 24, 0.0f);
  Status s0;
  std::thread root([&] { s0 = world[0]->broadcast(v.data(), v.size(), DataType::kFloat32, 0); });
  std::thread loser([&] {
    std::this_thread::sleep_for(milliseconds(200));
    world[2]->abort();
  });
  const auto start = Clock::now();
  Status s = world[1]->broadcast(w.data(), w.size(), DataType::kFloat32, 0);
  loser.join();
  root.join();
  EXPECT_EQ(s.code(), Code::kRemoteError) << s.toString();
  EXPECT_NE(s.message().find("set rank 12"), std::string::npos) << s.toString();
  EXPECT_NE(s.message().find("sending to"), std::string::npos) << s.toString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
}

TEST(TcpRingTest, APeerLostDuringAnAlltoallOverTheMeshFailsItAtOnce) {
  // Five ranks: 0 and 2 talk over a mesh connection only. Rank 2 aborts
  // 200 ms into rank 0's alltoall (ranks 1, 3 and 4 never call), so rank 0
  // hears of it only through that connection's end of stream.
  World world = makeRing(5, milliseconds(20000));
  std::thread loser([&] {
    std::this_thread::sleep_for(milliseconds(200));
    world[2]->abort();
  });
  const int64_t per = 1 << 20;
  std::vector<float> in(5 * per, 1.0f), out(5 * per);
  std::vector<int64_t> counts(5, 0);
  counts[0] = counts[2] = per;
  const auto start = Clock::now();
  Status s = world[0]->alltoallv(in.data(), counts, out.data(), counts, DataType::kFloat32);
  loser.join();
  EXPECT_EQ(s.code(), Code::kRemoteError) << s.toString();
  EXPECT_NE(s.message().find("set rank 12"), std::string::npos) << s.toString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
}

TEST(TcpRingTest, AStrangerAtTheListenerIsTurnedAway) {
  auto store = std::make_shared<MemoryStore>();
  World world(2);
  std::thread rank0([&] {
    TcpRingOptions o;
    o.host = "127.0.0.1";
    auto b = createTcpRingBackend(store, 0, 2, o);
    ASSERT_TRUE(b.isOk()) << b.status().toString();
    world[0] = b.take();
  });
  // Rank 0's address is in the store; knock with the wrong token, then as
  // the right rank with the wrong token, before rank 1 arrives.
  auto v = store->get("tcp/0", milliseconds(5000));
  ASSERT_TRUE(v.isOk());
  const std::string entry = v.value();
  const int port = std::atoi(entry.substr(entry.find('\n') + 1).c_str());
  std::vector<int> strangers;
  for (int r : {5, 1}) {
    P2pHello h{};
    h.magic = kP2pHelloMagic;
    h.rank = r;
    std::snprintf(h.token, sizeof h.token, "%s", "not-the-token");
    auto c = p2pConnect("127.0.0.1", port, h, 2000);
    ASSERT_TRUE(c.isOk()) << c.status().toString();
    strangers.push_back(c.value());
  }
  std::thread rank1([&] {
    TcpRingOptions o;
    o.host = "127.0.0.1";
    auto b = createTcpRingBackend(store, 1, 2, o);
    ASSERT_TRUE(b.isOk()) << b.status().toString();
    world[1] = b.take();
  });
  rank0.join();
  rank1.join();
  ASSERT_TRUE(world[0] && world[1]);
  checkAllreduce(world, DataType::kInt64, ReduceOp::kSum, 4097);
  for (int fd : strangers) p2pClose(fd);
}

TEST(TcpRingTest, TheMeshTurnsAwayRanksThatDoNotConnectThere) {
  // Four ranks with the mesh: rank 2 accepts rank 1 (the ring) and rank 0
  // (the mesh) only. Before they arrive, knock with the right token as rank
  // 3 (rank 2 connects to it, never the other way) and as rank 7 (no such
  // rank): rank 2 must turn both away and keep the real connections.
  auto store = std::make_shared<MemoryStore>();
  World world(4);
  std::vector<std::thread> threads;
  auto start = [&](int r) {
    threads.emplace_back([&, r] {
      TcpRingOptions o;
      o.host = "127.0.0.1";
      o.mesh = true;
      auto b = createTcpRingBackend(store, r, 4, o);
      ASSERT_TRUE(b.isOk()) << r << ": " << b.status().toString();
      world[r] = b.take();
    });
  };
  start(2);
  auto v = store->get("tcp/2", milliseconds(5000));
  ASSERT_TRUE(v.isOk());
  const std::string entry = v.value();
  const size_t nl = entry.find('\n'), nl2 = entry.find('\n', nl + 1);
  const int port = std::atoi(entry.substr(nl + 1, nl2 - nl - 1).c_str());
  const std::string token = entry.substr(nl2 + 1);
  std::vector<int> knocks;
  for (int r : {3, 7}) {
    P2pHello h{};
    h.magic = kP2pHelloMagic;
    h.rank = r;
    std::snprintf(h.token, sizeof h.token, "%s", token.c_str());
    auto c = p2pConnect("127.0.0.1", port, h, 2000);
    ASSERT_TRUE(c.isOk()) << c.status().toString();
    knocks.push_back(c.value());
  }
  for (int r : {0, 1, 3}) start(r);
  for (auto& t : threads) t.join();
  ASSERT_TRUE(world[0] && world[1] && world[2] && world[3]);
  checkAlltoallv(world, [](int s, int d) { return static_cast<int64_t>(100 + s * 4 + d); });
  checkAllreduce(world, DataType::kInt32, ReduceOp::kSum, 1001);
  for (int fd : knocks) p2pClose(fd);
}

TEST(TcpRingTest, ALeftNeighbourThatNeverConnectsFailsTheStart) {
  // Rank 1 published an address (a listener that accepts nothing) and died
  // before connecting: rank 0 reaches the address, then waits for rank 1's
  // connection until the start timeout, or at once when the watch says so.
  for (bool watched : {false, true}) {
    SCOPED_TRACE(watched ? "watched" : "unwatched");
    auto store = std::make_shared<MemoryStore>();
    int port = 0;
    auto l = p2pListen("127.0.0.1", &port);
    ASSERT_TRUE(l.isOk());
    ASSERT_TRUE(store->set("tcp/1", "127.0.0.1\n" + std::to_string(port) + "\ntoken").isOk());
    TcpRingOptions o;
    o.host = "127.0.0.1";
    o.startTimeout = milliseconds(watched ? 20000 : 600);
    o.rankNames = {"set rank 0", "set rank 7"};
    if (watched)
      o.setUpWatch = [] {
        return Status(Code::kRemoteError, "set rank 7's control connection closed");
      };
    const auto start = Clock::now();
    auto b = createTcpRingBackend(store, 0, 2, o);
    ASSERT_FALSE(b.isOk());
    EXPECT_EQ(b.status().code(), watched ? Code::kRemoteError : Code::kTimeout)
        << b.status().toString();
    EXPECT_NE(b.status().message().find("set rank 7"), std::string::npos) << b.status().toString();
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
    p2pClose(l.value());
  }
}

TEST(TcpRingTest, AnInterfaceWithoutAnAddressIsRefused) {
  auto store = std::make_shared<MemoryStore>();
  TcpRingOptions o;
  o.host = "127.0.0.1";
  o.iface = "no-such-nic0";
  auto b = createTcpRingBackend(store, 0, 2, o);
  ASSERT_FALSE(b.isOk());
  EXPECT_EQ(b.status().code(), Code::kInvalidArgument);
  EXPECT_NE(b.status().message().find("no-such-nic0"), std::string::npos) << b.status().toString();
  EXPECT_NE(b.status().message().find("HORA_GLOO_IFACE"), std::string::npos);
}

TEST(TcpRingTest, ARankThatNeverArrivesFailsTheStartNamingIt) {
  auto store = std::make_shared<MemoryStore>();
  TcpRingOptions o;
  o.host = "127.0.0.1";
  o.startTimeout = milliseconds(500);
  o.rankNames = {"set rank 0", "set rank 7"};
  const auto start = Clock::now();
  auto b = createTcpRingBackend(store, 0, 2, o);
  ASSERT_FALSE(b.isOk());
  EXPECT_EQ(b.status().code(), Code::kTimeout) << b.status().toString();
  EXPECT_NE(b.status().message().find("set rank 7"), std::string::npos) << b.status().toString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
}

// The Gloo backend a RingPlaneBackend keeps: counts the calls that reach it
// (none should, the ring carries every collective).
class CountingRest : public Backend {
 public:
  CountingRest(int rank, int size) : rank_(rank), size_(size) {}
  std::string name() const override { return "gloo"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status allreduce(void*, size_t, DataType, ReduceOp) override { return count(); }
  Status allgatherv(const void*, void*, const std::vector<size_t>&, DataType) override {
    return count();
  }
  Status broadcast(void*, size_t, DataType, int) override { return count(); }
  Status alltoallv(const void*, const std::vector<int64_t>&, void*, const std::vector<int64_t>&,
                   DataType) override {
    return count();
  }
  Status reducescatter(void*, const std::vector<size_t>&, DataType, ReduceOp) override {
    return count();
  }
  Status barrier() override { return count(); }
  void abort() noexcept override { aborted = true; }
  std::atomic<int> calls{0};
  std::atomic<bool> aborted{false};

 private:
  Status count() {
    ++calls;
    return Status::ok();
  }
  int rank_, size_;
};

// Every rank runs withTcpRing with its own `wants`.
struct Wrapped {
  World world;
  std::vector<CountingRest*> rest;
  std::vector<std::string> whyNot;
};
Wrapped wrapAll(const std::vector<bool>& wants) {
  const int size = static_cast<int>(wants.size());
  auto store = std::make_shared<MemoryStore>();
  Wrapped w;
  w.world.resize(size);
  w.rest.resize(size);
  w.whyNot.resize(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      auto rest = std::make_unique<CountingRest>(r, size);
      w.rest[r] = rest.get();
      TcpRingOptions o;
      o.host = "127.0.0.1";
      o.startTimeout = milliseconds(5000);
      auto b = withTcpRing(store, r, size, wants[r] ? "" : "HORA_HIER_CROSS=gloo", o,
                           std::move(rest), &w.whyNot[r]);
      ASSERT_TRUE(b.isOk()) << b.status().toString();
      w.world[r] = b.take();
    });
  }
  for (auto& t : threads) t.join();
  return w;
}

TEST(TcpRingPlaneTest, EveryRankWantingItGetsTheRingForEveryCollective) {
  Wrapped w = wrapAll({true, true, true});
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(w.world[r]);
    EXPECT_EQ(w.world[r]->name(), "tcp-ring+gloo");
    EXPECT_TRUE(w.whyNot[r].empty()) << w.whyNot[r];
  }
  checkAllreduce(w.world, DataType::kFloat32, ReduceOp::kSum, 100003);
  checkReducescatter(w.world, {5, 0, 7}, DataType::kFloat32, ReduceOp::kSum);
  checkAllgatherv(w.world, {3, 1, 4});
  runRanks(w.world, [](int r, Backend& b) {
    EXPECT_TRUE(b.barrier().isOk());
    float x = static_cast<float>(r);
    EXPECT_TRUE(b.broadcast(&x, 1, DataType::kFloat32, 2).isOk());
    EXPECT_EQ(x, 2.0f);
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(w.rest[r]->calls.load(), 0) << r;
  // The executor's entry point, with a combine function: the ring too.
  checkAllreduceGather(w.world, DataType::kInt32, ReduceOp::kSum, 70001, CombineMode::kCombine);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(w.rest[r]->calls.load(), 0) << r;
  checkAlltoallv(w.world, [](int s, int d) { return static_cast<int64_t>(s + 2 * d); });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(w.rest[r]->calls.load(), 0) << r;
  // Abort reaches both halves: the ring fails at once, and so do its
  // neighbours.
  w.world[1]->abort();
  EXPECT_TRUE(w.rest[1]->aborted.load());
  float x = 1;
  EXPECT_EQ(w.world[1]->allreduce(&x, 1, DataType::kFloat32, ReduceOp::kSum).code(),
            Code::kRemoteError);
  const auto start = Clock::now();
  EXPECT_EQ(w.world[2]->allreduce(&x, 1, DataType::kFloat32, ReduceOp::kSum).code(),
            Code::kRemoteError);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
}

TEST(TcpRingPlaneTest, OneRankKeepingGlooKeepsEveryRankOnIt) {
  Wrapped w = wrapAll({true, false, true});
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(w.world[r]);
    EXPECT_EQ(w.world[r]->name(), "gloo") << r;
    EXPECT_FALSE(w.whyNot[r].empty()) << r;
  }
  EXPECT_NE(w.whyNot[0].find("ring rank 1 keeps Gloo (HORA_HIER_CROSS=gloo)"), std::string::npos)
      << w.whyNot[0];
  EXPECT_EQ(w.whyNot[1], "HORA_HIER_CROSS=gloo");
  float x = 1;
  EXPECT_TRUE(w.world[0]->allreduce(&x, 1, DataType::kFloat32, ReduceOp::kSum).isOk());
  EXPECT_EQ(w.rest[0]->calls.load(), 1);
}

}  // namespace
}  // namespace hora
