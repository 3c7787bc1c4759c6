// The batched scale-copy kernel body (ops/cuda/fusion_kernels_impl.h) run on
// the CPU: every launch the host would make is planned by the same code, and
// each (block, thread) pair of it runs serially. Blocks and threads share no
// memory and never synchronize, so serial execution computes exactly what the
// GPU does. Checks the launch plan, the alignment paths and the arithmetic of
// every dtype against hora's CPU scaleCopy, on machines without a GPU. What it
// cannot check (real launches, bandwidth) is in cuda_plugin_test.cc.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "copy_cases.h"
#include "ops/cuda/fusion_kernels_impl.h"

namespace hora {
namespace cuda {
namespace {

using gputest::CopyCase;

struct Emulated {
  int rc = 0;
  int launches = 0;
  uint64_t blocks = 0;
};

// Checks one launch's parameter block against the plan's invariants.
template <typename S, typename Params>
void checkPlan(const Params& p, uint32_t chunks) {
  constexpr uint64_t kChunkUnits = kChunkBytes / sizeof(S);
  ASSERT_GE(p.n, 1u);
  ASSERT_LE(p.n, Params::kCap);
  ASSERT_EQ(p.chunkBegin[0], 0u);
  ASSERT_EQ(p.chunkBegin[p.n], chunks);
  for (uint32_t i = 0; i < p.n; ++i) {
    ASSERT_GT(p.entry[i].count, 0u) << "empty copies must not reach the kernel";
    const uint64_t want = (p.entry[i].count + kChunkUnits - 1) / kChunkUnits;
    ASSERT_EQ(p.chunkBegin[i + 1] - p.chunkBegin[i], want) << "entry " << i;
  }
}

// Plans and runs one batched_scale_copy with parameter blocks of type Params.
template <typename Params>
Emulated emulateWith(int32_t dtype, const hora_gpu_copy_t* copies, size_t n, double scale,
                     bool runKernel) {
  auto params = std::make_unique<Params>();
  hostMisalignedAccesses = 0;
  Emulated out;
  out.rc = dispatchScaleCopy(dtype, scale, [&](auto op, uint64_t unitsPerElement) -> int {
    using Op = decltype(op);
    using S = typename Op::Storage;
    return planBatches(copies, n, unitsPerElement, sizeof(S), *params,
                       [&](Params& p, uint32_t chunks) -> int {
                         ++out.launches;
                         out.blocks += chunks;
                         checkPlan<S>(p, chunks);
                         if (!runKernel) return 0;
                         for (uint32_t b = 0; b < chunks; ++b) {
                           for (unsigned t = 0; t < kThreads; ++t) runChunk(p, b, t, op);
                         }
                         return 0;
                       });
  });
  EXPECT_EQ(hostMisalignedAccesses, 0u) << "word accesses that would fault on the GPU";
  return out;
}

// As the plugin does it: the small block for up to kSmallBatchCopies copies.
Emulated emulate(int32_t dtype, const hora_gpu_copy_t* copies, size_t n, double scale,
                 bool runKernel = true) {
  if (n <= kSmallBatchCopies) return emulateWith<SmallBatch>(dtype, copies, n, scale, runKernel);
  return emulateWith<LargeBatch>(dtype, copies, n, scale, runKernel);
}

class FusionEmulationTest : public ::testing::TestWithParam<int32_t> {};

TEST_P(FusionEmulationTest, MatchesCpuScaleCopyForEveryScale) {
  const int32_t dtype = GetParam();
  for (double scale : gputest::kScales) {
    for (bool misaligned : {false, true}) {
      SCOPED_TRACE(::testing::Message() << gputest::dtypeName(dtype) << " scale " << scale
                                        << (misaligned ? " with element-misaligned copies" : ""));
      // Both sizes of parameter block: kCounts has more copies than the small
      // one holds (two launches); the large one takes them in one.
      CopyCase c = gputest::makeCase(dtype, gputest::kCounts, 1234 + dtype, misaligned);
      ASSERT_GT(c.pieces.size(), kSmallBatchCopies);
      const std::vector<uint8_t> want = gputest::expectedDst(c, scale);
      for (bool small : {true, false}) {
        std::vector<uint8_t> got = c.dst;
        const auto k = gputest::copiesFor(c, got.data(), c.src.data());
        const Emulated e = small ? emulateWith<SmallBatch>(dtype, k.data(), k.size(), scale, true)
                                 : emulateWith<LargeBatch>(dtype, k.data(), k.size(), scale, true);
        ASSERT_EQ(e.rc, 0);
        EXPECT_EQ(e.launches, small ? 2 : 1) << k.size() << " copies";
        ASSERT_EQ(gputest::firstDifference(c, got, want), "") << (small ? "small" : "large");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, FusionEmulationTest, ::testing::ValuesIn(gputest::kAllDtypes),
                         [](const ::testing::TestParamInfo<int32_t>& info) {
                           return std::string(gputest::dtypeName(info.param));
                         });

TEST(FusionEmulation, LongListsTakeSeveralLaunches) {
  std::vector<size_t> counts;
  for (size_t i = 0; i < 2500; ++i) counts.push_back(i % 9 == 0 ? 0 : 1 + (i * 37) % 300);
  size_t nonEmpty = 0;
  for (size_t n : counts) nonEmpty += n != 0;
  for (double scale : {1.0, 0.5}) {
    CopyCase c = gputest::makeCase(HORA_GPU_DTYPE_FLOAT32, counts, 99, false);
    const std::vector<uint8_t> want = gputest::expectedDst(c, scale);
    std::vector<uint8_t> got = c.dst;
    const auto copies = gputest::copiesFor(c, got.data(), c.src.data());
    const Emulated e = emulate(HORA_GPU_DTYPE_FLOAT32, copies.data(), copies.size(), scale);
    ASSERT_EQ(e.rc, 0);
    EXPECT_EQ(e.launches, static_cast<int>((nonEmpty + kMaxBatchCopies - 1) / kMaxBatchCopies));
    ASSERT_EQ(gputest::firstDifference(c, got, want), "");
  }
}

TEST(FusionEmulation, EmptyListsLaunchNothing) {
  std::vector<hora_gpu_copy_t> copies(5, hora_gpu_copy_t{nullptr, nullptr, 0});
  const Emulated e = emulate(HORA_GPU_DTYPE_FLOAT32, copies.data(), copies.size(), 0.5);
  EXPECT_EQ(e.rc, 0);
  EXPECT_EQ(e.launches, 0);
  EXPECT_EQ(emulate(HORA_GPU_DTYPE_INT8, nullptr, 0, 1.0).launches, 0);
  // 40 copies of which 35 are empty fit one small block.
  std::vector<int32_t> a(5, 7);
  std::vector<int32_t> b(5, 0);
  std::vector<hora_gpu_copy_t> some(40, hora_gpu_copy_t{nullptr, nullptr, 0});
  for (int i = 0; i < 5; ++i) some[i * 8] = hora_gpu_copy_t{&b[i], &a[i], 1};
  const Emulated f =
      emulateWith<SmallBatch>(HORA_GPU_DTYPE_INT32, some.data(), some.size(), 1.0 / 3.0, true);
  EXPECT_EQ(f.launches, 1);
  EXPECT_EQ(b, std::vector<int32_t>(5, 2));
}

TEST(FusionEmulation, UnknownDtypeAndOverflowAreRefused) {
  hora_gpu_copy_t copy{nullptr, nullptr, 1};
  EXPECT_EQ(emulate(42, &copy, 1, 1.0).rc, kPlanUnknownDtype);
  copy.count = ~size_t{0} / 2;  // times 4 bytes does not fit 64 bits
  EXPECT_EQ(emulate(HORA_GPU_DTYPE_FLOAT32, &copy, 1, 1.0, false).rc, kPlanCountOverflow);
}

// The ResNet-50 gradients (161 tensors, 102 MB of float32) pack into the
// fusion buffer in one launch of ~3,200 blocks: enough to fill an H100 (132
// SMs x 8 blocks) about three times over.
TEST(FusionEmulation, ResNet50PackIsOneLaunch) {
  const std::vector<size_t> counts =
      gputest::readShapeCounts(std::string(HORA_SOURCE_DIR) + "/bench/resnet50_grad_shapes.txt");
  ASSERT_EQ(counts.size(), 161u);
  size_t total = 0;
  std::vector<hora_gpu_copy_t> copies;
  for (size_t n : counts) {
    // Plan only (nothing runs), so the addresses just need the right alignment.
    copies.push_back(hora_gpu_copy_t{reinterpret_cast<void*>(0x100000 + total * 4),
                                     reinterpret_cast<const void*>(0x40000000 + total * 4), n});
    total += n;
  }
  EXPECT_EQ(total, 25557032u);
  for (double scale : {1.0, 0.25}) {
    const Emulated e = emulate(HORA_GPU_DTYPE_FLOAT32, copies.data(), copies.size(), scale, false);
    ASSERT_EQ(e.rc, 0);
    EXPECT_EQ(e.launches, 1);
    EXPECT_GT(e.blocks, 3000u);
    EXPECT_LT(e.blocks, 3400u);
  }
}

TEST(FusionEmulation, ExactDivisorMatchesCore) {
  EXPECT_EQ(exactDivisor(0.5), 2);
  EXPECT_EQ(exactDivisor(1.0 / 3.0), 3);
  EXPECT_EQ(exactDivisor(1.0 / 49.0), 49);
  EXPECT_EQ(exactDivisor(1.0), 0);
  EXPECT_EQ(exactDivisor(0.3), 0);
  EXPECT_EQ(exactDivisor(-0.5), 0);
  // 49 * (1/49) is just below 1 in double: the division rule keeps it at 1.
  int32_t v = 49;
  hora_gpu_copy_t copy{&v, &v, 1};
  ASSERT_EQ(emulate(HORA_GPU_DTYPE_INT32, &copy, 1, 1.0 / 49.0).rc, 0);
  EXPECT_EQ(v, 1);
}

}  // namespace
}  // namespace cuda
}  // namespace hora
