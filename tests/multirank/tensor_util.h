// Typed access to raw tensor bytes for tests: write/read any hora dtype as a
// double, and exact reference reductions.
#pragma once

#include <hora/hora.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/reduce.h"
#include "core/types.h"

namespace htest {

struct DT {
  hora::DataType dt;
  DLDataType dl;
  const char* name;
};

inline std::vector<DT> allDtypes() {
  using hora::DataType;
  return {{DataType::kUint8, {kDLUInt, 8, 1}, "uint8"},
          {DataType::kInt8, {kDLInt, 8, 1}, "int8"},
          {DataType::kInt16, {kDLInt, 16, 1}, "int16"},
          {DataType::kInt32, {kDLInt, 32, 1}, "int32"},
          {DataType::kInt64, {kDLInt, 64, 1}, "int64"},
          {DataType::kFloat16, {kDLFloat, 16, 1}, "float16"},
          {DataType::kBfloat16, {kDLBfloat, 16, 1}, "bfloat16"},
          {DataType::kFloat32, {kDLFloat, 32, 1}, "float32"},
          {DataType::kFloat64, {kDLFloat, 64, 1}, "float64"},
          {DataType::kBool, {6, 8, 1}, "bool"}};
}

inline void writeVal(hora::DataType dt, void* base, int64_t i, double v) {
  using hora::DataType;
  switch (dt) {
    case DataType::kUint8:
      static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v);
      break;
    case DataType::kInt8:
      static_cast<int8_t*>(base)[i] = static_cast<int8_t>(v);
      break;
    case DataType::kInt16:
      static_cast<int16_t*>(base)[i] = static_cast<int16_t>(v);
      break;
    case DataType::kInt32:
      static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v);
      break;
    case DataType::kInt64:
      static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v);
      break;
    case DataType::kFloat16:
      static_cast<uint16_t*>(base)[i] = hora::floatToHalf(static_cast<float>(v));
      break;
    case DataType::kBfloat16:
      static_cast<uint16_t*>(base)[i] = hora::floatToBfloat16(static_cast<float>(v));
      break;
    case DataType::kFloat32:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      break;
    case DataType::kFloat64:
      static_cast<double*>(base)[i] = v;
      break;
    case DataType::kBool:
      static_cast<uint8_t*>(base)[i] = v != 0;
      break;
    default:
      break;
  }
}

inline double readVal(hora::DataType dt, const void* base, int64_t i) {
  using hora::DataType;
  switch (dt) {
    case DataType::kUint8:
      return static_cast<const uint8_t*>(base)[i];
    case DataType::kInt8:
      return static_cast<const int8_t*>(base)[i];
    case DataType::kInt16:
      return static_cast<const int16_t*>(base)[i];
    case DataType::kInt32:
      return static_cast<const int32_t*>(base)[i];
    case DataType::kInt64:
      return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case DataType::kFloat16:
      return hora::halfToFloat(static_cast<const uint16_t*>(base)[i]);
    case DataType::kBfloat16:
      return hora::bfloat16ToFloat(static_cast<const uint16_t*>(base)[i]);
    case DataType::kFloat32:
      return static_cast<const float*>(base)[i];
    case DataType::kFloat64:
      return static_cast<const double*>(base)[i];
    case DataType::kBool:
      return static_cast<const uint8_t*>(base)[i] != 0;
    default:
      return 0;
  }
}

inline bool isSigned(hora::DataType dt) {
  return dt != hora::DataType::kUint8 && dt != hora::DataType::kBool;
}

// Small integer inputs keep every sum and product exact in every dtype.
inline double inputValue(int rank, int64_t i, hora::ReduceOp op, hora::DataType dt) {
  if (dt == hora::DataType::kBool) return ((i + rank) % 3) == 0;
  if (op == hora::ReduceOp::kProduct) return 1 + ((i + rank) % 2);
  double v = static_cast<double>(((i * 7 + rank * 3) % 5) + 1);
  if ((op == hora::ReduceOp::kMin || op == hora::ReduceOp::kMax) && isSigned(dt)) v -= 3;
  return v;
}

inline double reference(int size, int64_t i, hora::ReduceOp op, hora::DataType dt,
                        const std::vector<int>& contributors = {}) {
  std::vector<int> ranks = contributors;
  if (ranks.empty())
    for (int r = 0; r < size; ++r) ranks.push_back(r);
  double acc = inputValue(ranks[0], i, op, dt);
  for (size_t k = 1; k < ranks.size(); ++k) {
    double v = inputValue(ranks[k], i, op, dt);
    switch (op) {
      case hora::ReduceOp::kSum:
      case hora::ReduceOp::kAverage:
        acc += v;
        break;
      case hora::ReduceOp::kProduct:
        acc *= v;
        break;
      case hora::ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case hora::ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
      default:
        break;
    }
  }
  if (dt == hora::DataType::kBool) return acc != 0;
  if (op == hora::ReduceOp::kAverage) {
    double k = static_cast<double>(ranks.size());
    if (!hora::isFloatingPoint(dt)) return static_cast<double>(static_cast<int64_t>(acc / k));
    return acc / k;
  }
  return acc;
}

inline double tolerance(hora::DataType dt, hora::ReduceOp op) {
  if (op != hora::ReduceOp::kAverage) return 0;
  if (dt == hora::DataType::kFloat16) return 5e-3;
  if (dt == hora::DataType::kBfloat16) return 2e-2;
  if (dt == hora::DataType::kFloat32) return 1e-6;
  return 1e-12;
}

}  // namespace htest
