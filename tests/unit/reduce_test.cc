// Unit tests for core/reduce.h: 16-bit float conversions, reduction kernels
// against a scalar reference, identity elements and scaling.
#include "core/reduce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace hora {
namespace {

uint32_t bitsOf(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}
float fromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

// ------------------------------------------------------------- conversions

TEST(HalfTest, EveryBitPatternRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = halfToFloat(static_cast<uint16_t>(h));
    const bool isNan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
    if (isNan) {
      EXPECT_TRUE(std::isnan(f)) << h;
      // The NaN keeps its sign and payload, and is quiet on the way back.
      EXPECT_EQ(floatToHalf(f), h | 0x200) << h;
    } else {
      ASSERT_EQ(floatToHalf(f), h) << std::hex << h;
    }
  }
}

TEST(HalfTest, KnownValues) {
  EXPECT_EQ(halfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(halfToFloat(0xc000), -2.0f);
  EXPECT_EQ(halfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(halfToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(halfToFloat(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_TRUE(std::isinf(halfToFloat(0x7c00)));
  EXPECT_EQ(bitsOf(halfToFloat(0x8000)), 0x80000000u);  // -0 keeps its sign
}

TEST(HalfTest, RoundsToNearestEven) {
  // 1 + 2^-11 is exactly halfway between 1 and 1 + 2^-10: ties go to even (1).
  EXPECT_EQ(floatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3*2^-11 is halfway between 0x3c01 and 0x3c02: even is 0x3c02.
  EXPECT_EQ(floatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  // Just above halfway rounds up.
  EXPECT_EQ(floatToHalf(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3c01);
  // Overflow: 65519 rounds down to max, 65520 (halfway to 2^16) to inf.
  EXPECT_EQ(floatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(floatToHalf(-1e10f), 0xfc00);
  EXPECT_EQ(floatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_TRUE(std::isnan(halfToFloat(floatToHalf(std::nanf("")))));
  // Subnormal range: half of the smallest subnormal ties to even (zero);
  // three halves ties to 2 subnormal units.
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(floatToHalf(3 * std::ldexp(1.0f, -25)), 0x0002);
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -26)), 0x0000);
  EXPECT_EQ(floatToHalf(-std::ldexp(1.0f, -30)), 0x8000);
}

TEST(HalfTest, MatchesDoubleReferenceOnRandomFloats) {
  // Reference: the two neighbouring halves, pick the nearer (even on ties).
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-70000.0f, 70000.0f);
  for (int i = 0; i < 200000; ++i) {
    float f = dist(rng) * (i % 3 == 0 ? 1e-5f : 1.0f);
    uint16_t h = floatToHalf(f);
    double got = halfToFloat(h);
    if (std::isinf(got)) {
      EXPECT_GE(std::fabs(f), 65520.0f);
      continue;
    }
    uint16_t up = static_cast<uint16_t>(h + 1), down = static_cast<uint16_t>(h - 1);
    double err = std::fabs(got - f);
    if ((up & 0x7c00) != 0x7c00) {
      EXPECT_LE(err, std::fabs(halfToFloat(up) - double(f))) << f;
    }
    if ((h & 0x7fff) != 0) {
      EXPECT_LE(err, std::fabs(halfToFloat(down) - double(f))) << f;
    }
  }
}

TEST(Bfloat16Test, ConversionAndRounding) {
  for (uint32_t b = 0; b < 65536; ++b) {
    float f = bfloat16ToFloat(static_cast<uint16_t>(b));
    if (!std::isnan(f)) {
      ASSERT_EQ(floatToBfloat16(f), b);
    }
  }
  EXPECT_EQ(floatToBfloat16(1.0f), 0x3f80);
  // Ties to even: 1 + 2^-8 is halfway between 0x3f80 and 0x3f81 -> 0x3f80.
  EXPECT_EQ(floatToBfloat16(fromBits(0x3f808000)), 0x3f80);
  // 0x3f818000 is halfway between 0x3f81 and 0x3f82 -> even 0x3f82.
  EXPECT_EQ(floatToBfloat16(fromBits(0x3f818000)), 0x3f82);
  EXPECT_EQ(floatToBfloat16(fromBits(0x3f808001)), 0x3f81);
  // Largest finite float rounds to inf; NaN stays NaN (never becomes inf).
  EXPECT_EQ(floatToBfloat16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(floatToBfloat16(fromBits(0x7f800001)) & 0x7fff, 0x7fc0);
  EXPECT_TRUE(std::isnan(bfloat16ToFloat(floatToBfloat16(fromBits(0x7fffffff)))));
  EXPECT_EQ(floatToBfloat16(-0.0f), 0x8000);
}

// ------------------------------------------------------------- reductions

template <typename T>
T refOp(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return a + b;
    case ReduceOp::kProduct:
      return a * b;
    case ReduceOp::kMin:
      return a < b ? a : b;
    case ReduceOp::kMax:
      return a > b ? a : b;
    default:
      return a;
  }
}

const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kProduct, ReduceOp::kMin,
                         ReduceOp::kMax};

// Integer types: compare against a wrapping reference computed in uint64.
template <typename T>
void checkIntegers(DataType dt) {
  std::mt19937_64 rng(static_cast<uint64_t>(dt) * 977);
  const size_t n = 1037;  // odd, exercises the vector epilogue
  for (ReduceOp op : kOps) {
    std::vector<T> a(n), b(n);
    for (size_t i = 0; i < n; ++i) {
      a[i] = static_cast<T>(rng());
      b[i] = static_cast<T>(rng());
    }
    a[0] = std::numeric_limits<T>::max();
    b[0] = std::numeric_limits<T>::max();  // forces wrap on sum and product
    std::vector<T> inout = a, out3(n);
    reduceInto(dt, op, inout.data(), b.data(), n);
    reduceFunction(dt, op)(out3.data(), a.data(), b.data(), n);
    for (size_t i = 0; i < n; ++i) {
      T want;
      uint64_t ua = static_cast<uint64_t>(a[i]), ub = static_cast<uint64_t>(b[i]);
      if (op == ReduceOp::kSum || op == ReduceOp::kAverage) {
        want = static_cast<T>(ua + ub);
      } else if (op == ReduceOp::kProduct) {
        want = static_cast<T>(ua * ub);
      } else {
        want = refOp(op, a[i], b[i]);
      }
      ASSERT_EQ(inout[i], want) << dataTypeName(dt) << " " << reduceOpName(op) << " i=" << i;
      ASSERT_EQ(out3[i], want) << dataTypeName(dt) << " " << reduceOpName(op) << " i=" << i;
    }
  }
}

TEST(ReduceTest, Integers) {
  checkIntegers<uint8_t>(DataType::kUint8);
  checkIntegers<int8_t>(DataType::kInt8);
  checkIntegers<int16_t>(DataType::kInt16);
  checkIntegers<int32_t>(DataType::kInt32);
  checkIntegers<int64_t>(DataType::kInt64);
}

template <typename T>
void checkFloats(DataType dt) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> dist(-100, 100);
  const size_t n = 1001;
  for (ReduceOp op : kOps) {
    std::vector<T> a(n), b(n);
    for (size_t i = 0; i < n; ++i) {
      a[i] = static_cast<T>(dist(rng));
      b[i] = static_cast<T>(dist(rng));
    }
    std::vector<T> inout = a, out3(n), aliasA = a, aliasB = b;
    reduceInto(dt, op, inout.data(), b.data(), n);
    ReduceFn fn = reduceFunction(dt, op);
    fn(out3.data(), a.data(), b.data(), n);
    fn(aliasA.data(), aliasA.data(), b.data(), n);  // out aliases a
    fn(aliasB.data(), a.data(), aliasB.data(), n);  // out aliases b
    for (size_t i = 0; i < n; ++i) {
      const T want = refOp(op, a[i], b[i]);
      ASSERT_EQ(inout[i], want) << i;
      ASSERT_EQ(out3[i], want) << i;
      ASSERT_EQ(aliasA[i], want) << i;
      ASSERT_EQ(aliasB[i], want) << i;
    }
  }
}

TEST(ReduceTest, Float32AndFloat64) {
  checkFloats<float>(DataType::kFloat32);
  checkFloats<double>(DataType::kFloat64);
}

TEST(ReduceTest, MinMaxPropagateNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    std::vector<float> a = {nan, 1.0f, nan}, b = {1.0f, nan, nan};
    reduceInto(DataType::kFloat32, op, a.data(), b.data(), 3);
    for (float v : a) EXPECT_TRUE(std::isnan(v)) << reduceOpName(op);
  }
}

// The kernel gives the same bits whether its output is a separate buffer,
// its first operand or its second: ranks of one allreduce call it both ways
// on the same operands (ShmBackend's small chunks), and must all get the
// same result. NaNs with distinct payloads on both sides show which operand
// a loop kept; a vector loop and a scalar one for the aliased case have
// differed there (clang's, for float sum and product; GCC 12's agree).
template <typename T>
void checkAliasing(DataType dt, T (*make)(uint32_t payload, size_t i)) {
  const size_t n = 1003;  // a vector body and a tail
  for (ReduceOp op : kOps) {
    if (!reduceOpSupported(op, dt)) continue;
    std::vector<T> a(n), b(n);
    for (size_t i = 0; i < n; ++i) {
      a[i] = make(1, i);
      b[i] = make(2, i);
    }
    const ReduceFn f = reduceFunction(dt, op);
    std::vector<T> apart(n), intoA = a, intoB = b;
    f(apart.data(), a.data(), b.data(), n);
    f(intoA.data(), intoA.data(), b.data(), n);
    f(intoB.data(), a.data(), intoB.data(), n);
    EXPECT_EQ(std::memcmp(apart.data(), intoA.data(), n * sizeof(T)), 0)
        << dataTypeName(dt) << " " << reduceOpName(op) << ": out == a";
    EXPECT_EQ(std::memcmp(apart.data(), intoB.data(), n * sizeof(T)), 0)
        << dataTypeName(dt) << " " << reduceOpName(op) << ": out == b";
  }
}

TEST(ReduceTest, SameBitsWhetherTheOutputIsAnOperandOrNot) {
  // Every third element a NaN whose payload names its side, the others finite.
  checkAliasing<float>(DataType::kFloat32, [](uint32_t payload, size_t i) {
    uint32_t bits = 0x7fc00000u | payload;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return i % 3 == 0 ? f : static_cast<float>(i % 11) - 5.0f;
  });
  checkAliasing<double>(DataType::kFloat64, [](uint32_t payload, size_t i) {
    uint64_t bits = 0x7ff8000000000000ull | payload;
    double d;
    std::memcpy(&d, &bits, sizeof(d));
    return i % 3 == 0 ? d : static_cast<double>(i % 11) - 5.0;
  });
  // Half and bfloat16 quiet NaNs, and finite values near 1.
  checkAliasing<uint16_t>(DataType::kFloat16, [](uint32_t payload, size_t i) {
    return static_cast<uint16_t>(i % 3 == 0 ? 0x7e00 | payload : 0x3c00 + i % 11);
  });
  checkAliasing<uint16_t>(DataType::kBfloat16, [](uint32_t payload, size_t i) {
    return static_cast<uint16_t>(i % 3 == 0 ? 0x7fc0 | payload : 0x3f80 + i % 11);
  });
}

void checkLowFloat(DataType dt, uint16_t (*toLow)(float), float (*fromLow)(uint16_t)) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-50, 50);
  const size_t n = 257;
  for (ReduceOp op : kOps) {
    std::vector<uint16_t> a(n), b(n);
    for (size_t i = 0; i < n; ++i) {
      a[i] = toLow(dist(rng));
      b[i] = toLow(dist(rng));
    }
    std::vector<uint16_t> inout = a, out3(n);
    reduceInto(dt, op, inout.data(), b.data(), n);
    reduceFunction(dt, op)(out3.data(), a.data(), b.data(), n);
    for (size_t i = 0; i < n; ++i) {
      const uint16_t want = toLow(refOp(op, fromLow(a[i]), fromLow(b[i])));
      ASSERT_EQ(inout[i], want) << dataTypeName(dt) << " " << reduceOpName(op) << " " << i;
      ASSERT_EQ(out3[i], want);
    }
  }
}

TEST(ReduceTest, Float16AndBfloat16ComputedInFloat) {
  checkLowFloat(DataType::kFloat16, floatToHalf, halfToFloat);
  checkLowFloat(DataType::kBfloat16, floatToBfloat16, bfloat16ToFloat);
  // 2048 + 1 is not representable in half: rounds back to 2048 (ties to even).
  uint16_t x = floatToHalf(2048.0f), one = floatToHalf(1.0f);
  reduceInto(DataType::kFloat16, ReduceOp::kSum, &x, &one, 1);
  EXPECT_EQ(halfToFloat(x), 2048.0f);
}

TEST(ReduceTest, BoolIsLogical) {
  // Non-zero bytes other than 1 count as true; results are normalized.
  const std::vector<uint8_t> a = {0, 0, 1, 7}, b = {0, 2, 0, 1};
  const std::vector<uint8_t> orWant = {0, 1, 1, 1}, andWant = {0, 0, 0, 1};
  for (ReduceOp op : kOps) {
    if (!reduceOpSupported(op, DataType::kBool)) continue;
    std::vector<uint8_t> io = a;
    reduceInto(DataType::kBool, op, io.data(), b.data(), a.size());
    const bool isOr = op == ReduceOp::kSum || op == ReduceOp::kMax;
    EXPECT_EQ(io, isOr ? orWant : andWant) << reduceOpName(op);
  }
}

TEST(ReduceTest, ZeroCountAndUnsupported) {
  int32_t v = 5;
  reduceInto(DataType::kInt32, ReduceOp::kSum, &v, &v, 0);
  EXPECT_EQ(v, 5);
  EXPECT_EQ(reduceFunction(DataType::kCount, ReduceOp::kSum), nullptr);
  EXPECT_EQ(reduceFunction(DataType::kInt32, ReduceOp::kCount), nullptr);
  EXPECT_NE(reduceFunction(DataType::kBool, ReduceOp::kProduct), nullptr);
}

// ---------------------------------------------------------------- identity

template <typename T>
void checkIdentity(DataType dt) {
  for (ReduceOp op : kOps) {
    std::vector<T> id(9), v(9);
    fillIdentity(dt, op, id.data(), id.size());
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<T>(static_cast<int>(i) * 3 - 12);
    std::vector<T> r = v;
    reduceInto(dt, op, r.data(), id.data(), r.size());
    EXPECT_EQ(r, v) << dataTypeName(dt) << " " << reduceOpName(op);
  }
}

TEST(IdentityTest, AllTypes) {
  checkIdentity<uint8_t>(DataType::kUint8);
  checkIdentity<int8_t>(DataType::kInt8);
  checkIdentity<int16_t>(DataType::kInt16);
  checkIdentity<int32_t>(DataType::kInt32);
  checkIdentity<int64_t>(DataType::kInt64);
  checkIdentity<float>(DataType::kFloat32);
  checkIdentity<double>(DataType::kFloat64);

  float f;
  fillIdentity(DataType::kFloat32, ReduceOp::kMin, &f, 1);
  EXPECT_EQ(f, std::numeric_limits<float>::infinity());
  int64_t i64;
  fillIdentity(DataType::kInt64, ReduceOp::kMax, &i64, 1);
  EXPECT_EQ(i64, std::numeric_limits<int64_t>::lowest());

  uint16_t h[4];
  fillIdentity(DataType::kFloat16, ReduceOp::kProduct, h, 4);
  EXPECT_EQ(halfToFloat(h[3]), 1.0f);
  fillIdentity(DataType::kFloat16, ReduceOp::kMax, h, 1);
  EXPECT_EQ(halfToFloat(h[0]), -std::numeric_limits<float>::infinity());
  fillIdentity(DataType::kBfloat16, ReduceOp::kMin, h, 1);
  EXPECT_EQ(bfloat16ToFloat(h[0]), std::numeric_limits<float>::infinity());
  fillIdentity(DataType::kBfloat16, ReduceOp::kProduct, h, 1);
  EXPECT_EQ(bfloat16ToFloat(h[0]), 1.0f);

  uint8_t b[2];
  fillIdentity(DataType::kBool, ReduceOp::kProduct, b, 2);
  EXPECT_EQ(b[0], 1);
  fillIdentity(DataType::kBool, ReduceOp::kSum, b, 2);
  EXPECT_EQ(b[1], 0);
  fillIdentity(DataType::kBool, ReduceOp::kMin, b, 1);
  EXPECT_EQ(b[0], 1);
  fillIdentity(DataType::kBool, ReduceOp::kMax, b, 1);
  EXPECT_EQ(b[0], 0);
}

// ----------------------------------------------------------------- scaling

TEST(ScaleTest, IntegersRoundTowardZeroAndSaturate) {
  std::vector<int32_t> v = {7, -7, 5, -5, 0, 2147483647};
  scaleInPlace(DataType::kInt32, v.data(), v.size(), 1.0 / 2);
  EXPECT_EQ(v, (std::vector<int32_t>{3, -3, 2, -2, 0, 1073741823}));

  std::vector<int8_t> s = {100, -100, 3};
  scaleInPlace(DataType::kInt8, s.data(), s.size(), 2.0);
  EXPECT_EQ(s, (std::vector<int8_t>{127, -128, 6}));

  std::vector<uint8_t> u = {10, 255};
  std::vector<uint8_t> du(2);
  scaleCopy(DataType::kUint8, du.data(), u.data(), 2, -1.0);  // negative saturates at 0
  EXPECT_EQ(du, (std::vector<uint8_t>{0, 0}));
  scaleCopy(DataType::kUint8, du.data(), u.data(), 2, 1.0 / 3);
  EXPECT_EQ(du, (std::vector<uint8_t>{3, 85}));

  std::vector<int64_t> l = {9, -9, std::numeric_limits<int64_t>::max()};
  scaleInPlace(DataType::kInt64, l.data(), l.size(), 1.0 / 4);
  EXPECT_EQ(l[0], 2);
  EXPECT_EQ(l[1], -2);
  EXPECT_EQ(l[2], std::numeric_limits<int64_t>::max() / 4);  // 1/k: exact division
  std::vector<int64_t> big = {std::numeric_limits<int64_t>::max()};
  scaleInPlace(DataType::kInt64, big.data(), 1, 4.0);
  EXPECT_EQ(big[0], std::numeric_limits<int64_t>::max());

  // 49 * (1/49) is just below 1 in double; averaging must still give 1.
  std::vector<int32_t> avg = {49, -98, 48};
  scaleInPlace(DataType::kInt32, avg.data(), 3, 1.0 / 49);
  EXPECT_EQ(avg, (std::vector<int32_t>{1, -2, 0}));
  // Not of the form 1/k: multiply and truncate.
  std::vector<int32_t> m = {10, -10};
  scaleInPlace(DataType::kInt32, m.data(), 2, 0.75);
  EXPECT_EQ(m, (std::vector<int32_t>{7, -7}));

  std::vector<int16_t> w = {-32768, 1000};
  scaleInPlace(DataType::kInt16, w.data(), 2, 1.0 / 3);
  EXPECT_EQ(w, (std::vector<int16_t>{-10922, 333}));
}

TEST(ScaleTest, Floats) {
  std::vector<float> f(1003);
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i) - 500.0f;
  std::vector<float> g(f.size());
  scaleCopy(DataType::kFloat32, g.data(), f.data(), f.size(), 0.25);
  scaleInPlace(DataType::kFloat32, f.data(), f.size(), 0.25);
  for (size_t i = 0; i < f.size(); ++i) {
    EXPECT_EQ(f[i], (static_cast<float>(i) - 500.0f) * 0.25f);
    EXPECT_EQ(g[i], f[i]);
  }
  std::vector<double> d = {3.0, -1.5};
  scaleInPlace(DataType::kFloat64, d.data(), 2, 1.0 / 3);
  EXPECT_EQ(d[0], 3.0 * (1.0 / 3));
  EXPECT_EQ(d[1], -0.5);

  uint16_t h[2] = {floatToHalf(6.0f), floatToHalf(-3.0f)};
  scaleInPlace(DataType::kFloat16, h, 2, 0.5);
  EXPECT_EQ(halfToFloat(h[0]), 3.0f);
  EXPECT_EQ(halfToFloat(h[1]), -1.5f);
  uint16_t bf = floatToBfloat16(10.0f), bout = 0;
  scaleCopy(DataType::kBfloat16, &bout, &bf, 1, 0.1);
  EXPECT_EQ(bout, floatToBfloat16(10.0f * 0.1f));
}

