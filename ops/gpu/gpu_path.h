// GpuPath: collectives on GPU memory for one process set, on the executor
// thread, through the GPU plugin (hora_gpu_plugin.h, loaded by
// gpu_plugin_loader.h). It owns the set's GPU resources: a stream, a
// completion event, the communicator, the device fusion buffer and pinned
// host staging, all created on first use and released after the executor
// stopped.
//
// Two ways to run a group, chosen per group from what every rank shares (the
// response and HORA_GPU_BACKEND), so all ranks take the same one:
//  - communicator (NCCL): created at the first GPU group that asks for it
//    (every rank reaches that group at the same point of the agreed order);
//    data never leaves the device;
//  - staging: device -> pinned host, the set's CPU data plane, host ->
//    device. For dtypes NCCL lacks (int16, bool), HORA_GPU_BACKEND=gloo, and
//    sets whose ranks share a physical GPU (NCCL refuses those; auto checks).
// The few bytes the communicator's set-up exchanges (each rank's GPU
// identity, rank 0's communicator id) go over the CPU data plane in that same
// agreed order: no rendezvous store on this thread, and a peer lost meanwhile
// aborts the exchange like any collective.
//
// Everything runs on the set's stream; completion is an event polled here,
// together with the communicator's asynchronous error and the set's health (a
// lost peer aborts the communicator instead of waiting on it), bounded by
// HORA_PEER_TIMEOUT_S. Executor thread only, except release() (after the
// executor stopped) and the memory it hands out (freed from any thread).
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ops/executor/collective_path.h"
#include "ops/executor/exec_context.h"
#include "ops/gpu/gpu_plugin_loader.h"

namespace hora {

// HORA_GPU_BACKEND.
enum class GpuBackendChoice { kAuto, kNccl, kGloo };
bool parseGpuBackend(const std::string& text, GpuBackendChoice* out);
const char* gpuBackendName(GpuBackendChoice choice);

struct GpuPathOptions {
  // The runtime's plugin (shared by its sets); null: GPU tensors unsupported.
  std::shared_ptr<GpuPlugin> plugin;
  GpuBackendChoice backend = GpuBackendChoice::kAuto;
  // This process's rank on its host: the GPU a joined rank without GPU
  // history takes part on (local rank modulo the visible GPUs, the usual
  // one-GPU-per-local-rank layout).
  int localRank = 0;
  // HORA_GPU_PIPELINE: collectives through the communicator end launched,
  // not waited for (see GpuPath::tookLaunch).
  bool pipeline = true;
};

class GpuPath : public CollectivePath, public DeviceMemory {
 public:
  GpuPath(const ExecContext& ctx, GpuPathOptions options) : ctx_(ctx), opts_(std::move(options)) {}

  // gpu_collectives.cc
  Status allreduce(const std::vector<Response>& group, const std::vector<EntryPtr>& es) override;
  Status broadcast(const Response& r, TensorEntry* e) override;
  Status allgather(const Response& r, TensorEntry* e, Status* outputLost) override;
  Status alltoall(const Response& r, TensorEntry* e, Status* outputLost) override;
  Status reducescatter(const Response& r, TensorEntry* e, Status* outputLost) override;

  // DeviceMemory: library-owned outputs on the current group's device.
  Result<std::shared_ptr<void>> allocate(size_t bytes, const std::string& what) override;

  // Pipelining (HORA_GPU_PIPELINE). A collective through the communicator
  // ends with its work launched on the stream instead of finished: an event
  // from a small pool is recorded after it, and the executor goes on to the
  // next group (stream order keeps the fusion buffer and outputs safe). True
  // once after such a group; the executor then completes it when
  // pollLaunched() says its event fired. Groups are launched and seen done
  // in order.
  bool tookLaunch();
  // The oldest launched group: true when done (its event goes back to the
  // pool), false while it runs. An error (the communicator's asynchronous
  // error, a lost peer, HORA_PEER_TIMEOUT_S) aborts the communicator and
  // forgets every launched group: they all fail with it.
  Result<bool> pollLaunched();
  // When the oldest launched group was launched (for the executor's pacing).
  Clock::time_point oldestLaunch() const { return launched_.front().at; }

  // After the executor stopped.
  void release();
  // The data plane the last group went through, for telemetry.
  const char* planeName() const { return comm_ && !sharedGpu_ ? "nccl" : "gpu-staged"; }

