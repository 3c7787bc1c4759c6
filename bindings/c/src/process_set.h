// ProcessSetImpl: one communicator (the global set or a subset of ranks) with
// its own coordinator, control plane, response cache, data-plane backend and
// threads. This is where the runtime's threads live:
//
//  - framework threads call enqueue(): entries go into the tensor table and
//    the inbox, and the control thread is woken (no fixed-cycle sleeping).
//  - the control thread (one per set) runs the ControlPlane's event loop:
//    it drains the inbox into a RequestList (cache hits where possible),
//    sends it to the coordinator (or, on the coordinator, feeds it in
//    directly), applies response lists to the cache, and hands the resolved
//    groups to the executor. On the coordinator it also emits responses,
//    inspects stalls and broadcasts aborts when a peer is lost.
//  - the executor thread (one per set) runs the groups in order through the
//    Backend, using the persistent fusion buffer, and completes entries.
//    It is separate from the control thread so heartbeats, loss detection
//    and negotiation of the next tensors continue during a long collective.
//
// A set that loses a peer, receives an abort, or fails a collective becomes
// broken: every pending and future request fails with the recorded status,
// which names the lost rank. shutdown() completes pending requests with
// kShutDown and joins both threads.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "controllers/control_plane.h"
#include "controllers/coordinator.h"
#include "core/backend.h"
#include "core/host_buffer.h"
#include "core/logging.h"
#include "core/response_cache.h"
#include "core/store.h"
#include "gpu_plugin.h"
#include "request_state.h"

namespace hora {

// A negotiated group with the local entries it refers to, claimed from the
// tensor table when the group is queued so that a later failure of the set
// cannot fail work every rank has already agreed to run.
// What a response says each rank moves, derived once for the CPU and GPU
// executors (executor.cc).
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
// The op the data plane runs (average is a sum) and the factor applied after
// it: postscale, divided by the ranks that contributed for average.
ReduceOp reducingOp(const Response& r);
double postFactor(const Response& r, int size);
// Whether NCCL reduces this dtype (it lacks int16 and bool).
bool ncclHasType(DataType dt);

struct ExecGroup {
  std::vector<Response> responses;
  std::vector<std::shared_ptr<TensorEntry>> entries;  // null where this rank has none (joined)
};

// The set's GPU resources (gpu_executor.cc); executor thread only, released
// after it stopped.
struct GpuState {
  const hora_gpu_plugin_v1_t* api = nullptr;
  int device = -1;
  hora_gpu_stream_t stream = nullptr;
  hora_gpu_event_t done = nullptr;
  hora_gpu_comm_t comm = nullptr;
  int commsCreated = 0;
  Status commError;        // a failed creation, reported by every later GPU group
  bool sharedGpu = false;  // ranks share a GPU (auto): no communicator, everything staged
  char* fusion = nullptr;  // device fusion buffer
  size_t fusionBytes = 0;
  char* pinned = nullptr;  // pinned host staging
  size_t pinnedBytes = 0;
};

struct SetOptions {
  int64_t fusionThresholdBytes = 128 << 20;
  int cacheCapacity = 1024;
  double cycleTimeMs = 1;
  double stallWarningS = 60;
  double stallShutdownS = 300;
  double peerTimeoutS = 30;
  double startTimeoutS = 120;
  int heartbeatIntervalMs = 1000;
  std::string hostname = "127.0.0.1";
  std::string glooIface;
  std::string glooAlgorithm = "auto";
  bool shm = true;
  int64_t shmChunkBytes = 4 << 20;
  int64_t shmMinBytes = 0;
  // The runtime's GPU plugin (loaded on first use; shared by its sets) and
  // HORA_GPU_BACKEND: auto (communicator where the dtype allows), nccl, gloo.
  std::shared_ptr<GpuPlugin> gpu;
  std::string gpuBackend = "auto";
  // This process's rank on its host: the GPU a joined rank without GPU
  // history takes part on (local rank modulo the visible GPUs, the usual
  // one-GPU-per-local-rank layout).
  int localRank = 0;
  Logger logger;
};

class ProcessSetImpl {
 public:
  // Connects the set's control plane and data plane (blocks until every
  // member arrived) and starts its threads. `store` is already prefixed for
  // this set.
  static Result<std::unique_ptr<ProcessSetImpl>> create(std::string name,
                                                        std::vector<int> globalRanks,
                                                        int myGlobalRank,
                                                        std::shared_ptr<Store> store,
                                                        SetOptions options);
  ~ProcessSetImpl();

  const std::shared_ptr<GpuPlugin>& gpuPlugin() const { return opts_.gpu; }
  // Framework threads. On failure nothing was enqueued.
  Status enqueue(std::vector<std::shared_ptr<TensorEntry>> entries);
  std::string autoName(CollectiveKind kind);

  // Completes pending requests with kShutDown and stops the threads.
  void shutdown(const std::string& reason);

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(globalRanks_.size()); }
  int globalRank(int setRank) const { return globalRanks_[setRank]; }
  const std::string& name() const { return name_; }

 private:
  ProcessSetImpl(std::string name, std::vector<int> globalRanks, int rank, SetOptions options);

  // Control thread.
  void drainInbox();
  void onFrame(int from, FrameType type, std::string payload);
  void onPeerLost(int peer, Status why);
  void submit(RequestList list);
  void maybeEmit(bool force = false);
  void applyResponses(const ResponseList& list);
  void stallTick();
  void abortSet(Status why);

