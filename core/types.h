// Core vocabulary types shared by every layer: element types, reduction ops,
// collective kinds and devices, with their byte sizes and printable names.
//
// Pure values, no state; safe from any thread. The numeric values of DataType,
// ReduceOp and CollectiveKind travel on the wire (core/message.h), so they are
// append-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace hora {

enum class DataType : uint8_t {
  kUint8 = 0,
  kInt8 = 1,
  kInt16 = 2,
  kInt32 = 3,
  kInt64 = 4,
  kFloat16 = 5,
  kBfloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBool = 9,
  kCount = 10,
};

enum class ReduceOp : uint8_t {
  kSum = 0,
  kAverage = 1,
  kMin = 2,
  kMax = 3,
  kProduct = 4,
  kCount = 5,
};

enum class CollectiveKind : uint8_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kAlltoall = 3,
  kReducescatter = 4,
  kBarrier = 5,
  kJoin = 6,
  kCount = 7,
};

// Where a tensor's memory lives. Only kCpu is served by the core; kCuda
// requests fail with kNotSupported until a GPU backend is loaded.
enum class DeviceKind : uint8_t { kCpu = 0, kCuda = 1 };

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int32_t index = 0;
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

size_t dataTypeSize(DataType dt);
const char* dataTypeName(DataType dt);         // "float32"
const char* reduceOpName(ReduceOp op);         // "sum"
const char* collectiveName(CollectiveKind k);  // "allreduce"
std::string deviceName(const Device& d);       // "cpu", "cuda:1"

bool isFloatingPoint(DataType dt);
// Whether `op` is defined for `dt` (e.g. bool supports min/max/sum-as-or only).
bool reduceOpSupported(ReduceOp op, DataType dt);

// "float32[1024,3]"
std::string describeTensor(DataType dt, const std::vector<int64_t>& shape);
// The product of the dimensions; only for shapes checked with shapeOverflowDim().
int64_t numElements(const std::vector<int64_t>& shape);

// The largest tensor hora handles, in bytes: 2^63 - 1 (int64_t's maximum, which is also
// ptrdiff_t's on the 64-bit platforms hora runs on; the smaller of the two otherwise). Every
// element count, byte size and byte offset within such a tensor (rows, splits, reducescatter
// blocks, the positions the data planes compute) then fits in int64_t, size_t and ptrdiff_t,
// so no size computation on a checked shape can overflow. No real tensor comes near it (no
// 64-bit machine addresses 2^63 bytes); what exceeds it is a corrupt shape.
constexpr int64_t kMaxTensorBytes =
    std::numeric_limits<std::ptrdiff_t>::max() < std::numeric_limits<int64_t>::max()
        ? static_cast<int64_t>(std::numeric_limits<std::ptrdiff_t>::max())
        : std::numeric_limits<int64_t>::max();

// Whether a tensor of `shape` with elements of `elementSize` bytes is within kMaxTensorBytes:
// returns -1 if it is, else the index of the first dimension that is negative or at which the
// running byte size (elementSize times the dimensions so far) goes past kMaxTensorBytes. Zero
// dimensions count as 1 here, so every partial product of a checked shape fits too (the
// elements of one row of an empty [0, n, m] tensor, for example). All arithmetic is checked.
int shapeOverflowDim(const std::vector<int64_t>& shape, size_t elementSize);

}  // namespace hora
