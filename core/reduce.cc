#include "core/reduce.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#endif

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

// The elementwise loops below are the hot path of every Gloo reduction. GCC's
// -O2 cost model ("very-cheap") refuses to vectorize loops that need an
// epilogue, so the kernels opt into the dynamic cost model explicitly.
#if defined(__GNUC__) && !defined(__clang__)
#define HORA_VECTORIZE __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic")))
#else
#define HORA_VECTORIZE
#endif
#define HORA_RESTRICT __restrict__
// Before a loop whose output may be exactly one of its inputs (never a
// partial overlap): no iteration depends on another, so the compiler need
// not version the loop on a runtime overlap check. Why it matters: a vector
// and a scalar version may keep different NaN payloads (clang's do for float
// sum and product), and an in-place rank would then get other bits than its
// peers (ShmBackend's small chunks alias on ranks 0 and 1 only).
#if defined(__clang__)
#define HORA_NO_OVERLAP_VERSIONS _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define HORA_NO_OVERLAP_VERSIONS _Pragma("GCC ivdep")
#else
#define HORA_NO_OVERLAP_VERSIONS
#endif

namespace hora {

// ---------------------------------------------------------------- conversions

float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {
      // Subnormal: mant * 2^-24 is exact in float.
      float f = static_cast<float>(mant) * 5.9604644775390625e-8f;
      std::memcpy(&bits, &f, sizeof(bits));
      bits |= sign;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf, or NaN keeping its payload
  } else {
    bits = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
  }
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

uint16_t floatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint32_t o;
  if (x >= (127u + 16u) << 23) {
    // |f| >= 2^16, inf or NaN. Finite values in [65520, 2^16) round to inf in
    // the normal path below (the rounding carry reaches the exponent).
    o = x > 0x7f800000u ? (0x7e00u | ((x >> 13) & 0x3ffu)) : 0x7c00u;
  } else if (x < (113u << 23)) {
    // Result is subnormal or zero: let the FPU do the round-to-nearest-even by
    // adding a magic number that aligns the half's last mantissa bit with the
    // float's last bit (requires the default rounding mode).
    const uint32_t magicBits = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    float magic, v;
    std::memcpy(&magic, &magicBits, sizeof(magic));
    std::memcpy(&v, &x, sizeof(v));
    v += magic;
    uint32_t vb;
    std::memcpy(&vb, &v, sizeof(vb));
    o = vb - magicBits;
  } else {
    const uint32_t mantOdd = (x >> 13) & 1u;
    x += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + mantOdd;
    o = x >> 13;
  }
  return static_cast<uint16_t>(o | (sign >> 16));
}

float bfloat16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

uint16_t floatToBfloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((x >> 16) | 0x0040u);  // quiet NaN, never inf
  }
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

namespace {

// ------------------------------------------------------------- element types

// Tag types for the two 16-bit float formats (stored as uint16_t).
struct Half {
  static float load(uint16_t v) { return halfToFloat(v); }
  static uint16_t store(float v) { return floatToHalf(v); }
};
struct Bf16 {
  static float load(uint16_t v) { return bfloat16ToFloat(v); }
  static uint16_t store(float v) { return floatToBfloat16(v); }
};

// Unsigned type wide enough that T's arithmetic cannot hit signed-int UB
// through integer promotion (uint16 * uint16 promotes to int).
template <typename T>
using Wide = std::conditional_t<(sizeof(T) < 4), uint32_t, std::make_unsigned_t<T>>;

template <typename T>
inline T wrapAdd(T a, T b) {
  return static_cast<T>(static_cast<Wide<T>>(a) + static_cast<Wide<T>>(b));
}
template <typename T>
inline T wrapMul(T a, T b) {
  return static_cast<T>(static_cast<Wide<T>>(a) * static_cast<Wide<T>>(b));
}
// NaN-propagating for floats; plain for integers (x != x is false there).
template <typename T>
inline T minOf(T a, T b) {
  return (a != a || a < b) ? a : b;  // NOLINT: a != a detects NaN
}
template <typename T>
inline T maxOf(T a, T b) {
  return (a != a || a > b) ? a : b;  // NOLINT
}

struct SumF {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      return a + b;
    } else {
      return wrapAdd(a, b);
    }
  }
};
struct ProdF {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      return a * b;
    } else {
      return wrapMul(a, b);
    }
  }
};
struct MinF {
  template <typename T>
  T operator()(T a, T b) const {
    return minOf(a, b);
  }
};
struct MaxF {
  template <typename T>
  T operator()(T a, T b) const {
    return maxOf(a, b);
  }
};
struct OrF {
  uint8_t operator()(uint8_t a, uint8_t b) const { return (a != 0) | (b != 0); }
};
struct AndF {
  uint8_t operator()(uint8_t a, uint8_t b) const { return (a != 0) & (b != 0); }
};

