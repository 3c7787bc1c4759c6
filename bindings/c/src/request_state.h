// RequestState: what a caller's request (hora_request_t) is inside libhora.
// It implements the runtime's RequestSink (core/tensor_entry.h), so the
// threads below the ABI hand results back without knowing about hora_alloc_t,
// callbacks or library-owned memory:
//  - the framework thread creates it (c_api.cc) and waits on it;
//  - the executor thread allocates outputs through it and completes entries
//    (the control thread too, for a collective combined inline when the
//    caller gave no allocator);
//  - the control thread completes entries that fail before they run.
//
// It completes once, when its last entry completes (a grouped allreduce has
// several). `mu` guards the completion fields; `cbMu` serializes a running
// callback against hora_request_free.
//
// Lifetime of a library-owned output: it lives as long as the request. When
// the caller frees a completed request, the output is released right there,
// on the caller's thread, whoever else still holds a reference to the state
// (the executor drops its entries a moment after completing them).
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/spin_wait.h"
#include "core/status.h"
#include "core/tensor_entry.h"
#include "hora/hora.h"
#include "ops/p2p/p2p_engine.h"

namespace hora {

class ProcessSet;
constexpr uint32_t kRequestMagic = 0x68726571;  // "hreq"

struct RequestState : RequestSink {
  // User-provided, so make_shared<RequestState>() does not zero the whole
  // object before the member initializers run (a `rep stos` of ~500 bytes
  // was a third of a point-to-point submit's own time).
  RequestState() {}
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;  // guarded by mu; waiters wake on it
  // `done`, readable without mu: what a waiter polling the point-to-point
  // engine checks between rounds (set under mu, after `done`).
  std::atomic<bool> finished{false};
  bool resultsReady = false;        // guarded by mu; set before the callback runs
  Status status;                    // guarded by mu; first failure wins
  int remaining = 0;                // entries not yet completed; guarded by mu
  hora_request_t handle = nullptr;  // null once the user freed it; guarded by cbMu
  std::recursive_mutex cbMu;
  hora_callback_t callback = nullptr;
  void* callbackUser = nullptr;
  hora_alloc_t alloc = nullptr;
  void* allocUser = nullptr;
  void* allocEvent = nullptr;        // options.alloc_event
  DLDataType dlType{kDLUInt, 8, 1};  // the input's, echoed into allocated outputs
  bool dlTypeFromOutput = false;     // a receive without a buffer: the message's dtype
  // Set at creation when no entry can allocate an output (sends and
  // receives into the caller's buffers): freeing then has nothing to release.
  bool noOutputs = false;
  // Point-to-point requests: a waiter polls the engine's progress itself
  // before it sleeps (hora_wait), which saves a thread hand-off per message.
  std::shared_ptr<P2pEngine> p2p;
  // Collectives: how long hora_wait polls `finished` before it sleeps (the
  // set's HORA_SPIN_US policy, core/spin_wait.h).
  SpinPolicy waitSpin;
  // Collectives on a set whose waiters drive it (HORA_CALLER_DRIVES): the
  // set, so that hora_wait does its control thread's work while it polls.
  std::weak_ptr<ProcessSet> driveSet;
  // The set whose rank's CPU hora_wait moves its thread back to
  // (HORA_HOME_CALLER); null where the ranks fit the CPUs.
  std::weak_ptr<ProcessSet> homeSet;

  // Results written by the executor before completion, read after.
  std::vector<int64_t> outShape;
  std::vector<char> ownedOutput;  // library-owned output in host memory
  // Library-owned output in GPU memory (GPU inputs, no allocator); freed
  // through the GPU plugin, on whichever thread releases it.
  std::shared_ptr<void> ownedDeviceOutput;
  DLTensor outTensor{};
  bool hasOutput = false;
  std::vector<int64_t> receivedSplits;
  int32_t lastJoinedRank = -1;

  // RequestSink.
  Result<void*> allocateOutput(const std::vector<int64_t>& shape, DataType dtype,
                               const Device& device, DeviceMemory* deviceMemory) override;
  void setReceivedSplits(std::vector<int64_t> rows) override { receivedSplits = std::move(rows); }
  void setLastJoinedRank(int32_t globalRank) override { lastJoinedRank = globalRank; }
  // The last entry (or the first failure's bookkeeping) finishes the
  // request: results become readable, the callback runs, waiters wake.
  void completeEntry(const Status& s) override;
  bool callsBack() const override { return callback != nullptr; }
  bool allocatesThroughCaller() const override { return alloc != nullptr; }
  void* allocatedOutputEvent() const override { return alloc ? allocEvent : nullptr; }

  // hora_request_free: a completed request's library-owned output goes now.
  void releaseOutputsIfDone();
};

}  // namespace hora

// The opaque handle: a checked wrapper so a stale or foreign pointer is
// reported as invalid instead of crashing.
struct hora_request_s {
  uint32_t magic = hora::kRequestMagic;
  std::shared_ptr<hora::RequestState> state;
};
