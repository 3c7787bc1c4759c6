// Backend checks shared by the backend unit tests (Gloo, shm): ranks as
// threads over one World, small-integer data so every dtype's result is exact,
// and the allreduceGather contract (every element packed once before it is
// unpacked once, with its final value); allgatherv and reducescatter results.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.h"
#include "core/reduce.h"
#include "core/types.h"

namespace hora {
namespace {

using World = std::vector<std::unique_ptr<Backend>>;

// memcmp == 0 that accepts n == 0 with null pointers (empty vectors).
inline bool sameBytes(const void* a, const void* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n) == 0;
}

// Runs fn(rank, backend) on one thread per rank and joins them.
void runRanks(World& world, const std::function<void(int, Backend&)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < static_cast<int>(world.size()); ++r) {
    threads.emplace_back([&, r] { fn(r, *world[r]); });
  }
  for (auto& t : threads) t.join();
}

bool isSigned(DataType dt) { return dt != DataType::kUint8 && dt != DataType::kBool; }

// Writes integer v as element i of a buffer of type dt (exact for our ranges).
void storeInt(DataType dt, void* p, size_t i, int64_t v) {
  switch (dt) {
    case DataType::kUint8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
      break;
    case DataType::kInt8:
      static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v);
      break;
    case DataType::kInt16:
      static_cast<int16_t*>(p)[i] = static_cast<int16_t>(v);
      break;
    case DataType::kInt32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case DataType::kInt64:
      static_cast<int64_t*>(p)[i] = v;
      break;
    case DataType::kFloat16:
      static_cast<uint16_t*>(p)[i] = floatToHalf(static_cast<float>(v));
      break;
    case DataType::kBfloat16:
      static_cast<uint16_t*>(p)[i] = floatToBfloat16(static_cast<float>(v));
      break;
    case DataType::kFloat32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DataType::kFloat64:
      static_cast<double*>(p)[i] = static_cast<double>(v);
      break;
    case DataType::kBool:
      static_cast<uint8_t*>(p)[i] = v != 0;
      break;
    default:
      break;
  }
}

// The value rank r contributes at element i for `op`, and the reduction of
// all ranks' values (computed in int64; bool sum/max = or, product/min = and).
int64_t inputValue(DataType dt, ReduceOp op, int r, size_t i) {
  const int64_t base = static_cast<int64_t>((i * 7 + static_cast<size_t>(r) * 3) % 4);
  if (dt == DataType::kBool) return base % 2;
  if (op == ReduceOp::kProduct) {
    int64_t v = 1 + base % 2;
    return isSigned(dt) && (i + r) % 5 == 0 ? -v : v;
  }
  return isSigned(dt) ? base - 2 : base;
}

int64_t expectedValue(DataType dt, ReduceOp op, int size, size_t i) {
  int64_t acc = inputValue(dt, op, 0, i);
  for (int r = 1; r < size; ++r) {
    const int64_t v = inputValue(dt, op, r, i);
    switch (op) {
      case ReduceOp::kSum:
        acc = dt == DataType::kBool ? (acc | v) : acc + v;
        break;
      case ReduceOp::kProduct:
        acc = dt == DataType::kBool ? (acc & v) : acc * v;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
      default:
        break;
    }
  }
  return acc;
}

const DataType kAllTypes[] = {DataType::kUint8,    DataType::kInt8,    DataType::kInt16,
                              DataType::kInt32,    DataType::kInt64,   DataType::kFloat16,
                              DataType::kBfloat16, DataType::kFloat32, DataType::kFloat64,
                              DataType::kBool};
const ReduceOp kReduceOps[] = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct};

void checkAllreduce(World& world, DataType dt, ReduceOp op, size_t count) {
  const int size = static_cast<int>(world.size());
  const size_t es = dataTypeSize(dt);
  std::vector<uint8_t> want(count * es);
  for (size_t i = 0; i < count; ++i) storeInt(dt, want.data(), i, expectedValue(dt, op, size, i));
  runRanks(world, [&](int r, Backend& b) {
    std::vector<uint8_t> buf(count * es);
    for (size_t i = 0; i < count; ++i) storeInt(dt, buf.data(), i, inputValue(dt, op, r, i));
    Status s = b.allreduce(buf.data(), count, dt, op);
    ASSERT_TRUE(s.isOk()) << s.toString();
    EXPECT_TRUE(buf == want) << "rank " << r << " " << dataTypeName(dt) << " " << reduceOpName(op)
                             << " count " << count;
  });
}