// ------------------------------------------------------------------- kernels

template <typename T, typename F>
HORA_VECTORIZE void loop2(T* HORA_RESTRICT io, const T* HORA_RESTRICT in, size_t n) {
  F f;
  for (size_t i = 0; i < n; ++i) io[i] = f(io[i], in[i]);
}

// No restrict: out may equal a or b (exactly; never a partial overlap). One
// loop for both cases (HORA_NO_OVERLAP_VERSIONS), vectorized either way.
template <typename T, typename F>
HORA_VECTORIZE void loop3(T* out, const T* a, const T* b, size_t n) {
  F f;
  HORA_NO_OVERLAP_VERSIONS
  for (size_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
}

template <typename Fmt, typename F>
void loop2Low(uint16_t* HORA_RESTRICT io, const uint16_t* HORA_RESTRICT in, size_t n) {
  F f;
  for (size_t i = 0; i < n; ++i) io[i] = Fmt::store(f(Fmt::load(io[i]), Fmt::load(in[i])));
}

template <typename Fmt, typename F>
void loop3Low(uint16_t* out, const uint16_t* a, const uint16_t* b, size_t n) {
  F f;
  HORA_NO_OVERLAP_VERSIONS
  for (size_t i = 0; i < n; ++i) out[i] = Fmt::store(f(Fmt::load(a[i]), Fmt::load(b[i])));
}

template <typename T, typename F>
void fn2(void* io, const void* in, size_t n) {
  loop2<T, F>(static_cast<T*>(io), static_cast<const T*>(in), n);
}
template <typename T, typename F>
void fn3(void* out, const void* a, const void* b, size_t n) {
  loop3<T, F>(static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n);
}
template <typename Fmt, typename F>
void fn2Low(void* io, const void* in, size_t n) {
  loop2Low<Fmt, F>(static_cast<uint16_t*>(io), static_cast<const uint16_t*>(in), n);
}
template <typename Fmt, typename F>
void fn3Low(void* out, const void* a, const void* b, size_t n) {
  loop3Low<Fmt, F>(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(a),
                   static_cast<const uint16_t*>(b), n);
}

using Fn2 = void (*)(void*, const void*, size_t);

struct Kernels {
  Fn2 two = nullptr;
  ReduceFn three = nullptr;
};

template <typename F>
Kernels pickForOp(DataType dt) {
  switch (dt) {
    case DataType::kUint8:
      return {fn2<uint8_t, F>, fn3<uint8_t, F>};
    case DataType::kInt8:
      return {fn2<int8_t, F>, fn3<int8_t, F>};
    case DataType::kInt16:
      return {fn2<int16_t, F>, fn3<int16_t, F>};
    case DataType::kInt32:
      return {fn2<int32_t, F>, fn3<int32_t, F>};
    case DataType::kInt64:
      return {fn2<int64_t, F>, fn3<int64_t, F>};
    case DataType::kFloat16:
      return {fn2Low<Half, F>, fn3Low<Half, F>};
    case DataType::kBfloat16:
      return {fn2Low<Bf16, F>, fn3Low<Bf16, F>};
    case DataType::kFloat32:
      return {fn2<float, F>, fn3<float, F>};
    case DataType::kFloat64:
      return {fn2<double, F>, fn3<double, F>};
    default:
      return {};
  }
}

Kernels pick(DataType dt, ReduceOp op) {
  if (dt == DataType::kBool) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage:
      case ReduceOp::kMax:
        return {fn2<uint8_t, OrF>, fn3<uint8_t, OrF>};
      case ReduceOp::kProduct:
      case ReduceOp::kMin:
        return {fn2<uint8_t, AndF>, fn3<uint8_t, AndF>};
      default:
        return {};
    }
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return pickForOp<SumF>(dt);
    case ReduceOp::kProduct:
      return pickForOp<ProdF>(dt);
    case ReduceOp::kMin:
      return pickForOp<MinF>(dt);
    case ReduceOp::kMax:
      return pickForOp<MaxF>(dt);
    default:
      return {};
  }
}

