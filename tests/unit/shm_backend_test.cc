// ShmBackend with ranks as threads in one process: every rank gets a Gloo
// backend and wraps it through createShmBackend over one shared MemoryStore,
// as ranks of one host would. Checks the allreduce results and the
// allreduceGather contract on both reduction paths (small chunks reduced
// whole by every rank, large chunks split in parts), the set-up agreement
// (one rank that cannot use shared memory keeps every rank on Gloo), that no
// segment file outlives set-up, that ranks sharing a CPU yield it to each
// other instead of sleeping, and that a stalled or aborted peer fails the
// call promptly instead of hanging it.
#include "ops/shm/shm_backend.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "backend_check.h"
#include "core/cpu_affinity.h"
#include "core/logging.h"
#include "core/memory_store.h"
#include "core/spin_wait.h"
#include "core/tcp_store.h"
#include "core/tuning.h"
#include "ops/gloo/gloo_backend.h"

namespace hora {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

struct ShmWorld {
  World world;
  std::vector<std::string> whyNot;
};

// Builds `size` backends; options(r) gives rank r's shm options.
ShmWorld makeShmWorld(int size, const std::function<ShmBackendOptions(int)>& options) {
  static std::atomic<int> counter{0};
  auto store = std::make_shared<MemoryStore>();
  const std::string prefix = "shm_test_" + std::to_string(counter++);
  ShmWorld w;
  w.world.resize(size);
  w.whyNot.resize(size);
  std::vector<Status> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      ShmBackendOptions so = options(r);
      GlooBackendOptions go;
      go.timeout = so.timeout;
      auto gloo = createGlooBackend(store, prefix + "/gloo", r, size, go);
      if (!gloo.isOk()) {
        errors[r] = gloo.status();
        return;
      }
      auto shm = createShmBackend(std::make_shared<PrefixStore>(store, prefix + "/shm"), r, size,
                                  so, gloo.take(), &w.whyNot[r]);
      if (shm.isOk()) {
        w.world[r] = shm.take();
      } else {
        errors[r] = shm.status();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r)
    EXPECT_TRUE(errors[r].isOk()) << "rank " << r << ": " << errors[r].toString();
  return w;
}

ShmWorld makeShmWorld(int size, size_t chunkBytes, milliseconds timeout = milliseconds(5000)) {
  return makeShmWorld(size, [&](int) {
    ShmBackendOptions so;
    so.chunkBytes = chunkBytes;
    so.timeout = timeout;
    return so;
  });
}

// A chunk's [lo, hi) floats copied from `in` (pack) or into `out` (unpack),
// as the executor's pack and unpack functions do for one tensor.
Backend::PackFn packFloatsFrom(const std::vector<float>& in) {
  return [&in](size_t lo, size_t hi, void* dst) {
    std::memcpy(dst, in.data() + lo, (hi - lo) * sizeof(float));
  };
}
Backend::UnpackFn unpackFloatsInto(std::vector<float>& out) {
  return [&out](size_t lo, size_t hi, const void* src) {
    std::memcpy(out.data() + lo, src, (hi - lo) * sizeof(float));
  };
}

class ShmWorldTest : public ::testing::TestWithParam<int> {};

TEST_P(ShmWorldTest, UsesSharedMemoryOnOneHost) {
  ShmWorld w = makeShmWorld(GetParam(), 4096);
  for (int r = 0; r < GetParam(); ++r) {
    ASSERT_TRUE(w.world[r]);
    if (GetParam() > 1) {
      EXPECT_EQ(w.world[r]->name(), "shm+gloo") << w.whyNot[r];
      EXPECT_EQ(w.whyNot[r], "");
    } else {
      EXPECT_EQ(w.world[r]->name(), "gloo");
    }
  }
}

TEST_P(ShmWorldTest, AllreduceEveryDtypeAndOpBothPaths) {
  // 4 KiB chunks: every chunk takes the small path, many chunks per call.
  // 256 KiB chunks: the split path, plus a small tail chunk.
  for (size_t chunk : {size_t{4096}, size_t{256} << 10}) {
    ShmWorld w = makeShmWorld(GetParam(), chunk);
    for (DataType dt : kAllTypes) {
      for (ReduceOp op : kReduceOps) {
        if (!reduceOpSupported(op, dt)) continue;
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1001}, size_t{100003}}) {
          checkAllreduce(w.world, dt, op, count);
        }
      }
    }
  }
}

TEST_P(ShmWorldTest, AllreduceGatherPacksAndUnpacksEveryElementOnce) {
  for (size_t chunk : {size_t{4096}, size_t{256} << 10}) {
    ShmWorld w = makeShmWorld(GetParam(), chunk);
    for (DataType dt : {DataType::kFloat32, DataType::kInt32, DataType::kFloat16}) {
      for (ReduceOp op : kReduceOps) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1001}, size_t{300007}}) {
          checkAllreduceGather(w.world, dt, op, count);
        }
      }
    }
    // Many calls in a row: the chunk counters keep counting across calls and
    // the two slots keep alternating; interleaved with delegated collectives.
    for (int k = 0; k < 5; ++k) {
      checkAllreduceGather(w.world, DataType::kFloat32, ReduceOp::kSum, 70001);
      checkAllreduce(w.world, DataType::kFloat64, ReduceOp::kMax, 3);
      runRanks(w.world, [](int, Backend& b) { ASSERT_TRUE(b.barrier().isOk()); });
    }
  }
}

// The combine path (Backend::CombineFn): on split chunks each rank's own part
// comes straight from its input; small chunks pack everything, and ranks 0
// and 1 also take their own operand of the first step from the input; one
// rank only packs. Results, the pack/combine-at-most-once contract and a
// combine that refuses.
TEST_P(ShmWorldTest, AllreduceGatherCombineSkipsPackingTheOwnPart) {
  for (size_t chunk : {size_t{4096}, size_t{256} << 10}) {
    ShmWorld w = makeShmWorld(GetParam(), chunk);
    for (DataType dt : {DataType::kFloat32, DataType::kInt32, DataType::kFloat16}) {
      for (ReduceOp op : kReduceOps) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{1001}, size_t{300007}}) {
          size_t both = 0;
          const size_t combined =
              checkAllreduceGather(w.world, dt, op, count, CombineMode::kCombine, &both);
          // Small chunks (at most 64 KiB): ranks 0 and 1 pack and combine
          // every element, the others only pack. Split chunks: each element
          // packed or combined, never both.
          const size_t es = dataTypeSize(dt), chunkElems = chunk / es;
          size_t inSmall = 0, inSplit = 0;
          for (size_t base = 0; base < count; base += chunkElems) {
            const size_t len = std::min(chunkElems, count - base);
            (len * es <= (size_t{64} << 10) ? inSmall : inSplit) += len;
          }
          const std::string what = std::string(dataTypeName(dt)) + " " + std::to_string(count);
          if (GetParam() == 1) {
            EXPECT_EQ(combined, 0u) << what;
          } else {
            EXPECT_EQ(both, 2 * inSmall) << what;
            EXPECT_EQ(combined > both, inSplit > 0) << what;
          }
          checkAllreduceGather(w.world, dt, op, count, CombineMode::kRefuse);
        }
      }
    }
  }
}

