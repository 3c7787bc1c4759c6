// GlooBackend with ranks as threads in one process: every rank gets its own
// backend (own TCP device and loopback sockets) built through one shared
// MemoryStore. Data are small integers so every dtype's result is exact.
// Timeouts are a few seconds so a broken collective fails instead of hanging.
#include "ops/gloo/gloo_backend.h"

#include <arpa/inet.h>
#include <gloo/transport/tcp/address.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend_check.h"
#include "core/memory_store.h"
#include "core/reduce.h"
#include "core/store.h"

namespace hora {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

std::string uniquePrefix() {
  static std::atomic<int> counter{0};
  return "gloo_test_" + std::to_string(counter++);
}

// Builds `size` connected backends (rendezvous runs concurrently, one thread
// per rank, as it would across processes).
World makeWorld(int size, const std::string& algorithm = "auto",
                milliseconds timeout = milliseconds(5000)) {
  auto store = std::make_shared<MemoryStore>();
  const std::string prefix = uniquePrefix();
  World world(size);
  std::vector<Status> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      GlooBackendOptions opts;
      EXPECT_TRUE(parseGlooAlgorithm(algorithm, &opts.algorithm)) << algorithm;
      opts.timeout = timeout;
      auto result = createGlooBackend(store, prefix, r, size, opts);
      if (result.isOk()) {
        world[r] = result.take();
      } else {
        errors[r] = result.status();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r) {
    EXPECT_TRUE(errors[r].isOk()) << "rank " << r << ": " << errors[r].toString();
  }
  return world;
}

class GlooWorldTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooWorldTest, AllreduceEveryDtypeAndOpSmallCounts) {
  for (const char* alg : {"ring", "bcube"}) {
    World world = makeWorld(GetParam(), alg);
    ASSERT_EQ(world.size(), static_cast<size_t>(GetParam()));
    for (DataType dt : kAllTypes) {
      for (ReduceOp op : kReduceOps) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}}) {
          checkAllreduce(world, dt, op, count);
        }
      }
    }
  }
}

TEST_P(GlooWorldTest, AllreduceLargeCount) {
  // "auto" picks ring for the wider dtypes here (bcube for 1-byte ones);
  // bcube is also forced once for float32.
  World world = makeWorld(GetParam());
  for (DataType dt : kAllTypes) {
    for (ReduceOp op : kReduceOps) checkAllreduce(world, dt, op, 1000003);
  }
  World bcube = makeWorld(GetParam(), "bcube");
  checkAllreduce(bcube, DataType::kFloat32, ReduceOp::kSum, 1000003);
}

TEST_P(GlooWorldTest, AllgathervUnevenCountsIncludingZero) {
  World world = makeWorld(GetParam());
  const int size = GetParam();
  std::vector<size_t> counts(size);
  for (int r = 0; r < size; ++r) counts[r] = (r * 3 + 1) % 4;  // 1, 0, 3, 2
  checkAllgatherv(world, counts);
  // All counts zero: a no-op everywhere.
  runRanks(world, [&](int, Backend& b) {
    EXPECT_TRUE(
        b.allgatherv(nullptr, nullptr, std::vector<size_t>(size, 0), DataType::kFloat64).isOk());
  });
}

TEST_P(GlooWorldTest, BroadcastFromEveryRoot) {
  World world = makeWorld(GetParam());
  const int size = GetParam();
  for (int root = 0; root < size; ++root) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{1001}}) {
      runRanks(world, [&](int r, Backend& b) {
        std::vector<uint16_t> buf(count);
        for (size_t i = 0; i < count; ++i) {
          buf[i] = r == root ? floatToHalf(static_cast<float>(root * 10 + i % 7)) : 0xffff;
        }
        Status s = b.broadcast(buf.data(), count, DataType::kFloat16, root);
        ASSERT_TRUE(s.isOk()) << s.toString();
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(halfToFloat(buf[i]), static_cast<float>(root * 10 + i % 7))
              << "root " << root << " rank " << r << " i " << i;
        }
      });
    }
  }
}

TEST_P(GlooWorldTest, AlltoallvUnevenSplitsIncludingZero) {
  World world = makeWorld(GetParam());
  // Rank s sends (s + 2d) % 3 elements to rank d.
  checkAlltoallv(world, [](int s, int d) { return static_cast<int64_t>((s + 2 * d) % 3); });
}