 private:
  // Resources (gpu_path.cc).
  Status prepare(const Device& dev, const std::string& what);
  // The device this rank runs a group on: its tensor's; for a rank without
  // one (joined), the device it used before, else the usual one for its
  // local rank (rank 0's index could be another rank's GPU, which NCCL refuses).
  Device localDevice(const Response& r, const std::vector<EntryPtr>& es) const;
  // *viaComm: the group goes through the communicator (created at the first
  // group that asks) rather than staging; dtypeOk: the communicator has the
  // group's dtype (or the collective only moves bytes).
  Status choosePath(bool dtypeOk, const std::string& what, bool* viaComm);
  Status comm(const std::string& what);
  Status createComm(const std::string& what);
  // "" when every rank has its own physical GPU, else which ranks share one.
  Status sharingVerdict(const std::string& what, std::string* verdict);
  Status afterReady(TensorEntry* e, const std::string& what);  // orders after ready_event
  // The output of `e` from its sink, with hora's stream ordered after the
  // caller's allocator event (options.alloc_event) before anything writes it.
  Result<void*> allocateOutput(TensorEntry* e, const std::vector<int64_t>& shape, DataType dtype,
                               const std::string& what);
  Status fusion(size_t bytes, const std::string& what);  // device fusion buffer
  Status pinned(size_t bytes, const std::string& what);  // pinned host staging
  Status wait(const std::string& what);
  // The end of a collective: launched (pipelining, communicator) or waited for.
  Status finish(const std::string& what);
  // Waits until every launched group's work is done (before the host touches
  // pinned staging, or a device buffer is freed); the executor still
  // completes them through pollLaunched().
  Status settle(const std::string& what);
  // While GPU work runs: the communicator's asynchronous error, the set's
  // health and the deadline (`since` + HORA_PEER_TIMEOUT_S); ok to go on.
  // (A failure is also kept in aborted_.)
  Status checkWhileWaiting(Clock::time_point since, const std::string& what);
  Status checkHealth(Clock::time_point since, const std::string& what);
  // Polls `event` until it fired, checking as checkWhileWaiting says; the
  // timeout counts from the call.
  Status waitEvent(hora_gpu_event_t event, const std::string& what);

  // Collective helpers (gpu_collectives.cc).
  // An allreduce group through the communicator: big tensors (and a group of
  // one) reduced in their own output, the rest packed into the fusion buffer.
  Status allreduceViaComm(const std::vector<Response>& group, const std::vector<EntryPtr>& es,
                          const Reduction& x, const std::vector<size_t>& start,
                          const std::string& what);
  // Every single-tensor collective's start: the device this rank runs it on,
  // its description for messages, the set's GPU resources, and the order
  // after the caller's ready event.
  Status begin(const char* op, const Response& r, TensorEntry* e, std::string* what);
  // The output of an allgather/alltoall on the input's device (*out null when
  // this rank has none and staging needs none); an allocation failure goes
  // to *outputLost, as this rank still takes part.
  Status output(TensorEntry* e, const std::vector<int64_t>& shape, size_t bytes, bool viaComm,
                const std::string& what, char** out, Status* outputLost);
  // Input (device) -> pinned host, run(pinned input, pinned output) on the
  // CPU data plane, pinned output -> out (device; null: nothing to copy back).
  Status staged(const void* in, size_t inBytes, char* out, size_t outBytes,
                const std::function<Status(char* in, char* out)>& run, const std::string& what);

  const ExecContext& ctx_;
  const GpuPathOptions opts_;
  GpuPlugin* plugin() const { return opts_.plugin.get(); }

  const hora_gpu_plugin_v1_t* api_ = nullptr;
  int device_ = -1;
  hora_gpu_stream_t stream_ = nullptr;
  hora_gpu_event_t done_ = nullptr;
  hora_gpu_comm_t comm_ = nullptr;
  Status commError_;        // a failed creation, reported by every later GPU group
  bool sharedGpu_ = false;  // ranks share a GPU (auto): no communicator, everything staged
  char* fusion_ = nullptr;  // device fusion buffer
  size_t fusionBytes_ = 0;
  char* pinned_ = nullptr;  // pinned host staging
  size_t pinnedBytes_ = 0;
  // Pipelining: whether this group chose the communicator (choosePath), the
  // groups launched and not yet seen done, and their events' pool.
  bool viaComm_ = false;
  bool tookLaunch_ = false;
  struct Launch {
    hora_gpu_event_t event;
    Clock::time_point at;
    std::string what;
  };
  std::deque<Launch> launched_;
  std::vector<hora_gpu_event_t> freeEvents_;
  // The first failure while GPU work ran (the communicator aborted, a lost
  // peer, a timeout): launched groups and later settles fail with it.
  Status aborted_;
};

// How hora waits for GPU work (GpuPath::wait, and the executor for launched
// groups): polling without sleeping for the first kGpuSpin (one sleep costs
// ~50 us of timer slack, more than a small NCCL call takes), then sleeping a
// 64th of the time waited so far (1-200 us), so that a long collective is seen
// within ~2% of its length. One pause between two polls, `waited` after the
// work began (HORA_SPIN_US=0: no spinning at all).
constexpr std::chrono::milliseconds kGpuSpin{1};
void gpuPollPause(const SpinPolicy& spin, Clock::duration waited);

// Fused allreduce through the communicator: tensors from this size on are
// reduced in their own output instead of packed (two device copies, ~4 MiB
// of them cost about what one NCCL launch does on an H100/H200).
constexpr size_t kGpuDirectBytes = size_t{4} << 20;

// Whether NCCL reduces this dtype (it lacks int16 and bool).
bool ncclHasType(DataType dt);

}  // namespace hora
