// Element kernels: reduction, scaling and identity fill over flat buffers of
// any hora DataType, plus IEEE half / bfloat16 <-> float conversions.
//
// Used by the runtime (averaging = sum + scaleInPlace, fusion-buffer copies
// with scaleCopy, padding with fillIdentity) and by backends (the reduce
// function handed to Gloo, the local step of ring reduce-scatter). Pure
// functions without state: safe from any thread. They never allocate and never
// throw. An unsupported (dtype, op) pair or an out-of-range enum is a caller
// bug: the kernels then leave the buffer untouched (reduceFunction returns
// nullptr), they do not crash.
//
// Semantics shared by every kernel:
//  - kAverage is treated as kSum here; the caller scales afterwards.
//  - float16 / bfloat16 are computed in float and rounded to nearest-even.
//  - Integer sum and product wrap around (two's complement), computed in
//    unsigned arithmetic so that overflow is defined behaviour.
//  - bool (one byte, any non-zero byte is true; results are 0 or 1):
//    sum and max are logical or, product and min are logical and.
//  - Floating min/max propagate NaN (either operand NaN gives NaN).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/types.h"

namespace hora {

// IEEE 754 binary16. Conversions to float are exact; conversions from float
// round to nearest-even, overflow to +-inf, keep NaN a NaN (quiet).
float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);
// bfloat16: the upper 16 bits of a float, rounded to nearest-even.
float bfloat16ToFloat(uint16_t b);
uint16_t floatToBfloat16(float f);

// inout[i] = op(inout[i], in[i]) for i < n. `inout` and `in` must not overlap.
void reduceInto(DataType dt, ReduceOp op, void* inout, const void* in, size_t n);

// out[i] = op(a[i], b[i]); `out` may be the same pointer as `a` or `b` (the
// other operand must not partially overlap it), with the same bits as into a
// separate buffer, NaN payloads included: ranks of one allreduce call it both
// ways on the same operands and must agree. Matches the signature of
// gloo::AllreduceOptions::Func, so it can be handed to setReduceFunction.
using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);
// The kernel for (dt, op), or nullptr when the pair is not supported.
ReduceFn reduceFunction(DataType dt, ReduceOp op);

// memcpy for the data planes' bulk copies (pack, unpack, gather, scatter)
// between user tensors and shared memory. Why not memcpy: glibc copies large
// blocks with `rep movsb`, which on this project's AMD EPYC machine runs
// 3-5x slower for some relative page offsets of source and destination, and
// a fused group's offsets in the shared slots against the tensors' own
// addresses hit them: the ResNet-50 step's 62 large gradients (sizes that
// are multiples of 4 KiB) took 45-56 ms to unpack instead of 7-9
// (bench/results/2026-11-25-inline-allreduce.md). A plain 16-byte vector
// loop is as fast as memcpy at good offsets and keeps that speed at the bad
// ones. `dst` and `src` must not overlap.
void copyBytes(void* dst, const void* src, size_t bytes);

// data[i] *= factor. Floats: float32 and the 16-bit types multiply in float
// (factor rounded to float), float64 in double. Integers: multiply in double
// and round toward zero (the semantics of integer averaging in Horovod and
// torch's integer true-divide-then-cast), saturating at the type's range;
// int64 values beyond 2^53 lose precision. A factor of exactly 1/k (k an
// integer >= 2, as averaging over k ranks passes) is applied as the exact
// integer division x / k, so multiples of k never come out one short. bool: true stays true when
// trunc(factor) != 0, as for an integer 1. factor == 1.0 is a no-op.
void scaleInPlace(DataType dt, void* data, size_t n, double factor);
// dst[i] = src[i] * factor in one pass, same rules as scaleInPlace; with
// factor == 1.0 a plain memcpy. dst and src must not overlap (or be equal).
void scaleCopy(DataType dt, void* dst, const void* src, size_t n, double factor);

// Fills with the identity of `op`: 0 for sum/average, 1 for product, the
// largest value (+inf for floats) for min, the lowest (-inf) for max; for
// bool, false for sum/max (or) and true for product/min (and).
void fillIdentity(DataType dt, ReduceOp op, void* data, size_t n);

}  // namespace hora
