// HostBuffer: a persistent, pre-touched CPU staging buffer (the fusion buffer).
//
// Why pre-touched and persistent: on these machines the first write to a page
// costs about 12 us per 4 KiB (a fresh 64 MiB buffer takes ~200 ms to fill, a
// reused one ~5 ms), so the hot path must never allocate. reserve() grows
// geometrically and touches every page once, off the steady state.
//
// Owned and used by one executor thread; not thread-safe.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "core/status.h"

namespace hora {

// The capacity a persistent buffer grows to so that it holds `want` bytes:
// doubling from `have` (or 1 MiB), so growth happens a few times, not per
// call. Shared by HostBuffer and the GPU buffers of the runtime.
inline size_t grownCapacity(size_t have, size_t want) {
  size_t cap = have ? have : (size_t{1} << 20);
  while (cap < want) cap *= 2;
  return cap;
}

class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { std::free(data_); }

  // Ensures capacity for `bytes`; contents are not preserved on growth.
  Status reserve(size_t bytes) {
    if (bytes <= capacity_) return Status::ok();
    const size_t want = grownCapacity(capacity_, bytes);
    void* p = nullptr;
    if (posix_memalign(&p, 4096, want) != 0 || !p)
      return systemError("cannot allocate a " + std::to_string(want >> 20) +
                         " MiB fusion buffer: lower HORA_FUSION_THRESHOLD_BYTES or free memory");
    std::memset(p, 0, want);  // touch every page now, not on the hot path
    std::free(data_);
    data_ = static_cast<char*>(p);
    capacity_ = want;
    return Status::ok();
  }
  char* data() { return data_; }
  size_t capacity() const { return capacity_; }

 private:
  char* data_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace hora