// allreduceGather: every rank's input lives in its own buffer and is copied
// into the staging buffer only through pack; results leave only through
// unpack. Counts every element's packs and unpacks and checks that each
// element is packed before it is unpacked and unpacked with its final value.
// How checkAllreduceGather calls the backend: allreduceGather, or
// allreduceGatherCombine with a combine function that combines (counting the
// elements it was given) or that refuses every time (the backend packs).
enum class CombineMode { kNone, kCombine, kRefuse };

// Returns how many elements every rank together combined (instead of, or as
// well as, packing them); `packedAndCombined` (optional): how many of those
// the same rank also packed.
inline size_t checkAllreduceGather(World& world, DataType dt, ReduceOp op, size_t count,
                                   CombineMode mode = CombineMode::kNone,
                                   size_t* packedAndCombined = nullptr) {
  const int size = static_cast<int>(world.size());
  const size_t es = dataTypeSize(dt);
  std::vector<uint8_t> want(count * es);
  for (size_t i = 0; i < count; ++i) storeInt(dt, want.data(), i, expectedValue(dt, op, size, i));
  std::atomic<size_t> combinedTotal{0}, bothTotal{0};
  runRanks(world, [&](int r, Backend& b) {
    std::vector<uint8_t> in(count * es), staging(count * es + 1), out(count * es + 1, 0xab);
    for (size_t i = 0; i < count; ++i) storeInt(dt, in.data(), i, inputValue(dt, op, r, i));
    std::vector<uint8_t> packed(count, 0), combined(count, 0), unpacked(count, 0);
    const auto caller = std::this_thread::get_id();
    bool badRange = false, badThread = false, unpackBeforePack = false, wrongFinal = false;
    auto pack = [&](size_t lo, size_t hi, void* dst) {
      badThread |= std::this_thread::get_id() != caller;
      if (lo >= hi || hi > count) {
        badRange = true;
        return;
      }
      for (size_t i = lo; i < hi; ++i) ++packed[i];
      std::memcpy(dst, in.data() + lo * es, (hi - lo) * es);
    };
    const ReduceFn reduce = reduceFunction(dt, op);
    auto combine = [&](size_t lo, size_t hi, void* dst, const void* other, bool otherFirst) {
      badThread |= std::this_thread::get_id() != caller;
      if (mode == CombineMode::kRefuse) return false;
      if (lo >= hi || hi > count) {
        badRange = true;
        return true;
      }
      for (size_t i = lo; i < hi; ++i) ++combined[i];
      const uint8_t* own = in.data() + lo * es;
      if (otherFirst) {
        reduce(dst, other, own, hi - lo);
      } else {
        reduce(dst, own, other, hi - lo);
      }
      return true;
    };
    auto unpack = [&](size_t lo, size_t hi, const void* src) {
      badThread |= std::this_thread::get_id() != caller;
      if (lo >= hi || hi > count) {
        badRange = true;
        return;
      }
      for (size_t i = lo; i < hi; ++i) {
        ++unpacked[i];
        unpackBeforePack |= packed[i] + combined[i] == 0;
      }
      wrongFinal |= !sameBytes(src, want.data() + lo * es, (hi - lo) * es);
      std::memcpy(out.data() + lo * es, src, (hi - lo) * es);
    };
    Status s = mode == CombineMode::kNone
                   ? b.allreduceGather(staging.data(), count, dt, op, pack, unpack)
                   : b.allreduceGatherCombine(staging.data(), count, dt, op, pack, unpack, combine);
    ASSERT_TRUE(s.isOk()) << s.toString();
    const std::string where = "rank " + std::to_string(r) + " " + dataTypeName(dt) + " " +
                              reduceOpName(op) + " count " + std::to_string(count) + " mode " +
                              std::to_string(static_cast<int>(mode));
    EXPECT_FALSE(badRange) << where;
    EXPECT_FALSE(badThread) << where;
    EXPECT_FALSE(unpackBeforePack) << where;
    EXPECT_FALSE(wrongFinal) << where;
    size_t inputOnce = 0, unpackedOnce = 0, combinedHere = 0, bothHere = 0;
    for (size_t i = 0; i < count; ++i) {
      inputOnce += packed[i] <= 1 && combined[i] <= 1 && packed[i] + combined[i] >= 1;
      unpackedOnce += unpacked[i] == 1;
      combinedHere += combined[i];
      bothHere += packed[i] == 1 && combined[i] == 1;
    }
    combinedTotal += combinedHere;
    bothTotal += bothHere;
    EXPECT_EQ(inputOnce, count) << where
                                << ": every element packed at most once, combined at most "
                                   "once, and one of the two";
    EXPECT_EQ(unpackedOnce, count) << where;
    EXPECT_TRUE(sameBytes(out.data(), want.data(), want.size())) << where;
    EXPECT_EQ(out[count * es], 0xab) << where;
  });
  if (packedAndCombined) *packedAndCombined = bothTotal.load();
  return combinedTotal.load();
}

