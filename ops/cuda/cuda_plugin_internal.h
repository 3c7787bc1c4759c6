// What the two halves of libhora_cuda.so share: the handle structs behind the
// opaque handles of ops/gpu/hora_gpu_plugin.h, the error and device helpers
// (defined in cuda_plugin.cc), and the communicator and collective entries of
// the table (defined in nccl_comm.cc). Included by cuda_plugin.cc and
// nccl_comm.cc only. The names live in hora::cuda so both files can link to
// them; none is exported (hora_cuda.map exports hora_gpu_plugin_get alone).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "ops/gpu/hora_gpu_plugin.h"

namespace hora {
namespace cuda {

inline constexpr uint32_t kStreamMagic = 0x68537472;  // "hStr"
inline constexpr uint32_t kEventMagic = 0x68457674;   // "hEvt"
inline constexpr uint32_t kCommMagic = 0x68436f6d;    // "hCom"
inline constexpr uint32_t kDeadMagic = 0xdeadbeef;

}  // namespace cuda
}  // namespace hora

struct hora_gpu_stream_s {
  uint32_t magic = hora::cuda::kStreamMagic;
  int device = 0;
  cudaStream_t stream = nullptr;
};

struct hora_gpu_event_s {
  uint32_t magic = hora::cuda::kEventMagic;
  int device = 0;
  cudaEvent_t event = nullptr;
};

struct hora_gpu_comm_s {
  uint32_t magic = hora::cuda::kCommMagic;
  int device = 0;
  int rank = 0;
  int nranks = 0;
  int64_t timeoutMs = 0;  // bound for every wait on this communicator; <= 0: none
  std::mutex mu;
  std::condition_variable idle;  // signalled when calls drops to 0
  ncclComm_t comm = nullptr;     // guarded by mu; null once aborted or destroyed
  int calls = 0;                 // guarded by mu: NCCL calls in flight on comm
  std::atomic<bool> aborted{false};
};

namespace hora {
namespace cuda {

// ---- errors (cuda_plugin.cc). Each writes one line to this thread's
// last_error buffer and returns 1.

__attribute__((format(printf, 1, 2))) int fail(const char* fmt, ...);
// "<call with arguments> failed: cudaErrorX (description)"
__attribute__((format(printf, 2, 3))) int failCuda(cudaError_t e, const char* fmt, ...);
// "<call with arguments> failed: NCCL error N (string); NCCL: <last error>"
__attribute__((format(printf, 2, 3))) int failNccl(ncclResult_t r, const char* fmt, ...);

const char* dtypeName(int32_t dtype);  // HORA_GPU_DTYPE_* -> "float32", ...
const char* opName(int32_t op);        // HORA_GPU_OP_* -> "sum", ...

// ---- helpers (cuda_plugin.cc)

// Makes `device` current on this thread (cheap when it already is).
int useDevice(int device, const char* who);

bool validStream(hora_gpu_stream_t s);
bool validEvent(hora_gpu_event_t e);
bool validComm(hora_gpu_comm_t c);

int64_t nowMs();  // CLOCK_MONOTONIC
void sleepUs(long us);

// ---- communicators and collectives (nccl_comm.cc): the table's comm_* and
// collective entries, with the contracts of ops/gpu/hora_gpu_plugin.h.

int commUniqueId(void* idOut);
int commInit(int device, int nranks, int rank, const void* id, int64_t timeoutMs,
             hora_gpu_comm_t* out);
int commAbort(hora_gpu_comm_t c);
int commDestroy(hora_gpu_comm_t c);
int commAsyncError(hora_gpu_comm_t c, int* failed);
int allreduce(const void* in, void* out, size_t count, int32_t dtype, int32_t op, hora_gpu_comm_t c,
              hora_gpu_stream_t s);
int broadcast(void* data, size_t count, int32_t dtype, int root, hora_gpu_comm_t c,
              hora_gpu_stream_t s);
int allgatherv(const void* in, void* out, const size_t* counts, int32_t dtype, hora_gpu_comm_t c,
               hora_gpu_stream_t s);
int alltoallv(const void* in, const size_t* send, void* out, const size_t* recv, int32_t dtype,
              hora_gpu_comm_t c, hora_gpu_stream_t s);
int reducescatter(void* inout, const size_t* counts, int32_t dtype, int32_t op, hora_gpu_comm_t c,
                  hora_gpu_stream_t s);
int p2pGroup(const hora_gpu_p2p_op_t* ops, size_t n, hora_gpu_comm_t c, hora_gpu_stream_t s);

}  // namespace cuda
}  // namespace hora