TEST_P(GlooWorldTest, ReducescatterUnevenCountsIncludingZero) {
  World world = makeWorld(GetParam());
  const int size = GetParam();
  std::vector<size_t> small(size), large(size);
  for (int r = 0; r < size; ++r) {
    small[r] = (r * 2 + 1) % 3;               // 1, 0, 2, 1
    large[r] = r == 1 ? 0 : 300001 + 77 * r;  // > 1 MiB segments for float32
  }
  for (DataType dt : kAllTypes) {
    for (ReduceOp op : kReduceOps) checkReducescatter(world, small, dt, op);
  }
  checkReducescatter(world, large, DataType::kFloat32, ReduceOp::kSum);
  checkReducescatter(world, large, DataType::kFloat16, ReduceOp::kMax);
  checkReducescatter(world, large, DataType::kInt8, ReduceOp::kProduct);
  checkReducescatter(world, std::vector<size_t>(size, 0), DataType::kInt32, ReduceOp::kSum);
  // Several in a row: tags keep consecutive calls apart.
  for (int k = 0; k < 5; ++k) checkReducescatter(world, small, DataType::kInt64, ReduceOp::kSum);
}

TEST_P(GlooWorldTest, BarrierWaitsForTheSlowestRank) {
  World world = makeWorld(GetParam());
  for (int k = 0; k < 3; ++k) {
    runRanks(world, [&](int, Backend& b) { EXPECT_TRUE(b.barrier().isOk()); });
  }
  if (GetParam() == 1) return;
  // Ordering, not durations: no rank leaves the barrier before rank 0 (late
  // by 200 ms) entered it, however the threads were scheduled.
  std::vector<Clock::time_point> left(GetParam());
  Clock::time_point lastEntered;
  runRanks(world, [&](int r, Backend& b) {
    if (r == 0) {
      std::this_thread::sleep_for(milliseconds(200));
      lastEntered = Clock::now();
    }
    EXPECT_TRUE(b.barrier().isOk());
    left[r] = Clock::now();
  });
  for (int r = 1; r < GetParam(); ++r) EXPECT_GE(left[r], lastEntered) << r;
}

TEST_P(GlooWorldTest, MixedSequenceKeepsRanksInStep) {
  World world = makeWorld(GetParam());
  const int size = GetParam();
  runRanks(world, [&](int r, Backend& b) {
    for (int k = 0; k < 10; ++k) {
      std::vector<float> v(17 + k, static_cast<float>(r + 1));
      ASSERT_TRUE(b.allreduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum).isOk());
      EXPECT_EQ(v.back(), size * (size + 1) / 2.0f);
      int32_t x = r == k % size ? k : -1;
      ASSERT_TRUE(b.broadcast(&x, 1, DataType::kInt32, k % size).isOk());
      EXPECT_EQ(x, k);
      ASSERT_TRUE(b.barrier().isOk());
    }
  });
}

TEST_P(GlooWorldTest, AllreduceGatherPacksAndUnpacksEveryElementOnce) {
  // "ring" runs hora's ring allreduce at every count (many segments empty at
  // small counts); "auto" takes Backend's default up to kGlooBcubeMaxBytes.
  for (const char* alg : {"ring", "auto"}) {
    World world = makeWorld(GetParam(), alg);
    for (DataType dt : {DataType::kFloat32, DataType::kInt32, DataType::kFloat16}) {
      for (ReduceOp op : kReduceOps) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1001}, size_t{3000000}}) {
          checkAllreduceGather(world, dt, op, count);
        }
      }
    }
    // Interleaved with plain allreduces: tags keep consecutive calls apart.
    for (int k = 0; k < 3; ++k) {
      checkAllreduceGather(world, DataType::kFloat32, ReduceOp::kSum, 300007);
      checkAllreduce(world, DataType::kFloat32, ReduceOp::kSum, 300007);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, GlooWorldTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "size" + std::to_string(info.param);
                         });

// ------------------------------------------------------------ failure paths

TEST(GlooBackendTest, AbortFromAnotherThreadUnblocksACall) {
  World world = makeWorld(3, "auto", milliseconds(20000));
  const auto start = Clock::now();
  // Rank 1 never calls; ranks 0 and 2 block in allreduce. Another thread
  // aborts rank 0 (as the control plane would on learning rank 1 is lost).
  std::thread aborter([&] {
    std::this_thread::sleep_for(milliseconds(300));
    world[0]->abort();
  });
  Status s2;
  Clock::duration rank2Elapsed{};
  std::thread rank2([&] {
    std::vector<float> w(1000, 1.0f);
    s2 = world[2]->allreduce(w.data(), w.size(), DataType::kFloat32, ReduceOp::kSum);
    rank2Elapsed = Clock::now() - start;
  });
  std::vector<float> v(1000, 1.0f);
  Status s0 = world[0]->allreduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
  const auto elapsed = Clock::now() - start;
  aborter.join();
  EXPECT_EQ(s0.code(), Code::kRemoteError) << s0.toString();
  EXPECT_NE(s0.message().find("allreduce"), std::string::npos) << s0.toString();
  EXPECT_LT(elapsed, std::chrono::seconds(3));
  // Rank 2 fails as soon as it touches its closed pair with rank 0; if it was
  // only waiting on rank 1 it needs its own abort, as the runtime would do.
  world[2]->abort();
  rank2.join();
  EXPECT_FALSE(s2.isOk());
  EXPECT_LT(rank2Elapsed, std::chrono::seconds(3));
  // Later calls fail immediately.
  const auto again = Clock::now();
  EXPECT_EQ(world[0]->barrier().code(), Code::kRemoteError);
  EXPECT_LT(Clock::now() - again, milliseconds(100));
}

