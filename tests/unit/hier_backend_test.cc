// HierBackend with ranks as threads in one process: every rank gets a flat
// Gloo backend and wraps it through createHierBackend over one shared
// MemoryStore, with a host identity per rank (ShmBackendOptions::hostId) so
// that the threads emulate several hosts. Checks the pure parts (the mode
// parser, the host layout, the decision), the allreduce results (every dtype,
// op, counts that do not divide by the ranks, many shared-memory chunks per
// call), that only host-reduced parts cross hosts, that every rank gets the
// same float bits, the fallbacks (one rank per host, one host, unequal hosts,
// settings that differ, a host without shared memory), the other collectives
// on the flat backend, and that a stalled or aborted rank on the same host or
// on the other host fails every caller promptly, naming set ranks.
#include "ops/shm/hier_backend.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend_check.h"
#include "core/memory_store.h"
#include "ops/gloo/gloo_backend.h"

namespace hora {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// ------------------------------------------------------------ pure logic

TEST(HierModeTest, ParsesTheThreeChoices) {
  HierMode m = HierMode::kFlat;
  EXPECT_TRUE(parseHierMode("auto", &m));
  EXPECT_EQ(m, HierMode::kAuto);
  EXPECT_TRUE(parseHierMode("hier", &m));
  EXPECT_EQ(m, HierMode::kHier);
  EXPECT_TRUE(parseHierMode("flat", &m));
  EXPECT_EQ(m, HierMode::kFlat);
  EXPECT_TRUE(parseHierMode("", &m));
  EXPECT_EQ(m, HierMode::kAuto);
  m = HierMode::kHier;
  EXPECT_FALSE(parseHierMode("Flat", &m));
  EXPECT_FALSE(parseHierMode("ring", &m));
  EXPECT_EQ(m, HierMode::kHier);  // unchanged on failure
}

TEST(HostLayoutTest, InterleavedHostsNumberedByFirstAppearance) {
  const std::vector<std::string> ids = {"b", "a", "b", "a"};
  HostLayout l = layoutHosts(ids, 1);
  EXPECT_EQ(l.hosts, 2);
  EXPECT_EQ(l.perHost, 2);
  EXPECT_EQ(l.hostIndex, 1);  // "a" appears second
  EXPECT_EQ(l.localRank, 0);
  EXPECT_EQ(l.local, (std::vector<int>{1, 3}));
  l = layoutHosts(ids, 2);
  EXPECT_EQ(l.hostIndex, 0);
  EXPECT_EQ(l.localRank, 1);
  EXPECT_EQ(l.local, (std::vector<int>{0, 2}));
}

TEST(HostLayoutTest, UnequalHostsOneHostOneRankPerHostAndEmpty) {
  HostLayout l = layoutHosts({"a", "a", "b"}, 2);
  EXPECT_EQ(l.hosts, 2);
  EXPECT_EQ(l.perHost, 0);  // 2 and 1
  EXPECT_EQ(l.localRank, 0);
  EXPECT_EQ(l.local, (std::vector<int>{2}));
  l = layoutHosts({"a", "a", "a", "a"}, 3);
  EXPECT_EQ(l.hosts, 1);
  EXPECT_EQ(l.perHost, 4);
  EXPECT_EQ(l.localRank, 3);
  l = layoutHosts({"a", "b", "c"}, 0);
  EXPECT_EQ(l.hosts, 3);
  EXPECT_EQ(l.perHost, 1);
  l = layoutHosts({}, 0);
  EXPECT_EQ(l.hosts, 0);
  EXPECT_EQ(l.perHost, 0);
  EXPECT_EQ(l.hostIndex, -1);
  l = layoutHosts({"a", "b"}, 5);  // rank outside: layout only
  EXPECT_EQ(l.hosts, 2);
  EXPECT_EQ(l.hostIndex, -1);
  EXPECT_TRUE(l.local.empty());
}

TEST(WantsHierarchyTest, OnlySeveralHostsWithSeveralEqualRanks) {
  std::string why;
  EXPECT_TRUE(wantsHierarchy(layoutHosts({"a", "a", "b", "b"}, 0), HierMode::kAuto, &why));
  EXPECT_EQ(why, "");
  EXPECT_TRUE(
      wantsHierarchy(layoutHosts({"a", "b", "c", "a", "b", "c"}, 0), HierMode::kHier, &why));
  EXPECT_FALSE(wantsHierarchy(layoutHosts({"a", "a", "b", "b"}, 0), HierMode::kFlat, &why));
  EXPECT_EQ(why, "HORA_HIER_ALLREDUCE=flat");
  EXPECT_FALSE(wantsHierarchy(layoutHosts({"a", "a", "a", "a"}, 0), HierMode::kHier, &why));
  EXPECT_NE(why.find("one host"), std::string::npos) << why;
  EXPECT_FALSE(wantsHierarchy(layoutHosts({"a", "b"}, 0), HierMode::kAuto, &why));
  EXPECT_NE(why.find("one rank per host"), std::string::npos) << why;
  EXPECT_FALSE(wantsHierarchy(layoutHosts({"a", "a", "b"}, 0), HierMode::kHier, &why));
  EXPECT_NE(why.find("different numbers of ranks"), std::string::npos) << why;
}

// ------------------------------------------------------------ worlds of threads

// Counts what reaches a cross communicator, to show that only host-reduced
// parts cross hosts, and its calls (an allreduce's one per chunk, an
// allgatherv's or reducescatter's one per piece).
class CountingBackend : public Backend {
 public:
  CountingBackend(std::unique_ptr<Backend> inner, std::atomic<size_t>* elements,
                  std::atomic<size_t>* calls)
      : inner_(std::move(inner)), elements_(elements), calls_(calls) {}
  std::string name() const override { return inner_->name(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Status allreduce(void* d, size_t n, DataType dt, ReduceOp op) override {
    *elements_ += n;
    ++*calls_;
    return inner_->allreduce(d, n, dt, op);
  }
  Status allgatherv(const void* in, void* out, const std::vector<size_t>& c, DataType dt) override {
    *elements_ += c[static_cast<size_t>(inner_->rank())];  // what this rank sends across
    ++*calls_;
    return inner_->allgatherv(in, out, c, dt);
  }
  Status broadcast(void* d, size_t n, DataType dt, int root) override {
    return inner_->broadcast(d, n, dt, root);
  }
  Status alltoallv(const void* in, const std::vector<int64_t>& s, void* out,
                   const std::vector<int64_t>& r, DataType dt) override {
    return inner_->alltoallv(in, s, out, r, dt);
  }
  Status reducescatter(void* io, const std::vector<size_t>& c, DataType dt, ReduceOp op) override {
    for (size_t n : c) *elements_ += n;  // what this rank hands across
    ++*calls_;
    return inner_->reducescatter(io, c, dt, op);
  }
  Status barrier() override { return inner_->barrier(); }
  void abort() noexcept override { inner_->abort(); }

 private:
  std::unique_ptr<Backend> inner_;
  std::atomic<size_t>* elements_;
  std::atomic<size_t>* calls_;
};

struct HierWorld {
  World world;
  std::vector<HierOutcome> outcome;
  std::vector<std::string> whyNot;
  std::atomic<size_t> crossElements{0};
  std::atomic<size_t> crossCalls{0};
};

struct RankSetup {
  std::string hostId;
  HierMode mode = HierMode::kAuto;
  bool overlap = true;
  std::string cross = "gloo";  // HORA_HIER_CROSS as compared (the fake connects either way)
  ShmBackendOptions shm;
  size_t collectiveMinBytes = size_t{1} << 20;
  size_t collectivePieceBytes = size_t{512} << 10;
};

// Builds one backend per entry of `ranks` (rank r's host id and options).
std::unique_ptr<HierWorld> makeHierWorld(const std::vector<RankSetup>& ranks) {
  static std::atomic<int> counter{0};
  auto store = std::make_shared<MemoryStore>();
  const std::string prefix = "hier_test_" + std::to_string(counter++);
  const int size = static_cast<int>(ranks.size());
  auto w = std::make_unique<HierWorld>();
  w->world.resize(size);
  w->outcome.resize(size);
  w->whyNot.resize(size);
  std::vector<Status> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      HierBackendOptions ho;
      ho.mode = ranks[r].mode;
      ho.overlap = ranks[r].overlap;
      ho.cross = ranks[r].cross;
      ho.shm = ranks[r].shm;
      ho.shm.hostId = ranks[r].hostId;
      ho.collectiveMinBytes = ranks[r].collectiveMinBytes;
      ho.collectivePieceBytes = ranks[r].collectivePieceBytes;
      GlooBackendOptions go;
      go.timeout = ho.shm.timeout;
      auto flat = createGlooBackend(store, prefix + "/gloo", r, size, go);
      if (!flat.isOk()) {
        errors[r] = flat.status();
        return;
      }
      HierWorld* hw = w.get();
      auto connect = [go, hw](std::shared_ptr<Store> s, int cr,
                              int n) -> Result<std::unique_ptr<Backend>> {
        auto g = createGlooBackend(std::move(s), "gloo", cr, n, go);
        if (!g.isOk()) return g.status();
        return std::unique_ptr<Backend>(
            new CountingBackend(g.take(), &hw->crossElements, &hw->crossCalls));
      };
      auto hb = createHierBackend(std::make_shared<PrefixStore>(store, prefix + "/hier"), r, size,
                                  ho, flat.take(), connect, &w->outcome[r], &w->whyNot[r]);
      if (hb.isOk()) {
        w->world[r] = hb.take();
      } else {
        errors[r] = hb.status();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r)
    EXPECT_TRUE(errors[r].isOk()) << "rank " << r << ": " << errors[r].toString();
  return w;
}

// `hosts` x `perHost` ranks, host of rank r = r % hosts (interleaved, so set
// ranks and local ranks differ), every rank with the same options.
std::unique_ptr<HierWorld> makeGrid(int hosts, int perHost, size_t chunkBytes,
                                    milliseconds timeout = milliseconds(10000), bool overlap = true,
                                    size_t collectiveMinBytes = size_t{1} << 20,
                                    size_t collectivePieceBytes = size_t{512} << 10) {
  std::vector<RankSetup> ranks(hosts * perHost);
  for (int r = 0; r < hosts * perHost; ++r) {
    ranks[r].hostId = "host" + std::to_string(r % hosts);
    ranks[r].overlap = overlap;
    ranks[r].collectiveMinBytes = collectiveMinBytes;
    ranks[r].collectivePieceBytes = collectivePieceBytes;
    ranks[r].shm.chunkBytes = chunkBytes;
    ranks[r].shm.timeout = timeout;
  }
  return makeHierWorld(ranks);
}

struct Grid {
  int hosts, perHost;
  bool overlap;
};

class HierGridTest : public ::testing::TestWithParam<Grid> {
 protected:
  std::unique_ptr<HierWorld> grid(size_t chunkBytes) {
    return makeGrid(GetParam().hosts, GetParam().perHost, chunkBytes, milliseconds(10000),
                    GetParam().overlap);
  }
};

TEST_P(HierGridTest, ChoosesTheHierarchy) {
  auto w = grid(4096);
  const std::string want = "hier(" + std::to_string(GetParam().hosts) + " hosts x " +
                           std::to_string(GetParam().perHost) + " ranks";
  for (size_t r = 0; r < w->world.size(); ++r) {
    ASSERT_TRUE(w->world[r]);
    EXPECT_EQ(w->outcome[r], HierOutcome::kHierarchical) << w->whyNot[r];
    EXPECT_EQ(w->world[r]->name().rfind(want, 0), 0u) << w->world[r]->name();
    EXPECT_EQ(w->whyNot[r], "");
  }
}

TEST_P(HierGridTest, AllreduceEveryDtypeAndOpManyChunks) {
  // 4 KiB chunks: many chunks per call, parts of one 64-byte unit or none;
  // 64 KiB: a few large chunks and a short tail.
  for (size_t chunk : {size_t{4096}, size_t{64} << 10}) {
    auto w = grid(chunk);
    for (DataType dt : kAllTypes) {
      for (ReduceOp op : kReduceOps) {
        if (!reduceOpSupported(op, dt)) continue;
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1001}, size_t{40009}})
          checkAllreduce(w->world, dt, op, count);
      }
    }
  }
}

