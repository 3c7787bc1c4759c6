// Test cases for batched_scale_copy, shared by cuda_plugin_test.cc (on a
// GPU) and fusion_emulation_test.cc (the kernel body run on the CPU): many
// copies of one dtype laid out in a source and a destination arena at
// assorted offsets (element-aligned or not, co-aligned to 16 bytes or not),
// with counts from 0 to several kernel chunks, and the expected destination
// arena computed with hora's CPU scaleCopy (core/reduce.h). Bytes between the
// copies keep a sentinel, so comparing whole arenas also catches stray writes.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/shapes_file.h"
#include "core/reduce.h"
#include "core/types.h"
#include "ops/gpu/hora_gpu_plugin.h"

namespace hora {
namespace gputest {

constexpr uint8_t kSentinel = 0xa5;

inline const char* dtypeName(int32_t dtype) {
  static const char* const kNames[] = {"uint8",   "int8",     "int16",   "int32",   "int64",
                                       "float16", "bfloat16", "float32", "float64", "bool"};
  return (dtype >= 0 && dtype <= 9) ? kNames[dtype] : "unknown";
}

inline size_t dtypeSize(int32_t dtype) { return dataTypeSize(static_cast<DataType>(dtype)); }

const std::vector<int32_t> kAllDtypes = {
    HORA_GPU_DTYPE_UINT8,   HORA_GPU_DTYPE_INT8,    HORA_GPU_DTYPE_INT16,    HORA_GPU_DTYPE_INT32,
    HORA_GPU_DTYPE_INT64,   HORA_GPU_DTYPE_FLOAT16, HORA_GPU_DTYPE_BFLOAT16, HORA_GPU_DTYPE_FLOAT32,
    HORA_GPU_DTYPE_FLOAT64, HORA_GPU_DTYPE_BOOL};

// 1.0 copies; 0.5, 1/3 and 1/8 are averaging factors (exact integer
// division); 2.5 saturates integers; -0.75 is a plain negative factor.
const std::vector<double> kScales = {1.0, 0.5, 1.0 / 3.0, 0.125, 2.5, -0.75};

// Counts around the vector width, the block size and the 32 KiB chunk: 40
// copies, more than the small parameter block holds.
const std::vector<size_t> kCounts = {0,  1,     2,  3,     5,   7,     8,     15,  16,   17,
                                     31, 33,    63, 64,    65,  127,   255,   256, 1000, 4097,
                                     0,  10007, 1,  70001, 3,   16384, 16385, 9,   4,    6,
                                     11, 12,    13, 14,    100, 101,   0,     2,   48,   8193};

struct Piece {
  size_t srcOffset;  // bytes into the source arena
  size_t dstOffset;  // bytes into the destination arena
  size_t count;      // elements
};

struct CopyCase {
  int32_t dtype = 0;
  size_t elem = 0;
  std::vector<uint8_t> src;  // source arena
  std::vector<uint8_t> dst;  // destination arena as it starts (sentinel bytes)
  std::vector<Piece> pieces;
};

// Random element bits without NaNs (a NaN's payload after a multiply is not
// specified the same way on the CPU and the GPU).
inline void fillRandom(int32_t dtype, uint8_t* p, size_t count, std::mt19937_64& rng) {
  const size_t elem = dtypeSize(dtype);
  for (size_t i = 0; i < count; ++i) {
    uint64_t bits = rng();
    switch (dtype) {
      case HORA_GPU_DTYPE_FLOAT16:
        if ((bits & 0x7c00) == 0x7c00 && (bits & 0x3ff) != 0) bits &= ~uint64_t{0x3ff};
        break;
      case HORA_GPU_DTYPE_BFLOAT16:
        if ((bits & 0x7f80) == 0x7f80 && (bits & 0x7f) != 0) bits &= ~uint64_t{0x7f};
        break;
      case HORA_GPU_DTYPE_FLOAT32:
        if ((bits & 0x7f800000) == 0x7f800000 && (bits & 0x7fffff) != 0)
          bits &= ~uint64_t{0x7fffff};
        break;
      case HORA_GPU_DTYPE_FLOAT64: {
        const uint64_t exp = uint64_t{0x7ff} << 52;
        const uint64_t man = (uint64_t{1} << 52) - 1;
        if ((bits & exp) == exp && (bits & man) != 0) bits &= ~man;
        break;
      }
      case HORA_GPU_DTYPE_BOOL: {
        static const uint8_t kBytes[] = {0, 1, 1, 0, 2, 255, 1, 0};
        bits = kBytes[bits & 7];
        break;
      }
      default:
        break;
    }
    std::memcpy(p + i * elem, &bits, elem);  // little endian: the low bytes
  }
}

// `elementMisaligned`: some copies start one byte off the element size
// (possible through a DLPack byte_offset), which takes the bytewise path.
inline CopyCase makeCase(int32_t dtype, const std::vector<size_t>& counts, uint64_t seed,
                         bool elementMisaligned = true) {
  CopyCase c;
  c.dtype = dtype;
  c.elem = dtypeSize(dtype);
  std::mt19937_64 rng(seed);
  size_t srcAt = 0;
  size_t dstAt = 0;
  auto align16 = [](size_t v) { return (v + 15) / 16 * 16; };
  for (size_t i = 0; i < counts.size(); ++i) {
    Piece p;
    const bool odd = elementMisaligned && c.elem > 1;
    p.srcOffset = align16(srcAt) + (i % 4) * c.elem + ((odd && i % 7 == 3) ? 1 : 0);
    p.dstOffset = align16(dstAt) + ((i * 3) % 5) * c.elem + ((odd && i % 5 == 2) ? 1 : 0);
    p.count = counts[i];
    srcAt = p.srcOffset + p.count * c.elem + 16;
    dstAt = p.dstOffset + p.count * c.elem + 16;
    c.pieces.push_back(p);
  }
  c.src.assign(align16(srcAt) + 16, kSentinel);
  c.dst.assign(align16(dstAt) + 16, kSentinel);
  for (const Piece& p : c.pieces) fillRandom(dtype, c.src.data() + p.srcOffset, p.count, rng);
  return c;
}

// The destination arena after hora's CPU scaleCopy of every piece. Goes
// through aligned temporaries: the CPU kernels expect element-aligned data.
inline std::vector<uint8_t> expectedDst(const CopyCase& c, double scale) {
  std::vector<uint8_t> out = c.dst;
  std::vector<uint64_t> in;
  std::vector<uint64_t> res;
  for (const Piece& p : c.pieces) {
    const size_t bytes = p.count * c.elem;
    in.assign(bytes / 8 + 1, 0);
    res.assign(bytes / 8 + 1, 0);
    std::memcpy(in.data(), c.src.data() + p.srcOffset, bytes);
    scaleCopy(static_cast<DataType>(c.dtype), res.data(), in.data(), p.count, scale);
    std::memcpy(out.data() + p.dstOffset, res.data(), bytes);
  }
  return out;
}

inline std::vector<hora_gpu_copy_t> copiesFor(const CopyCase& c, void* dstBase,
                                              const void* srcBase) {
  std::vector<hora_gpu_copy_t> copies;
  for (const Piece& p : c.pieces) {
    hora_gpu_copy_t k;
    k.dst = static_cast<char*>(dstBase) + p.dstOffset;
    k.src = static_cast<const char*>(srcBase) + p.srcOffset;
    k.count = p.count;
    copies.push_back(k);
  }
  return copies;
}

// First differing byte as "piece i element j byte b: got X want Y", or "".
inline std::string firstDifference(const CopyCase& c, const std::vector<uint8_t>& got,
                                   const std::vector<uint8_t>& want) {
  if (got.size() != want.size()) return "arena sizes differ";
  for (size_t b = 0; b < got.size(); ++b) {
    if (got[b] == want[b]) continue;
    std::ostringstream os;
    os << "byte " << b << " of the destination arena";
    for (size_t i = 0; i < c.pieces.size(); ++i) {
      const Piece& p = c.pieces[i];
      if (b >= p.dstOffset && b < p.dstOffset + p.count * c.elem) {
        const size_t e = (b - p.dstOffset) / c.elem;
        os << " (piece " << i << " of count " << p.count << ", element " << e << ";";
        // The element's bytes, high first: source, got, want.
        auto hex = [&](const uint8_t* at) {
          std::ostringstream h;
          h << std::hex;
          for (size_t k = c.elem; k-- > 0;) h << int(at[k] >> 4) << int(at[k] & 15);
          return h.str();
        };
        os << " in 0x" << hex(c.src.data() + p.srcOffset + e * c.elem) << ", got 0x"
           << hex(got.data() + p.dstOffset + e * c.elem) << ", want 0x"
           << hex(want.data() + p.dstOffset + e * c.elem) << ")";
      }
    }
    os << ": got " << int(got[b]) << ", want " << int(want[b]);
    return os.str();
  }
  return "";
}

// Element counts of the tensors in bench/resnet50_grad_shapes.txt ("64x3x7x7"
// per line, '#' comments).
inline std::vector<size_t> readShapeCounts(const std::string& path) {
  std::vector<hora_bench::TensorShape> shapes;
  std::string error;
  std::vector<size_t> counts;
  if (!hora_bench::readShapeFile(path, &shapes, &error)) return counts;  // empty: caller fails
  for (const auto& t : shapes) counts.push_back(t.count);
  return counts;
}

}  // namespace gputest
}  // namespace hora