  // Any thread.
  void markBroken(Status why);
  Status brokenStatus();
  std::shared_ptr<TensorEntry> takeEntry(const std::string& name);
  void failAllPending(const Status& why);
  Status entryStatus(const TensorEntry& e, const Status& why) const;

  // Executor thread (executor.cc).
  void executorLoop();
  void execute(ExecGroup& group);
  void queueGroup(std::vector<Response> responses);  // control thread
  Status claimEntries(const std::vector<Response>& responses, ExecGroup* g);
  Status validateResponse(const Response& r) const;
  void sendAbort(int peer, const Status& why);  // control thread; peer -1 = every worker
  Status runAllreduce(std::vector<Response>& group, std::vector<std::shared_ptr<TensorEntry>>& es);
  // *outputLost: the output could not be allocated but this rank took part.
  Status runAllgather(const Response& r, TensorEntry* e, Status* outputLost);
  Status runBroadcast(const Response& r, TensorEntry* e);
  Status runAlltoall(const Response& r, TensorEntry* e, Status* outputLost);
  Status runReducescatter(const Response& r, TensorEntry* e, Status* outputLost);
  Result<void*> allocateOutput(TensorEntry& e, const std::vector<int64_t>& shape);
  // GPU tensors (gpu_executor.cc).
  Status runGpuAllreduce(std::vector<Response>& group,
                         std::vector<std::shared_ptr<TensorEntry>>& es);
  Status runGpuBroadcast(const Response& r, TensorEntry* e);
  // *outputLost: the output allocator failed but this rank took part.
  Status runGpuAllgather(const Response& r, TensorEntry* e, Status* outputLost);
  Status runGpuAlltoall(const Response& r, TensorEntry* e, Status* outputLost);
  Status runGpuReducescatter(const Response& r, TensorEntry* e, Status* outputLost);
  Status gpuAfterReady(TensorEntry* e, const std::string& what);  // orders after ready_event
  // The output of a GPU allgather/alltoall on the input's device (*out null
  // when this rank has none and staging needs none); allocation failures go
  // to *outputLost, as this rank still takes part.
  Status gpuOutput(TensorEntry* e, const std::vector<int64_t>& shape, size_t bytes, bool viaComm,
                   const std::string& what, char** out, Status* outputLost);
  // Staging of a collective with separate input and output: input (device)
  // -> pinned host, run(pinned input, pinned output) on the CPU data plane,
  // pinned output -> out (device; null: nothing to copy back).
  Status gpuStaged(const void* in, size_t inBytes, char* out, size_t outBytes,
                   const std::function<Status(char* in, char* out)>& run, const std::string& what);
  Status gpuPrepare(const Device& dev, const std::string& what);
  Device localDevice(const Response& r, const std::vector<std::shared_ptr<TensorEntry>>& es) const;
  // *viaComm: this group goes through the set's communicator (created at the
  // first group that asks) rather than staging; dtypeOk: the communicator
  // has the group's dtype (or the collective only moves bytes).
  Status gpuChoosePath(bool dtypeOk, const std::string& what, bool* viaComm);
  Status gpuComm(const std::string& what);
  Status createComm(const std::string& what);
  // "" when every rank has its own physical GPU, else which ranks share one.
  Status gpuSharing(const std::string& what, std::string* verdict);
  Status gpuFusion(size_t bytes, const std::string& what);  // device fusion buffer
  Status gpuPinned(size_t bytes, const std::string& what);  // pinned host staging
  Status gpuWait(const std::string& what);
  void gpuRelease();
  Status backendFailure(const Status& s, const std::string& what);
  void failedAfterAgreement(const Status& s);

  std::string name_;
  std::vector<int> globalRanks_;
  int rank_;
  SetOptions opts_;
  Logger logger_;

  std::unique_ptr<ControlPlane> cp_;
  std::unique_ptr<Backend> backend_;
  ResponseCache cache_;                       // control thread only
  std::unique_ptr<Coordinator> coordinator_;  // set rank 0 only; control thread only
  std::unique_ptr<boost::asio::steady_timer> emitTimer_, stallTimer_;
  bool emitTimerArmed_ = false;
  Clock::time_point firstReady_{};
  std::unordered_map<uint64_t, Request> sentAsHits_;  // control thread: for nack resends

  std::mutex tableMu_;  // guards table_, inbox_, broken_
  std::unordered_map<std::string, std::shared_ptr<TensorEntry>> table_;
  std::vector<std::shared_ptr<TensorEntry>> inbox_;
  Status broken_;
  std::atomic<bool> isBroken_{false};
  std::atomic<bool> stopping_{false};
  std::mutex shutdownMu_;  // serializes shutdown()
  std::atomic<bool> drainPosted_{false};

  std::mutex execMu_;  // guards execQueue_
  std::condition_variable execCv_;
  std::deque<ExecGroup> execQueue_;
  std::atomic<int> execInFlight_{0};
  std::condition_variable execIdleCv_;  // signalled (under execMu_) after each group
  std::atomic<bool> executorExit_{false};
  HostBuffer fusion_;             // executor thread only
  GpuState gpu_;                  // executor thread only
  std::shared_ptr<Store> store_;  // rendezvous (GPU communicator ids)

  std::atomic<uint64_t> autoNameCounters_[static_cast<int>(CollectiveKind::kCount)] = {};

  std::thread controlThread_;
  // Set by the control thread itself when it starts (reading controlThread_
  // from that thread would race with its assignment in create()).
  std::atomic<std::thread::id> controlThreadId_{};
  std::thread executorThread_;
};

}  // namespace hora
