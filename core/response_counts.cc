#include "core/response_counts.h"

#include <algorithm>

namespace hora {

int64_t rowElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

std::vector<size_t> allgatherCounts(const Response& r, int size) {
  const int64_t row = rowElements(r.shape);
  std::vector<size_t> counts(size);
  for (int i = 0; i < size; ++i) counts[i] = static_cast<size_t>(r.sizes[i] * row);
  return counts;
}

AlltoallCounts alltoallCounts(const Response& r, int rank, int size) {
  const int64_t row = rowElements(r.shape);
  AlltoallCounts c;
  c.send.resize(size);
  c.recv.resize(size);
  c.recvRows.resize(size);
  for (int d = 0; d < size; ++d) {
    c.send[d] = r.sizes[rank * size + d] * row;
    c.recvRows[d] = r.sizes[d * size + rank];
    c.recv[d] = c.recvRows[d] * row;
    c.outRows += c.recvRows[d];
  }
  return c;
}

ScatterCounts reducescatterCounts(const Response& r, int rank, int size) {
  const int64_t dim0 = r.shape.empty() ? 0 : r.shape[0];
  const int64_t row = rowElements(r.shape);
  ScatterCounts c;
  c.counts.resize(size);
  for (int i = 0; i < size; ++i) {
    const int64_t rows = dim0 / size + (i < dim0 % size ? 1 : 0);
    c.counts[i] = static_cast<size_t>(rows * row);
    if (i < rank) c.before += c.counts[i];
    if (i == rank) c.rows = rows;
  }
  return c;
}

Result<std::vector<size_t>> fusedOffsets(const std::vector<Response>& group) {
  std::vector<size_t> start(group.size() + 1, 0);
  // Each response was checked (SetController::validateResponse); their sum is bounded by the
  // coordinator's fusion threshold, unless the response list is corrupt.
  const int64_t maxElements =
      group.empty() ? 0 : kMaxTensorBytes / static_cast<int64_t>(dataTypeSize(group[0].dtype));
  int64_t total = 0;
  for (size_t i = 0; i < group.size(); ++i) {
    if (__builtin_add_overflow(total, group[i].numElements(), &total) || total > maxElements)
      return protocolError("fused allreduce of " + std::to_string(group.size()) +
                           " tensors from \"" + group[0].name +
                           "\" on: together more than 2^63-1 bytes, past any fusion "
                           "threshold; the coordinator's response list is corrupt");
    start[i + 1] = static_cast<size_t>(total);
  }
  return start;
}

}  // namespace hora
