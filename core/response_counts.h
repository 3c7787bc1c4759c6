// What a response says each rank moves, derived once for the CPU and GPU
// paths (ops/executor/cpu_path.cc, ops/gpu/gpu_collectives.cc) and for
// collectives the coordinator combined inline (core/agreed_group.cc, on the
// control or executor thread): pure functions of the response and the set's
// size, so every rank derives the same counts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/agreed_group.h"
#include "core/message.h"
#include "core/status.h"
#include "core/types.h"

namespace hora {

// Elements per row (dimension 0) of a tensor of this shape.
int64_t rowElements(const std::vector<int64_t>& shape);
// Allgather: elements contributed by each rank.
std::vector<size_t> allgatherCounts(const Response& r, int size);
// Alltoall as seen by `rank`: elements sent to / received from each rank.
struct AlltoallCounts {
  std::vector<int64_t> send, recv, recvRows;
  int64_t outRows = 0;
};
AlltoallCounts alltoallCounts(const Response& r, int rank, int size);
// Reducescatter: elements of each rank's block of dimension 0 (ranks below
// dim0 % size get one more row) and the first element of `rank`'s block.
struct ScatterCounts {
  std::vector<size_t> counts;
  size_t before = 0;
  int64_t rows = 0;  // rows of `rank`'s block
};
ScatterCounts reducescatterCounts(const Response& r, int rank, int size);
// Reduction and reductionOf: core/agreed_group.h (the control thread needs
// them too, for collectives the coordinator combined inline).
// First element of each tensor of a fused group in the fusion buffer, plus
// the total as the last entry; a protocol error when the total would pass
// kMaxTensorBytes (only a corrupt response list can ask for that).
Result<std::vector<size_t>> fusedOffsets(const std::vector<Response>& group);

}  // namespace hora
