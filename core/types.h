// Core vocabulary types shared by every layer: element types, reduction ops,
// collective kinds and devices, with their byte sizes and printable names.
//
// Pure values, no state; safe from any thread. The numeric values of DataType,
// ReduceOp and CollectiveKind travel on the wire (core/message.h), so they are
// append-only.
#pragma once

#include <cstddef>
#include <cstdint>
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
const char* dataTypeName(DataType dt);    // "float32"
const char* reduceOpName(ReduceOp op);    // "sum"
const char* collectiveName(CollectiveKind k);  // "allreduce"
std::string deviceName(const Device& d);  // "cpu", "cuda:1"

bool isFloatingPoint(DataType dt);
// Whether `op` is defined for `dt` (e.g. bool supports min/max/sum-as-or only).
bool reduceOpSupported(ReduceOp op, DataType dt);

// "float32[1024,3]"
std::string describeTensor(DataType dt, const std::vector<int64_t>& shape);
int64_t numElements(const std::vector<int64_t>& shape);

}  // namespace hora