// allgatherv with rank r contributing counts[r] int32 values r*1000000+i,
// out of place and in place (the input already at its place in the output).
inline void checkAllgatherv(World& world, const std::vector<size_t>& counts) {
  const int size = static_cast<int>(world.size());
  size_t total = 0;
  for (size_t c : counts) total += c;
  for (bool inPlace : {false, true}) {
    runRanks(world, [&](int r, Backend& b) {
      std::vector<int32_t> out(total, -1);
      size_t offset = 0;
      for (int q = 0; q < r; ++q) offset += counts[q];
      std::vector<int32_t> in(counts[r]);
      for (size_t i = 0; i < counts[r]; ++i) in[i] = r * 1000000 + static_cast<int32_t>(i);
      if (inPlace) std::copy(in.begin(), in.end(), out.begin() + offset);
      const void* src = inPlace ? static_cast<const void*>(out.data() + offset)
                                : (in.empty() ? nullptr : in.data());
      Status s = b.allgatherv(src, out.data(), counts, DataType::kInt32);
      ASSERT_TRUE(s.isOk()) << s.toString();
      size_t k = 0;
      for (int q = 0; q < size; ++q)
        for (size_t i = 0; i < counts[q]; ++i, ++k)
          ASSERT_EQ(out[k], q * 1000000 + static_cast<int32_t>(i))
              << "rank " << r << (inPlace ? " in place" : "") << " [" << k << "]";
    });
  }
}

// Rank r's region of a reducescatter (counts[r] elements at their offset)
// must hold the reduction over every rank; other regions are free to change.
inline void checkReducescatter(World& world, const std::vector<size_t>& counts, DataType dt,
                               ReduceOp op) {
  const int size = static_cast<int>(world.size());
  const size_t es = dataTypeSize(dt);
  size_t total = 0;
  for (size_t c : counts) total += c;
  runRanks(world, [&](int r, Backend& b) {
    std::vector<uint8_t> buf(total * es + 1);  // +1: never a null pointer
    for (size_t i = 0; i < total; ++i) storeInt(dt, buf.data(), i, inputValue(dt, op, r, i));
    Status s = b.reducescatter(buf.data(), counts, dt, op);
    ASSERT_TRUE(s.isOk()) << s.toString();
    size_t offset = 0;
    for (int q = 0; q < r; ++q) offset += counts[q];
    std::vector<uint8_t> want(counts[r] * es);
    for (size_t i = 0; i < counts[r]; ++i) {
      storeInt(dt, want.data(), i, expectedValue(dt, op, size, offset + i));
    }
    EXPECT_TRUE(sameBytes(buf.data() + offset * es, want.data(), want.size()))
        << "rank " << r << " " << dataTypeName(dt) << " " << reduceOpName(op);
  });
}

// alltoallv where rank s sends split(s, d) int64 values (s << 40) | (d << 20)
// | i (i < split < 2^20) to rank d; every rank checks what it received, in
// rank order.
inline void checkAlltoallv(World& world, const std::function<int64_t(int, int)>& split) {
  const int size = static_cast<int>(world.size());
  runRanks(world, [&](int r, Backend& b) {
    std::vector<int64_t> send(size), recv(size);
    std::vector<int64_t> in;
    for (int d = 0; d < size; ++d) {
      send[d] = split(r, d);
      recv[d] = split(d, r);
      for (int64_t i = 0; i < send[d]; ++i)
        in.push_back((int64_t{r} << 40) | (int64_t{d} << 20) | i);
    }
    int64_t recvTotal = 0;
    for (int64_t v : recv) recvTotal += v;
    std::vector<int64_t> out(recvTotal, -1);
    Status s = b.alltoallv(in.empty() ? nullptr : in.data(), send,
                           out.empty() ? nullptr : out.data(), recv, DataType::kInt64);
    ASSERT_TRUE(s.isOk()) << s.toString();
    size_t k = 0;
    for (int src = 0; src < size; ++src)
      for (int64_t i = 0; i < recv[src]; ++i, ++k)
        ASSERT_EQ(out[k], (int64_t{src} << 40) | (int64_t{r} << 20) | i)
            << "rank " << r << " from " << src;
  });
}

}  // namespace
}  // namespace hora