// Small chunks, in place (staging, input and output are one buffer): every
// rank gets the bits of the reduction in rank order, ranks 0 and 1 combining
// their own operand from that buffer (rank 1 with otherFirst) while the
// others read theirs from their slot. The values tell the first step's
// operand order apart at every world size: NaNs only from ranks 0 and 1, with
// payloads naming the rank (which one a sum keeps depends on the kernel, but
// the kernel is one function of its operands; min and max keep their first
// operand's by definition), and sums whose rounding depends on the grouping.
TEST_P(ShmWorldTest, SmallChunksInPlaceGiveEveryRankTheBitsOfRankOrder) {
  const int size = GetParam();
  ShmWorld w = makeShmWorld(size, 4096);
  auto input = [](int r, size_t i) {
    if (i % 2 == 0 && r < 2) {
      const uint32_t bits = 0x7fc00000u | static_cast<uint32_t>(r * 8 + i % 5 + 1);
      float f;
      std::memcpy(&f, &bits, sizeof(f));
      return f;
    }
    const float v[] = {1e8f, -1e8f, 1.0f, 3.0f};
    return v[r % 4] * static_cast<float>(1 + i % 3);
  };
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
    const ReduceFn reduce = reduceFunction(DataType::kFloat32, op);
    for (size_t count : {size_t{700}, size_t{3001}}) {  // one chunk, several
      const std::string what = std::string(reduceOpName(op)) + " count " + std::to_string(count);
      std::vector<float> want(count), next(count);
      for (size_t i = 0; i < count; ++i) want[i] = input(0, i);
      for (int q = 1; q < size; ++q) {
        for (size_t i = 0; i < count; ++i) next[i] = input(q, i);
        reduce(want.data(), want.data(), next.data(), count);
      }
      std::atomic<size_t> combinedTotal{0};
      runRanks(w.world, [&](int r, Backend& b) {
        std::vector<float> buf(count);
        for (size_t i = 0; i < count; ++i) buf[i] = input(r, i);
        auto pack = [&](size_t lo, size_t hi, void* dst) {
          std::memcpy(dst, buf.data() + lo, (hi - lo) * sizeof(float));
        };
        auto combine = [&](size_t lo, size_t hi, void* dst, const void* other, bool otherFirst) {
          combinedTotal += hi - lo;
          if (otherFirst) {
            reduce(dst, other, buf.data() + lo, hi - lo);
          } else {
            reduce(dst, buf.data() + lo, other, hi - lo);
          }
          return true;
        };
        auto unpack = [&](size_t lo, size_t hi, const void* src) {
          if (src != buf.data() + lo) std::memcpy(buf.data() + lo, src, (hi - lo) * sizeof(float));
        };
        Status s = b.allreduceGatherCombine(buf.data(), count, DataType::kFloat32, op, pack, unpack,
                                            combine);
        ASSERT_TRUE(s.isOk()) << s.toString();
        for (size_t i = 0; i < count; ++i) {
          uint32_t got, exp;
          std::memcpy(&got, &buf[i], sizeof(got));
          std::memcpy(&exp, &want[i], sizeof(exp));
          ASSERT_EQ(got, exp) << "rank " << r << " " << what << " element " << i;
        }
      });
      EXPECT_EQ(combinedTotal.load(), size > 1 ? 2 * count : 0) << what;
    }
  }
}

// Packing ahead (Backend::prepackAllreduce): what was packed ahead is used
// by the next allreduce whose token matches, whole or in part (a stop after
// the first piece), and every element is then packed or combined exactly
// once; a stop before the first piece packs nothing; a token that does not
// match, a collective in between or a new chunk size (autotune) leaves the
// allreduce packing everything itself. prepacksUsed() counts exactly the
// uses. Results exact in every case. Only where every rank has a core.
TEST_P(ShmWorldTest, PackedAheadIsUsedByTheMatchingNextAllreduceOnly) {
  const int size = GetParam();
  enum class Mode {
    kWhole,
    kStopAfterOnePiece,
    kStopAtOnce,
    kOtherToken,
    kBroadcastBetween,
    kRetuned
  };
  const size_t pieceElems = (16u << 10) / sizeof(float);
  for (size_t chunk : {size_t{4096}, size_t{256} << 10}) {
    ShmWorld w = makeShmWorld(size, chunk);
    uint64_t token = 0;
    for (size_t count : {size_t{1}, size_t{1001}, size_t{300007}}) {
      for (Mode mode : {Mode::kWhole, Mode::kStopAfterOnePiece, Mode::kStopAtOnce,
                        Mode::kOtherToken, Mode::kBroadcastBetween, Mode::kRetuned}) {
        ++token;
        const std::string where = "chunk " + std::to_string(chunk) + " count " +
                                  std::to_string(count) + " mode " +
                                  std::to_string(static_cast<int>(mode));
        runRanks(w.world, [&](int r, Backend& b) {
          std::vector<float> in(count), out(count, -1.0f);
          for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((r * 5 + i) % 11);
          std::vector<int> packs(count, 0);
          auto pack = [&](size_t lo, size_t hi, void* dst) {
            for (size_t i = lo; i < hi; ++i) ++packs[i];
            std::memcpy(dst, in.data() + lo, (hi - lo) * sizeof(float));
          };
          int stops = 0;
          auto stop = [&] {
            ++stops;
            return mode == Mode::kStopAtOnce || (mode == Mode::kStopAfterOnePiece && stops > 1);
          };
          const bool packed =
              b.prepackAllreduce(token, 0, count, DataType::kFloat32, ReduceOp::kSum, pack, stop);
          const bool mayPack = size > 1;
          EXPECT_EQ(packed, mayPack && mode != Mode::kStopAtOnce) << where << " rank " << r;
          const size_t ahead = static_cast<size_t>(std::count(packs.begin(), packs.end(), 1));
          const std::vector<int> packsAhead = packs;
          EXPECT_EQ(ahead > 0, packed) << where << " rank " << r;
          if (packed && mode == Mode::kStopAfterOnePiece) {
            EXPECT_LE(ahead, pieceElems) << where << " rank " << r;
          }
          if (mode == Mode::kBroadcastBetween) {
            int32_t v = r;
            ASSERT_TRUE(b.broadcast(&v, 1, DataType::kInt32, 0).isOk());
          }
          TuningValues tv;
          tv.shmChunkBytes = static_cast<int64_t>(chunk / 2);
          if (mode == Mode::kRetuned) b.tune(tv);
          std::vector<int> combined(count, 0);
          auto combine = [&](size_t lo, size_t hi, void* dst, const void* other, bool otherFirst) {
            for (size_t i = lo; i < hi; ++i) ++combined[i];
            const ReduceFn add = reduceFunction(DataType::kFloat32, ReduceOp::kSum);
            if (otherFirst) {
              add(dst, other, in.data() + lo, hi - lo);
            } else {
              add(dst, in.data() + lo, other, hi - lo);
            }
            return true;
          };
          auto unpack = [&](size_t lo, size_t hi, const void* src) {
            std::memcpy(out.data() + lo, src, (hi - lo) * sizeof(float));
          };
          const uint64_t usedBefore = b.prepacksUsed();
          b.expectPrepacked(mode == Mode::kOtherToken ? token + 1000 : token);
          std::vector<float> staging(count);
          Status st = b.allreduceGatherCombine(staging.data(), count, DataType::kFloat32,
                                               ReduceOp::kSum, pack, unpack, combine);
          ASSERT_TRUE(st.isOk()) << st.toString();
          if (mode == Mode::kRetuned) {
            tv.shmChunkBytes = static_cast<int64_t>(chunk);
            b.tune(tv);
          }
          for (size_t i = 0; i < count; ++i) {
            float want = 0;
            for (int q = 0; q < size; ++q) want += static_cast<float>((q * 5 + i) % 11);
            ASSERT_EQ(out[i], want) << where << " rank " << r << " element " << i;
          }
          // Packed once, or not packed but combined (the own part of a split
          // chunk); small chunks may combine what they packed too. `again`:
          // packed ahead, then packed or combined by the allreduce as well.
          size_t once = 0, again = 0, tooMany = 0;
          for (size_t i = 0; i < count; ++i) {
            once += packs[i] == 1 || (packs[i] == 0 && combined[i] == 1);
            again += packsAhead[i] == 1 && (packs[i] == 2 || combined[i] == 1);
            tooMany += combined[i] > 1 || packs[i] > 2;
          }
          EXPECT_EQ(tooMany, 0u) << where << " rank " << r;
          // A new chunk size changes the first chunk's layout unless the
          // first chunk is the whole tensor either way.
          const bool sameLayout =
              mode != Mode::kRetuned ||
              std::min(count, chunk / sizeof(float)) == std::min(count, chunk / 2 / sizeof(float));
          const bool used =
              packed && sameLayout &&
              (mode == Mode::kWhole || mode == Mode::kStopAfterOnePiece || mode == Mode::kRetuned);
          EXPECT_EQ(b.prepacksUsed() - usedBefore, used ? 1u : 0u) << where << " rank " << r;
          if (!packed || used) {
            EXPECT_EQ(once, count) << where << " rank " << r;
          } else {
            // Not used: the elements packed ahead were packed (or combined) again.
            EXPECT_EQ(again, ahead) << where << " rank " << r;
          }
        });
      }
    }
  }
}

