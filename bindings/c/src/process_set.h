// ProcessSet: one communicator (the global set or a subset of ranks),
// assembled from its parts, and the order in which they start and stop.
// It holds no thread logic of its own:
//  - ControlPlane (controllers/): the control sockets around the set's
//    coordinator (its lowest rank);
//  - SetController (controllers/): the control thread: tensor table, cache,
//    negotiation through a CoordinatorLink (CoordinatorService on set rank
//    0, RemoteCoordinator elsewhere), agreed groups into the GroupQueue;
//  - Executor (ops/executor/): the executor thread, running agreed groups
//    through the CPU data plane (ops/shm over ops/gloo) or the GPU path;
//  - the seams between them (core/): the GroupQueue, and SetHealth (first
//    failure wins; listeners tell the peers, abort the data plane and fail
//    pending requests).
//
// Threads: create() and shutdown() on a framework thread; enqueue() and
// autoName() from any framework thread. A set that loses a peer, receives an
// abort or fails a collective becomes broken: every pending and later
// request fails with the recorded status, which names the lost rank.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "controllers/control_plane.h"
#include "controllers/set_controller.h"
#include "controllers/settings_agreement.h"
#include "core/backend.h"
#include "core/clock.h"
#include "core/group_queue.h"
#include "core/logging.h"
#include "core/set_health.h"
#include "core/store.h"
#include "core/telemetry.h"
#include "core/tuning.h"
#include "ops/executor/executor.h"
#include "ops/gloo/gloo_backend.h"
#include "ops/p2p/p2p_engine.h"

namespace hora {

struct SetOptions {
  int64_t fusionThresholdBytes = 128 << 20;
  int cacheCapacity = 1024;
  std::chrono::microseconds cycleTime{1000};
  Seconds stallWarning{60};
  Seconds stallShutdown{300};  // 0 = never
  std::chrono::milliseconds peerTimeout{30000};
  std::chrono::milliseconds startTimeout{120000};
  std::chrono::milliseconds heartbeatInterval{1000};
  std::string hostname = "127.0.0.1";
  std::string glooIface;
  GlooAlgorithm glooAlgorithm = GlooAlgorithm::kAuto;
  bool shm = true;
  int64_t shmChunkBytes = 1 << 20;
  // Each of a segment's two slots on one host (runtime.cc: HORA_SHM_CHUNK_BYTES
  // when set, else max(chunk, kShmMinSlotBytes)); a hierarchy's are of one chunk.
  int64_t shmSlotBytes = kShmMinSlotBytes;
  // Non-zero: the chunk when every rank on the host has a CPU of its own
  // (ShmBackendOptions::chunkBytesWhenRanksFit); HORA_SHM_CHUNK_BYTES unset.
  int64_t shmChunkBytesWhenRanksFit = 0;
  int64_t shmMinBytes = 0;
  // HORA_INLINE_MAX_BYTES (SetControllerOptions::inlineMaxBytes); -1: picked
  // by the set's data plane when it is created (process_set.cc).
  int64_t inlineMaxBytes = -1;
  // HORA_RUN_ON_CONTROL_MAX_BYTES (SetController::setSmallGroupRunner); 0: off.
  size_t runOnControlMaxBytes = 0;
  // HORA_PACK_AHEAD (SetController::setPacker).
  bool packAhead = false;
  // HORA_CALLER_DRIVES (SetController::setCallerDrives).
  bool callerDrives = false;
  // Online autotune (core/autotune.h, controllers/autotune_driver.h): on, its
  // CSV log, its seed, and the parameters that stay as configured.
  bool autotune = true;
  std::string autotuneLog;
  uint64_t autotuneSeed = 0;
  bool autotunePinned[kTuneDims] = {};
  // HORA_HIER_ALLREDUCE (auto|hier|flat) and this rank's host identity
  // (core/host_identity.h, HORA_HOST_ID applied): which ranks share a host.
  std::string hierAllreduce = "auto";
  bool hierOverlap = true;                   // HORA_HIER_OVERLAP
  int64_t hierCollectiveMinBytes = 1 << 20;  // HORA_HIER_COLLECTIVE_MIN_BYTES
  std::string hierCross = "tcp";             // HORA_HIER_CROSS: tcp|gloo
  std::string hostId;
  // Point-to-point (ops/p2p/p2p_engine.h).
  int64_t p2pRingBytes = 1 << 20;
  int64_t p2pEagerBytes = 64 << 10;
  int64_t p2pFastBytes = 32;
  int p2pSpinUs = 50;
  std::string p2pTransport = "auto";
  // Polling before a thread sleeps on a hand-off (core/spin_wait.h), and the
  // runtime's ranks on this host (whether the polls must yield the core).
  int64_t spinUs = 100;
  // How long a framework thread in hora_wait drives before it sleeps
  // (HORA_WAIT_SPIN_US; driveSpin_).
  int64_t waitSpinUs = 2000;
  // How long a wait for a peer in the shared-memory data plane polls before
  // it sleeps, where the ranks fit (HORA_SHM_WAIT_SPIN_US;
  // ShmBackendOptions::peerSpin).
  int64_t shmWaitSpinUs = 1000;
  // ShmBackendOptions::claimLines (HORA_SHM_CLAIM_LINES).
  bool shmClaimLines = true;
  int localSize = 1;
  // The CPU of the set's executor thread (ExecContext::cpu); -1: unbound.
  // Only the global set gets one (runtime.cc, HORA_BIND_EXECUTOR).
  int executorCpu = -1;
  // The CPU this rank's framework threads are moved back to when they wait
  // elsewhere (HORA_HOME_CALLER, core/cpu_affinity.h callerHomeCpuFor); -1:
  // none. The runtime's, for every set; a set applies it only where its
  // shared-memory set-up found every rank on one mask, two or more ranks to
  // each CPU (ShmBackend::ranksShareCpusEvenly).
  int callerHomeCpu = -1;
  // Negotiation through shared memory when every rank is on one host.
  bool shmNegotiation = true;
  // Elastic mode: member-caused failures are kMembership (SetHealth).
  bool elastic = false;
  std::vector<std::string> workerIds;  // global rank -> worker id (elastic mode)
  // The runtime's GPU plugin (loaded on first use; shared by its sets),
  // HORA_GPU_BACKEND and this process's local rank.
  GpuPathOptions gpu;
  Logger logger;
  // Observability (core/telemetry.h, SetControllerOptions); off: the
  // threads report nothing (snapshots stay empty).
  bool telemetry = true;
  size_t flightEntries = 1024;
  size_t stragglerWindow = 256;
  std::string dumpDir;
  Seconds metricsInterval{0};
  std::string prometheusDir;
  const std::atomic<uint64_t>* dumpRequests = nullptr;  // SIGUSR1 count (c_api)
  std::shared_ptr<Timeline> timeline;                   // the runtime's
};

// The settings every member of a set must share (checked at set-up; elastic
// formation checks a newcomer's against the members' with the same list).
SharedSettings sharedSettings(const SetOptions& options);

class ProcessSet {
 public:
  // Agrees on the shared settings, connects the set's control plane and data
  // plane (blocks until every member arrived) and starts its threads.
  // `store` is already prefixed for this set.
  static Result<std::unique_ptr<ProcessSet>> create(std::string name, std::vector<int> globalRanks,
                                                    int myGlobalRank, std::shared_ptr<Store> store,
                                                    SetOptions options);
  ~ProcessSet();

