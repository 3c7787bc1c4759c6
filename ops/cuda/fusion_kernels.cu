// The batched scale-copy kernel and its launcher; see fusion_kernels_impl.h
// for the launch plan, the vectorization and the arithmetic.
#include "ops/cuda/fusion_kernels.h"
#include "ops/cuda/fusion_kernels_impl.h"

namespace hora {
namespace cuda {
namespace {

// Kernel parameters may take 32764 bytes (CUDA 12.1+, Volta+); an op is at
// most 16 bytes.
static_assert(sizeof(LargeBatch) + 16 <= 32764, "LargeBatch exceeds the kernel parameter limit");
static_assert(sizeof(SmallBatch) + 16 <= 4096, "SmallBatch should fit the classic 4 KiB limit");

// One block per chunk (see runChunk). The parameter block is read in place
// from the kernel parameter space (__grid_constant__), never copied to local
// memory, so indexing it by the block's entry is cheap.
template <typename Params, typename Op>
__global__ void __launch_bounds__(kThreads)
    batchedScaleCopyKernel(const __grid_constant__ Params params, const Op op) {
  runChunk(params, blockIdx.x, threadIdx.x, op);
}

// cudaLaunchKernel copies the parameters when it is called, so one block per
// thread and size can be refilled for every launch.
thread_local SmallBatch tlsSmall;
thread_local LargeBatch tlsLarge;

template <typename Params, typename Op>
int launchAll(Params& params, Op op, uint64_t unitsPerElement, const hora_gpu_copy_t* copies,
              size_t n, cudaStream_t stream) {
  return planBatches(copies, n, unitsPerElement, sizeof(typename Op::Storage), params,
                     [&](Params& p, uint32_t chunks) -> int {
                       void* args[] = {&p, &op};
                       const cudaError_t e = cudaLaunchKernel(
                           reinterpret_cast<const void*>(&batchedScaleCopyKernel<Params, Op>),
                           dim3(chunks), dim3(kThreads), args, 0, stream);
                       return static_cast<int>(e);
                     });
}

}  // namespace

int batchedScaleCopy(int32_t dtype, const hora_gpu_copy_t* copies, size_t n, double scale,
                     cudaStream_t stream) {
  return dispatchScaleCopy(dtype, scale, [&](auto op, uint64_t unitsPerElement) -> int {
    if (n <= kSmallBatchCopies) return launchAll(tlsSmall, op, unitsPerElement, copies, n, stream);
    return launchAll(tlsLarge, op, unitsPerElement, copies, n, stream);
  });
}

}  // namespace cuda
}  // namespace hora