// A pack ahead published under a peer key (prepackAllreduce with peerKey,
// expectPeersPrepacked): a rank whose peers all published the first chunk
// of the allreduce it runs reads their slots without waiting for them; a
// different key, a stale chunk (another collective ran in between), an
// unpublished pack, one replaced by a partial pack or one withdrawn keep it
// waiting. Every result exact. Rank 1 packs ahead and then holds back its
// own call: when rank 0 may read rank 1's pack (a small chunk: nothing else
// of it is needed), rank 1 waits until rank 0 has returned (10 s at most);
// otherwise (a split one still waits for its part) it waits 400 ms, and rank
// 0 must not return before rank 1 called. Orderings, not durations, so that
// a loaded machine's scheduling cannot fail it.
TEST(ShmBackendPeerPrepack, APublishedPackAheadSparesThePeersWaitOnlyWhenItMatches) {
  enum class Case { kMatch, kOtherKey, kNoKey, kStale, kSplit, kReplaced, kWithdrawn };
  const uint64_t key = 0x1234567890abcdefull;
  for (Case c : {Case::kMatch, Case::kOtherKey, Case::kNoKey, Case::kStale, Case::kSplit,
                 Case::kReplaced, Case::kWithdrawn}) {
    SCOPED_TRACE("case " + std::to_string(static_cast<int>(c)));
    ShmWorld w = makeShmWorld(2, size_t{256} << 10);
    // Small: 8 KiB (64 KiB: four pieces of a pack ahead), one chunk every
    // rank reduces whole. Split: 200 KiB.
    const size_t count = c == Case::kSplit ? 51200 : c == Case::kReplaced ? 16384 : 2048;
    std::atomic<bool> packedAhead{false};  // rank 0 starts once rank 1 packed ahead
    std::atomic<bool> rank0Returned{false}, rank1SawIt{false};
    Clock::time_point rank0End, rank1Called;
    runRanks(w.world, [&](int r, Backend& b) {
      std::vector<float> in(count), out(count, -1.0f);
      for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((r * 3 + i) % 13);
      const Backend::PackFn pack = packFloatsFrom(in);
      const Backend::UnpackFn unpack = unpackFloatsInto(out);
      if (r == 1) {
        const uint64_t published = c == Case::kNoKey ? 0 : key;
        ASSERT_TRUE(b.prepackAllreduce(7, published, count, DataType::kFloat32, ReduceOp::kSum,
                                       pack, nullptr));
        if (c == Case::kReplaced) {
          // Packed again, stopped after the first piece: not published.
          int asked = 0;
          ASSERT_TRUE(b.prepackAllreduce(8, key + 1, count, DataType::kFloat32, ReduceOp::kSum,
                                         pack, [&] { return ++asked > 1; }));
        }
        if (c == Case::kWithdrawn) b.withdrawPrepacked();
        packedAhead = true;
      } else {
        while (!packedAhead) std::this_thread::yield();
      }
      if (c == Case::kStale) {
        // A broadcast in between: rank 1's pack was for the chunk it used.
        int32_t v = r;
        ASSERT_TRUE(b.broadcast(&v, 1, DataType::kInt32, 0).isOk());
      }
      if (r == 1 && c == Case::kMatch) {
        const auto until = Clock::now() + std::chrono::seconds(10);
        while (!rank0Returned && Clock::now() < until) std::this_thread::sleep_for(milliseconds(1));
        rank1SawIt = rank0Returned.load();
      } else if (r == 1) {
        std::this_thread::sleep_for(milliseconds(400));
      }
      if (r == 1) rank1Called = Clock::now();
      b.expectPrepacked(r == 1 ? (c == Case::kReplaced ? 8 : 7) : 0);
      b.expectPeersPrepacked(c == Case::kOtherKey && r == 0 ? key + 1 : key);
      Status s =
          b.allreduceGather(nullptr, count, DataType::kFloat32, ReduceOp::kSum, pack, unpack);
      ASSERT_TRUE(s.isOk()) << s.toString();
      if (r == 0) {
        rank0End = Clock::now();
        rank0Returned = true;
      }
      for (size_t i = 0; i < count; ++i) {
        const float want = static_cast<float>(i % 13) + static_cast<float>((3 + i) % 13);
        ASSERT_EQ(out[i], want) << "rank " << r << " element " << i;
      }
    });
    if (c == Case::kMatch) {
      EXPECT_TRUE(rank1SawIt.load()) << "rank 0 waited for rank 1's published pack";
    } else {
      EXPECT_GE(rank0End, rank1Called) << "rank 0 did not wait for rank 1";
    }
  }
}

// A published pack ahead whose allreduce never ran on shared memory (min
// bytes moved above it, as autotune may, so it ran through Gloo without a
// chunk) does not outlive it: the next run of the same tensor at that
// chunk, with new data and no pack ahead, is waited for and gets the new
// data's sum, not the old pack's.
TEST(ShmBackendPeerPrepack, APackWhoseAllreduceRanElsewhereIsNotReadLater) {
  const uint64_t key = 0x5eedull;
  ShmWorld w = makeShmWorld(2, size_t{256} << 10);
  const size_t count = 2048;
  std::atomic<bool> packedAhead{false};
  Clock::time_point rank0End, rank1Called;
  runRanks(w.world, [&](int r, Backend& b) {
    std::vector<float> in(count), out(count, -1.0f), staging(count);  // staging: for Gloo
    auto fill = [&](int step) {
      for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((r * 3 + step * 5 + i) % 13);
    };
    const Backend::PackFn pack = packFloatsFrom(in);
    const Backend::UnpackFn unpack = unpackFloatsInto(out);
    auto check = [&](int step) {
      for (size_t i = 0; i < count; ++i) {
        const float want =
            static_cast<float>((step * 5 + i) % 13) + static_cast<float>((3 + step * 5 + i) % 13);
        ASSERT_EQ(out[i], want) << "rank " << r << " step " << step << " element " << i;
      }
    };
    fill(0);
    if (r == 1) {
      ASSERT_TRUE(
          b.prepackAllreduce(7, key, count, DataType::kFloat32, ReduceOp::kSum, pack, nullptr));
      packedAhead = true;
    } else {
      while (!packedAhead) std::this_thread::yield();
    }
    TuningValues tv;
    tv.shmChunkBytes = size_t{256} << 10;
    tv.shmMinBytes = int64_t{1} << 30;  // step 0 through the fallback
    b.tune(tv);
    b.expectPrepacked(r == 1 ? 7 : 0);
    b.expectPeersPrepacked(key);
    ASSERT_TRUE(
        b.allreduceGather(staging.data(), count, DataType::kFloat32, ReduceOp::kSum, pack, unpack)
            .isOk());
    check(0);
    tv.shmMinBytes = 0;  // step 1 on shared memory again, at the same chunk
    b.tune(tv);
    fill(1);
    if (r == 1) {
      std::this_thread::sleep_for(milliseconds(400));
      rank1Called = Clock::now();
    }
    b.expectPeersPrepacked(key);
    ASSERT_TRUE(
        b.allreduceGather(staging.data(), count, DataType::kFloat32, ReduceOp::kSum, pack, unpack)
            .isOk());
    if (r == 0) rank0End = Clock::now();
    check(1);
  });
  EXPECT_GE(rank0End, rank1Called) << "rank 0 read rank 1's old pack without waiting";
}

// A rank that published a pack ahead and then gave up (its set failed or
// shut down: abort) withdraws it, so a peer does not finish, on that pack,
// an allreduce the rank will never run: it fails naming the rank instead.
TEST(ShmBackendPeerPrepack, APeerThatGaveUpAfterPublishingIsNotReadButNamed) {
  const uint64_t key = 0xab0127ull;
  ShmWorld w = makeShmWorld(2, size_t{256} << 10);
  const size_t count = 2048;
  std::atomic<bool> gaveUp{false};
  runRanks(w.world, [&](int r, Backend& b) {
    std::vector<float> in(count, static_cast<float>(r + 1)), out(count, -1.0f);
    const Backend::PackFn pack = packFloatsFrom(in);
    const Backend::UnpackFn unpack = unpackFloatsInto(out);
    if (r == 1) {
      ASSERT_TRUE(
          b.prepackAllreduce(7, key, count, DataType::kFloat32, ReduceOp::kSum, pack, nullptr));
      b.abort();
      gaveUp = true;
      return;
    }
    while (!gaveUp) std::this_thread::yield();
    b.expectPeersPrepacked(key);
    Status s = b.allreduceGather(nullptr, count, DataType::kFloat32, ReduceOp::kSum, pack, unpack);
    EXPECT_EQ(s.code(), Code::kRemoteError) << s.toString();
    EXPECT_NE(s.toString().find("rank 1"), std::string::npos) << s.toString();
  });
}

