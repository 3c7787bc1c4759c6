// CpuPath: collectives on host memory through the set's CPU data plane
// (core/backend.h: shared memory on one host, Gloo otherwise), using the
// set's persistent fusion buffer for fused allreduces and for the stand-ins
// of ranks without a tensor. Executor thread only; see collective_path.h for
// the contract.
#pragma once

#include <atomic>

#include "core/host_buffer.h"
#include "ops/executor/collective_path.h"
#include "ops/executor/exec_context.h"

namespace hora {

class CpuPath : public CollectivePath {
 public:
  explicit CpuPath(const ExecContext& ctx) : ctx_(ctx) {}

  Status allreduce(const std::vector<Response>& group, const std::vector<EntryPtr>& es) override;
  Status broadcast(const Response& r, TensorEntry* e) override;
  Status allgather(const Response& r, TensorEntry* e, Status* outputLost) override;
  Status alltoall(const Response& r, TensorEntry* e, Status* outputLost) override;
  Status reducescatter(const Response& r, TensorEntry* e, Status* outputLost) override;

  // Packs the first chunk of `e`'s allreduce into the data plane's memory
  // before its negotiation's answer arrives (Backend::prepackAllreduce) and
  // marks the entry; its allreduce then skips that packing if nothing ran
  // in between. Returns whether it packed. Same thread rules as the
  // collectives (Executor::prepareHere).
  bool prepack(TensorEntry& e, const std::function<bool()>& stop);

  // Time the last allreduce spent packing into and unpacking out of the data
  // plane's memory (core/telemetry.h's timeline). Backends interleave both
  // with the network waits, range by range, so these are sums, not spans.
  struct Phases {
    int64_t packNs = 0, unpackNs = 0;
  };
  Phases lastPhases() const { return {packNs_.load(), unpackNs_.load()}; }

 private:
  Status allreduceOne(const Response& r, TensorEntry* e);
  Status allreduceFused(const std::vector<Response>& group, const std::vector<EntryPtr>& es);

  const ExecContext& ctx_;
  // Pre-touched and grown geometrically, so nothing on the hot path allocates.
  HostBuffer fusion_;
  // Atomic: a backend may call pack/unpack from a thread of its own.
  std::atomic<int64_t> packNs_{0}, unpackNs_{0};
  uint64_t lastPrepackToken_ = 0;  // tokens handed out so far
};

}  // namespace hora
