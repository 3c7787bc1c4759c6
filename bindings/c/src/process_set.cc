#include "process_set.h"

#include <sched.h>

#include <algorithm>

#include "controllers/coordinator_service.h"
#include "controllers/settings_agreement.h"
#include "core/cpu_affinity.h"
#include "core/host_identity.h"
#include "core/spin_wait.h"
#include "hora/version.h"
#include "ops/shm/hier_backend.h"
#include "ops/shm/shm_backend.h"
#include "ops/tcp/tcp_ring.h"

namespace hora {

SharedSettings sharedSettings(const SetOptions& o) {
  // Settings that change how a rank pairs its collectives with the others'.
  // (The shm settings are agreed by the shm set-up itself, which falls back
  // to Gloo.)
  return {
      {"hora version", std::to_string(HORA_VERSION_MAJOR) + "." +
                           std::to_string(HORA_VERSION_MINOR) + "." +
                           std::to_string(HORA_VERSION_PATCH)},
      // The response cache only works if every rank applies the same
      // operations to a cache of the same capacity.
      {"HORA_CACHE_CAPACITY", std::to_string(o.cacheCapacity)},
      {"HORA_GLOO_ALGORITHM", glooAlgorithmName(o.glooAlgorithm)},
      {"HORA_GPU_BACKEND", gpuBackendName(o.gpu.backend)},
  };
}

namespace {

// How long the shutdown of a set that already failed waits for its peers'
// goodbyes (a healthy set waits up to the peer timeout).
constexpr std::chrono::seconds kFailedSetLinger(2);

// What set rank 0's autotune starts from and may change; null when it is off
// (HORA_AUTOTUNE=0, a set of one rank, or nothing left to tune).
std::shared_ptr<const AutotuneDriverOptions> autotuneOptions(const SetOptions& o,
                                                             const TuningValues& start,
                                                             const std::string& setName, bool onShm,
                                                             bool allreduceOnGloo, int size,
                                                             Telemetry* telemetry) {
  if (!o.autotune || size < 2) return nullptr;
  auto at = std::make_shared<AutotuneDriverOptions>();
  at->tuner.start = start;
  at->tuner.seed = o.autotuneSeed;
  at->tuner.shmSlotBytes = std::max<int64_t>(std::max(o.shmSlotBytes, o.shmChunkBytes), 64);
  for (int d = 0; d < kTuneDims; ++d) at->tuner.tune[d] = !o.autotunePinned[d];
  // Only what the set's data plane uses: the shm values on shared memory,
  // the Gloo cut-over where allreduce runs on Gloo (not on the hierarchy nor
  // the tcp ring, and not when bcube is forced).
  at->tuner.tune[static_cast<int>(TuneDim::kShmChunk)] &= onShm;
  at->tuner.tune[static_cast<int>(TuneDim::kShmMinBytes)] &= onShm;
  at->tuner.tune[static_cast<int>(TuneDim::kGlooBcubeMax)] &=
      allreduceOnGloo && o.glooAlgorithm != GlooAlgorithm::kBcube;
  at->setName = setName;
  at->logPath = o.autotuneLog;
  at->telemetry = telemetry;
  if (!Autotuner(at->tuner).active()) return nullptr;
  return at;
}

}  // namespace

ProcessSet::ProcessSet(std::string name, std::vector<int> globalRanks, int rank, SetOptions options)
    : name_(std::move(name)),
      globalRanks_(std::move(globalRanks)),
      rank_(rank),
      opts_(std::move(options)),
      health_(name_, opts_.logger) {
  health_.setElastic(opts_.elastic);
  setSpin(spinPolicyFor(opts_.spinUs, opts_.localSize));
}

void ProcessSet::setSpin(const SpinPolicy& spin) {
  spin_ = spin;
  driveSpin_ = spin_;
  if (spin_.enabled() && !spin_.yieldToPeers)
    driveSpin_.window = std::max(
        spin_.window, std::chrono::nanoseconds(std::chrono::microseconds(opts_.waitSpinUs)));
  queue_.setSpin(spin_);
}

void ProcessSet::homeCaller() {
  // The common case, already home, costs a vDSO read.
  if (homeCpu_ < 0) return;
  const int here = ::sched_getcpu();
  if (here < 0 || here == homeCpu_) return;
  constexpr auto kHomingInterval = std::chrono::milliseconds(10);
  const int64_t now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  int64_t last = lastHomingNs_.load(std::memory_order_relaxed);
  if (now - last < std::chrono::nanoseconds(kHomingInterval).count() ||
      !lastHomingNs_.compare_exchange_strong(last, now, std::memory_order_relaxed))
    return;
  if (moveCallingThreadTo(homeCpu_)) telemetry_->callerHomed();
}

Result<std::unique_ptr<ProcessSet>> ProcessSet::create(std::string name,
                                                       std::vector<int> globalRanks,
                                                       int myGlobalRank,
                                                       std::shared_ptr<Store> store,
                                                       SetOptions options) {
  auto it = std::find(globalRanks.begin(), globalRanks.end(), myGlobalRank);
  if (it == globalRanks.end())
    return invalidArgument("rank " + std::to_string(myGlobalRank) +
                           " is not a member of process set " + name);
  const int rank = static_cast<int>(it - globalRanks.begin());
  std::unique_ptr<ProcessSet> ps(new ProcessSet(name, globalRanks, rank, std::move(options)));
  const SetOptions& o = ps->opts_;
  const Logger& logger = o.logger;

  // Compared before anything connects, so a difference fails every member
  // at once with both values named.
  const SharedSettings shared = sharedSettings(o);
  HORA_RETURN_IF_ERROR(agreeOnSettings(*store, rank, globalRanks, shared, o.startTimeout, name));

  // Control plane.
  ControlPlaneOptions cpo;
  cpo.rank = rank;
  cpo.size = ps->size();
  cpo.globalRanks = globalRanks;
  cpo.workerIds = o.workerIds;
  cpo.hostname = o.hostname;
  cpo.startTimeout = o.startTimeout;
  cpo.heartbeatInterval = o.heartbeatInterval;
  cpo.peerTimeout = o.peerTimeout;
  cpo.setName = name;
  cpo.shmLane = o.shmNegotiation;
  cpo.hostId = hostIdentity();  // exchanged either way: kernel mates
  cpo.spin = ps->spin_;
  auto cp = ControlPlane::create(std::make_shared<PrefixStore>(store, "ctrl"), cpo, logger);
  if (!cp.isOk()) return cp.status();
  ps->cp_ = cp.take();
  // Ranks on other "hosts" that share this kernel (emulated or container
  // hosts on one machine) share its cores too: counted with the host's own
  // ranks, so that waits give the core to peers where together they
  // outnumber the cores (a waiter that kept it made 4 such ranks on 2 cores
  // 2.3-2.8x slower, bench/results/2026-11-29-tcp-caller-drives.md).
  if (ps->cp_->kernelMates() > o.localSize) {
    ps->setSpin(spinPolicyFor(o.spinUs, ps->cp_->kernelMates()));
    HORA_LOG(logger, kInfo) << "process set " << name << ": " << ps->cp_->kernelMates()
                            << " of its ranks share this machine's kernel (more than the "
                            << o.localSize << " of this host): waits yield the core as if "
                            << "they ran on one host (in a hierarchy's shared-memory stage too, "
                            << "where they outnumber the machine's CPUs)";
  }
  if (ps->size() > 1)
    HORA_LOG(logger, kInfo) << "process set " << name << ": negotiation "
                            << (ps->cp_->laneUp() ? "through shared memory"
                                                  : "over TCP (" + ps->cp_->laneStatus() + ")");

  // The data plane's set-up waits for every rank's keys in the store: a rank
  // that dies meanwhile fails the others' waits at once, named by the control
  // connection it closed (instead of after the start timeout), and so do
  // Gloo's pair connects (a peer that died after publishing its address never
  // connects). Disarmed before the control thread starts and takes the
  // connections over; a communicator connected later would race it for them.
  auto setUpArmed = std::make_shared<std::atomic<bool>>(ps->size() > 1);
  ControlPlane* cpRaw = ps->cp_.get();
  auto setUpWatch = [cpRaw, setUpArmed] {
    return setUpArmed->load() ? cpRaw->peersStillConnected() : Status::ok();
  };
  store = std::make_shared<WatchedStore>(store, setUpWatch, setUpArmed);

  // Data plane: Gloo, wrapped in shared memory when every rank is on one
  // host (the ranks agree on it at set-up, else the set stays on Gloo).
  GlooBackendOptions go;
  go.hostname = o.hostname;
  go.iface = o.glooIface;
  go.timeout = o.peerTimeout;
  go.algorithm = o.glooAlgorithm;
  go.setUpWatch = setUpWatch;
  // With two ranks ring and bcube exchange the same data, and ring measured
  // about twice as fast for small messages here (bench/README.md).
  if (go.algorithm == GlooAlgorithm::kAuto && globalRanks.size() == 2)
    go.algorithm = GlooAlgorithm::kRing;
  auto be = createGlooBackend(store, "gloo", rank, ps->size(), go);
  if (!be.isOk())
    return be.status().withContext("process set " + name + ": connecting the Gloo data plane");
  ShmBackendOptions sho;
  sho.enabled = o.shm && o.shmChunkBytes > 0 && o.shmMinBytes >= 0;
  sho.chunkBytes = static_cast<size_t>(std::max<int64_t>(o.shmChunkBytes, 0));
  sho.slotBytes = static_cast<size_t>(std::max<int64_t>(o.shmSlotBytes, 0));
  sho.chunkBytesWhenRanksFit =
      static_cast<size_t>(std::max<int64_t>(o.shmChunkBytesWhenRanksFit, 0));
  sho.minBytes = static_cast<size_t>(std::max<int64_t>(o.shmMinBytes, 0));
  sho.peerYield = std::chrono::microseconds(std::max<int64_t>(o.spinUs, 0));
  sho.smallChunkBytesWhenCrowded = 256 << 10;
  sho.claimLines = o.shmClaimLines;
  // Never below HORA_SPIN_US, off with it (as a framework thread's wait).
  sho.peerSpin = o.spinUs > 0 ? std::chrono::microseconds(std::max(o.spinUs, o.shmWaitSpinUs))
                              : std::chrono::microseconds(0);
  sho.timeout = o.peerTimeout;
  sho.startTimeout = o.startTimeout;
  sho.hostId = o.hostId;
  // The hierarchy's host-local stage shares the cores with the kernel mates
  // too (ShmPlacement::matesCrowd).
  sho.kernelRanks = ps->cp_->kernelMates();
  // Across hosts with several ranks on each: the hierarchical allreduce
  // (ops/shm/hier_backend.h); on one host: shared memory for the whole set.
  HierBackendOptions ho;
  ho.shm = sho;
  ho.overlap = o.hierOverlap;
  ho.collectiveMinBytes = static_cast<size_t>(std::max<int64_t>(o.hierCollectiveMinBytes, 0));
  if (!parseHierMode(o.hierAllreduce, &ho.mode))
    return invalidArgument("HORA_HIER_ALLREDUCE: '" + o.hierAllreduce + "' is not auto|hier|flat");
  ho.cross = o.hierCross;
  GlooBackendOptions crossGo = go;
  TcpRingOptions tro;
  tro.host = o.hostname;
  tro.iface = o.glooIface;  // the NIC the job chose for Gloo carries the cross stage too
  tro.timeout = o.peerTimeout;
  tro.startTimeout = o.startTimeout;
  tro.setUpWatch = setUpWatch;
  // Polls for the peer's bytes as a rank's other waits do, giving the core
  // away between looks where this process's threads (the cross thread is one
  // more) or the host's ranks outnumber its CPUs.
  tro.spin = std::chrono::duration_cast<std::chrono::microseconds>(ps->spin_.window);
  tro.yieldWhilePolling = ps->spin_.yield || ps->spin_.yieldToPeers;
  const bool tcpCross = o.hierCross == "tcp";
  auto connectCross = [crossGo, tro, tcpCross](std::shared_ptr<Store> s, int r,
                                               int n) mutable -> Result<std::unique_ptr<Backend>> {
    if (tcpCross) {
      TcpRingOptions named = tro;
      for (int h = 0; h < n; ++h)
        named.rankNames.push_back("the rank of this local index on host " + std::to_string(h));
      return createTcpRingBackend(std::move(s), r, n, named);
    }
    // With two hosts ring and bcube exchange the same data (see above).
    if (crossGo.algorithm == GlooAlgorithm::kAuto && n == 2)
      crossGo.algorithm = GlooAlgorithm::kRing;
    return createGlooBackend(std::move(s), "gloo", r, n, crossGo);
  };
  // Across hosts, every collective runs on a tcp ring over all ranks (a Gloo
  // wait is two thread wake-ups; alltoall over a mesh beside the ring); with
  // the hierarchy, those it does not run itself (its allreduce, and allgather
  // and reducescatter from HORA_HIER_COLLECTIVE_MIN_BYTES). Not where the job
  // asked for Gloo's ring or its algorithm, and only up to kMaxFlatRingRanks:
  // a ring's 2(n-1) steps were measured up to 4 ranks only, against Gloo's
  // bcube with its log2(n) steps. Every rank must want it, else all keep Gloo.
  constexpr int kMaxFlatRingRanks = 8;
  TcpRingOptions flatRing = tro;
  for (int r = 0; r < ps->size(); ++r)
    flatRing.rankNames.push_back("set rank " + std::to_string(r) + " (global rank " +
                                 std::to_string(globalRanks[r]) + ")");
  const std::string refusal =
      !tcpCross                                 ? "HORA_HIER_CROSS=gloo"
      : ho.mode == HierMode::kFlat              ? "HORA_HIER_ALLREDUCE=flat"
      : o.glooAlgorithm != GlooAlgorithm::kAuto ? "HORA_GLOO_ALGORITHM is set"
      : ps->size() > kMaxFlatRingRanks ? "more than " + std::to_string(kMaxFlatRingRanks) + " ranks"
                                       : "";
  std::string noRing;
  auto ringOver = [&](std::unique_ptr<Backend> rest) {
    return withTcpRing(std::make_shared<PrefixStore>(store, "flatring"), rank, ps->size(), refusal,
                       flatRing, std::move(rest), &noRing);
  };
  ho.wrapFlat = ringOver;
  HierOutcome outcome;
  std::string noHier;
  auto hb = createHierBackend(std::make_shared<PrefixStore>(store, "hier"), rank, ps->size(), ho,
                              be.take(), connectCross, &outcome, &noHier);
  if (!hb.isOk())
    return hb.status().withContext("process set " + name + ": setting up the hierarchy");
  std::string noShm;
  if (outcome == HierOutcome::kOneHost) {
    auto sb = createShmBackend(std::make_shared<PrefixStore>(store, "shm"), rank, ps->size(), sho,
                               hb.take(), &noShm);
    if (!sb.isOk())
      return sb.status().withContext("process set " + name + ": setting up shared memory");
    ps->backend_ = sb.take();
  } else if (outcome == HierOutcome::kFlat && ps->size() > 1) {
    noShm = "ranks run on different hosts, no hierarchy: " + noHier;
    auto rb = ringOver(hb.take());
    if (!rb.isOk())
      return rb.status().withContext("process set " + name + ": setting up the tcp ring");
    ps->backend_ = rb.take();
    // Under HORA_HIER_ALLREDUCE=flat the reason is already in the line.
    if (!noRing.empty() && ho.mode != HierMode::kFlat) noShm += "; collectives on Gloo: " + noRing;
  } else {
    ps->backend_ = hb.take();
  }
  // With the hierarchy its name says where the rest runs; why not the ring:
  const std::string restNote = outcome == HierOutcome::kHierarchical && !noRing.empty()
                                   ? " (the rest on Gloo: " + noRing + ")"
                                   : "";
  if (ps->size() > 1)
    HORA_LOG(logger, kInfo) << "process set " << name << ": data plane " << ps->backend_->name()
                            << (noShm.empty() ? "" : " (no shared memory: " + noShm + ")")
                            << restNote;

  // A collective blocked on a vanished peer must not wait for the data
  // plane's timeout. A goodbye is different: that peer finished everything
  // agreed before it, so queued work may still complete. (Registered before
  // the controller's listener, which fails the pending requests.)
  Backend* backend = ps->backend_.get();
  ps->health_.addListener([backend](const Status& why, bool) {
    if (why.code() != Code::kShutDown) backend->abort();
  });

  // Metrics, flight recorder and timeline, before the threads that report into them.
  TelemetryOptions to;
  to.setName = name;
  to.setRank = rank;
  to.globalRanks = globalRanks;
  to.flightEntries = o.telemetry ? o.flightEntries : 0;
  to.stragglerWindow = o.stragglerWindow;
  to.dumpDir = o.dumpDir;
  to.host = o.hostname;
  to.timeline = o.timeline;
  ps->telemetry_ = std::make_shared<Telemetry>(std::move(to));

  // Point-to-point: nothing is created until the first send or receive.
  P2pEngineOptions po;
  po.setName = name;
  po.rank = rank;
  po.globalRanks = globalRanks;
  po.store = std::make_shared<PrefixStore>(store, "p2p");
  po.hostId = o.hostId.empty() ? hostIdentity() : o.hostId;
  po.ringBytes = static_cast<uint64_t>(o.p2pRingBytes);
  po.eagerBytes = static_cast<uint64_t>(o.p2pEagerBytes);
  po.fastBytes = static_cast<uint64_t>(o.p2pFastBytes);
  po.spinUs = o.p2pSpinUs;
  po.transport = o.p2pTransport;
  po.hostname = o.hostname;
  po.stallWarning = o.stallWarning;
  po.stallShutdown = o.stallShutdown;
  po.logger = logger;
  po.gpuPlugin = o.gpu.plugin;
  po.localRank = o.gpu.localRank;
  po.peerTimeout = o.peerTimeout;
  if (o.telemetry) po.telemetry = ps->telemetry_;
  SetHealth* health = &ps->health_;
  po.onFatal = [health](const Status& why) { health->fail(why, true); };
  ps->p2p_ = std::make_shared<P2pEngine>(std::move(po));
  P2pEngine* p2p = ps->p2p_.get();
  // A peer's goodbye breaks the set for collectives, which need everyone;
  // sends and receives between the remaining ranks go on (the engine sees
  // that peer's inbox closed and fails only what waits for it).
  ps->health_.addListener([p2p](const Status& why, bool) {
    if (why.code() != Code::kShutDown) p2p->fail(why);
  });
  // Weak: the engine holds the telemetry, not the other way round.
  ps->telemetry_->setP2pReport([weak = std::weak_ptr<P2pEngine>(ps->p2p_)] {
    auto engine = weak.lock();
    return engine ? engine->pendingReport() : std::string();
  });

  // Autotune: every rank starts from the configured values (the shm ones
  // were agreed at set-up) and applies what set rank 0 sends.
  TuningValues start;
  start.fusionThresholdBytes = o.fusionThresholdBytes;
  start.cycleTimeUs = o.cycleTime.count();
  start.shmChunkBytes = o.shmChunkBytes;
  // The chunk shared memory picked at set-up (it depends on the ranks' CPUs).
  const auto* shm = dynamic_cast<const ShmBackend*>(ps->backend_.get());
  // Whether the shared-memory set-up found this rank's CPUs its own: its
  // mask holds the ranks, or no other rank's mask holds any of them (a
  // launcher's core per rank; ShmBackend::pollsPeers). Only where the set
  // holds every rank of the host: the set-up sees its own members' masks
  // alone, and a smaller set (2 of 4 ranks on 2 CPUs) would otherwise take
  // the host for uncrowded.
  const bool ownCores = shm && ps->size() == o.localSize && shm->pollsPeers();
  if (shm) {
    start.shmChunkBytes = static_cast<int64_t>(shm->initialChunkBytes());
    // Where the process's own mask holds fewer CPUs than the host's ranks
    // but the cores are its own: a framework thread polling for a peer need
    // not give its core away (it still does while it waits for a thread of
    // its own). Before any of the set's threads run. 2 ranks bound by
    // taskset, 4 B: see bench/results/2026-11-28-claim-lines.md.
    if (ps->spin_.yieldToPeers && ownCores) {
      SpinPolicy spin = ps->spin_;
      spin.yieldToPeers = false;
      ps->setSpin(spin);
    }
    // Homing where the shared-memory set-up found every rank on one mask,
    // two or more ranks to each of its CPUs (not where a launcher gave each
    // rank CPUs of its own).
    if (o.callerHomeCpu >= 0 && shm->ranksShareCpusEvenly()) {
      ps->homeCpu_ = o.callerHomeCpu;
      HORA_LOG(logger, kInfo) << "process set " << name << ": " << ps->size()
                              << " ranks share their CPUs evenly; a framework thread waiting in "
                                 "hora_wait on another CPU is moved back to CPU "
                              << ps->homeCpu_ << " (HORA_HOME_CALLER=0 leaves it)";
    }
  }
  start.shmMinBytes = o.shmMinBytes;
  start.glooBcubeMaxBytes = static_cast<int64_t>(kGlooBcubeMaxBytes);
  const bool onShm = ps->backend_->name().rfind("shm+", 0) == 0;
  Telemetry* telemetry = o.telemetry ? ps->telemetry_.get() : nullptr;
  const bool allreduceOnGloo = ps->backend_->name().rfind("gloo", 0) == 0;
  auto autotune = autotuneOptions(o, start, name, onShm, allreduceOnGloo, ps->size(), telemetry);
  ps->telemetry_->autotuneStart(o.autotune && ps->size() > 1, start);

  // Control thread.
  std::unique_ptr<CoordinatorLink> link;
  if (rank == 0) {
    CoordinatorServiceOptions co;
    co.coordinator.size = ps->size();
    co.coordinator.fusionThresholdBytes = o.fusionThresholdBytes;
    co.coordinator.stallWarning = o.stallWarning;
    co.coordinator.stallShutdown = o.stallShutdown;
    co.coordinator.setName = name;
    co.coordinator.globalRanks = globalRanks;
    co.coordinator.telemetry = o.telemetry ? ps->telemetry_.get() : nullptr;
    co.cacheCapacity = o.cacheCapacity;
    co.cycleTime = o.cycleTime;
    co.autotune = autotune;
    link = std::make_unique<CoordinatorService>(co, *ps->cp_, ps->health_, ps->queue_, logger);
  } else {
    link = std::make_unique<RemoteCoordinator>(*ps->cp_, name);
  }
  SetControllerOptions sco;
  sco.setName = name;
  sco.rank = rank;
  sco.globalRanks = globalRanks;
  sco.cacheCapacity = o.cacheCapacity;
  sco.telemetry = o.telemetry ? ps->telemetry_.get() : nullptr;
  sco.metricsInterval = o.metricsInterval;
  sco.prometheusDir = o.prometheusDir;
  sco.dumpRequests = o.dumpRequests;
  sco.stallWarning = o.stallWarning;
  // -1: on the shared-memory data plane a small allreduce is a few µs, and
  // at 2 ranks it beats the coordinator's round trip from about 16 KiB; off
  // it (Gloo across hosts or over loopback) a round trip to the coordinator
  // beats a Gloo exchange behind the negotiation up to the 64 KiB cap
  // (bench/results/2026-11-25-inline-allreduce.md, 2 and 4 ranks). Every
  // rank's copy goes through the coordinator's link twice, so large sets get
  // less: at most 256 KiB per tensor in each direction (not measured beyond
  // 4 ranks: this machine has two cores), on one host too, where rank 0's
  // control thread reduces every copy.
  // A tcp ring (the hierarchy's cross stage, or the allreduce of a set
  // across hosts without it) is faster behind the negotiation than Gloo. As
  // a multiple of Open MPI's time in the same launch (each figure its own
  // launch): 2 hosts x 2 ranks, 32 KiB through the ring 1.84x, inline 2.06x,
  // 16 KiB 2.55x against 1.63x; 4 hosts x 1 rank, 64 KiB 0.99x against
  // 2.0x, 16 KiB 2.2x against 2.1x. So such sets get a quarter of the
  // budget, 16 KiB at 4 ranks (bench/results/2026-11-28-tcp-cross.md;
  // larger sets unmeasured).
  // "tcp-ring+gloo", or "hier(... tcp-ring across; ...)".
  const bool onTcpRing = ps->backend_->name().find("tcp-ring") != std::string::npos;
  const size_t perSet = (size_t{onTcpRing ? 64u : 256u} << 10) / static_cast<size_t>(ps->size());
  sco.inlineMaxBytes = o.inlineMaxBytes >= 0 ? static_cast<size_t>(o.inlineMaxBytes)
                       : onShm               ? std::clamp<size_t>(perSet, 256, 4096)
                                             : std::clamp<size_t>(perSet, 256, kMaxInlineBytes);
  // The other collectives: on one host inline takes 0.32-0.66x the time of
  // the shared-memory data plane at 64 B-1 KiB and 0.39-0.87x at 4 KiB at 4
  // ranks. Across hosts the response carries the result to every rank where
  // the ring or mesh sends each rank its part once: inline wins up to 4-8
  // KiB (1.1-2.0x) but loses at 16 KiB (0.37-0.87x at 2 x 1 and 4 x 1), so
  // off shared memory (across hosts, or HORA_SHM=0, unmeasured) they get a
  // quarter of the allreduce's budget
  // (bench/results/2026-11-29-inline-collectives.md).
  sco.inlineMaxOtherBytes =
      o.inlineMaxBytes >= 0 || onShm ? sco.inlineMaxBytes : sco.inlineMaxBytes / 4;
  ps->controller_ = std::make_unique<SetController>(sco, *ps->cp_, std::move(link), ps->health_,
                                                    ps->queue_, logger);

  // Executor thread.
  ExecContext ctx;
  ctx.setName = name;
  ctx.rank = rank;
  ctx.globalRanks = globalRanks;
  ctx.backend = backend;
  ctx.health = &ps->health_;
  ctx.logger = logger;
  ctx.peerTimeout = o.peerTimeout;
  ctx.spin = ps->spin_;
  ctx.telemetry = o.telemetry ? ps->telemetry_.get() : nullptr;
  ctx.cpu = o.executorCpu;
  if (ctx.cpu >= 0) ctx.processCpus = allowedCpus();
  ps->executor_ = std::make_unique<Executor>(std::move(ctx), ps->queue_, o.gpu);

  // Only on the shared-memory data plane: its waits notice a dead peer at
  // once and a stalled one after the peer timeout on their own, without the
  // heartbeats this thread stops sending meanwhile (Gloo across hosts: not
  // measured, and a round trip there is long).
  if (onShm && o.runOnControlMaxBytes > 0) {
    Executor* ex = ps->executor_.get();
    ControlPlane* cp = ps->cp_.get();
    ps->controller_->setSmallGroupRunner(
        [ex, cp](AgreedGroup& g) { return ex->runHere(g, [cp] { cp->markAlive(); }); },
        [ex](const AgreedGroup& g) { return ex->canRunHere(g); }, o.runOnControlMaxBytes);
  }
  // Packing ahead is for the shared-memory plane only (the one whose memory
  // a rank can fill before its peers are ready): while the negotiation runs
  // with a core per rank, before the request where the ranks outnumber the
  // cores (SetController::setPacker). A core per rank as the shared-memory
  // set-up found it (ownCores), else as this process's own mask says.
  if (onShm && o.packAhead) {
    Executor* ex = ps->executor_.get();
    const bool crowded = !ownCores && ps->backend_->size() > usableCpuCount();
    ps->controller_->setPacker(
        [ex](TensorEntry& e, const std::function<bool()>& stop) {
          return ex->prepareHere(e, stop);
        },
        crowded, [ex] { ex->withdrawPrepared(); });
  }
  ps->controller_->setCallerDrives(o.callerDrives);
  setUpArmed->store(false);
  ps->controller_->start();
  ps->executor_->start();
  return ps;
}

ProcessSet::~ProcessSet() { shutdown("the process set was destroyed"); }

void ProcessSet::shutdown(const std::string& reason) {
  std::lock_guard<std::mutex> once(shutdownMu_);  // concurrent destroy/shutdown calls run it once
  if (!controller_) return;                       // create() failed before anything started
  if (controller_->isControlThread()) {
    // Called from a completion callback on the control thread: joining itself would crash.
    HORA_LOG(opts_.logger, kError)
        << "hora_shutdown called from a completion callback; ignored (callbacks must not "
           "call blocking hora functions)";
    return;
  }
  if (!controller_->beginShutdown()) return;
  const Status why(Code::kShutDown, reason);
  const bool running = controller_->running();
  // Graceful order, so that the last collectives complete on every rank:
  // 1. emit what is ready (other ranks may be waiting for it), 2. let the
  // executor finish every agreed group, 3. fail what was never negotiated,
  // 4. say goodbye and keep the data plane open until every peer is done.
  // Each wait is bounded, so a hung peer delays shutdown but never blocks it.
  auto linger = std::clamp<Clock::duration>(opts_.peerTimeout, std::chrono::seconds(1),
                                            std::chrono::seconds(30));
  // A set that already failed has nothing left to complete together: its
  // peers are failing too (they were told, SetHealth::holdForPeers), and a
  // peer that cannot answer (still in its own set-up, or stopped) must not
  // hold this rank's shutdown for the peer timeout. Not a set that is only
  // ending: a peer's goodbye breaks it too (kShutDown), and then this rank
  // may still have agreed groups to finish.
  if (health_.broken() && health_.status().code() != Code::kShutDown)
    linger = std::min<Clock::duration>(linger, kFailedSetLinger);
  const auto deadline = Clock::now() + linger;
  if (running) {
    controller_->flush(deadline);
    queue_.waitIdle(deadline);
  }
  p2p_->shutdown(reason);
  controller_->failPending(why);
  if (running) controller_->closeGracefully(deadline);
  controller_->stop();
  queue_.close();
  executor_->join();
  executor_->releaseGpu();
  // A data-plane failure still waiting for the control thread to name its
  // cause: that thread is gone, so the failure stands as it is.
  health_.settleNow();
  // The control thread that would release a held failure is gone.
  health_.release();
  for (auto& g : queue_.takeRemaining())
    for (auto& e : g.entries)
      if (e) e->complete(entryFailure(*e, globalRank(rank_), why));
}

}  // namespace hora