// Broadcasts `count` int32 from every root in turn, each followed by an
// allreduce of as many floats (counters and slots stay in step).
void checkBroadcastFromEveryRoot(World& world, size_t count) {
  const int size = static_cast<int>(world.size());
  for (int root = 0; root < size; ++root) {
    runRanks(world, [&](int r, Backend& b) {
      std::vector<int32_t> v(count);
      for (size_t i = 0; i < count; ++i) v[i] = static_cast<int32_t>(r * 1000003 + i);
      Status s = b.broadcast(v.data(), count, DataType::kInt32, root);
      ASSERT_TRUE(s.isOk()) << s.toString();
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(v[i], static_cast<int32_t>(root * 1000003 + i))
            << "rank " << r << " root " << root << " count " << count << " [" << i << "]";
    });
    checkAllreduce(world, DataType::kFloat32, ReduceOp::kSum, count);
  }
}

TEST_P(ShmWorldTest, BroadcastFromEveryRootInterleavedWithAllreduce) {
  const int size = GetParam();
  for (size_t chunk : {size_t{4096}, size_t{256} << 10}) {
    ShmWorld w = makeShmWorld(size, chunk);
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1001}, size_t{100003}})
      checkBroadcastFromEveryRoot(w.world, count);
  }
}

TEST_P(ShmWorldTest, AllgathervUnevenIncludingZeroAndInPlace) {
  const int size = GetParam();
  ShmWorld w = makeShmWorld(size, 4096);
  for (size_t unit : {size_t{1}, size_t{3001}}) {  // 3001 int32: parts span several chunks
    std::vector<size_t> counts(size);
    for (int r = 0; r < size; ++r) counts[r] = ((r * 3 + 1) % 4) * unit;  // 1, 0, 3, 2 units
    checkAllgatherv(w.world, counts);
    checkAllreduce(w.world, DataType::kFloat32, ReduceOp::kSum, 5000);
  }
  runRanks(w.world, [&](int, Backend& b) {
    EXPECT_TRUE(
        b.allgatherv(nullptr, nullptr, std::vector<size_t>(size, 0), DataType::kFloat64).isOk());
  });
}

TEST_P(ShmWorldTest, PayloadsOnBothSidesOfMinBytesAreCorrect) {
  ShmWorld w = makeShmWorld(GetParam(), [](int) {
    ShmBackendOptions so;
    so.chunkBytes = 8192;
    so.minBytes = 4000;  // 1000 float32 = exactly 4000 bytes go through shm
    return so;
  });
  for (size_t count : {size_t{1}, size_t{999}, size_t{1000}, size_t{5000}})
    checkAllreduce(w.world, DataType::kFloat32, ReduceOp::kSum, count);
}

// checkReducescatter (backend_check.h) with counts 1, 0, 3, 2 units, every
// dtype and op; then an allreduce (counters and slots stay in step for the
// next collective).
void checkReducescatterUneven(World& world, size_t unit) {
  const int size = static_cast<int>(world.size());
  std::vector<size_t> counts(size);
  for (int r = 0; r < size; ++r) counts[r] = ((r * 3 + 1) % 4) * unit;
  for (DataType dt : kAllTypes)
    for (ReduceOp op : kReduceOps)
      if (reduceOpSupported(op, dt)) checkReducescatter(world, counts, dt, op);
  checkAllreduce(world, DataType::kFloat32, ReduceOp::kSum, 5000);
}

TEST_P(ShmWorldTest, ReducescatterEveryDtypeAndOpUnevenAcrossChunks) {
  ShmWorld w = makeShmWorld(GetParam(), 4096);
  for (size_t unit : {size_t{1}, size_t{1500}})  // 1500 x 8 bytes: regions span chunks
    checkReducescatterUneven(w.world, unit);
}

// Rank r sends (r + 2*j) % 5 * unit int64 values r*1e6 + j*1e3 + i to rank
// j; then an allreduce (counters and slots stay in step).
void checkAlltoallvUneven(World& world, size_t unit) {
  const int size = static_cast<int>(world.size());
  auto blockLen = [](int from, int to, size_t u) {
    return static_cast<int64_t>(((from + 2 * to) % 5) * u);
  };
  runRanks(world, [&](int r, Backend& b) {
    std::vector<int64_t> send(size), recv(size);
    int64_t sendTotal = 0, recvTotal = 0;
    for (int j = 0; j < size; ++j) {
      send[j] = blockLen(r, j, unit);
      recv[j] = blockLen(j, r, unit);
      sendTotal += send[j];
      recvTotal += recv[j];
    }
    std::vector<int64_t> in(sendTotal), out(recvTotal, -1);
    size_t k = 0;
    for (int j = 0; j < size; ++j)
      for (int64_t i = 0; i < send[j]; ++i) in[k++] = r * 1000000 + j * 1000 + i;
    Status s = b.alltoallv(in.data(), send, out.data(), recv, DataType::kInt64);
    ASSERT_TRUE(s.isOk()) << s.toString();
    k = 0;
    bool ok = true;
    for (int j = 0; j < size; ++j)
      for (int64_t i = 0; i < recv[j]; ++i) ok &= out[k++] == j * 1000000 + r * 1000 + i;
    EXPECT_TRUE(ok) << "rank " << r << " unit " << unit;
  });
  checkAllreduce(world, DataType::kInt32, ReduceOp::kSum, 3000);
}

TEST_P(ShmWorldTest, AlltoallvUnevenIncludingEmptyBlocksAcrossRounds) {
  ShmWorld w = makeShmWorld(GetParam(), 4096);
  for (size_t unit : {size_t{0}, size_t{1}, size_t{700}})  // 700 x 8 bytes: many rounds
    checkAlltoallvUneven(w.world, unit);
}

// Where ranks claim the lines they read (ShmBackendOptions::claimLines;
// forced at every world size here, the machine's CPUs aside): every
// collective stays exact, over many chunks, on the whole-chunk path (4 KiB
// chunks) and the split path (256 KiB chunks), so a claim that stored
// anything but what it read into a range another rank still reads, or that
// came after the owner may write again, shows.
TEST_P(ShmWorldTest, EveryCollectiveStaysExactWhereRanksClaimTheLinesTheyRead) {
  const int size = GetParam();
  for (size_t chunk : {size_t{4096}, size_t{256} << 10}) {
    ShmWorld w = makeShmWorld(size, [&](int) {
      ShmBackendOptions so;
      so.chunkBytes = chunk;
      so.claimLines = true;
      so.claimLinesAnyPlacement = true;
      // Each claim holds what it read for a while before storing it back:
      // a claim placed after this rank's `consumed` would then often undo
      // the owner's next pack.
      so.claimHoldForTests = std::chrono::microseconds(200);
      return so;
    });
    for (int r = 0; r < size && size > 1; ++r) {  // one rank stays on Gloo
      auto* shm = dynamic_cast<ShmBackend*>(w.world[r].get());
      ASSERT_NE(shm, nullptr) << w.whyNot[r];
      EXPECT_TRUE(shm->claimsLines()) << "rank " << r;
    }
    for (size_t count : {size_t{1}, size_t{1001}, size_t{100003}, size_t{300007}}) {
      for (int repeat = 0; repeat < 3; ++repeat)  // back to back: owners repack at once
        checkAllreduce(w.world, DataType::kFloat32, ReduceOp::kSum, count);
      checkAllreduce(w.world, DataType::kInt32, ReduceOp::kMax, count);
      for (CombineMode mode : {CombineMode::kNone, CombineMode::kCombine})
        checkAllreduceGather(w.world, DataType::kFloat64, ReduceOp::kSum, count, mode);
    }
    checkBroadcastFromEveryRoot(w.world, 100003);
    for (size_t unit : {size_t{1}, size_t{3001}}) {
      std::vector<size_t> counts(size);
      for (int r = 0; r < size; ++r) counts[r] = ((r * 3 + 1) % 4) * unit;
      checkAllgatherv(w.world, counts);
    }
    checkReducescatterUneven(w.world, 1500);
    checkAlltoallvUneven(w.world, 700);
  }
}