TEST_P(HierGridTest, AllreduceGatherPacksAndUnpacksEveryElementOnce) {
  auto w = grid(4096);
  for (DataType dt : {DataType::kFloat32, DataType::kInt32, DataType::kFloat16})
    for (ReduceOp op : kReduceOps)
      for (size_t count : {size_t{1}, size_t{1001}, size_t{30011}})
        checkAllreduceGather(w->world, dt, op, count);
}

// The local stage skips packing each rank's own part when it can combine it
// straight from the input (Backend::CombineFn), and packs it when the
// caller's combine refuses.
TEST_P(HierGridTest, AllreduceGatherCombineSkipsPackingTheOwnPart) {
  auto w = grid(4096);
  const bool localPeers = w->world.size() > static_cast<size_t>(GetParam().hosts);
  for (DataType dt : {DataType::kFloat32, DataType::kInt32, DataType::kFloat16})
    for (ReduceOp op : kReduceOps)
      for (size_t count : {size_t{1}, size_t{1001}, size_t{30011}}) {
        const size_t combined =
            checkAllreduceGather(w->world, dt, op, count, CombineMode::kCombine);
        if (localPeers && count > 1000) {
          EXPECT_GT(combined, 0u) << dataTypeName(dt) << " " << count;
        }
        checkAllreduceGather(w->world, dt, op, count, CombineMode::kRefuse);
      }
}

