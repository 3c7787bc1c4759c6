// CollectivePath: how the executor runs one agreed group on one kind of
// memory. The Executor picks the path once per group from the device in the
// response (every rank sees the same response, so every rank takes the same
// path): CpuPath (cpu_path.h) for host memory, GpuPath (ops/gpu/gpu_path.h)
// for GPU memory.
//
// Contract for every method (executor thread only):
//  - every rank of the set calls it for the same response at the same point
//    of the agreed order, and every rank takes part in the collective, a rank
//    that joined (null entry) with a stand-in contributing the op's identity
//    or nothing: a rank that stepped out would leave its peers waiting;
//  - a failure is returned, never thrown; failures of the data plane go
//    through dataPlaneFailure (exec_context.h);
//  - `*outputLost`: the output could not be allocated, yet this rank took
//    part, so only its request fails and the set goes on.
#pragma once

#include <vector>

#include "core/message.h"
#include "core/status.h"
#include "core/tensor_entry.h"

namespace hora {

class CollectivePath {
 public:
  virtual ~CollectivePath() = default;
  // One tensor, or several fused (same dtype, op, scales, device, joined set).
  virtual Status allreduce(const std::vector<Response>& group, const std::vector<EntryPtr>& es) = 0;
  virtual Status broadcast(const Response& r, TensorEntry* e) = 0;
  virtual Status allgather(const Response& r, TensorEntry* e, Status* outputLost) = 0;
  virtual Status alltoall(const Response& r, TensorEntry* e, Status* outputLost) = 0;
  virtual Status reducescatter(const Response& r, TensorEntry* e, Status* outputLost) = 0;
};

}  // namespace hora