// ------------------------------------------------------------------- scaling

// Integer scaling: multiply in double, truncate toward zero, saturate (a
// double outside T's range converted to T would be undefined behaviour).
template <typename T>
inline T scaleInt(T v, double factor) {
  double r = std::trunc(static_cast<double>(v) * factor);
  if (r != r) return T(0);
  constexpr double lo = static_cast<double>(std::numeric_limits<T>::lowest());
  // For int64 the max is not representable; 2^63 as a double is the bound.
  constexpr double hi = static_cast<double>(std::numeric_limits<T>::max());
  if (r <= lo) return std::numeric_limits<T>::lowest();
  if (r >= hi) return std::numeric_limits<T>::max();
  return static_cast<T>(r);
}

// Averaging passes factor = 1/k, and x * (1/k) in double can land just below
// the exact quotient (49 * (1/49) < 1), which truncation would turn into an
// off-by-one. A factor that is 1/k for an integer k is therefore applied as an
// exact integer division (C++ '/' also truncates toward zero). Returns 0 when
// the factor is not of that form.
int64_t exactDivisor(double factor) {
  if (!(factor > 0.0) || factor >= 1.0) return 0;
  const double inv = 1.0 / factor;
  const double k = std::round(inv);
  if (k < 2.0 || k > 9.0e15 || std::fabs(inv - k) > 1e-9 * k) return 0;
  return static_cast<int64_t>(k);
}

template <typename T>
void scaleIntLoop(T* dst, const T* src, size_t n, double factor) {
  if (const int64_t k = exactDivisor(factor)) {
    if constexpr (std::is_same_v<T, int64_t>) {
      for (size_t i = 0; i < n; ++i) dst[i] = src[i] / k;
    } else {
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<T>(static_cast<int64_t>(src[i]) / k);
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) dst[i] = scaleInt(src[i], factor);
}

template <typename T>
HORA_VECTORIZE void scaleFloatLoop(T* HORA_RESTRICT dst, const T* HORA_RESTRICT src, size_t n,
                                   T factor) {
  for (size_t i = 0; i < n; ++i) dst[i] = src[i] * factor;
}
template <typename T>
HORA_VECTORIZE void scaleFloatInPlace(T* data, size_t n, T factor) {
  for (size_t i = 0; i < n; ++i) data[i] *= factor;
}

template <typename Fmt>
void scaleLowLoop(uint16_t* dst, const uint16_t* src, size_t n, float factor) {
  for (size_t i = 0; i < n; ++i) dst[i] = Fmt::store(Fmt::load(src[i]) * factor);
}

void scaleBoolLoop(uint8_t* dst, const uint8_t* src, size_t n, double factor) {
  const uint8_t keep = std::trunc(factor) != 0.0 ? 1 : 0;
  for (size_t i = 0; i < n; ++i) dst[i] = (src[i] != 0) & keep;
}

// dst may equal src (the in-place entry point); the loops read element i
// before writing it, so that is safe for the scalar loops.
void scaleAny(DataType dt, void* dst, const void* src, size_t n, double factor) {
  switch (dt) {
    case DataType::kUint8:
      return scaleIntLoop(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n, factor);
    case DataType::kInt8:
      return scaleIntLoop(static_cast<int8_t*>(dst), static_cast<const int8_t*>(src), n, factor);
    case DataType::kInt16:
      return scaleIntLoop(static_cast<int16_t*>(dst), static_cast<const int16_t*>(src), n, factor);
    case DataType::kInt32:
      return scaleIntLoop(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n, factor);
    case DataType::kInt64:
      return scaleIntLoop(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n, factor);
    case DataType::kFloat16:
      return scaleLowLoop<Half>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n,
                                static_cast<float>(factor));
    case DataType::kBfloat16:
      return scaleLowLoop<Bf16>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n,
                                static_cast<float>(factor));
    case DataType::kFloat32:
      if (dst == src) {
        return scaleFloatInPlace(static_cast<float*>(dst), n, static_cast<float>(factor));
      }
      return scaleFloatLoop(static_cast<float*>(dst), static_cast<const float*>(src), n,
                            static_cast<float>(factor));
    case DataType::kFloat64:
      if (dst == src) return scaleFloatInPlace(static_cast<double*>(dst), n, factor);
      return scaleFloatLoop(static_cast<double*>(dst), static_cast<const double*>(src), n, factor);
    case DataType::kBool:
      return scaleBoolLoop(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n, factor);
    default:
      return;
  }
}