TEST_P(ShmWorldTest, BarrierWaitsForEveryRank) {
  const int size = GetParam();
  ShmWorld w = makeShmWorld(size, 4096);
  std::atomic<int> arrived{0};
  std::atomic<bool> early{false};
  for (int round = 0; round < 20; ++round) {
    runRanks(w.world, [&](int r, Backend& b) {
      // The last rank arrives late: nobody may leave before it came.
      if (r == size - 1) std::this_thread::sleep_for(milliseconds(round % 5 == 0 ? 20 : 0));
      arrived.fetch_add(1);
      Status s = b.barrier();
      ASSERT_TRUE(s.isOk()) << s.toString();
      if (arrived.load() < (round + 1) * size) early = true;
    });
  }
  EXPECT_FALSE(early);
  checkAllreduce(w.world, DataType::kFloat32, ReduceOp::kSum, 100);
}

INSTANTIATE_TEST_SUITE_P(Sizes, ShmWorldTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "size" + std::to_string(info.param);
                         });

// ------------------------------------------------------------ set-up agreement

TEST(ShmBackendTest, OneRankWithoutSharedMemoryKeepsEveryRankOnGloo) {
  ShmWorld w = makeShmWorld(3, [](int r) {
    ShmBackendOptions so;
    so.chunkBytes = 4096;
    if (r == 1) so.dir = "/nonexistent-hora-test-dir";
    return so;
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(w.world[r]);
    EXPECT_EQ(w.world[r]->name(), "gloo");
    EXPECT_NE(w.whyNot[r].find("rank 1"), std::string::npos) << w.whyNot[r];
    EXPECT_NE(w.whyNot[r].find("/nonexistent-hora-test-dir"), std::string::npos) << w.whyNot[r];
  }
  checkAllreduce(w.world, DataType::kFloat32, ReduceOp::kSum, 1001);
}

TEST(ShmBackendTest, DisabledOnOneRankKeepsEveryRankOnGloo) {
  ShmWorld w = makeShmWorld(2, [](int r) {
    ShmBackendOptions so;
    so.enabled = r != 0;
    return so;
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(w.world[r]);
    EXPECT_EQ(w.world[r]->name(), "gloo");
    EXPECT_NE(w.whyNot[r].find("HORA_SHM=0"), std::string::npos) << w.whyNot[r];
  }
  checkAllreduce(w.world, DataType::kInt64, ReduceOp::kMax, 17);
}

TEST(ShmBackendTest, NoSegmentFileOutlivesSetUp) {
  char tmpl[] = "/dev/shm/hora-test-XXXXXX";
  const char* dir = ::mkdtemp(tmpl);
  ASSERT_NE(dir, nullptr);
  const std::string d = dir;
  {
    ShmWorld w = makeShmWorld(3, [&](int) {
      ShmBackendOptions so;
      so.chunkBytes = 4096;
      so.dir = d;
      return so;
    });
    ASSERT_EQ(w.world[0]->name(), "shm+gloo") << w.whyNot[0];
    int entries = 0;
    DIR* dp = ::opendir(d.c_str());
    ASSERT_NE(dp, nullptr);
    while (dirent* e = ::readdir(dp))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") ++entries;
    ::closedir(dp);
    EXPECT_EQ(entries, 0) << "segment files left in " << d;
    checkAllreduce(w.world, DataType::kFloat32, ReduceOp::kSum, 5000);
  }
  ::rmdir(d.c_str());
}

TEST(ShmBackendTest, BadChunkSizeOnOneRankKeepsEveryRankOnGloo) {
  // The refusing rank still takes part in the exchange: nobody waits for it.
  const auto start = Clock::now();
  ShmWorld w = makeShmWorld(3, [](int r) {
    ShmBackendOptions so;
    so.chunkBytes = r == 2 ? 100 : 4096;  // 100: not a multiple of 64
    so.startTimeout = milliseconds(10000);
    return so;
  });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(w.world[r]);
    EXPECT_EQ(w.world[r]->name(), "gloo");
    EXPECT_NE(w.whyNot[r].find("rank 2: HORA_SHM_CHUNK_BYTES=100"), std::string::npos)
        << w.whyNot[r];
  }
  checkAllreduce(w.world, DataType::kFloat32, ReduceOp::kSum, 1001);
}

TEST(ShmBackendTest, UnequalSettingsKeepEveryRankOnGloo) {
  // Different HORA_SHM_MIN_BYTES would send one allreduce through shm on one
  // rank and through Gloo on the other.
  ShmWorld w = makeShmWorld(2, [](int r) {
    ShmBackendOptions so;
    so.chunkBytes = 4096;
    so.minBytes = r == 0 ? 0 : 1024;
    return so;
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(w.world[r]);
    EXPECT_EQ(w.world[r]->name(), "gloo");
    EXPECT_NE(w.whyNot[r].find("differ between ranks 0 and 1"), std::string::npos) << w.whyNot[r];
  }
  checkAllreduce(w.world, DataType::kFloat32, ReduceOp::kSum, 300);
}

TEST(ShmBackendTest, ChunkSmallerThanTheSlot) {
  // The runtime's default: 4 MiB slots (reducescatter and alltoall use them
  // whole), allreduce, broadcast and allgather pipelined in smaller chunks.
  for (int size : {2, 3}) {
    ShmWorld w = makeShmWorld(size, [](int) {
      ShmBackendOptions so;
      so.chunkBytes = 4096;
      so.slotBytes = 64 << 10;
      return so;
    });
    for (int r = 0; r < size; ++r) {
      ASSERT_TRUE(w.world[r]);
      EXPECT_EQ(w.world[r]->name(), "shm+gloo") << w.whyNot[r];
    }
    for (size_t count : {size_t{1}, size_t{1001}, size_t{100003}}) {
      checkAllreduce(w.world, DataType::kFloat32, ReduceOp::kSum, count);
      checkAllreduceGather(w.world, DataType::kFloat64, ReduceOp::kMax, count);
    }
    std::vector<size_t> counts(size);
    for (int r = 0; r < size; ++r) counts[r] = 3001 * (r + 1);  // parts span several chunks
    checkAllgatherv(w.world, counts);
    checkAllreduce(w.world, DataType::kInt32, ReduceOp::kSum, 70001);
  }
}

size_t initialChunk(const std::unique_ptr<Backend>& b) {
  auto* shm = dynamic_cast<const ShmBackend*>(b.get());
  return shm ? shm->initialChunkBytes() : 0;
}

// The chunk choice's options: 4096-byte chunks, 1024 when the ranks fit the
// CPUs (0: no choice, as with HORA_SHM_CHUNK_BYTES set).
ShmBackendOptions chunkChoice(size_t whenRanksFit = 1024) {
  ShmBackendOptions so;
  so.chunkBytes = 4096;
  so.chunkBytesWhenRanksFit = whenRanksFit;
  so.slotBytes = 64 << 10;
  return so;
}

// Every rank is on shared memory with `want` as its chunk, and allreduces
// come out right.
void expectChunkEverywhere(ShmWorld w, size_t want, const std::string& context) {
  for (size_t r = 0; r < w.world.size(); ++r) {
    ASSERT_TRUE(w.world[r]);
    EXPECT_EQ(w.world[r]->name(), "shm+gloo") << w.whyNot[r];
    EXPECT_EQ(initialChunk(w.world[r]), want) << context << ", rank " << r;
  }
  checkAllreduce(w.world, DataType::kFloat32, ReduceOp::kSum, 10007);
  checkAllreduceGather(w.world, DataType::kFloat64, ReduceOp::kMax, 3001);
}

TEST(ShmBackendTest, SmallerChunkOnlyWhenEveryRankHasACpuOfItsOwn) {
  // Sizes 2-4 on this machine's CPUs: each rank's mask holds all of them.
  const int cpus = usableCpuCount();
  for (int size : {2, 3, 4}) {
    ShmWorld w = makeShmWorld(size, [](int) { return chunkChoice(); });
    expectChunkEverywhere(std::move(w), cpus >= size ? 1024 : 4096,
                          "size " + std::to_string(size) + ", " + std::to_string(cpus) + " CPUs");
  }
}

// Two ranks whose threads a launcher bound: `cpuOf(r)` is rank r's one CPU.
ShmWorld boundPair(const std::function<int(int)>& cpuOf) {
  return makeShmWorld(2, [&](int r) {
    EXPECT_TRUE(bindThisThread(cpuOf(r)).isOk());
    return chunkChoice();
  });
}

TEST(ShmBackendTest, RanksBoundToOneCpuTogetherGetTheLargerChunk) {
  // Both ranks on one CPU (as a launcher binding both processes there
  // would): they outnumber their CPUs, and every rank must pick alike.
  const int cpu = allowedCpus().front();
  expectChunkEverywhere(boundPair([cpu](int) { return cpu; }), 4096, "both on one CPU");
}

TEST(ShmBackendTest, RanksBoundToACoreEachGetTheSmallerChunk) {
  // mpirun --bind-to core: each mask holds one CPU, a different one per rank.
  const std::vector<int> cpus = allowedCpus();
  if (cpus.size() < 2) GTEST_SKIP() << "one CPU";
  expectChunkEverywhere(boundPair([&cpus](int r) { return cpus[static_cast<size_t>(r)]; }), 1024,
                        "a CPU each");
}

TEST(ShmBackendTest, UnequalChunkChoiceKeepsEveryRankOnGloo) {
  // One rank with HORA_SHM_CHUNK_BYTES set (no choice by CPUs), one without.
  ShmWorld w = makeShmWorld(2, [](int r) { return chunkChoice(r == 0 ? 1024 : 0); });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(w.world[r]);
    EXPECT_EQ(w.world[r]->name(), "gloo");
    EXPECT_NE(w.whyNot[r].find("differ between ranks 0 and 1"), std::string::npos) << w.whyNot[r];
  }
  checkAllreduce(w.world, DataType::kFloat32, ReduceOp::kSum, 300);
}

TEST(ShmBackendTest, UnequalSlotsKeepEveryRankOnGloo) {
  ShmWorld w = makeShmWorld(2, [](int r) {
    ShmBackendOptions so;
    so.chunkBytes = 4096;
    so.slotBytes = r == 0 ? 64 << 10 : 0;
    return so;
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(w.world[r]);
    EXPECT_EQ(w.world[r]->name(), "gloo");
    EXPECT_NE(w.whyNot[r].find("differ between ranks 0 and 1"), std::string::npos) << w.whyNot[r];
  }
  checkAllreduce(w.world, DataType::kFloat32, ReduceOp::kSum, 300);
}

// ------------------------------------------------------------ failure paths

TEST(ShmBackendTest, StalledPeerTimesOutNamingIt) {
  ShmWorld w = makeShmWorld(2, 4096, milliseconds(800));
  std::vector<float> v(100000, 1.0f);
  const auto start = Clock::now();
  // Rank 1 never calls.
  Status s = w.world[0]->allreduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(s.code(), Code::kTimeout) << s.toString();
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.toString();
  EXPECT_NE(s.message().find("a peer rank may have died or stalled"), std::string::npos);
  EXPECT_NE(s.message().find("float32"), std::string::npos);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  // Unusable afterwards, delegated collectives included.
  EXPECT_FALSE(w.world[0]->allreduce(v.data(), 1, DataType::kFloat32, ReduceOp::kSum).isOk());
  EXPECT_FALSE(w.world[0]->barrier().isOk());
}

TEST(ShmBackendTest, AWaitForAStalledPeerCallsTheWaitHookWhileItSleeps) {
  // The control thread running a collective itself tells its peers it is
  // alive through this hook (Backend::setWaitHook): it must be called all
  // along a long wait, and no longer once cleared.
  ShmWorld w = makeShmWorld(2, 4096, milliseconds(300));
  int calls = 0;
  w.world[0]->setWaitHook([&] { ++calls; });
  std::vector<float> v(1000, 1.0f);
  Status s = w.world[0]->allreduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(s.code(), Code::kTimeout) << s.toString();
  // 300 ms in slices of a few ms: dozens of calls (loaded machines sleep longer).
  EXPECT_GE(calls, 10);
  const int before = calls;
  w.world[0]->setWaitHook(nullptr);
  EXPECT_FALSE(w.world[0]->barrier().isOk());  // failed at once, no wait
  EXPECT_EQ(calls, before);
}

TEST(ShmBackendTest, RanksSharingACpuYieldToEachOtherInsteadOfSleeping) {
  // Every rank confined to one CPU (threads inherit the creating thread's
  // mask): each shares it with the others, so a wait for a peer gives the CPU
  // away (ShmBackendOptions::peerYield) and the peer finishes its step
  // without either side sleeping. With peerYield at 0 the same waits sleep.
  const std::vector<int> cpus = allowedCpus();
  ASSERT_FALSE(cpus.empty());
  ScopedThreadCpus oneCpu({cpus[0]});
  for (int size : {2, 3}) {
    for (long yieldUs : {1000000L, 0L}) {
      SCOPED_TRACE("size " + std::to_string(size) + ", peerYield " + std::to_string(yieldUs));
      ShmWorld w = makeShmWorld(size, [&](int) {
        ShmBackendOptions so;
        so.chunkBytes = 256 << 10;
        so.peerYield = std::chrono::microseconds(yieldUs);
        so.timeout = milliseconds(20000);
        return so;
      });
      // Split chunks (packed, reduced, consumed waits) and small ones.
      for (size_t count : {size_t{100003}, size_t{1001}})
        for (int i = 0; i < 5; ++i)
          checkAllreduce(w.world, DataType::kFloat32, ReduceOp::kSum, count);
      uint64_t sleeps = 0;
      for (int r = 0; r < size; ++r) {
        auto* shm = dynamic_cast<ShmBackend*>(w.world[r].get());
        ASSERT_NE(shm, nullptr) << w.whyNot[r];
        sleeps += shm->waitSleeps();
      }
      if (yieldUs > 0)
        EXPECT_EQ(sleeps, 0u);
      else
        EXPECT_GT(sleeps, 0u);
    }
  }
}

TEST(ShmBackendTest, AWaiterWithACorePollsALatePeerForItsWindowBeforeSleeping) {
  // Ranks that fit the CPUs: rank 1 comes 200 ms late (20 ms was too little
  // on a loaded machine: a preempted test thread let rank 1 arrive first).
  // With a window longer than that rank 0 polls through it (no futex
  // sleep); with none it sleeps after its short spin.
  if (allowedCpus().size() < 2) GTEST_SKIP() << "one allowed CPU: the ranks do not fit";
  for (long spinUs : {2000000L, 0L}) {
    SCOPED_TRACE("peerSpin " + std::to_string(spinUs));
    ShmWorld w = makeShmWorld(2, [&](int) {
      ShmBackendOptions so;
      so.chunkBytes = 64 << 10;
      so.peerSpin = std::chrono::microseconds(spinUs);
      so.timeout = milliseconds(20000);
      return so;
    });
    auto* shm0 = dynamic_cast<ShmBackend*>(w.world[0].get());
    ASSERT_NE(shm0, nullptr) << w.whyNot[0];
    const uint64_t before = shm0->waitSleeps();
    std::vector<float> a(1000, 1.0f), b(1000, 2.0f);
    Status s0, s1;
    std::thread late([&] {
      std::this_thread::sleep_for(milliseconds(200));
      s1 = w.world[1]->allreduce(b.data(), b.size(), DataType::kFloat32, ReduceOp::kSum);
    });
    s0 = w.world[0]->allreduce(a.data(), a.size(), DataType::kFloat32, ReduceOp::kSum);
    late.join();
    ASSERT_TRUE(s0.isOk() && s1.isOk()) << s0.toString() << " / " << s1.toString();
    EXPECT_EQ(a[999], 3.0f);
    if (spinUs > 0)
      EXPECT_EQ(shm0->waitSleeps(), before);
    else
      EXPECT_GT(shm0->waitSleeps(), before);
  }
}

TEST(ShmBackendTest, PlacementFollowsEveryRanksMask) {
  // Decided at set-up from every rank's mask (ShmPlacement), the same on
  // every rank: yielding (ranksShareCpusEvenly) needs one mask on every rank
  // and the ranks a multiple of its CPUs; chunks up to
  // smallChunkBytesWhenCrowded are reduced whole where the ranks outnumber
  // the CPUs otherwise (uneven shares, or per-rank masks holding fewer CPUs
  // than ranks); read lines are claimed only where the masks together hold
  // a CPU per rank. Waits poll per rank: where its own mask holds the ranks
  // or no other rank's mask holds its CPUs. Each rank's mask is set on its own thread, in the
  // options callback, which runs there before the set-up. The results are checked on both paths
  // (256 KiB chunks: whole where crowded, split elsewhere).
  const std::vector<int> cpus = allowedCpus();
  if (cpus.size() < 2) GTEST_SKIP() << "one allowed CPU";
  struct Case {
    int size;
    std::function<std::vector<int>(int)> mask;
    bool even, crowded, fit;
    std::function<bool(int)> polls;  // per rank: may differ (ownCpusAlone)
  };
  const std::vector<int> two{cpus[0], cpus[1]};
  auto all = [](bool v) { return [v](int) { return v; }; };
  auto one = [&](size_t i) { return std::vector<int>{cpus[i]}; };
  const Case cases[] = {
      {2, [&](int) { return one(0); }, true, false, false, all(false)},
      {4, [&](int) { return two; }, true, false, false, all(false)},
      {3, [&](int) { return two; }, false, true, false, all(false)},
      {2, [&](int) { return two; }, false, false, true, all(true)},
      // A launcher's CPU per rank: a CPU each, the masks differ; no peer
      // runs on a rank's CPU, so its waits poll.
      {2, [&](int r) { return one(static_cast<size_t>(r)); }, false, false, true, all(true)},
      // A launcher's CPU per pair of ranks: the masks differ.
      {4, [&](int r) { return one(static_cast<size_t>(r / 2)); }, false, true, false, all(false)},
      // Two ranks on one CPU, a third alone on the other: only it polls.
      {3, [&](int r) { return one(r < 2 ? 0 : 1); }, false, true, false,
       [](int r) { return r == 2; }},
      // Rank 0's own mask holds both ranks (it polls); rank 1's CPU is also
      // rank 0's (it sleeps at once).
      {2, [&](int r) { return r == 0 ? two : one(1); }, false, false, true,
       [](int r) { return r == 0; }},
  };
  for (const Case& c : cases) {
    ShmWorld w = makeShmWorld(c.size, [&](int r) {
      cpu_set_t set;
      CPU_ZERO(&set);
      for (int cpu : c.mask(r)) CPU_SET(cpu, &set);
      EXPECT_EQ(pthread_setaffinity_np(pthread_self(), sizeof(set), &set), 0);
      ShmBackendOptions so;
      so.chunkBytes = 256 << 10;
      so.peerYield = std::chrono::microseconds(100);
      so.smallChunkBytesWhenCrowded = 256 << 10;
      return so;
    });
    for (int r = 0; r < c.size; ++r) {
      auto* shm = dynamic_cast<ShmBackend*>(w.world[r].get());
      ASSERT_NE(shm, nullptr) << w.whyNot[r];
      EXPECT_EQ(shm->ranksShareCpusEvenly(), c.even) << c.size << " ranks, rank " << r;
      // Claiming read lines (on by default) only where every rank has a CPU.
      EXPECT_EQ(shm->claimsLines(), c.fit) << c.size << " ranks, rank " << r;
      EXPECT_EQ(shm->pollsPeers(), c.polls(r)) << c.size << " ranks, rank " << r;
      EXPECT_EQ(shm->smallChunkBytes(), c.crowded ? size_t{256} << 10 : size_t{64} << 10)
          << c.size << " ranks, rank " << r;
    }
    for (size_t count : {size_t{65536}, size_t{100003}})
      checkAllreduce(w.world, DataType::kFloat32, ReduceOp::kSum, count);
    checkAllreduce(w.world, DataType::kInt32, ReduceOp::kMax, 65536);
  }
}

TEST(ShmBackendTest, KernelMatesBeyondTheCommunicatorShareItsCpus) {
  // Two ranks whose masks hold two CPUs fit them, unless more of the set's
  // ranks run on this kernel (emulated or container hosts) than the machine
  // has CPUs: then they claim no lines, do not poll, yield before they
  // sleep, and start with the chunk for ranks that crowd the CPUs. Mates
  // within the machine's CPUs (pods with CPUs of their own) change nothing.
  // The most any rank reports counts, so that one rank that missed the
  // count (0) decides as the others do. Reduced-whole chunks stay as the
  // communicator's masks say.
  const std::vector<int> cpus = allowedCpus();
  if (cpus.size() < 2) GTEST_SKIP() << "one allowed CPU";
  const std::vector<int> two{cpus[0], cpus[1]};
  struct Case {
    std::vector<int> kernelRanks;  // per rank
    int online;                    // the machine's CPUs
    bool crowd;
  };
  const Case cases[] = {{{0, 0}, 2, false}, {{2, 2}, 2, false}, {{4, 4}, 2, true},
                        {{0, 4}, 2, true},  {{3, 0}, 2, true},  {{4, 4}, 8, false},
                        {{8, 8}, 8, false}, {{9, 0}, 8, true}};
  for (const Case& c : cases) {
    ShmWorld w = makeShmWorld(2, [&](int r) {
      cpu_set_t set;
      CPU_ZERO(&set);
      for (int cpu : two) CPU_SET(cpu, &set);
      EXPECT_EQ(pthread_setaffinity_np(pthread_self(), sizeof(set), &set), 0);
      ShmBackendOptions so;
      so.chunkBytes = 256 << 10;
      so.peerYield = std::chrono::microseconds(100);
      so.smallChunkBytesWhenCrowded = 256 << 10;
      so.chunkBytesWhenRanksFit = 128 << 10;
      so.kernelRanks = c.kernelRanks[static_cast<size_t>(r)];
      so.onlineCpusForTests = c.online;
      return so;
    });
    const std::string what = "kernel ranks " + std::to_string(c.kernelRanks[0]) + "," +
                             std::to_string(c.kernelRanks[1]) + " on " + std::to_string(c.online) +
                             " CPUs";
    for (int r = 0; r < 2; ++r) {
      auto* shm = dynamic_cast<ShmBackend*>(w.world[r].get());
      ASSERT_NE(shm, nullptr) << w.whyNot[r];
      EXPECT_EQ(shm->claimsLines(), !c.crowd) << what << ", rank " << r;
      EXPECT_EQ(shm->pollsPeers(), !c.crowd) << what << ", rank " << r;
      EXPECT_EQ(shm->yieldsToPeers(), c.crowd) << what << ", rank " << r;
      EXPECT_FALSE(shm->ranksShareCpusEvenly()) << what << ", rank " << r;
      EXPECT_EQ(shm->smallChunkBytes(), size_t{64} << 10) << what << ", rank " << r;
      EXPECT_EQ(shm->initialChunkBytes(), c.crowd ? size_t{256} << 10 : size_t{128} << 10)
          << what << ", rank " << r;
    }
    for (size_t count : {size_t{65536}, size_t{100003}})
      checkAllreduce(w.world, DataType::kFloat32, ReduceOp::kSum, count);
  }
}

TEST(ShmBackendTest, APeerThatGivesUpFailsItsWaitersAtOnceNamingIt) {
  // Rank 2 aborts (its set failed) without ever joining the allreduce; rank
  // 0 waits for rank 2 and rank 1 for both. Neither may wait out the 20 s
  // timeout: a control thread running the collective itself reads no abort
  // frame, so the news must come through shared memory.
  ShmWorld w = makeShmWorld(3, 4096, milliseconds(20000));
  std::vector<Status> got(2);
  std::vector<std::thread> ts;
  const auto start = Clock::now();
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      std::vector<float> v(10000, 1.0f);
      got[r] = w.world[r]->allreduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
    });
  std::this_thread::sleep_for(milliseconds(100));
  w.world[2]->abort();
  for (auto& t : ts) t.join();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[r].code(), Code::kRemoteError) << got[r].toString();
    EXPECT_NE(got[r].message().find("rank 2 gave up"), std::string::npos) << got[r].toString();
  }
}