TEST_P(HierGridTest, OnlyHostReducedPartsCrossHosts) {
  const int hosts = GetParam().hosts;
  auto w = grid(4096);
  const size_t count = 100003;  // many chunks, not divisible by the ranks
  checkAllreduce(w->world, DataType::kFloat32, ReduceOp::kSum, count);
  // Every element crosses once per host (each host's owner of its part
  // hands it to its cross communicator), not once per rank.
  EXPECT_EQ(w->crossElements.load(), count * static_cast<size_t>(hosts));
}

TEST_P(HierGridTest, FloatsAreBitIdenticalOnEveryRankAndCloseToTheReference) {
  auto w = grid(4096);
  const int size = static_cast<int>(w->world.size());
  const size_t count = 50021;
  for (DataType dt : {DataType::kFloat32, DataType::kFloat64}) {
    std::vector<std::vector<double>> in(size, std::vector<double>(count));
    std::mt19937 gen(42);
    std::uniform_real_distribution<double> dist(-1.0, 1.0);
    for (auto& v : in)
      for (double& x : v) x = dt == DataType::kFloat32 ? static_cast<float>(dist(gen)) : dist(gen);
    std::vector<std::vector<uint8_t>> out(size);
    runRanks(w->world, [&](int r, Backend& b) {
      const size_t es = dataTypeSize(dt);
      std::vector<uint8_t> buf(count * es);
      for (size_t i = 0; i < count; ++i) {
        if (dt == DataType::kFloat32)
          reinterpret_cast<float*>(buf.data())[i] = static_cast<float>(in[r][i]);
        else
          reinterpret_cast<double*>(buf.data())[i] = in[r][i];
      }
      Status s = b.allreduce(buf.data(), count, dt, ReduceOp::kSum);
      ASSERT_TRUE(s.isOk()) << s.toString();
      out[r] = std::move(buf);
    });
    for (int r = 1; r < size; ++r)
      EXPECT_TRUE(out[r] == out[0]) << dataTypeName(dt) << ": rank " << r << " differs from 0";
    int wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      double want = 0;
      for (int r = 0; r < size; ++r) want += in[r][i];
      const double got = dt == DataType::kFloat32 ? reinterpret_cast<float*>(out[0].data())[i]
                                                  : reinterpret_cast<double*>(out[0].data())[i];
      const double tol = dt == DataType::kFloat32 ? 1e-5 : 1e-12;
      if (std::fabs(got - want) > tol * size && wrong++ < 3)
        ADD_FAILURE() << dataTypeName(dt) << " [" << i << "] got " << got << " want " << want;
    }
  }
}

