// SetController: the control thread of one process set, on every rank alike.
//
// What it does, in the order a tensor meets it:
//  1. enqueue() (framework threads): a small collective's tensor is copied
//     (prescaled, if it reduces) into its request (inline, below); the entries go
//     into the tensor table (name -> entry; a name may be in flight once) and
//     the inbox, and the control thread is woken: no fixed-cycle sleeping.
//  2. drain (control thread): the inbox becomes one RequestList: a cache hit
//     (bit + signature) for each tensor whose response this rank has cached
//     with the same signature, the full request otherwise; either carries
//     the tensor of an inline collective, up to kMaxInlineListBytes per list.
//     It goes to the coordinator through the CoordinatorLink (a direct call
//     on set rank 0, a frame elsewhere). A nacked hit is resent in full.
//  3. responses: every response list is applied to this rank's response
//     cache in order (touch a bit, put a full cacheable response), checked,
//     and each group's entries are claimed from the table. A group that needs
//     no data plane (barrier, join, error, a collective whose result the
//     coordinator computed from the ranks' tensors) is completed right here when
//     nothing is queued ahead of it; every other group goes to the executor
//     through the GroupQueue, so this thread keeps heartbeats and loss
//     detection running while collectives wait on peers.
//  4. failures: a lost or silent peer (ControlPlane), an abort from the
//     coordinator, a malformed message or a response that does not match
//     break the set through SetHealth. Its listener here tells the peers
//     (through the link) and fails every pending request with the cause.
//
// Threads: enqueue/autoName/driveWhile from framework threads; the shutdown
// steps from the thread that shuts the set down; everything else on the
// control thread, which start() creates and which runs the ControlPlane's
// event loop, or on a framework thread while it holds the set's drive lock
// in its stead (setCallerDrives: enqueue sends the request itself, a waiter
// reads the answer and runs a small group; controllers/drive_lock.h).
#pragma once

#include <atomic>
#include <boost/asio/steady_timer.hpp>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "controllers/control_plane.h"
#include "controllers/coordinator_link.h"
#include "core/agreed_group.h"
#include "core/group_queue.h"
#include "core/logging.h"
#include "core/response_cache.h"
#include "core/set_health.h"
#include "core/spin_wait.h"
#include "core/telemetry.h"

namespace hora {

struct SetControllerOptions {
  std::string setName = "global";
  int rank = 0;                  // within the set
  std::vector<int> globalRanks;  // set rank -> global rank
  int cacheCapacity = 1024;
  // Observability (core/telemetry.h); null in unit tests that do not need it.
  Telemetry* telemetry = nullptr;
  // The telemetry tick on the control thread: a metrics line every
  // metricsInterval (0 = never), <prometheusDir>/hora-<set>-rank<R>.prom
  // rewritten as often ("" = none), a flight dump when *dumpRequests moves
  // (SIGUSR1, counted by the C layer) or when a tensor of this rank waits
  // longer than stallWarning (once per stalled tensor).
  Seconds metricsInterval{0};
  std::string prometheusDir;
  const std::atomic<uint64_t>* dumpRequests = nullptr;
  Seconds stallWarning{60};
  // Allreduces of host tensors of 1..inlineMaxBytes bytes carry the tensor
  // in their request (Request::payload; HORA_INLINE_MAX_BYTES, at most
  // kMaxInlineBytes; 0 = this rank sends none). Ranks need not agree: the
  // coordinator combines inline only when every rank sent its tensor.
  size_t inlineMaxBytes = 0;
  // The same for the other collectives, on their result (what the response
  // carries back: the tensor, or for allgather and alltoall about the set's
  // size times it; a broadcast's tensor only from its root):
  // HORA_INLINE_MAX_BYTES when set; by default lower off shared memory,
  // where the response repeats a result the data plane would send each rank
  // a part of.
  size_t inlineMaxOtherBytes = 0;
};

class SetController : public CoordinatorLink::Client {
 public:
  // Registers the controller's SetHealth listener (tell the peers, fail what
  // is pending) and the suspicion timer; call before any thread can break
  // the set. `cp`, `health` and `queue` outlive the controller.
  SetController(SetControllerOptions options, ControlPlane& cp,
                std::unique_ptr<CoordinatorLink> link, SetHealth& health, GroupQueue& queue,
                Logger logger);
  ~SetController() override;

