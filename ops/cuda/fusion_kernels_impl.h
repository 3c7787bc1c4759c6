// The body of the batched scale-copy kernel, written once for two compilers:
// nvcc builds it into the __global__ kernel (fusion_kernels.cu), and the host
// compiler builds it into tests/gpu/fusion_emulation_test.cc, which runs every
// (block, thread) pair of a launch serially on the CPU. So the chunk planning,
// the alignment handling and the per-dtype arithmetic are checked against
// core/reduce.cc's scaleCopy on machines without a GPU.
//
// How a launch works:
//  1. The host (planBatches) turns the copies into entries of one launch's
//     parameter block (BatchParams, passed by value as a __grid_constant__
//     kernel parameter, so there is no descriptor upload and nothing to keep
//     alive across calls). Each entry is cut into chunks of kChunkBytes; entry
//     i owns the chunks [chunkBegin[i], chunkBegin[i + 1]). Two sizes of
//     block: SmallBatch (up to 32 copies, under 1 KiB, for single-tensor
//     copies) and LargeBatch (up to 1024 copies, ~28 KiB, for fused groups);
//     a longer list becomes several launches.
//  2. The grid has one block per chunk. A block finds its entry by binary
//     search over chunkBegin (uniform across the block) and copies its chunk.
//  3. Within a chunk, the widest word W in {16, 8, 4, 2, 1} bytes at which
//     dst and src are equally aligned is used: a few scalar elements until dst
//     is W-aligned, then W-byte loads/stores (kUnroll in flight per thread),
//     then a scalar tail. Element-misaligned pointers (possible through a
//     DLPack byte_offset) take a byte-assembling path instead of faulting.
//
// Arithmetic (the rules of core/reduce.h scaleCopy, bit for bit):
//  - scale == 1.0: a byte copy for every dtype (the dtype does not matter).
//  - float32: multiply in float by (float)scale; float64: in double.
//  - float16 / bfloat16: widen to float, multiply by (float)scale, round to
//    nearest-even.
//  - integers: multiply in double, truncate toward zero, saturate at the
//    type's range (NaN gives 0); a scale of exactly 1/k (k >= 2 integer) is
//    an exact integer division by k.
//  - bool: (x != 0) when trunc(scale) != 0, else 0.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ops/gpu/hora_gpu_plugin.h"

#define HORA_HD __host__ __device__ inline
// Only the device pass unrolls; the host compiler would warn about the pragma.
#ifdef __CUDA_ARCH__
#define HORA_UNROLL _Pragma("unroll")
#else
#define HORA_UNROLL
#endif