TEST(GlooBackendTest, AbortUnblocksAllreduceGather) {
  World world = makeWorld(3, "ring", milliseconds(20000));
  const size_t count = 3000000;  // many segments of hora's ring
  const auto start = Clock::now();
  // Rank 1 never calls; ranks 0 and 2 block; rank 0 is aborted from outside.
  std::thread aborter([&] {
    std::this_thread::sleep_for(milliseconds(300));
    world[0]->abort();
  });
  auto noop = [](size_t, size_t, const void*) {};
  auto packNoop = [](size_t, size_t, void*) {};
  Status s2;
  Clock::duration rank2Elapsed{};
  std::thread rank2([&] {
    std::vector<float> w(count, 1.0f);
    s2 = world[2]->allreduceGather(w.data(), count, DataType::kFloat32, ReduceOp::kSum, packNoop,
                                   noop);
    rank2Elapsed = Clock::now() - start;
  });
  std::vector<float> v(count, 1.0f);
  Status s0 = world[0]->allreduceGather(v.data(), count, DataType::kFloat32, ReduceOp::kSum,
                                        packNoop, noop);
  const auto elapsed = Clock::now() - start;
  aborter.join();
  EXPECT_EQ(s0.code(), Code::kRemoteError) << s0.toString();
  EXPECT_NE(s0.message().find("allreduce"), std::string::npos) << s0.toString();
  EXPECT_LT(elapsed, std::chrono::seconds(3));
  world[2]->abort();
  rank2.join();
  EXPECT_FALSE(s2.isOk());
  EXPECT_LT(rank2Elapsed, std::chrono::seconds(3));
  EXPECT_EQ(
      world[0]
          ->allreduceGather(v.data(), count, DataType::kFloat32, ReduceOp::kSum, packNoop, noop)
          .code(),
      Code::kRemoteError);
}

TEST(GlooBackendTest, AllreduceGatherTimesOutOnAStalledPeer) {
  World world = makeWorld(2, "ring", milliseconds(800));
  std::vector<float> v(3000000, 1.0f);
  size_t unpacked = 0;
  const auto start = Clock::now();
  Status s = world[0]->allreduceGather(
      v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum, [](size_t, size_t, void*) {},
      [&](size_t lo, size_t hi, const void*) { unpacked += hi - lo; });
  EXPECT_EQ(s.code(), Code::kTimeout) << s.toString();
  EXPECT_NE(s.message().find("a peer rank may have died or stalled"), std::string::npos);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  EXPECT_EQ(unpacked, 0u);
  EXPECT_FALSE(world[0]->barrier().isOk());
}

TEST(GlooBackendTest, AbortBeforeAnyCallAndTwice) {
  World world = makeWorld(2);
  world[1]->abort();
  world[1]->abort();
  int32_t x = 1;
  EXPECT_EQ(world[1]->allreduce(&x, 1, DataType::kInt32, ReduceOp::kSum).code(),
            Code::kRemoteError);
  // The peer notices the closed connection instead of hanging.
  Status s = world[0]->allreduce(&x, 1, DataType::kInt32, ReduceOp::kSum);
  EXPECT_FALSE(s.isOk());
}

TEST(GlooBackendTest, StalledPeerTimesOut) {
  World world = makeWorld(2, "ring", milliseconds(800));
  std::vector<double> v(10, 1.0);
  const auto start = Clock::now();
  Status s = world[0]->allreduce(v.data(), v.size(), DataType::kFloat64, ReduceOp::kMax);
  EXPECT_EQ(s.code(), Code::kTimeout) << s.toString();
  EXPECT_NE(s.message().find("a peer rank may have died or stalled"), std::string::npos);
  EXPECT_NE(s.message().find("float64"), std::string::npos);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  // The context is poisoned: the next call fails at once.
  EXPECT_FALSE(world[0]->barrier().isOk());
}

TEST(GlooBackendTest, RendezvousTimesOutWhenARankIsMissing) {
  auto store = std::make_shared<MemoryStore>();
  GlooBackendOptions opts;
  opts.timeout = milliseconds(500);
  const auto start = Clock::now();
  auto r = createGlooBackend(store, uniquePrefix(), 0, 2, opts);
  EXPECT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), Code::kTimeout) << r.status().toString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
}