TEST(ShmBackendTest, OnlyWhatRunsOnSharedMemoryCallsTheWaitHook) {
  ShmWorld two = makeShmWorld(2, [](int) {
    ShmBackendOptions so;
    so.minBytes = 4096;
    return so;
  });
  EXPECT_TRUE(two.world[0]->callsWaitHook(1024, DataType::kFloat32));   // 4 KiB
  EXPECT_FALSE(two.world[0]->callsWaitHook(1023, DataType::kFloat32));  // below: Gloo
  ShmWorld one = makeShmWorld(1, 4096);
  EXPECT_FALSE(one.world[0]->callsWaitHook(1 << 20, DataType::kFloat32));  // one rank
}

TEST(ShmBackendTest, ReducescatterAlltoallAndBarrierWithAStalledPeerTimeOutNamingIt) {
  for (int which = 0; which < 3; ++which) {
    ShmWorld w = makeShmWorld(2, 4096, milliseconds(600));
    std::vector<float> v(10000, 1.0f);
    std::vector<int64_t> split = {5000, 5000};
    std::vector<float> out(10000);
    const auto start = Clock::now();
    // Rank 1 never calls.
    Status s =
        which == 0
            ? w.world[0]->reducescatter(v.data(), {5000, 5000}, DataType::kFloat32, ReduceOp::kSum)
        : which == 1 ? w.world[0]->alltoallv(v.data(), split, out.data(), split, DataType::kFloat32)
                     : w.world[0]->barrier();
    EXPECT_EQ(s.code(), Code::kTimeout) << which << ": " << s.toString();
    EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.toString();
    EXPECT_NE(s.message().find("HORA_PEER_TIMEOUT_S"), std::string::npos) << s.toString();
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
    EXPECT_FALSE(w.world[0]->barrier().isOk());  // unusable afterwards
  }
}