TEST(ScaleTest, FactorOneIsCopyAndBool) {
  std::vector<int32_t> src = {1, 2, 3}, dst(3);
  scaleCopy(DataType::kInt32, dst.data(), src.data(), 3, 1.0);
  EXPECT_EQ(dst, src);
  scaleInPlace(DataType::kInt32, src.data(), 3, 1.0);
  EXPECT_EQ(src, (std::vector<int32_t>{1, 2, 3}));

  uint8_t b[3] = {0, 1, 9}, out[3];
  scaleCopy(DataType::kBool, out, b, 3, 2.0);
  EXPECT_EQ(out[0], 0);
  EXPECT_EQ(out[1], 1);
  EXPECT_EQ(out[2], 1);
  scaleCopy(DataType::kBool, out, b, 3, 0.5);
  EXPECT_EQ(out[2], 0);
}

}  // namespace
TEST(CopyBytes, EverySizeAndOffsetCopiesExactly) {
  // Around the vector loop's 4 KiB start and 64-byte step, at odd offsets.
  std::vector<unsigned char> src(200000), dst(200000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
  for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{4095}, size_t{4096}, size_t{4097},
                   size_t{4159}, size_t{65536 + 13}, size_t{150001}})
    for (size_t so : {size_t{0}, size_t{1}, size_t{16}, size_t{4080}})
      for (size_t d : {size_t{0}, size_t{3}, size_t{2048}}) {
        std::fill(dst.begin(), dst.end(), 0xAB);
        copyBytes(dst.data() + d, src.data() + so, n);
        ASSERT_TRUE(std::equal(src.begin() + so, src.begin() + so + n, dst.begin() + d))
            << n << " bytes from +" << so << " to +" << d;
        if (d > 0) {
          ASSERT_EQ(dst[d - 1], 0xAB) << "wrote before the destination";
        }
        ASSERT_EQ(dst[d + n], 0xAB) << "wrote past the destination";
      }
}

}  // namespace hora