  // Starts the control thread (the ControlPlane's event loop).
  // Small allreduces of host tensors (at most maxBytes in all) that find the
  // executor idle, and every frame handed to the shared-memory lane, run on
  // the control thread through `run` (the executor's runHere): one thread
  // hand-off less. Set before start(); none by default.
  // `run` returns false, running nothing, to leave the group to the executor;
  // `accepts` says beforehand whether it would run a group (the executor's
  // canRunHere). A framework thread waiting for its requests runs a lone
  // queued group through `run` too, of any size (runLoneQueued).
  void setSmallGroupRunner(std::function<bool(AgreedGroup&)> run,
                           std::function<bool(const AgreedGroup&)> accepts, size_t maxBytes) {
    smallRunner_ = std::move(run);
    smallRunnerAccepts_ = std::move(accepts);
    smallRunnerMaxBytes_ = maxBytes;
  }
  // Packs an allreduce's first chunk into the data plane's memory while its
  // negotiation is under way (the executor's prepareHere), when it is the
  // only tensor pending, this rank's request is already in the shared-memory
  // lane and the executor is idle. `pack` gets a stop function to ask
  // between pieces (true: the lane has input; the negotiation's answer
  // comes first). Set before start(); none by default.
  // beforeRequest: pack first, then send the request. Where the ranks
  // outnumber the cores no core idles while a rank waits for its answer, so
  // packing after the request only reorders work; packed before it (and
  // published to the peers), the data plane's wait for this rank's pack,
  // a round of sleeps and wake-ups there, is gone by the time the answer
  // arrives.
  // `withdraw` (may be empty) runs before every request list goes out: what
  // an earlier pack published for the peers no longer counts
  // (Backend::withdrawPrepacked).
  void setPacker(std::function<bool(TensorEntry&, const std::function<bool()>&)> pack,
                 bool beforeRequest = false, std::function<void()> withdraw = nullptr) {
    packer_ = std::move(pack);
    packBeforeRequest_ = beforeRequest;
    withdrawPack_ = std::move(withdraw);
  }
  // Framework threads submitting to and waiting on the set do the control
  // thread's work themselves when no other thread does it (controllers/
  // drive_lock.h): only with the shared-memory lane. Set before start().
  void setCallerDrives(bool on) { callerDrives_ = on; }
  void start();

  // Framework threads. On failure nothing was enqueued.
  Status enqueue(std::vector<EntryPtr> entries);
  // A framework thread waiting for `done` (one of its requests on this
  // set): polls it for up to the spin window like spinUntil, and between
  // polls does the control thread's work when nobody else does (the lane's
  // or the sockets' frames, the coordinator's decisions, on one host a small
  // group's data plane).
  // Returns whether `done` became true.
  // Driving stops at `deadline` too (the caller's own timeout).
  bool driveWhile(const SpinPolicy& spin, const std::function<bool()>& done,
                  Clock::time_point deadline);
  // "<kind>.noname.<n>", counted per kind in call order.
  std::string autoName(CollectiveKind kind);

  // Shutdown, in this order, from the thread that shuts the set down.
  // False when shutdown already began; new requests are refused from here.
  bool beginShutdown();
  bool isControlThread() const;
  bool running() const { return thread_.joinable(); }
  // Emits what is ready (other ranks may be waiting for it); bounded.
  void flush(Clock::time_point deadline);
  // Fails every request not yet agreed with `why`.
  void failPending(const Status& why);
  // Says goodbye and waits (bounded) until every peer is done.
  void closeGracefully(Clock::time_point deadline);
  // Stops the control thread and joins it.
  void stop();

  // CoordinatorLink::Client (control thread).
  void onResponses(const ResponseList& list) override;
  void onNacks(const std::vector<CacheHit>& hits) override;
  void failSet(Status why, bool tellPeers) override;
  bool stopping() const override { return stopping_.load(); }