TEST_P(HierGridTest, AllgatherAndReducescatterRunHierarchically) {
  // Every size hierarchical (collectiveMinBytes 0), 4 KiB chunks; with
  // overlap, in pieces of 4 bytes per local rank (up to 8 pieces, many of
  // them empty for the uneven counts), the cross stage of each beside the
  // local stage of the next.
  auto w = makeGrid(GetParam().hosts, GetParam().perHost, 4096, milliseconds(10000),
                    GetParam().overlap, 0, 4);
  const int size = static_cast<int>(w->world.size());
  const size_t hosts = static_cast<size_t>(GetParam().hosts);
  std::vector<size_t> uneven(size), large(size);
  for (int r = 0; r < size; ++r) {
    uneven[r] = static_cast<size_t>((r * 3 + 1) % 4);  // with empty blocks
    large[r] = 30011 + static_cast<size_t>(r) * 977;   // many chunks
  }
  for (const std::vector<size_t>* list : {&uneven, &large}) {
    const std::vector<size_t>& counts = *list;
    size_t total = 0;
    for (size_t c : counts) total += c;
    w->crossElements = 0;
    w->crossCalls = 0;
    checkAllgatherv(w->world, counts);  // out of place and in place
    // Each block crosses hosts once per call, from its own rank.
    EXPECT_EQ(w->crossElements.load(), 2 * total);
    // The large counts in 8 pieces with overlap (one without): a cross call
    // per piece, per rank, per call.
    if (list == &large || !GetParam().overlap)
      EXPECT_EQ(w->crossCalls.load(), 2 * size * (GetParam().overlap ? 8u : 1u));
    w->crossElements = 0;
    checkReducescatter(w->world, counts, DataType::kInt32, ReduceOp::kSum);
    // Each local rank hands its host-reduced local index across: every
    // element once per host.
    EXPECT_EQ(w->crossElements.load(), hosts * total);
  }
  for (DataType dt : kAllTypes)
    for (ReduceOp op : kReduceOps) checkReducescatter(w->world, uneven, dt, op);
  checkReducescatter(w->world, large, DataType::kFloat64, ReduceOp::kMax);
  checkAllreduce(w->world, DataType::kInt32, ReduceOp::kSum, 5000);  // still in step
}

