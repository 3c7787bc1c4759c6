// RequestState and TensorEntry: what a caller's request becomes inside
// libhora, shared by three threads:
//  - the framework thread creates them (c_api.cc) and waits on RequestState;
//  - the control thread reads TensorEntry::request to negotiate;
//  - the executor thread reads/writes the tensor memory and completes them.
//
// A RequestState completes exactly once, when its last TensorEntry completes
// (grouped allreduce has several). Its mutex guards the completion fields; the
// callback mutex serializes a running callback against hora_request_free.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/message.h"
#include "core/status.h"
#include "hora/hora.h"

namespace hora {

constexpr uint32_t kRequestMagic = 0x68726571;  // "hreq"

struct RequestState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;                // guarded by mu; waiters wake on it
  bool resultsReady = false;        // guarded by mu; set before the callback runs
  Status status;                    // guarded by mu; first failure wins
  int remaining = 0;                // entries not yet completed; guarded by mu
  hora_request_t handle = nullptr;  // null once the user freed it; guarded by cbMu
  std::recursive_mutex cbMu;
  hora_callback_t callback = nullptr;
  void* callbackUser = nullptr;
  hora_alloc_t alloc = nullptr;
  void* allocUser = nullptr;

  // Results written by the executor before completion, read after.
  std::vector<int64_t> outShape;
  std::vector<char> ownedOutput;  // library-owned output when no allocator
  // Library-owned output in GPU memory (GPU inputs, no allocator); freed with
  // the request through the GPU plugin, on whichever thread frees it.
  std::shared_ptr<void> ownedDeviceOutput;
  DLTensor outTensor{};
  bool hasOutput = false;
  std::vector<int64_t> receivedSplits;
  int32_t lastJoinedRank = -1;

  // Completes one entry; the last one (or the first failure's bookkeeping)
  // finishes the request, wakes waiters and runs the callback.
  void completeEntry(const Status& s);
};

// One tensor of a request.
struct TensorEntry {
  Request request;  // what is negotiated (name, kind, dtype, shape, ...)
  const void* in = nullptr;
  void* out = nullptr;         // allreduce/broadcast: result location
  int64_t count = 0;           // elements of the input
  DLDataType dlType{};         // echoed into allocated outputs
  void* readyEvent = nullptr;  // GPU: the framework's event hora's stream waits for
  std::shared_ptr<RequestState> owner;
  std::atomic<bool> completed{false};

  void complete(const Status& s) {
    if (completed.exchange(true)) return;
    owner->completeEntry(s);
  }
};

}  // namespace hora

// The opaque handle: a checked wrapper so a stale or foreign pointer is
// reported as invalid instead of crashing.
struct hora_request_s {
  uint32_t magic = hora::kRequestMagic;
  std::shared_ptr<hora::RequestState> state;
};
