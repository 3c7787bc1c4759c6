// TensorEntry and RequestSink: one tensor of a caller's request as the
// runtime's threads see it, and the small interface through which those
// threads hand results back to whoever made the request.
//
//  - a framework thread creates the entries of a request (the C layer's
//    hora_*_async) with a sink, and enqueues them in a process set;
//  - the control thread (controllers/) reads TensorEntry::request to
//    negotiate, and claims the entries of an agreed group;
//  - the executor thread (ops/) reads and writes the tensor memory, asks the
//    sink for outputs whose size negotiation decided, and completes entries.
//
// The sink is implemented by the C layer's RequestState (bindings/c): it owns
// user callbacks, allocators and library-owned outputs, none of which the
// threads below the ABI need to know about. A request completes once, when
// its last entry completes (a grouped allreduce has several).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/message.h"
#include "core/status.h"
#include "core/types.h"

namespace hora {

// GPU memory for outputs the library owns, provided by the GPU path
// (ops/gpu), which knows the device and the plugin. Executor thread.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // `bytes` on the device the current group runs on; the memory is freed when
  // the last copy of the returned pointer goes, on whichever thread that is.
  virtual Result<std::shared_ptr<void>> allocate(size_t bytes, const std::string& what) = 0;
};

class RequestSink {
 public:
  virtual ~RequestSink() = default;
  // Executor thread (or, for a collective the coordinator combined inline
  // and no caller's allocator, the control thread or a thread driving it).
  // The output of an allgather, alltoall or reducescatter, whose shape
  // negotiation decided: through the caller's allocator, else owned by the
  // request (host memory, or `deviceMemory` for a GPU input).
  virtual Result<void*> allocateOutput(const std::vector<int64_t>& shape, DataType dtype,
                                       const Device& device, DeviceMemory* deviceMemory) = 0;
  // Executor thread, right after allocateOutput gave GPU memory from the
  // caller's allocator: the event (options.alloc_event) the allocator recorded
  // on the stream that memory belongs to, which hora's stream must wait for
  // before writing it; nullptr when there is none.
  virtual void* allocatedOutputEvent() const { return nullptr; }
  // Before completion, on the thread that allocates: rows received from each rank (alltoall).
  virtual void setReceivedSplits(std::vector<int64_t> rows) = 0;
  // Control or executor thread, before completion: the last rank to join.
  virtual void setLastJoinedRank(int32_t globalRank) = 0;
  // Any hora thread, exactly once per entry (TensorEntry::complete ensures it).
  virtual void completeEntry(const Status& status) = 0;
  // Whether completing runs the caller's code (a completion callback): a
  // thread inside one of the caller's own submissions must not do that
  // (SetController, HORA_CALLER_DRIVES).
  virtual bool callsBack() const { return false; }
  // Whether allocateOutput runs the caller's code (its allocator, which may
  // wait for a lock of the caller's, such as Python's GIL): a collective the
  // coordinator combined inline is then completed on the executor, never on
  // the control thread, whose heartbeats and negotiation must not wait on it.
  virtual bool allocatesThroughCaller() const { return false; }
};

// Where the entry's flight record is and when it passed each stage (Clock
// nanoseconds), written by the thread of each stage (core/telemetry.h).
struct EntryTrace {
  uint64_t seq = 0;
  int64_t submitNs = 0;
  int64_t agreedNs = 0;
  bool cacheHit = false;
};

struct TensorEntry {
  Request request;  // what is negotiated (name, kind, dtype, shape, ...)
  const void* in = nullptr;
  void* out = nullptr;         // allreduce/broadcast: where the result goes
  void* readyEvent = nullptr;  // GPU: the framework's event hora's stream waits for
  std::shared_ptr<RequestSink> sink;
  std::atomic<bool> completed{false};
  EntryTrace trace;
  // Non-zero: the data plane packed this allreduce's input ahead of its
  // negotiation's answer under this token (Backend::prepackAllreduce).
  // Written by the control thread before the entry's group is agreed, read
  // by whichever thread runs the group (the group's hand-off orders them).
  uint64_t prepackToken = 0;

  // The first call wins; later ones (a failure racing the result) are no-ops.
  void complete(const Status& status) {
    if (completed.exchange(true)) return;
    sink->completeEntry(status);
  }
};

using EntryPtr = std::shared_ptr<TensorEntry>;

// `why` as this entry's failure: "<kind> "<name>" on rank <globalRank>: <why>".
Status entryFailure(const TensorEntry& entry, int globalRank, const Status& why);

}  // namespace hora