// Publishes, as rank 1 of a 2-rank communicator under `prefix`, a pair
// address above any local one: rank 0's pair is then the side that waits to
// be connected to, and nobody ever connects.
void publishAnAddressNobodyConnectsFrom(Store& store, const std::string& prefix) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(65535);
  ASSERT_EQ(inet_pton(AF_INET, "255.255.255.254", &sa.sin_addr), 1);
  sockaddr_storage ss{};
  std::memcpy(&ss, &sa, sizeof(sa));
  const std::vector<char> bytes = gloo::transport::tcp::Address(ss, 0).bytes();
  ASSERT_TRUE(store.set(prefix + "/1", std::string(bytes.begin(), bytes.end())).isOk());
}

// A peer that published its pair's address and then died never connects,
// and Gloo's own full-mesh connect would wait five times the timeout for it.
// The set-up watch reporting the loss (in a process set: the dead rank's
// control connection closed) fails the connect at once, with its reason.
TEST(GlooBackendTest, ALossTheSetUpWatchReportsFailsAPendingConnectAtOnce) {
  auto store = std::make_shared<MemoryStore>();
  const std::string prefix = uniquePrefix();
  publishAnAddressNobodyConnectsFrom(*store, prefix);

  std::atomic<bool> lost{false};
  std::atomic<int> asked{0};
  GlooBackendOptions opts;
  opts.timeout = milliseconds(20000);
  opts.setUpWatch = [&] {
    ++asked;
    return lost ? Status(Code::kRemoteError, "rank 1 closed its control connection") : Status::ok();
  };
  std::thread loser([&] {
    std::this_thread::sleep_for(milliseconds(300));
    lost = true;
  });
  const auto start = Clock::now();
  auto r = createGlooBackend(store, prefix, 0, 2, opts);
  const auto took = Clock::now() - start;
  loser.join();
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), Code::kRemoteError) << r.status().toString();
  EXPECT_NE(r.status().message().find("rank 1 closed its control connection"), std::string::npos)
      << r.status().toString();
  EXPECT_LT(took, std::chrono::seconds(5)) << "waited for the timeout instead";
  EXPECT_GE(asked.load(), 2) << "asked while the connect was pending";
}

// The same passive pair with nothing reporting a loss (a peer that published
// its address, then stalled): the connect fails after the timeout, naming the
// peer, not after Gloo's own bound of five times the timeout.
TEST(GlooBackendTest, APairNobodyConnectsFailsAfterTheTimeoutNamingThePeer) {
  auto store = std::make_shared<MemoryStore>();
  const std::string prefix = uniquePrefix();
  publishAnAddressNobodyConnectsFrom(*store, prefix);
  GlooBackendOptions opts;
  opts.timeout = milliseconds(1000);
  const auto start = Clock::now();
  auto r = createGlooBackend(store, prefix, 0, 2, opts);
  const auto took = Clock::now() - start;
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), Code::kTimeout) << r.status().toString();
  EXPECT_NE(r.status().message().find("rank 1 of this Gloo communicator did not connect"),
            std::string::npos)
      << r.status().toString();
  EXPECT_GE(took, milliseconds(900));
  EXPECT_LT(took, milliseconds(3000)) << "Gloo's own bound is 5 s here";
}

TEST(GlooBackendTest, InvalidArgumentsLeaveTheBackendUsable) {
  auto store = std::make_shared<MemoryStore>();
  GlooAlgorithm alg = GlooAlgorithm::kRing;
  EXPECT_FALSE(parseGlooAlgorithm("tree", &alg));  // the runtime refuses it (HORA_GLOO_ALGORITHM)
  EXPECT_EQ(alg, GlooAlgorithm::kRing) << "left as it was";
  EXPECT_EQ(createGlooBackend(store, "x", 2, 2, GlooBackendOptions()).status().code(),
            Code::kInvalidArgument);

  World world = makeWorld(2);
  runRanks(world, [&](int r, Backend& b) {
    int32_t x = r + 1;
    EXPECT_EQ(b.allgatherv(&x, &x, {1}, DataType::kInt32).code(), Code::kInvalidArgument);
    EXPECT_EQ(b.broadcast(&x, 1, DataType::kInt32, 5).code(), Code::kInvalidArgument);
    EXPECT_EQ(b.reducescatter(&x, {1, 1, 1}, DataType::kInt32, ReduceOp::kSum).code(),
              Code::kInvalidArgument);
    EXPECT_EQ(b.allreduce(&x, 1, DataType::kBool, ReduceOp::kAverage).code(),
              Code::kInvalidArgument);
    EXPECT_EQ(b.name(), "gloo");
    EXPECT_EQ(b.rank(), r);
    EXPECT_EQ(b.size(), 2);
    ASSERT_TRUE(b.allreduce(&x, 1, DataType::kInt32, ReduceOp::kSum).isOk());
    EXPECT_EQ(x, 3);
  });
}

}  // namespace
}  // namespace hora
