// The fusion buffer's pack/unpack copies on a CUDA stream: hora's
// batched_scale_copy (ops/gpu/hora_gpu_plugin.h) in as few kernel launches as
// possible. Called by cuda_plugin.cc on an executor thread; the kernel itself
// and its launch plan are described in fusion_kernels_impl.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ops/gpu/hora_gpu_plugin.h"

namespace hora {
namespace cuda {

// Enqueues copies[i].dst[j] = copies[i].src[j] * scale (j < count, elements
// of `dtype`) on `stream`, whose device must be current. One launch for up to
// 1024 non-empty copies (more launches for longer lists); nothing for empty
// ones. Returns 0; a cudaError_t (> 0) from cudaLaunchKernel; or a negative
// kPlan* code from fusion_kernels_impl.h (unknown dtype, count overflow).
// Thread-safe: the launch parameter block is per thread.
int batchedScaleCopy(int32_t dtype, const hora_gpu_copy_t* copies, size_t n, double scale,
                     cudaStream_t stream);

}  // namespace cuda
}  // namespace hora