  const std::shared_ptr<GpuPlugin>& gpuPlugin() const { return opts_.gpu.plugin; }
  // Framework threads. On failure nothing was enqueued.
  Status enqueue(std::vector<EntryPtr> entries) { return controller_->enqueue(std::move(entries)); }
  std::string autoName(CollectiveKind kind) { return controller_->autoName(kind); }

  // Emits what is ready, lets the executor finish every group all ranks
  // agreed to, fails what was never negotiated with kShutDown (`reason`),
  // says goodbye and waits for the peers; every step bounded.
  void shutdown(const std::string& reason);

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(globalRanks_.size()); }
  int globalRank(int setRank) const { return globalRanks_[setRank]; }
  const std::string& name() const { return name_; }
  // How a thread in hora_wait polls this set's requests before it sleeps.
  const SpinPolicy& spin() const { return spin_; }
  // A framework thread waiting for `done`: SetController::driveWhile.
  bool driveWhile(const std::function<bool()>& done, Clock::time_point deadline) {
    // The wider window where there is a lane or sockets to drive: with
    // only 100 us a waiter across hosts often gave up before the answer (a
    // peer that submitted late) and slept, and the control thread then woke
    // for the answer and again for it (2 hosts x 1 rank, 1.2-1.5x faster
    // at 64 B and 1.3-1.6x at 4 KiB with the wider window in one launch;
    // bench/results/2026-11-29-tcp-caller-drives.md). Not for a set of one
    // rank: nothing arrives there, the executor completes its request.
    return controller_->driveWhile(cp_->drivable() ? driveSpin_ : spin_, done, deadline);
  }
  bool callerDrives() const { return opts_.callerDrives; }
  // A framework thread about to wait in hora_wait on one of this set's
  // requests: when it runs on another CPU than its rank's home (SetOptions::
  // callerHomeCpu, where it applies), moves it there (keeping its affinity
  // mask), at most once per kHomingInterval for the set, so that it never
  // fights the scheduler at the rate it waits.
  void homeCaller();
  bool homesCaller() const { return homeCpu_ >= 0; }
  const Telemetry& telemetry() const { return *telemetry_; }
  // Sends and receives (any framework thread); shared with the requests
  // whose waiters drive its progress.
  const std::shared_ptr<P2pEngine>& p2p() const { return p2p_; }

 private:
  ProcessSet(std::string name, std::vector<int> globalRanks, int rank, SetOptions options);

  const std::string name_;
  const std::vector<int> globalRanks_;
  const int rank_;
  const SetOptions opts_;
  // Sets spin_, driveSpin_ and the queue's policy; before the set's threads
  // start (constructor, create).
  void setSpin(const SpinPolicy& spin);
  SpinPolicy spin_;
  // spin_ with HORA_WAIT_SPIN_US's window while it need not yield to peers
  // (the ranks fit the cores, or a launcher gave each its own; create).
  SpinPolicy driveSpin_;
  int homeCpu_ = -1;                      // SetOptions::callerHomeCpu where it applies (create)
  std::atomic<int64_t> lastHomingNs_{0};  // homeCaller's rate limit (steady clock)
  // Outlives the threads that report into it.
  std::shared_ptr<Telemetry> telemetry_;  // shared with the p2p engine
  // Destroyed in reverse order: the threads' owners first.
  std::unique_ptr<ControlPlane> cp_;
  std::unique_ptr<Backend> backend_;
  SetHealth health_;
  GroupQueue queue_;
  std::unique_ptr<SetController> controller_;
  std::shared_ptr<P2pEngine> p2p_;
  std::unique_ptr<Executor> executor_;
  std::mutex shutdownMu_;  // serializes shutdown()
};

}  // namespace hora