TEST(ShmBackendTest, BroadcastWaitingForAStalledRootTimesOutNamingIt) {
  ShmWorld w = makeShmWorld(2, 4096, milliseconds(800));
  std::vector<int64_t> v(1000, 5);
  const auto start = Clock::now();
  // Rank 0, the root, never calls.
  Status s = w.world[1]->broadcast(v.data(), v.size(), DataType::kInt64, 0);
  EXPECT_EQ(s.code(), Code::kTimeout) << s.toString();
  EXPECT_NE(s.message().find("rank 0"), std::string::npos) << s.toString();
  EXPECT_NE(s.message().find("broadcast"), std::string::npos) << s.toString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  EXPECT_EQ(v[0], 5);  // nothing copied from a root that never published
}

TEST(ShmBackendTest, AbortFromAnotherThreadUnblocksACall) {
  ShmWorld w = makeShmWorld(3, 4096, milliseconds(20000));
  const auto start = Clock::now();
  std::thread aborter([&] {
    std::this_thread::sleep_for(milliseconds(300));
    w.world[0]->abort();
  });
  // Rank 2 joins, rank 1 never does: rank 0 (and 2) wait for rank 1.
  Status s2;
  std::thread rank2([&] {
    std::vector<float> x(50000, 1.0f);
    s2 = w.world[2]->allreduce(x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
  });
  std::vector<float> v(50000, 1.0f);
  Status s0 = w.world[0]->allreduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
  const auto elapsed = Clock::now() - start;
  aborter.join();
  EXPECT_EQ(s0.code(), Code::kRemoteError) << s0.toString();
  EXPECT_NE(s0.message().find("aborted"), std::string::npos) << s0.toString();
  EXPECT_LT(elapsed, std::chrono::seconds(3));
  w.world[2]->abort();
  rank2.join();
  EXPECT_FALSE(s2.isOk());
  EXPECT_EQ(w.world[0]->allreduce(v.data(), 1, DataType::kFloat32, ReduceOp::kSum).code(),
            Code::kRemoteError);
  EXPECT_FALSE(w.world[0]->barrier().isOk());
}

// Ranks as processes: rank 1 sets up, then exits without ever joining the
// allreduce. Rank 0 (the test process, which reaps it so no zombie keeps the
// pid alive) must see the process vanish and fail naming it, long before its
// 20 s timeout. The control plane, not present here, would notice too; this
// is the data plane's own guard.
TEST(ShmBackendTest, PeerProcessThatExitsIsNamedWithoutWaitingForTheTimeout) {
  // The child is forked before this process starts any thread (the store
  // server's among them): a fork taken while another thread holds a lock
  // (the allocator's, ASan's) can leave the child blocked on it for good,
  // which once hung this test under ASan. The port reaches the child
  // through a pipe.
  int portPipe[2];
  ASSERT_EQ(::pipe(portPipe), 0);
  Logger quiet(LogLevel::kOff, "");
  auto build = [&](int rank, int port) -> Result<std::unique_ptr<Backend>> {
    auto store = TcpStoreClient::connect("127.0.0.1", port, "s3cret", milliseconds(5000), quiet);
    if (!store.isOk()) return store.status();
    GlooBackendOptions go;
    go.timeout = milliseconds(20000);
    auto gloo = createGlooBackend(store.value(), "gloo", rank, 2, go);
    if (!gloo.isOk()) return gloo.status();
    ShmBackendOptions so;
    so.timeout = milliseconds(20000);
    std::string why;
    auto shm = createShmBackend(std::make_shared<PrefixStore>(store.value(), "shm"), rank, 2, so,
                                gloo.take(), &why);
    if (shm.isOk() && shm.value()->name() != "shm+gloo") return internalError("no shm: " + why);
    return shm;
  };
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(portPipe[1]);
    int port = 0;
    if (::read(portPipe[0], &port, sizeof(port)) != static_cast<ssize_t>(sizeof(port))) ::_exit(4);
    auto b = build(1, port);
    std::this_thread::sleep_for(milliseconds(500));  // rank 0 is set up by now
    ::_exit(b.isOk() ? 0 : 3);
  }
  ::close(portPipe[0]);
  auto server = TcpStoreServer::start("127.0.0.1", 0, "s3cret", quiet);
  int port = server.isOk() ? server.value()->port() : 0;
  // Always answer, so the child never waits for a port that will not come.
  EXPECT_EQ(::write(portPipe[1], &port, sizeof(port)), static_cast<ssize_t>(sizeof(port)));
  ::close(portPipe[1]);
  ASSERT_TRUE(server.isOk()) << server.status().toString();
  int childStatus = -1;
  std::thread reaper([&] { ::waitpid(child, &childStatus, 0); });
  auto b = build(0, port);
  Status s = b.status();
  const auto start = Clock::now();
  if (b.isOk()) {
    std::vector<float> v(1 << 20, 1.0f);
    s = b.value()->allreduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
  }
  reaper.join();  // before any ASSERT can return with the thread still joinable
  ASSERT_TRUE(b.isOk()) << b.status().toString();
  EXPECT_EQ(s.code(), Code::kRemoteError) << s.toString();
  EXPECT_NE(s.message().find("rank 1 (pid " + std::to_string(child) + ") exited"),
            std::string::npos)
      << s.toString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_TRUE(WIFEXITED(childStatus) && WEXITSTATUS(childStatus) == 0) << childStatus;
}

TEST(ShmBackendTest, InvalidArgumentsLeaveTheBackendUsable) {
  ShmWorld w = makeShmWorld(2, 4096);
  runRanks(w.world, [](int, Backend& b) {
    int32_t x = 0;
    EXPECT_EQ(b.broadcast(&x, 1, DataType::kInt32, 2).code(), Code::kInvalidArgument);
    EXPECT_EQ(b.broadcast(nullptr, 1, DataType::kInt32, 0).code(), Code::kInvalidArgument);
    EXPECT_EQ(b.allreduce(nullptr, 5, DataType::kFloat32, ReduceOp::kSum).code(),
              Code::kInvalidArgument);
    EXPECT_EQ(b.allreduce(nullptr, 0, DataType::kFloat32, ReduceOp::kSum).code(), Code::kOk);
  });
  checkAllreduce(w.world, DataType::kFloat32, ReduceOp::kSum, 3000);
}

}  // namespace
}  // namespace hora