TEST(HierLayoutTest, AllgatherAndReducescatterPutBlocksInSetRankOrderWhateverTheLayout) {
  // Host-major (as launchers place ranks) and irregular orders: the local
  // and cross stages group blocks by local index, so only the final
  // reordering puts them back in set-rank order.
  for (const std::vector<std::string>& hostOf : {std::vector<std::string>{"a", "a", "b", "b"},
                                                 {"a", "a", "a", "b", "b", "b"},
                                                 {"a", "b", "b", "a"},
                                                 {"b", "a", "c", "c", "a", "b"}}) {
    std::vector<RankSetup> ranks(hostOf.size());
    for (size_t r = 0; r < ranks.size(); ++r) {
      ranks[r].hostId = hostOf[r];
      ranks[r].shm.chunkBytes = 4096;
      ranks[r].shm.timeout = milliseconds(10000);
      ranks[r].collectiveMinBytes = 0;
      ranks[r].collectivePieceBytes = 1000;  // several pieces
    }
    auto w = makeHierWorld(ranks);
    ASSERT_EQ(w->outcome[0], HierOutcome::kHierarchical) << w->whyNot[0];
    const int size = static_cast<int>(ranks.size());
    std::vector<size_t> counts(size);
    for (int r = 0; r < size; ++r) counts[r] = 1000 + static_cast<size_t>(r) * 37;
    checkAllgatherv(w->world, counts);
    checkReducescatter(w->world, counts, DataType::kInt64, ReduceOp::kSum);
    EXPECT_GT(w->crossElements.load(), 0u);
  }
}