namespace hora {
namespace cuda {

constexpr unsigned kThreads = 256;       // threads per block
constexpr uint64_t kChunkBytes = 32768;  // bytes of one entry a block copies
constexpr unsigned kUnroll = 4;          // vector loads in flight per thread
constexpr uint32_t kSmallBatchCopies = 32;
constexpr uint32_t kMaxBatchCopies = 1024;
constexpr uint32_t kMaxBatchChunks = 1u << 30;  // grid size bound per launch

struct BatchEntry {
  char* dst;
  const char* src;
  uint64_t count;  // in units of the launch's storage type
};

// One launch's parameter block for up to kCapacity copies. The large one is
// ~28 KiB: kernels may take up to 32764 bytes of parameters since CUDA 12.1
// on Volta and later.
template <uint32_t kCapacity>
struct BatchParams {
  static constexpr uint32_t kCap = kCapacity;
  uint32_t n;                          // entries in use
  uint32_t chunkBegin[kCapacity + 1];  // strictly increasing, [0] == 0
  BatchEntry entry[kCapacity];
};
using SmallBatch = BatchParams<kSmallBatchCopies>;
using LargeBatch = BatchParams<kMaxBatchCopies>;

template <typename To, typename From>
HORA_HD To bitCast(From from) {
  static_assert(sizeof(To) == sizeof(From), "bitCast between types of different size");
  To to;
  memcpy(&to, &from, sizeof(to));
  return to;
}

// ------------------------------------------------------------- element ops
// Each op works on the storage bits (S) of one element.

struct CopyOp {
  using Storage = uint8_t;
  static constexpr bool kIdentity = true;
  HORA_HD uint8_t operator()(uint8_t x) const { return x; }
};

struct MulF32 {
  using Storage = uint32_t;
  static constexpr bool kIdentity = false;
  float factor;
  HORA_HD uint32_t operator()(uint32_t x) const {
    return bitCast<uint32_t>(bitCast<float>(x) * factor);
  }
};

struct MulF64 {
  using Storage = uint64_t;
  static constexpr bool kIdentity = false;
  double factor;
  HORA_HD uint64_t operator()(uint64_t x) const {
    return bitCast<uint64_t>(bitCast<double>(x) * factor);
  }
};

struct MulF16 {
  using Storage = uint16_t;
  static constexpr bool kIdentity = false;
  float factor;
  HORA_HD uint16_t operator()(uint16_t x) const {
    __half_raw in;
    in.x = x;
    const __half_raw out = __float2half_rn(__half2float(__half(in)) * factor);
    return out.x;
  }
};

struct MulBf16 {
  using Storage = uint16_t;
  static constexpr bool kIdentity = false;
  float factor;
  HORA_HD uint16_t operator()(uint16_t x) const {
    __nv_bfloat16_raw in;
    in.x = x;
    const __nv_bfloat16_raw out = __float2bfloat16_rn(__bfloat162float(__nv_bfloat16(in)) * factor);
    return out.x;
  }
};

// The range of an integer type without std::numeric_limits (its members are
// host functions as far as nvcc is concerned).
template <typename T>
struct IntRange {
  using U = std::make_unsigned_t<T>;
  static constexpr T kHigh =
      std::is_signed_v<T> ? static_cast<T>(static_cast<U>(~U{0}) >> 1) : static_cast<T>(~U{0});
  static constexpr T kLow = std::is_signed_v<T> ? static_cast<T>(-kHigh - 1) : T{0};
};

// Integer x * factor: in double, truncated toward zero, saturated.
template <typename T>
struct MulInt {
  using Storage = std::make_unsigned_t<T>;
  static constexpr bool kIdentity = false;
  double factor;
  HORA_HD Storage operator()(Storage x) const {
    constexpr T kLow = IntRange<T>::kLow;
    constexpr T kHigh = IntRange<T>::kHigh;
    const double r = ::trunc(static_cast<double>(static_cast<T>(x)) * factor);
    if (r != r) return 0;
    // static_cast<double>(kHigh) is 2^63 for int64: the first value that does not fit.
    if (r <= static_cast<double>(kLow)) return static_cast<Storage>(kLow);
    if (r >= static_cast<double>(kHigh)) return static_cast<Storage>(kHigh);
    return static_cast<Storage>(static_cast<T>(r));
  }
};

// Integer x / divisor (truncating), the exact form of a 1/k scale. divisor32
// is the divisor when 32-bit division gives the same result (types up to 32
// bits and a divisor that fits), else 0.
template <typename T>
struct DivInt {
  using Storage = std::make_unsigned_t<T>;
  static constexpr bool kIdentity = false;
  int64_t divisor;
  int32_t divisor32;
  HORA_HD Storage operator()(Storage x) const {
    const T v = static_cast<T>(x);
    if constexpr (sizeof(T) <= 4) {
      if (divisor32 != 0) {
        if constexpr (std::is_signed_v<T>) {
          return static_cast<Storage>(static_cast<T>(static_cast<int32_t>(v) / divisor32));
        } else {
          return static_cast<Storage>(static_cast<uint32_t>(v) / static_cast<uint32_t>(divisor32));
        }
      }
    }
    return static_cast<Storage>(static_cast<T>(static_cast<int64_t>(v) / divisor));
  }
};

struct BoolOp {
  using Storage = uint8_t;
  static constexpr bool kIdentity = false;
  uint8_t keep;  // 1 when trunc(scale) != 0
  HORA_HD uint8_t operator()(uint8_t x) const { return static_cast<uint8_t>((x != 0) & keep); }
};

// ------------------------------------------------------------ memory words

template <unsigned W>
struct WordOf;
template <>
struct WordOf<16> {
  using Type = uint4;
};
template <>
struct WordOf<8> {
  using Type = uint2;
};
template <>
struct WordOf<4> {
  using Type = uint32_t;
};
template <>
struct WordOf<2> {
  using Type = uint16_t;
};
template <>
struct WordOf<1> {
  using Type = uint8_t;
};

#ifndef __CUDA_ARCH__
// Host emulation only: word accesses that would be misaligned on the GPU
// (where they fault). The CPU emulation test expects none.
inline uint64_t hostMisalignedAccesses = 0;
#endif

// Aligned loads and stores. On the device a plain (vectorizable) access; on
// the host memcpy, which keeps the emulation free of strict-aliasing trouble,
// plus the alignment count above.
template <typename V>
HORA_HD V loadWord(const char* p) {
#ifdef __CUDA_ARCH__
  return *reinterpret_cast<const V*>(p);
#else
  if (reinterpret_cast<uintptr_t>(p) % sizeof(V) != 0) ++hostMisalignedAccesses;
  V v;
  memcpy(&v, p, sizeof(v));
  return v;
#endif
}
template <typename V>
HORA_HD void storeWord(char* p, V v) {
#ifdef __CUDA_ARCH__
  *reinterpret_cast<V*>(p) = v;
#else
  if (reinterpret_cast<uintptr_t>(p) % sizeof(V) != 0) ++hostMisalignedAccesses;
  memcpy(p, &v, sizeof(v));
#endif
}

template <typename V, typename Op>
HORA_HD V applyWord(V v, const Op& op) {
  if constexpr (Op::kIdentity) {
    return v;
  } else {
    using S = typename Op::Storage;
    constexpr unsigned kElems = sizeof(V) / sizeof(S);
    S e[kElems];
    memcpy(e, &v, sizeof(v));
    HORA_UNROLL
    for (unsigned i = 0; i < kElems; ++i) e[i] = op(e[i]);
    memcpy(&v, e, sizeof(v));
    return v;
  }
}

// ------------------------------------------------------------ chunk copies

// n elements at dst/src, both aligned to the element size and congruent
// modulo W (W a multiple of the element size). Thread `tid` of the block.
template <unsigned W, typename Op>
HORA_HD void copyWords(char* dst, const char* src, uint64_t n, unsigned tid, const Op& op) {
  using S = typename Op::Storage;
  using V = typename WordOf<W>::Type;
  constexpr uint64_t kElems = W / sizeof(S);
  const uint64_t mis = reinterpret_cast<uintptr_t>(dst) & (W - 1);
  uint64_t head = ((W - mis) & (W - 1)) / sizeof(S);
  if (head > n) head = n;
  const uint64_t words = (n - head) / kElems;
  const uint64_t tail = head + words * kElems;
  // Head and tail: fewer than kElems elements each.
  if (tid < head) {
    storeWord<S>(dst + tid * sizeof(S), op(loadWord<S>(src + tid * sizeof(S))));
  }
  if (tid < n - tail) {
    const uint64_t i = (tail + tid) * sizeof(S);
    storeWord<S>(dst + i, op(loadWord<S>(src + i)));
  }
  char* vd = dst + head * sizeof(S);
  const char* vs = src + head * sizeof(S);
  uint64_t w = tid;
  // Body: kUnroll independent loads in flight before the stores.
  for (; w + (kUnroll - 1) * kThreads < words; w += kUnroll * kThreads) {
    V r[kUnroll];
    HORA_UNROLL
    for (unsigned u = 0; u < kUnroll; ++u) r[u] = loadWord<V>(vs + (w + u * kThreads) * W);
    HORA_UNROLL
    for (unsigned u = 0; u < kUnroll; ++u) {
      storeWord<V>(vd + (w + u * kThreads) * W, applyWord(r[u], op));
    }
  }
  for (; w < words; w += kThreads) storeWord<V>(vd + w * W, applyWord(loadWord<V>(vs + w * W), op));
}

// Element-misaligned pointers: assemble each element from bytes (little
// endian). Slow, but a misaligned typed access would fault the context.
//
// The op's result passes through a volatile local before it is taken apart.
// Without it, ptxas (CUDA 13.0, sm_90) compiled "the low byte of the float16
// or bfloat16 bits that cvt.rn.f16.f32 produced" into F2I.U8.F16.TRUNC, a
// numeric conversion of the half value to an 8-bit integer: -2.0 (0xc000)
// stored 0x00 and 3.3 stored 0x03 as its low byte; the high byte was right
// and the integer ops were unaffected. Found on an H100 by
// SixteenBitFloatsScaleLikeTheCpuForEveryPattern (tests/gpu/cuda_plugin_test.cc);
// the CPU emulation cannot see it. With the volatile, ptxas keeps the result in
// a register and stores its low byte directly (checked with cuobjdump -sass on
// that machine): no local-memory round trip is left on this path.
template <typename Op>
HORA_HD void copyBytewise(char* dst, const char* src, uint64_t n, unsigned tid, const Op& op) {
  using S = typename Op::Storage;
  using Wide = std::conditional_t<(sizeof(S) > 4), uint64_t, uint32_t>;
  for (uint64_t i = tid; i < n; i += kThreads) {
    const unsigned char* in = reinterpret_cast<const unsigned char*>(src) + i * sizeof(S);
    Wide v = 0;
    HORA_UNROLL
    for (unsigned b = 0; b < sizeof(S); ++b) v |= static_cast<Wide>(in[b]) << (8 * b);
    volatile S result = op(static_cast<S>(v));
    const Wide r = static_cast<Wide>(result);
    unsigned char* out = reinterpret_cast<unsigned char*>(dst) + i * sizeof(S);
    HORA_UNROLL
    for (unsigned b = 0; b < sizeof(S); ++b) out[b] = static_cast<unsigned char>(r >> (8 * b));
  }
}

template <typename Op>
HORA_HD void copyRange(char* dst, const char* src, uint64_t n, unsigned tid, const Op& op) {
  using S = typename Op::Storage;
  const uintptr_t d = reinterpret_cast<uintptr_t>(dst);
  const uintptr_t s = reinterpret_cast<uintptr_t>(src);
  if (((d | s) & (sizeof(S) - 1)) != 0) return copyBytewise(dst, src, n, tid, op);
  const uintptr_t x = d ^ s;  // the low bits tell how far dst and src are co-aligned
  if ((x & 15) == 0) return copyWords<16>(dst, src, n, tid, op);
  if constexpr (sizeof(S) <= 8) {
    if ((x & 7) == 0) return copyWords<8>(dst, src, n, tid, op);
  }
  if constexpr (sizeof(S) <= 4) {
    if ((x & 3) == 0) return copyWords<4>(dst, src, n, tid, op);
  }
  if constexpr (sizeof(S) <= 2) {
    if ((x & 1) == 0) return copyWords<2>(dst, src, n, tid, op);
  }
  copyWords<sizeof(S)>(dst, src, n, tid, op);
}

// What block `chunk`, thread `tid` of a launch does.
template <typename Params, typename Op>
HORA_HD void runChunk(const Params& p, uint32_t chunk, unsigned tid, const Op& op) {
  using S = typename Op::Storage;
  constexpr uint64_t kChunkUnits = kChunkBytes / sizeof(S);
  // The entry owning this chunk: the last i with chunkBegin[i] <= chunk.
  uint32_t lo = 0;
  uint32_t hi = p.n - 1;
  while (lo < hi) {
    const uint32_t mid = (lo + hi + 1) / 2;
    if (p.chunkBegin[mid] <= chunk) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const BatchEntry& e = p.entry[lo];
  const uint64_t begin = static_cast<uint64_t>(chunk - p.chunkBegin[lo]) * kChunkUnits;
  const uint64_t rest = e.count - begin;
  const uint64_t n = rest < kChunkUnits ? rest : kChunkUnits;
  copyRange(e.dst + begin * sizeof(S), e.src + begin * sizeof(S), n, tid, op);
}

// ------------------------------------------------------------ host planning

// Results of planning and dispatch other than a launch's own (positive)
// error code.
constexpr int kPlanUnknownDtype = -1;
constexpr int kPlanCountOverflow = -2;

// Fills `p` with the copies (count * unitsPerElement units each; units of
// `unitBytes`), skipping empty ones and splitting the list into launches of at
// most Params::kCap entries and kMaxBatchChunks chunks. Calls
// launch(p, chunks) for each launch and stops at the first nonzero result,
// which it returns. Returns 0 when everything was launched, or
// kPlanCountOverflow when a count in bytes does not fit 64 bits.
template <typename Params, typename LaunchFn>
int planBatches(const hora_gpu_copy_t* copies, size_t n, uint64_t unitsPerElement,
                uint64_t unitBytes, Params& p, LaunchFn&& launch) {
  const uint64_t chunkUnits = kChunkBytes / unitBytes;
  uint64_t chunks = 0;
  p.n = 0;
  auto flush = [&]() -> int {
    if (p.n == 0) return 0;
    p.chunkBegin[p.n] = static_cast<uint32_t>(chunks);
    const int rc = launch(p, static_cast<uint32_t>(chunks));
    p.n = 0;
    chunks = 0;
    return rc;
  };
  for (size_t i = 0; i < n; ++i) {
    if (copies[i].count > std::numeric_limits<uint64_t>::max() / unitsPerElement) {
      return kPlanCountOverflow;
    }
    const uint64_t units = static_cast<uint64_t>(copies[i].count) * unitsPerElement;
    uint64_t done = 0;
    while (done < units) {
      if (p.n == Params::kCap || chunks == kMaxBatchChunks) {
        if (const int rc = flush()) return rc;
      }
      const uint64_t room = (kMaxBatchChunks - chunks) * chunkUnits;
      const uint64_t piece = units - done < room ? units - done : room;
      BatchEntry& e = p.entry[p.n];
      e.dst = static_cast<char*>(copies[i].dst) + done * unitBytes;
      e.src = static_cast<const char*>(copies[i].src) + done * unitBytes;
      e.count = piece;
      p.chunkBegin[p.n] = static_cast<uint32_t>(chunks);
      ++p.n;
      chunks += (piece + chunkUnits - 1) / chunkUnits;
      done += piece;
    }
  }
  return flush();
}

// Bytes per element of a HORA_GPU_DTYPE_*, 0 for an unknown code.
inline size_t dtypeBytes(int32_t dtype) {
  switch (dtype) {
    case HORA_GPU_DTYPE_UINT8:
    case HORA_GPU_DTYPE_INT8:
    case HORA_GPU_DTYPE_BOOL:
      return 1;
    case HORA_GPU_DTYPE_INT16:
    case HORA_GPU_DTYPE_FLOAT16:
    case HORA_GPU_DTYPE_BFLOAT16:
      return 2;
    case HORA_GPU_DTYPE_INT32:
    case HORA_GPU_DTYPE_FLOAT32:
      return 4;
    case HORA_GPU_DTYPE_INT64:
    case HORA_GPU_DTYPE_FLOAT64:
      return 8;
    default:
      return 0;
  }
}

// k when factor is 1/k for an integer k >= 2, else 0: core/reduce.cc's
// exactDivisor, repeated here so device results match the CPU's exactly.
inline int64_t exactDivisor(double factor) {
  if (!(factor > 0.0) || factor >= 1.0) return 0;
  const double inv = 1.0 / factor;
  const double k = std::round(inv);
  if (k < 2.0 || k > 9.0e15 || std::fabs(inv - k) > 1e-9 * k) return 0;
  return static_cast<int64_t>(k);
}

template <typename T, typename RunFn>
int dispatchInt(double scale, RunFn&& run) {
  if (const int64_t k = exactDivisor(scale)) {
    const bool fits32 = sizeof(T) <= 4 && k <= std::numeric_limits<int32_t>::max();
    return run(DivInt<T>{k, fits32 ? static_cast<int32_t>(k) : 0}, uint64_t{1});
  }
  return run(MulInt<T>{scale}, uint64_t{1});
}

// Picks the op for (dtype, scale) and calls run(op, unitsPerElement), where
// the op's Storage is the unit. Returns run's result, or kPlanUnknownDtype.
template <typename RunFn>
int dispatchScaleCopy(int32_t dtype, double scale, RunFn&& run) {
  const size_t bytes = dtypeBytes(dtype);
  if (bytes == 0) return kPlanUnknownDtype;
  if (scale == 1.0) return run(CopyOp{}, uint64_t{bytes});
  switch (dtype) {
    case HORA_GPU_DTYPE_FLOAT32:
      return run(MulF32{static_cast<float>(scale)}, uint64_t{1});
    case HORA_GPU_DTYPE_FLOAT64:
      return run(MulF64{scale}, uint64_t{1});
    case HORA_GPU_DTYPE_FLOAT16:
      return run(MulF16{static_cast<float>(scale)}, uint64_t{1});
    case HORA_GPU_DTYPE_BFLOAT16:
      return run(MulBf16{static_cast<float>(scale)}, uint64_t{1});
    case HORA_GPU_DTYPE_UINT8:
      return dispatchInt<uint8_t>(scale, run);
    case HORA_GPU_DTYPE_INT8:
      return dispatchInt<int8_t>(scale, run);
    case HORA_GPU_DTYPE_INT16:
      return dispatchInt<int16_t>(scale, run);
    case HORA_GPU_DTYPE_INT32:
      return dispatchInt<int32_t>(scale, run);
    case HORA_GPU_DTYPE_INT64:
      return dispatchInt<int64_t>(scale, run);
    case HORA_GPU_DTYPE_BOOL:
      return run(BoolOp{static_cast<uint8_t>(std::trunc(scale) != 0.0 ? 1 : 0)}, uint64_t{1});
    default:
      return kPlanUnknownDtype;
  }
}

}  // namespace cuda
}  // namespace hora
