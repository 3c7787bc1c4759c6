#include "core/types.h"

#include <algorithm>

namespace hora {

size_t dataTypeSize(DataType dt) {
  switch (dt) {
    case DataType::kUint8:
    case DataType::kInt8:
    case DataType::kBool:
      return 1;
    case DataType::kInt16:
    case DataType::kFloat16:
    case DataType::kBfloat16:
      return 2;
    case DataType::kInt32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kFloat64:
      return 8;
    case DataType::kCount:
      break;
  }
  return 0;
}

const char* dataTypeName(DataType dt) {
  switch (dt) {
    case DataType::kUint8:
      return "uint8";
    case DataType::kInt8:
      return "int8";
    case DataType::kInt16:
      return "int16";
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
    case DataType::kFloat16:
      return "float16";
    case DataType::kBfloat16:
      return "bfloat16";
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
    case DataType::kBool:
      return "bool";
    case DataType::kCount:
      break;
  }
  return "unknown-dtype";
}

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAverage:
      return "average";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kProduct:
      return "product";
    case ReduceOp::kCount:
      break;
  }
  return "unknown-op";
}

const char* collectiveName(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kAllreduce:
      return "allreduce";
    case CollectiveKind::kAllgather:
      return "allgather";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kAlltoall:
      return "alltoall";
    case CollectiveKind::kReducescatter:
      return "reducescatter";
    case CollectiveKind::kBarrier:
      return "barrier";
    case CollectiveKind::kJoin:
      return "join";
    case CollectiveKind::kCount:
      break;
  }
  return "unknown-collective";
}

std::string deviceName(const Device& d) {
  if (d.kind == DeviceKind::kCpu) return "cpu";
  return "cuda:" + std::to_string(d.index);
}

bool isFloatingPoint(DataType dt) {
  return dt == DataType::kFloat16 || dt == DataType::kBfloat16 || dt == DataType::kFloat32 ||
         dt == DataType::kFloat64;
}

bool reduceOpSupported(ReduceOp op, DataType dt) {
  if (dt == DataType::kBool) {
    // Sum on bool is logical or, product is logical and; average is meaningless.
    return op != ReduceOp::kAverage;
  }
  return op < ReduceOp::kCount && dt < DataType::kCount;
}

std::string describeTensor(DataType dt, const std::vector<int64_t>& shape) {
  std::string s = dataTypeName(dt);
  s += "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  s += "]";
  return s;
}

int64_t numElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int shapeOverflowDim(const std::vector<int64_t>& shape, size_t elementSize) {
  int64_t bytes = static_cast<int64_t>(elementSize);
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) return static_cast<int>(i);
    if (__builtin_mul_overflow(bytes, std::max<int64_t>(shape[i], 1), &bytes) ||
        bytes > kMaxTensorBytes)
      return static_cast<int>(i);
  }
  return -1;
}

}  // namespace hora