TEST_P(HierGridTest, SmallAllgatherAndReducescatterStayFlat) {
  auto w = grid(4096);  // collectiveMinBytes 1 MiB
  const int size = static_cast<int>(w->world.size());
  checkAllgatherv(w->world, std::vector<size_t>(size, 1000));
  checkReducescatter(w->world, std::vector<size_t>(size, 1000), DataType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(w->crossElements.load(), 0u);
  // Exactly 1 MiB over all ranks (float32, 2^18 elements): hierarchical; one
  // element less: flat. Both collectives.
  std::vector<size_t> at(size, (size_t{1} << 18) / size);
  at[0] += (size_t{1} << 18) - at[0] * size;
  std::vector<size_t> below = at;
  below[0] -= 1;
  checkAllgatherv(w->world, below);
  checkReducescatter(w->world, below, DataType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(w->crossElements.load(), 0u);
  checkAllgatherv(w->world, at);
  EXPECT_EQ(w->crossElements.load(), 2 * (size_t{1} << 18));  // out of place, in place
  w->crossElements = 0;
  checkReducescatter(w->world, at, DataType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(w->crossElements.load(), static_cast<size_t>(GetParam().hosts) << 18);
}

TEST_P(HierGridTest, OtherCollectivesRunOnTheFlatBackend) {
  auto w = grid(4096);
  const int size = static_cast<int>(w->world.size());
  std::vector<size_t> counts(size);
  for (int r = 0; r < size; ++r) counts[r] = static_cast<size_t>(r * 3 + (r == 1 ? 0 : 1));
  checkAllgatherv(w->world, counts);
  for (int root = 0; root < size; ++root) {
    runRanks(w->world, [&](int r, Backend& b) {
      std::vector<int64_t> v(1001, r == root ? 7 + root : -1);
      ASSERT_TRUE(b.broadcast(v.data(), v.size(), DataType::kInt64, root).isOk());
      EXPECT_EQ(v[1000], 7 + root) << "rank " << r;
    });
    checkAllreduce(w->world, DataType::kInt32, ReduceOp::kSum, 5000);  // interleaved
  }
  runRanks(w->world, [&](int r, Backend& b) {
    std::vector<float> v(size * 5);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i + r);
    ASSERT_TRUE(
        b.reducescatter(v.data(), std::vector<size_t>(size, 5), DataType::kFloat32, ReduceOp::kSum)
            .isOk());
    for (int i = 0; i < 5; ++i) {
      float want = 0;
      for (int q = 0; q < size; ++q) want += static_cast<float>(r * 5 + i + q);
      EXPECT_EQ(v[r * 5 + i], want) << "rank " << r << " [" << i << "]";
    }
    std::vector<int64_t> send(size, 2), recv(size, 2);
    std::vector<int32_t> in(2 * size), out(2 * size, -1);
    for (int q = 0; q < size; ++q) in[2 * q] = in[2 * q + 1] = r * 100 + q;
    ASSERT_TRUE(b.alltoallv(in.data(), send, out.data(), recv, DataType::kInt32).isOk());
    for (int q = 0; q < size; ++q) EXPECT_EQ(out[2 * q], q * 100 + r);
    ASSERT_TRUE(b.barrier().isOk());
  });
}

INSTANTIATE_TEST_SUITE_P(Layouts, HierGridTest,
                         ::testing::Values(Grid{2, 2, true}, Grid{2, 2, false}, Grid{2, 3, true},
                                           Grid{3, 2, true}, Grid{3, 2, false}),
                         [](const ::testing::TestParamInfo<Grid>& info) {
                           return std::to_string(info.param.hosts) + "hosts_x" +
                                  std::to_string(info.param.perHost) +
                                  (info.param.overlap ? "" : "_serial");
                         });

// ------------------------------------------------------------ fallbacks

std::vector<RankSetup> setups(const std::vector<std::string>& hostIds) {
  std::vector<RankSetup> v(hostIds.size());
  for (size_t r = 0; r < v.size(); ++r) {
    v[r].hostId = hostIds[r];
    v[r].shm.chunkBytes = 4096;
    v[r].shm.timeout = milliseconds(10000);
  }
  return v;
}

void expectFlat(HierWorld& w, const std::string& reason) {
  for (size_t r = 0; r < w.world.size(); ++r) {
    ASSERT_TRUE(w.world[r]);
    EXPECT_EQ(w.outcome[r], HierOutcome::kFlat) << "rank " << r;
    EXPECT_EQ(w.world[r]->name(), "gloo") << "rank " << r;
    EXPECT_NE(w.whyNot[r].find(reason), std::string::npos) << "rank " << r << ": " << w.whyNot[r];
  }
  checkAllreduce(w.world, DataType::kInt32, ReduceOp::kSum, 1001);
  EXPECT_EQ(w.crossElements.load(), 0u);
}

TEST(HierFallbackTest, OneRankPerHostStaysFlat) {
  auto w = makeHierWorld(setups({"a", "b"}));
  expectFlat(*w, "one rank per host");
}

TEST(HierFallbackTest, OneHostLeavesSharedMemoryToTheCaller) {
  auto w = makeHierWorld(setups({"a", "a", "a", "a"}));
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(w->outcome[r], HierOutcome::kOneHost);
    EXPECT_EQ(w->world[r]->name(), "gloo");
  }
}

TEST(HierFallbackTest, UnequalHostsStayFlat) {
  auto w = makeHierWorld(setups({"a", "a", "b"}));
  expectFlat(*w, "different numbers of ranks");
}

TEST(HierFallbackTest, FlatModeStaysFlat) {
  auto s = setups({"a", "b", "a", "b"});
  for (auto& x : s) x.mode = HierMode::kFlat;
  auto w = makeHierWorld(s);
  expectFlat(*w, "HORA_HIER_ALLREDUCE=flat");
}

TEST(HierFallbackTest, ModeDifferingBetweenRanksKeepsEveryRankFlat) {
  auto s = setups({"a", "b", "a", "b"});
  s[2].mode = HierMode::kFlat;
  auto w = makeHierWorld(s);
  expectFlat(*w, "differ between ranks");
  EXPECT_NE(w->whyNot[0].find("ranks 0 and 2"), std::string::npos) << w->whyNot[0];
  EXPECT_NE(w->whyNot[0].find("\"flat shm 4096 overlap/gloo/1048576/524288\""), std::string::npos)
      << w->whyNot[0];
}

TEST(HierFallbackTest, OverlapDifferingBetweenRanksKeepsEveryRankFlat) {
  // Inside a host, a rank with overlap and one without would wait for each
  // other's chunks in different orders.
  auto s = setups({"a", "b", "a", "b"});
  s[0].overlap = false;
  auto w = makeHierWorld(s);
  expectFlat(
      *w,
      "HORA_HIER_OVERLAP / HORA_HIER_CROSS / HORA_HIER_COLLECTIVE_MIN_BYTES differ between ranks");
}

TEST(HierFallbackTest, CrossTransportDifferingBetweenRanksKeepsEveryRankFlat) {
  // A tcp ring and a Gloo communicator cannot connect to each other.
  auto s = setups({"a", "b", "a", "b"});
  s[3].cross = "tcp";
  auto w = makeHierWorld(s);
  expectFlat(*w, "HORA_HIER_COLLECTIVE_MIN_BYTES differ between ranks");
  EXPECT_NE(w->whyNot[0].find("\"auto shm 4096 overlap/tcp/1048576/524288\""), std::string::npos)
      << w->whyNot[0];
}

TEST(HierFallbackTest, PieceSizeDifferingBetweenRanksKeepsEveryRankFlat) {
  // Ranks cutting an allgather in different pieces would make different
  // numbers of calls: not a user setting, but a build of another version
  // might differ in it.
  auto s = setups({"a", "b", "a", "b"});
  s[1].collectivePieceBytes = 4096;
  auto w = makeHierWorld(s);
  expectFlat(*w, "differ between ranks");
  EXPECT_NE(w->whyNot[0].find("overlap/gloo/1048576/4096\""), std::string::npos) << w->whyNot[0];
}

TEST(HierFallbackTest, CollectiveMinBytesDifferingBetweenRanksKeepsEveryRankFlat) {
  // One rank would run a hierarchical allgather the others run on the ring.
  auto s = setups({"a", "b", "a", "b"});
  s[2].collectiveMinBytes = 0;
  auto w = makeHierWorld(s);
  expectFlat(*w, "HORA_HIER_COLLECTIVE_MIN_BYTES differ between ranks");
  EXPECT_NE(w->whyNot[0].find("\"auto shm 4096 overlap/gloo/0/524288\""), std::string::npos)
      << w->whyNot[0];
}

TEST(HierFallbackTest, ChunkSizeDifferingBetweenHostsKeepsEveryRankFlat) {
  // Each host alone agrees; across hosts the parts would not pair up.
  auto s = setups({"a", "b", "a", "b"});
  s[1].shm.chunkBytes = s[3].shm.chunkBytes = 8192;
  auto w = makeHierWorld(s);
  expectFlat(*w,
             "HORA_SHM_CHUNK_BYTES / HORA_HIER_OVERLAP / HORA_HIER_CROSS / "
             "HORA_HIER_COLLECTIVE_MIN_BYTES differ");
  EXPECT_NE(w->whyNot[0].find("\"auto shm 8192 overlap/gloo/1048576/524288\""), std::string::npos)
      << w->whyNot[0];
}

TEST(HierFallbackTest, SlotSizeDifferingBetweenHostsStillCutsTheSameChunks) {
  // The hierarchy's slots are of one chunk whatever the slot a set on one
  // host would keep (HORA_SHM_CHUNK_BYTES unset: 4 MiB there), so hosts that
  // differ in it pair their parts up: one cross call per chunk of 4 KiB.
  auto s = setups({"a", "b", "a", "b"});
  s[1].shm.slotBytes = s[3].shm.slotBytes = 65536;
  auto w = makeHierWorld(s);
  for (int r = 0; r < 4; ++r)
    ASSERT_EQ(w->outcome[r], HierOutcome::kHierarchical) << "rank " << r << ": " << w->whyNot[r];
  const size_t count = 10 * 1024 + 64;  // 11 chunks of up to 1024 int32, each in 2 parts
  checkAllreduce(w->world, DataType::kInt32, ReduceOp::kSum, count);
  EXPECT_EQ(w->crossElements.load(), count * 2);  // each host's ranks send the whole once
  EXPECT_EQ(w->crossCalls.load(), 11u * 4);       // every rank, every chunk
}

TEST(HierFallbackTest, SharedMemoryOffOnOneRankKeepsEveryRankFlat) {
  auto s = setups({"a", "b", "a", "b"});
  s[3].shm.enabled = false;
  auto w = makeHierWorld(s);
  expectFlat(*w, "differ between ranks");
}

TEST(HierFallbackTest, HostWithoutSharedMemoryKeepsEveryRankFlat) {
  // Rank 3 cannot create its segment: its host gets no local stage, so no
  // host may use the hierarchy (the cross stage needs every host).
  auto s = setups({"a", "b", "a", "b"});
  s[3].shm.dir = "/nonexistent-hora-test-dir";
  auto w = makeHierWorld(s);
  expectFlat(*w, "has no shared memory with its host's ranks");
}

// ------------------------------------------------------------ failure paths

// Runs allreduce on every rank except `absent`; returns each rank's status
// and how long it took.
struct CallResult {
  Status status;
  double seconds = 0;
};
std::vector<CallResult> allreduceWithout(HierWorld& w, int absent, size_t count) {
  std::vector<CallResult> res(w.world.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < static_cast<int>(w.world.size()); ++r) {
    if (r == absent) continue;
    threads.emplace_back([&, r] {
      std::vector<float> v(count, 1.0f);
      const auto t0 = Clock::now();
      res[r].status = w.world[r]->allreduce(v.data(), count, DataType::kFloat32, ReduceOp::kSum);
      res[r].seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    });
  }
  for (auto& t : threads) t.join();
  return res;
}

// Hosts: rank r on host r % 2. Rank 3 (host 1, local rank 1) never calls:
// rank 1, its host peer, times out waiting for it to pack, naming set rank 3
// (not its local index); ranks 0 and 2 fail in the cross stage (their
// partner there is stuck, then gives up) or waiting for their host peer.
// Nobody hangs, and every later call fails at once.
TEST(HierFailureTest, StalledRankFailsEveryRankOnBothHostsPromptly) {
  auto w = makeGrid(2, 2, 4096, milliseconds(1000));
  auto res = allreduceWithout(*w, 3, 100000);
  for (int r : {0, 1, 2}) {
    EXPECT_FALSE(res[r].status.isOk()) << "rank " << r;
    EXPECT_LT(res[r].seconds, 6.0) << "rank " << r << ": " << res[r].status.toString();
  }
  EXPECT_EQ(res[1].status.code(), Code::kTimeout) << res[1].status.toString();
  EXPECT_NE(res[1].status.message().find("rank 3 (pid"), std::string::npos)
      << res[1].status.toString();
  EXPECT_NE(res[1].status.message().find("inside a host"), std::string::npos)
      << res[1].status.toString();
  for (int r : {0, 1, 2}) {
    std::vector<float> v(10, 1.0f);
    const auto t0 = Clock::now();
    Status s = w->world[r]->allreduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
    EXPECT_FALSE(s.isOk());
    EXPECT_NE(s.message().find("unusable after an earlier failure"), std::string::npos)
        << s.toString();
    EXPECT_FALSE(w->world[r]->barrier().isOk());
    EXPECT_LT(Clock::now() - t0, milliseconds(500));
  }
}

// Aborting one rank (what the set does when the control plane reports a lost
// peer) unblocks its call at once, far within the 20 s timeout.
TEST(HierFailureTest, AbortFromAnotherThreadUnblocksACall) {
  auto w = makeGrid(2, 2, 4096, milliseconds(20000));
  std::thread aborter([&] {
    std::this_thread::sleep_for(milliseconds(300));
    for (int r = 0; r < 3; ++r) w->world[r]->abort();
  });
  auto res = allreduceWithout(*w, 3, 100000);
  aborter.join();
  for (int r : {0, 1, 2}) {
    EXPECT_FALSE(res[r].status.isOk()) << "rank " << r;
    EXPECT_LT(res[r].seconds, 3.0) << "rank " << r << ": " << res[r].status.toString();
  }
}

// One rank is aborted before the call (all its stages, as after a lost
// peer): it fails at once, and the ranks on both hosts that wait for it
// (inside its host, or across in the cross stage) give up within their
// timeout instead of hanging.
TEST(HierFailureTest, AbortedRankFailsAtOnceAndReleasesItsPeersOnBothHosts) {
  auto w = makeGrid(2, 2, 4096, milliseconds(1500));
  w->world[2]->abort();  // rank 2: host 0, local rank 1
  std::vector<CallResult> res(4);
  runRanks(w->world, [&](int r, Backend& b) {
    std::vector<float> v(100000, 1.0f);
    const auto t0 = Clock::now();
    res[r].status = b.allreduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
    res[r].seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_FALSE(res[r].status.isOk()) << "rank " << r;
    EXPECT_LT(res[r].seconds, 8.0) << "rank " << r << ": " << res[r].status.toString();
  }
}

// The hierarchical allgather and reducescatter fail like the allreduce: a
// rank that never calls (stalled) or was aborted fails every rank that
// waits for it within its timeout, and the backend stays unusable.
TEST(HierFailureTest, AStalledOrAbortedRankFailsTheHierarchicalAllgatherAndReducescatter) {
  for (bool aborted : {false, true}) {
    for (const char* op : {"allgather", "reducescatter"}) {
      SCOPED_TRACE(std::string(op) + (aborted ? " aborted" : " stalled"));
      auto w = makeGrid(2, 2, 4096, milliseconds(1000), true, 0, 4096);  // pieces in flight
      if (aborted) w->world[2]->abort();
      std::vector<CallResult> res(4);
      const std::string which = op;
      runRanks(w->world, [&](int r, Backend& b) {
        if (!aborted && r == 3) return;  // rank 3 never calls
        std::vector<float> in(50000, 1.0f), out(200000);
        std::vector<size_t> counts(4, 50000);
        const auto t0 = Clock::now();
        res[r].status =
            which == "allgather"
                ? b.allgatherv(in.data(), out.data(), counts, DataType::kFloat32)
                : b.reducescatter(out.data(), counts, DataType::kFloat32, ReduceOp::kSum);
        res[r].seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      });
      for (int r = 0; r < (aborted ? 4 : 3); ++r) {
        EXPECT_FALSE(res[r].status.isOk()) << "rank " << r;
        EXPECT_LT(res[r].seconds, 8.0) << "rank " << r << ": " << res[r].status.toString();
        std::vector<float> v(10, 1.0f);
        EXPECT_FALSE(
            w->world[r]->allreduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum).isOk())
            << "rank " << r;
      }
    }
  }
}

}  // namespace
}  // namespace hora