template <typename T>
void fillWith(void* data, size_t n, T value) {
  T* p = static_cast<T*>(data);
  for (size_t i = 0; i < n; ++i) p[i] = value;
}

template <typename T>
void fillNumeric(void* data, size_t n, ReduceOp op) {
  using L = std::numeric_limits<T>;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return fillWith<T>(data, n, T(0));
    case ReduceOp::kProduct:
      return fillWith<T>(data, n, T(1));
    case ReduceOp::kMin:
      return fillWith<T>(data, n, L::has_infinity ? L::infinity() : L::max());
    case ReduceOp::kMax:
      return fillWith<T>(data, n, L::has_infinity ? -L::infinity() : L::lowest());
    default:
      return;
  }
}

// 16-bit float identities as bit patterns: {zero, one, +inf, -inf}.
void fillLow(void* data, size_t n, ReduceOp op, uint16_t one, uint16_t posInf, uint16_t negInf) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return fillWith<uint16_t>(data, n, 0);
    case ReduceOp::kProduct:
      return fillWith<uint16_t>(data, n, one);
    case ReduceOp::kMin:
      return fillWith<uint16_t>(data, n, posInf);
    case ReduceOp::kMax:
      return fillWith<uint16_t>(data, n, negInf);
    default:
      return;
  }
}

}  // namespace

// ------------------------------------------------------------------ public API

void reduceInto(DataType dt, ReduceOp op, void* inout, const void* in, size_t n) {
  if (n == 0) return;
  Kernels k = pick(dt, op);
  if (k.two != nullptr) k.two(inout, in, n);
}

ReduceFn reduceFunction(DataType dt, ReduceOp op) { return pick(dt, op).three; }

void scaleInPlace(DataType dt, void* data, size_t n, double factor) {
  if (n == 0 || factor == 1.0) return;
  scaleAny(dt, data, data, n, factor);
}

void copyBytes(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__) || defined(_M_X64)
  // Below a few KiB memcpy does not use `rep movsb`.
  if (bytes >= 4096) {
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    size_t i = 0;
    for (; i + 64 <= bytes; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    if (i < bytes) std::memcpy(d + i, s + i, bytes - i);
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

void scaleCopy(DataType dt, void* dst, const void* src, size_t n, double factor) {
  if (n == 0) return;
  if (factor == 1.0) {
    if (dst != src) copyBytes(dst, src, n * dataTypeSize(dt));
    return;
  }
  scaleAny(dt, dst, src, n, factor);
}

void fillIdentity(DataType dt, ReduceOp op, void* data, size_t n) {
  switch (dt) {
    case DataType::kUint8:
      return fillNumeric<uint8_t>(data, n, op);
    case DataType::kInt8:
      return fillNumeric<int8_t>(data, n, op);
    case DataType::kInt16:
      return fillNumeric<int16_t>(data, n, op);
    case DataType::kInt32:
      return fillNumeric<int32_t>(data, n, op);
    case DataType::kInt64:
      return fillNumeric<int64_t>(data, n, op);
    case DataType::kFloat32:
      return fillNumeric<float>(data, n, op);
    case DataType::kFloat64:
      return fillNumeric<double>(data, n, op);
    case DataType::kFloat16:
      return fillLow(data, n, op, 0x3c00, 0x7c00, 0xfc00);
    case DataType::kBfloat16:
      return fillLow(data, n, op, 0x3f80, 0x7f80, 0xff80);
    case DataType::kBool:
      switch (op) {
        case ReduceOp::kProduct:
        case ReduceOp::kMin:
          return fillWith<uint8_t>(data, n, 1);
        case ReduceOp::kSum:
        case ReduceOp::kAverage:
        case ReduceOp::kMax:
          return fillWith<uint8_t>(data, n, 0);
        default:
          return;
      }
    default:
      return;
  }
}

}  // namespace hora