 private:
  void drainInbox();
  // Around `e`'s request (see setPacker): packer_, when it applies.
  void packAhead(TensorEntry& e);
  // The entry's tensor (prescaled, if it reduces) when it may travel in
  // its request (SetControllerOptions::inlineMaxBytes), else empty.
  std::string inlinePayload(const TensorEntry& e) const;
  void onPeerLost(int peer, Status why);
  void onBroken(const Status& why, bool tellPeers);  // any thread
  Status validateResponse(const Response& r) const;
  Status claimEntries(const std::vector<Response>& responses, AgreedGroup* group);
  void queueGroup(std::vector<Response> responses);
  // Whether smallRunner_ takes `g` (allreduces of host tensors within its cap).
  bool runsHere(const AgreedGroup& g) const;
  static bool hostAllreduces(const AgreedGroup& g);
  static size_t groupBytes(const AgreedGroup& g);
  // A framework thread waiting in driveWhile, under the drive lock: runs
  // the one group queued for the executor itself when the executor has not
  // picked it up and this rank has nothing else pending (no later group to
  // negotiate while it runs, the executor's reason to exist). Of any size
  // within the runner's cap; above it only if it would move at 1 GB/s
  // (this plane's 4-ranks-on-2-cores speed is 1.5) before `deadline`, so
  // that a wait with a timeout keeps its bound. The executor's wake-up is
  // saved: next to other busy processes it waits for a time slice
  // (bench/results/2026-11-28-cpu-hogs.md).
  bool runLoneQueued(Clock::time_point deadline);
  // Whether completing `g` runs a caller's callback.
  static bool callsBack(const AgreedGroup& g);
  // Whether an entry's output comes from the caller's allocator.
  static bool allocatesThroughCaller(const AgreedGroup& g);
  EntryPtr takeEntry(const std::string& name);
  // Periodic observability work (see SetControllerOptions); control thread.
  void telemetryTick();
  void dumpFlight(const std::string& why);
  int size() const { return static_cast<int>(opts_.globalRanks.size()); }
  int myGlobalRank() const { return opts_.globalRanks[opts_.rank]; }

  const SetControllerOptions opts_;
  ControlPlane& cp_;
  std::unique_ptr<CoordinatorLink> link_;
  SetHealth& health_;
  GroupQueue& queue_;
  Logger logger_;

  // Control thread only.
  ResponseCache cache_;
  std::unordered_map<uint64_t, Request> sentAsHits_;  // for nack resends
  // Autotune values of a response list, until a group that needs the data
  // plane takes them (core/agreed_group.h).
  std::optional<TuningValues> pendingTuning_;
  boost::asio::steady_timer settleTimer_;
  boost::asio::steady_timer telemetryTimer_;
  Clock::time_point lastMetrics_{};
  uint64_t dumpRequestsSeen_ = 0;
  uint64_t stallDumpedSeq_ = 0;  // the last stalled entry dumped for

  mutable std::mutex tableMu_;  // guards table_, inbox_
  std::unordered_map<std::string, EntryPtr> table_;
  std::vector<EntryPtr> inbox_;
  std::atomic<bool> drainPosted_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> autoNames_[static_cast<int>(CollectiveKind::kCount)] = {};

  bool callerDrives_ = false;
  bool packBeforeRequest_ = false;      // setPacker
  std::function<void()> withdrawPack_;  // setPacker
  // Under the drive lock: a framework thread is inside enqueue's drive.
  bool submitting_ = false;
  std::function<bool(AgreedGroup&)> smallRunner_;
  std::function<bool(const AgreedGroup&)> smallRunnerAccepts_;
  size_t smallRunnerMaxBytes_ = 0;
  std::function<bool(TensorEntry&, const std::function<bool()>&)> packer_;
  std::thread thread_;
  // Set by the control thread itself (reading thread_ from it would race
  // with its assignment in start()).
  std::atomic<std::thread::id> threadId_{};
};

}  // namespace hora
