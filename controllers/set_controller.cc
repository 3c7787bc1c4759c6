#include "controllers/set_controller.h"

#include <algorithm>
#include <cstring>
#include <future>
#include <unordered_set>

#include "core/check.h"
#include "core/cpu_affinity.h"
#include "core/reduce.h"
#include "core/response_counts.h"

namespace hora {

namespace asio = boost::asio;

namespace {
// How long a rank that found a failure waits for its abort frames to reach
// the kernel before its user learns of it anyway: a peer stopped with a full
// receive buffer must not hold the error back.
constexpr std::chrono::milliseconds kTellPeersBound(200);
}  // namespace

SetController::SetController(SetControllerOptions options, ControlPlane& cp,
                             std::unique_ptr<CoordinatorLink> link, SetHealth& health,
                             GroupQueue& queue, Logger logger)
    : opts_(std::move(options)),
      cp_(cp),
      link_(std::move(link)),
      health_(health),
      queue_(queue),
      logger_(std::move(logger)),
      cache_(static_cast<size_t>(std::max(0, opts_.cacheCapacity))),
      settleTimer_(cp.io()),
      telemetryTimer_(cp.io()) {
  link_->attach(this);
  health_.addListener([this](const Status& why, bool tellPeers) { onBroken(why, tellPeers); });
  health_.holdForPeers(size() > 1);
  // A data-plane failure the control plane does not name within the grace
  // period breaks the set as it is (SetHealth::suspect).
  health_.setSuspectHook([this](Clock::time_point deadline) {
    cp_.post([this, deadline] {
      settleTimer_.expires_at(deadline);
      settleTimer_.async_wait(cp_.locked([this](boost::system::error_code ec) {
        if (!ec) health_.settle(Clock::now());
      }));
    });
  });
  if (link_->wantsExecutorIdle())
    queue_.setGroupDoneHook([this] {
      if (link_->executorIdleWanted()) cp_.post([this] { link_->executorIdle(); });
    });
}

SetController::~SetController() { stop(); }

void SetController::start() {
  ControlPlaneCallbacks cbs;
  cbs.onFrame = [this](int from, FrameType type, std::string payload) {
    link_->onFrame(from, type, std::move(payload));
  };
  cbs.onPeerLost = [this](int peer, Status why) { onPeerLost(peer, std::move(why)); };
  cp_.start(std::move(cbs));
  link_->start();
  if (opts_.dumpRequests) dumpRequestsSeen_ = opts_.dumpRequests->load();
  lastMetrics_ = Clock::now();
  if (opts_.telemetry) telemetryTick();
  thread_ = std::thread([this] {
    threadId_ = std::this_thread::get_id();
    cp_.run();
  });
  // Named as the executor is ("hora-exec"): `top -H` and profilers tell the
  // runtime's threads from the framework's.
  nameThread(thread_.native_handle(), "hora-ctl");
}

bool SetController::isControlThread() const {
  return std::this_thread::get_id() == threadId_.load() || cp_.drivenHere();
}

std::string SetController::autoName(CollectiveKind kind) {
  uint64_t n = autoNames_[static_cast<int>(kind)].fetch_add(1);
  return std::string(collectiveName(kind)) + ".noname." + std::to_string(n);
}

Status SetController::enqueue(std::vector<EntryPtr> entries) {
  // Copied here, on the caller's thread, while its input is surely alive:
  // once the entry is in the table another thread may fail it (shutdown),
  // and its caller may then free the buffer before the control thread drains.
  for (auto& e : entries) e->request.payload = inlinePayload(*e);
  {
    std::lock_guard<std::mutex> lk(tableMu_);
    if (stopping_)
      return Status(Code::kShutDown, "process set " + opts_.setName + " on rank " +
                                         std::to_string(myGlobalRank()) +
                                         " is shut down; no new collectives can start");
    // Checked under tableMu_: a set that breaks after this check fails the
    // entries below through failPending, which takes the same lock. A
    // failure not released yet (its peers are being told) fails them the
    // same way, once released: failPending runs after release().
    if (health_.released()) return health_.status();
    std::unordered_set<std::string> inCall;
    for (const auto& e : entries) {
      const std::string& n = e->request.name;
      if (!table_.count(n) && inCall.insert(n).second) continue;
      // Horovod's duplicate-name error, raised at submission on this rank only: the
      // earlier request (whatever its kind) is untouched and nothing is sent.
      const std::string rank = std::to_string(myGlobalRank());
      if (e->request.kind == CollectiveKind::kJoin)
        return invalidUsage("join on rank " + rank +
                            ": this rank's join is already in flight; wait for it to complete");
      auto other = table_.find(n);
      const std::string earlier =
          other == table_.end()
              ? "another tensor of this call"
              : "an earlier " + std::string(collectiveName(other->second->request.kind));
      return invalidUsage(std::string(collectiveName(e->request.kind)) + " \"" + n + "\" on rank " +
                          rank + " in process set " + opts_.setName +
                          ": a request with this name is already in flight (" + earlier +
                          " not yet agreed by every rank); wait for it or use a different name");
    }
    for (auto& e : entries) {
      e->request.rank = opts_.rank;
      if (opts_.telemetry) opts_.telemetry->submitted(*e);
      table_[e->request.name] = e;
      inbox_.push_back(e);
    }
  }
  // With no thread driving the set, the caller sends its request itself
  // (through the lane or straight into the socket) and runs what that
  // agrees, e.g. on the coordinator when it completes the set of requests:
  // the control thread, asleep in steady state, is not woken for it.
  // Otherwise the control thread drains.
  if (callerDrives_ && cp_.tryDrive([this] { drainInbox(); }, &submitting_)) return Status::ok();
  if (!drainPosted_.exchange(true)) cp_.post([this] { drainInbox(); });
  return Status::ok();
}

bool SetController::driveWhile(const SpinPolicy& spin, const std::function<bool()>& done,
                               Clock::time_point deadline) {
  if (!callerDrives_ || stopping_ || cp_.drivenHere() || !cp_.drivable())
    return spinUntil(spin, done);
  if (!spin.enabled()) return done();
  // As the control thread's own loop: the window runs from the last work
  // done, not from the start, so a wait longer than the window whose rounds
  // keep moving (a collective run here, frames read) does not end in a
  // sleep that something else must then wake.
  struct Driving {
    explicit Driving(ControlPlane& cp) : cp(cp) { cp.beginDriving(); }
    ~Driving() { cp.endDriving(); }
    ControlPlane& cp;
  } driving(cp_);
  // It gives the core away only while it waits for a thread of this
  // process (one driving in its stead, the executor running a group) when
  // those may share its core, or when the ranks alone outnumber the cores
  // (core/spin_wait.h: a yield next to another busy process costs a slice).
  // Over TCP the same: peers that share the cores (on this host, or on
  // emulated hosts sharing this kernel) count as the ranks outnumbering the
  // cores (ProcessSet). A yield beside a CPU-bound neighbour hands it a time
  // slice: yielding every eighth idle round made a 64 B collective across
  // hosts take 3.4-4.0 ms beside two busy loops, 39-54 us without
  // (bench/results/2026-11-29-tcp-caller-drives.md).
  Clock::time_point lastWork = Clock::now();
  bool executorBusy = false;
  // A lone queued group is asked for once per quiet spell: what keeps it
  // (another request pending, a group the runner declines) changes only
  // when something moves.
  bool takeAsked = false;
  for (uint32_t i = 1;; ++i) {
    if (done()) return true;
    const ControlPlane::DriveRound round = cp_.driveOnce();
    if (round == ControlPlane::DriveRound::kWorked) {
      lastWork = Clock::now();
      takeAsked = false;
      if (lastWork >= deadline) return done();
      continue;
    }
    if (done()) return true;
    if (round == ControlPlane::DriveRound::kHeldElsewhere) takeAsked = false;
    if (round == ControlPlane::DriveRound::kIdle && !takeAsked && queue_.loneQueued()) {
      takeAsked = true;
      bool ran = false;
      cp_.tryDrive([&] { ran = runLoneQueued(deadline); });
      if (ran) {
        lastWork = Clock::now();
        takeAsked = false;
        continue;
      }
    }
    if ((i & 7) == 0) {
      const Clock::time_point now = Clock::now();
      if (now - lastWork >= spin.window || now >= deadline) return false;
    }
    // Launched GPU groups count: the executor must run to reap them.
    if (spin.yield && !spin.yieldToPeers && (i & 7) == 1) executorBusy = queue_.inFlight() > 0;
    if (spin.yieldToPeers ||
        (spin.yield && (executorBusy || round == ControlPlane::DriveRound::kHeldElsewhere)))
      ::sched_yield();
    else
      cpuRelax();
  }
}

void SetController::drainInbox() {
  drainPosted_ = false;
  std::vector<EntryPtr> batch;
  {
    std::lock_guard<std::mutex> lk(tableMu_);
    batch.swap(inbox_);
  }
  if (batch.empty() || health_.broken()) return;
  RequestList list;
  size_t inlineBytes = 0;
  for (auto& e : batch) {
    if (e->completed) continue;  // failed locally before it was sent (e.g. a stall error raced it)
    const Request& r = e->request;
    // Past the list's budget a tensor goes without its data (the data plane
    // runs it; the coordinator inlines only what every rank sent).
    const bool withData =
        !r.payload.empty() && (inlineBytes += r.payload.size()) <= kMaxInlineListBytes;
    const bool cacheableKind = r.kind == CollectiveKind::kAllreduce ||
                               r.kind == CollectiveKind::kBroadcast ||
                               r.kind == CollectiveKind::kReducescatter;
    const uint64_t sig = cacheableKind ? r.signature() : 0;
    const int32_t bit = cacheableKind ? cache_.lookup(r.name, sig) : -1;
    if (opts_.telemetry) opts_.telemetry->sent(*e, bit >= 0);
    if (bit >= 0) {
      Request& kept = sentAsHits_[sig] = r;  // resent in full after a nack
      if (!withData) kept.payload.clear();
      list.hits.push_back(CacheHit{static_cast<uint32_t>(bit), sig, kept.payload});
    } else {
      list.requests.push_back(r);
      if (!withData) list.requests.back().payload.clear();
    }
  }
  if (withdrawPack_) withdrawPack_();
  if (packer_ && packBeforeRequest_ && batch.size() == 1) packAhead(*batch.front());
  link_->submit(std::move(list));
  if (packer_ && !packBeforeRequest_ && batch.size() == 1) packAhead(*batch.front());
}

void SetController::packAhead(TensorEntry& e) {
  const Request& r = e.request;
  // A tensor that travels inside the negotiation never reaches the data plane.
  if (e.completed || stopping_ || health_.broken() || r.kind != CollectiveKind::kAllreduce ||
      r.device.kind != DeviceKind::kCpu || !r.payload.empty())
    return;
  // Only with every frame of this rank already in the lane (after the
  // request: its request included): packing must not hold back what its
  // peers wait for. Before the request, input from peers does not stop it:
  // no answer for this tensor can come before its request, and the pack
  // would be due once it comes anyway.
  if (!cp_.laneFlushed() || (!packBeforeRequest_ && cp_.laneHasInput())) return;
  if (!queue_.tryBeginInline()) return;  // the executor is busy: it owns the data plane
  {
    // Held while packing: a thread that fails pending entries (shutdown,
    // a broken set) takes them out of the table under this lock before it
    // completes them, and only then may their callers free their inputs.
    std::lock_guard<std::mutex> lk(tableMu_);
    // The only tensor pending and not agreed yet (on the coordinator the
    // submit above may have agreed and run it already): its group most
    // likely runs alone and next, so what is packed now is what it packs
    // first. Otherwise the packing would be wasted.
    auto it = table_.find(r.name);
    if (!stopping_ && table_.size() == 1 && inbox_.empty() && it != table_.end() &&
        it->second.get() == &e)
      packer_(e, packBeforeRequest_ ? std::function<bool()>()
                                    : std::function<bool()>([this] { return cp_.laneHasInput(); }));
  }
  queue_.endInline();
}

std::string SetController::inlinePayload(const TensorEntry& e) const {
  const Request& r = e.request;
  if (r.device.kind != DeviceKind::kCpu || size() <= 1) return std::string();
  const size_t n = static_cast<size_t>(numElements(r.shape)), esz = dataTypeSize(r.dtype);
  const size_t bytes = n * esz;
  const size_t cap = std::min(
      r.kind == CollectiveKind::kAllreduce ? opts_.inlineMaxBytes : opts_.inlineMaxOtherBytes,
      kMaxInlineBytes);
  if (bytes == 0 || bytes > cap) return std::string();
  // The cap is on what the response list carries back to every rank: the
  // tensor for an allreduce, reducescatter (its input is the whole tensor)
  // or broadcast; every rank's tensor for an allgather or alltoall, about
  // the set's size times this one.
  switch (r.kind) {
    case CollectiveKind::kAllreduce:
    case CollectiveKind::kReducescatter:
      break;
    case CollectiveKind::kBroadcast:
      if (r.root != opts_.rank) return std::string();
      break;
    case CollectiveKind::kAllgather:
    case CollectiveKind::kAlltoall:
      if (bytes > cap / static_cast<size_t>(size())) return std::string();
      break;
    default:
      return std::string();
  }
  std::string p(bytes, '\0');
  if (r.kind == CollectiveKind::kAllreduce || r.kind == CollectiveKind::kReducescatter)
    // Prescaled here as the data plane's pack would: the coordinator only reduces.
    scaleCopy(r.dtype, &p[0], e.in, n, r.prescale);
  else
    std::memcpy(&p[0], e.in, bytes);
  return p;
}

void SetController::onNacks(const std::vector<CacheHit>& hits) {
  if (health_.broken()) return;
  RequestList again;
  for (const auto& h : hits) {
    auto it = sentAsHits_.find(h.signature);
    if (it != sentAsHits_.end()) again.requests.push_back(it->second);
  }
  if (!again.requests.empty()) link_->submit(std::move(again));
}

void SetController::onResponses(const ResponseList& list) {
  if (health_.broken()) return;
  if (opts_.telemetry) opts_.telemetry->cycle();
  if (list.tuning) pendingTuning_ = list.tuning;
  for (const auto& g : list.groups) {
    std::vector<Response> resolved;
    resolved.reserve(g.items.size());
    for (const auto& item : g.items) {
      if (item.cacheBit >= 0) {
        const Response* r = cache_.touch(static_cast<uint32_t>(item.cacheBit));
        if (!r)
          return failSet(
              protocolError("response cache out of step with the coordinator (bit " +
                            std::to_string(item.cacheBit) +
                            " unknown here): are all ranks using the same HORA_CACHE_CAPACITY?"),
              true);
        resolved.push_back(*r);
      } else {
        if (item.response.cacheable()) cache_.put(item.response);
        resolved.push_back(item.response);
      }
      resolved.back().inlineResult = item.result;
      sentAsHits_.erase(resolved.back().signature);
      Status v = validateResponse(resolved.back());
      if (!v.isOk()) return failSet(v, true);
      // Only data-plane allreduces fuse (planFusion): anything else in a
      // group of several would be completed wrongly or never.
      if (g.items.size() > 1 &&
          (resolved.back().kind != ResponseKind::kAllreduce || !needsDataPlane(resolved.back())))
        return failSet(protocolError("malformed response list from the coordinator of set " +
                                     opts_.setName + ": \"" + resolved.back().name +
                                     "\" is in a group of " + std::to_string(g.items.size()) +
                                     " but only allreduces on the data plane are fused"),
                       true);
    }
    queueGroup(std::move(resolved));
  }
}

Status SetController::validateResponse(const Response& r) const {
  auto bad = [&](const std::string& why) {
    return protocolError("malformed response for \"" + r.name + "\" from the coordinator of set " +
                         opts_.setName + ": " + why);
  };
  const size_t n = static_cast<size_t>(size());
  switch (r.kind) {
    case ResponseKind::kAllgather:
      if (r.shape.empty() || r.sizes.size() != n)
        return bad("allgather needs a shape and one size per rank");
      break;
    case ResponseKind::kAlltoall:
      if (r.shape.empty() || r.sizes.size() != n * n)
        return bad("alltoall needs a shape and a size*size matrix");
      break;
    case ResponseKind::kReducescatter:
      if (r.shape.empty()) return bad("reducescatter needs a shape");
      break;
    case ResponseKind::kBroadcast:
      if (r.root < 0 || r.root >= size()) return bad("broadcast root out of range");
      break;
    case ResponseKind::kError:
      if (r.errorCode <= 0 || r.errorCode > static_cast<int32_t>(kLastCode))
        return bad("invalid error code");
      break;
    case ResponseKind::kJoin:
      if (r.lastJoinedRank < 0 || r.lastJoinedRank >= size())
        return bad("invalid last joined rank");
      break;
    default:
      break;
  }
  for (int32_t j : r.joined)
    if (j < 0 || j >= size()) return bad("joined rank out of range");
  if (!r.inlineResult.empty()) {
    // Checked before the shape below only for the kind: the size check needs a valid shape.
    const bool combines = r.kind == ResponseKind::kAllreduce ||
                          r.kind == ResponseKind::kBroadcast ||
                          r.kind == ResponseKind::kReducescatter ||
                          r.kind == ResponseKind::kAllgather || r.kind == ResponseKind::kAlltoall;
    if (!combines || !r.joined.empty() || r.device.kind != DeviceKind::kCpu)
      return bad(
          "an inline result on a response that is not a collective of host memory "
          "without joined ranks");
  }
  for (int64_t d : r.sizes)
    if (d < 0) return bad("negative size");
  // The executor computes element counts, byte sizes and offsets from the shape and sizes
  // (core/response_counts.h): each must fit (core/types.h, kMaxTensorBytes), and an
  // allgather's sizes must add up to the rows of the output allocated from its shape.
  const bool tensor = r.kind == ResponseKind::kAllreduce || r.kind == ResponseKind::kBroadcast ||
                      r.kind == ResponseKind::kReducescatter ||
                      r.kind == ResponseKind::kAllgather || r.kind == ResponseKind::kAlltoall;
  if (!tensor) return Status::ok();
  const size_t esz = dataTypeSize(r.dtype);
  if (int dim = shapeOverflowDim(r.shape, esz); dim >= 0)
    return bad("shape " + describeTensor(r.dtype, r.shape) + " overflows at dimension " +
               std::to_string(dim));
  // `rows` rows of the response's trailing shape fit, and the sum did not overflow.
  auto rowsFit = [&](int64_t rows, bool overflow) {
    std::vector<int64_t> s = r.shape;
    s[0] = rows;
    return !overflow && shapeOverflowDim(s, esz) < 0;
  };
  // An inline result holds the tensor the shape describes; for an alltoall,
  // every block of its matrix (checked below, with the sizes).
  if (!r.inlineResult.empty() && r.kind != ResponseKind::kAlltoall &&
      static_cast<int64_t>(r.inlineResult.size()) !=
          numElements(r.shape) * static_cast<int64_t>(esz))
    return bad("an inline result of " + std::to_string(r.inlineResult.size()) + " bytes for " +
               describeTensor(r.dtype, r.shape));
  if (r.kind == ResponseKind::kAllgather) {
    int64_t total = 0;
    bool overflow = false;
    for (int64_t d : r.sizes) overflow |= __builtin_add_overflow(total, d, &total);
    if (overflow || total != r.shape[0])
      return bad("allgather sizes do not add up to dimension 0 of the shape");
  } else if (r.kind == ResponseKind::kAlltoall) {
    int64_t allRows = 0;
    bool allOverflow = false;
    for (size_t a = 0; a < n; ++a) {
      int64_t sent = 0, received = 0;
      bool sentOverflow = false, receivedOverflow = false;
      for (size_t b = 0; b < n; ++b) {
        sentOverflow |= __builtin_add_overflow(sent, r.sizes[a * n + b], &sent);
        receivedOverflow |= __builtin_add_overflow(received, r.sizes[b * n + a], &received);
      }
      if (!rowsFit(sent, sentOverflow) || !rowsFit(received, receivedOverflow))
        return bad("alltoall sizes to or from set rank " + std::to_string(a) + " overflow");
      allOverflow |= __builtin_add_overflow(allRows, sent, &allRows);
    }
    // Every rank's tensor, in rank order: all rows of the matrix.
    if (!r.inlineResult.empty() && (!rowsFit(allRows, allOverflow) ||
                                    static_cast<int64_t>(r.inlineResult.size()) !=
                                        allRows * rowElements(r.shape) * static_cast<int64_t>(esz)))
      return bad("an inline result of " + std::to_string(r.inlineResult.size()) +
                 " bytes for an alltoall of " + std::to_string(allRows) + " rows of " +
                 describeTensor(r.dtype, r.shape));
  }
  return Status::ok();
}

Status SetController::claimEntries(const std::vector<Response>& responses, AgreedGroup* g) {
  for (const auto& r : responses) {
    EntryPtr e;
    const bool joined = std::find(r.joined.begin(), r.joined.end(), opts_.rank) != r.joined.end();
    if (!joined) e = takeEntry(r.name);
    if (needsDataPlane(r.kind) && !joined) {
      // Every rank not listed as joined must take part with its own tensor:
      // contributing anything else would hand the others a wrong result.
      if (!e)
        // kRemoteError (not kShutDown) so the peers abort their data plane
        // instead of waiting in this collective for the peer timeout.
        return Status(Code::kRemoteError,
                      std::string(collectiveName(static_cast<CollectiveKind>(r.kind))) + " \"" +
                          r.name + "\" was agreed by all ranks but rank " +
                          std::to_string(myGlobalRank()) +
                          " no longer has it (it shut down or it failed locally); the collective "
                          "cannot run");
      const bool sameKind = static_cast<uint8_t>(e->request.kind) == static_cast<uint8_t>(r.kind);
      const bool exact = r.kind == ResponseKind::kAllreduce || r.kind == ResponseKind::kBroadcast ||
                         r.kind == ResponseKind::kReducescatter;
      // An inline result of an allreduce, broadcast or reducescatter is copied
      // into (or cut for) this rank's own tensor: its size must be the
      // tensor's, whatever the response says its shape is. Allgather and
      // alltoall outputs are allocated from the response (validateResponse
      // checked the result against it).
      const bool resultFits =
          r.inlineResult.empty() || !exact ||
          static_cast<int64_t>(r.inlineResult.size()) ==
              numElements(e->request.shape) * static_cast<int64_t>(dataTypeSize(e->request.dtype));
      if (!sameKind || (exact && e->request.signature() != r.signature) ||
          e->request.dtype != r.dtype || e->request.device.kind != r.device.kind || !resultFits) {
        e->complete(
            entryFailure(*e, myGlobalRank(),
                         protocolError("the coordinator's response does not match this request")));
        return protocolError(
            "response for \"" + r.name + "\" does not match rank " +
            std::to_string(myGlobalRank()) + "'s request (" + e->request.describe() +
            "): the response caches are out of step or the coordinator misbehaved");
      }
    }
    g->entries.push_back(std::move(e));
  }
  return Status::ok();
}

bool SetController::hostAllreduces(const AgreedGroup& g) {
  for (const Response& r : g.responses)
    if (r.kind != ResponseKind::kAllreduce || r.device.kind != DeviceKind::kCpu) return false;
  return !g.responses.empty();
}

size_t SetController::groupBytes(const AgreedGroup& g) {
  size_t bytes = 0;
  for (const Response& r : g.responses)
    bytes += static_cast<size_t>(r.numElements()) * dataTypeSize(r.dtype);
  return bytes;
}

bool SetController::runsHere(const AgreedGroup& g) const {
  return hostAllreduces(g) && groupBytes(g) <= smallRunnerMaxBytes_;
}

bool SetController::runLoneQueued(Clock::time_point deadline) {
  // As for a small group (queueGroup): only with the lane flushed, so that
  // no peer waits in the data plane for a response this thread holds.
  if (!smallRunner_ || stopping_ || !cp_.laneFlushed()) return false;
  {
    std::lock_guard<std::mutex> lk(tableMu_);
    if (!table_.empty() || !inbox_.empty()) return false;
  }
  // Groups the runner declines (autotune values, the Gloo fallback's sizes)
  // and those needing no data plane (the executor completes them at once)
  // stay queued.
  const double budgetBytes =
      deadline == Clock::time_point::max()
          ? 1e300
          : std::chrono::duration<double, std::nano>(deadline - Clock::now()).count();
  auto fits = [&](const AgreedGroup& q) {
    return needsDataPlane(q) &&
           (runsHere(q) ||
            (hostAllreduces(q) && static_cast<double>(groupBytes(q)) <= budgetBytes)) &&
           (!smallRunnerAccepts_ || smallRunnerAccepts_(q));
  };
  AgreedGroup g;
  if (!queue_.tryTakeLone(&g, fits)) return false;
  if (!smallRunner_(g)) {
    queue_.giveBack(std::move(g));
    return false;
  }
  if (opts_.telemetry) opts_.telemetry->ranByCaller();
  queue_.finished();
  return true;
}

void SetController::queueGroup(std::vector<Response> responses) {
  AgreedGroup g;
  Status s = claimEntries(responses, &g);
  if (!s.isOk()) {
    auto fail = [this, entries = g.entries, s] {
      for (auto& e : entries)
        if (e) e->complete(entryFailure(*e, myGlobalRank(), s));
    };
    // Completing runs the user's callbacks: never inside a submission.
    if (cp_.drivenHere() && submitting_)
      cp_.post(fail);
    else
      fail();
    return failSet(s, true);
  }
  HORA_CHECK(g.entries.size() == responses.size());
  g.responses = std::move(responses);
  if (pendingTuning_ && needsDataPlane(g)) {
    g.tuning = std::move(pendingTuning_);
    pendingTuning_.reset();
  }
  if (opts_.telemetry) opts_.telemetry->agreed(g);
  // Barrier/join/error groups and collectives the coordinator combined
  // inline need no data plane: complete them right here when nothing is
  // queued ahead (one thread hand-off less). Every other collective goes to
  // the executor so this thread keeps heartbeats and loss detection running
  // while it waits on peers; so does an inline one whose output comes from
  // the caller's allocator (it may wait for the caller's own lock).
  // Inside one of the caller's own submissions (HORA_CALLER_DRIVES) a group
  // whose completion runs a callback goes to the executor: hora_*_async
  // must not run the caller's callbacks (it may hold a lock they take, and
  // has not handed out the request yet).
  const bool mayComplete = !submitting_ || !callsBack(g);
  if (!needsDataPlane(g) && !stopping_ && mayComplete && !allocatesThroughCaller(g) &&
      queue_.tryBeginInline()) {
    completeWithoutDataPlane(g, opts_.rank, opts_.globalRanks, [&](const std::vector<Status>& o) {
      if (opts_.telemetry) opts_.telemetry->inlineDone(g, &o);
    });
    queue_.endInline();
    return;
  }
  // Small allreduces of host tensors on a set whose frames all went out
  // through the shared-memory lane: the data plane on this thread when the
  // executor is idle, sparing the hand-off (bench/results/
  // 2026-11-27-small-on-control.md: up to 1.4x faster at 2 ranks from 16 KiB
  // to 1 MiB, and steady between launches). Only with the lane flushed: the
  // coordinator's peers then have their responses without this thread
  // polling again, so no rank waits in the data plane for one that waits for
  // this thread. A wait inside gives up after the peer timeout or on a dead
  // peer as the executor's would, and meanwhile tells the peers this rank is
  // alive (the runner's wait hook, ControlPlane::markAlive).
  if (smallRunner_ && !stopping_ && mayComplete && runsHere(g) && cp_.laneFlushed() &&
      queue_.tryBeginInline(&g)) {
    const bool ran = smallRunner_(g);
    queue_.endInline();
    if (ran && opts_.telemetry && std::this_thread::get_id() != threadId_.load())
      opts_.telemetry->ranByCaller();
    if (ran) {
      if (link_->wantsExecutorIdle()) cp_.runSoon([this] { link_->executorIdle(); });
      return;
    }
  }
  queue_.push(std::move(g));
}

bool SetController::callsBack(const AgreedGroup& g) {
  for (const auto& e : g.entries)
    if (e && e->sink && e->sink->callsBack()) return true;
  return false;
}

bool SetController::allocatesThroughCaller(const AgreedGroup& g) {
  for (const auto& e : g.entries)
    if (e && e->sink && e->sink->allocatesThroughCaller()) return true;
  return false;
}

EntryPtr SetController::takeEntry(const std::string& name) {
  std::lock_guard<std::mutex> lk(tableMu_);
  auto it = table_.find(name);
  if (it == table_.end()) return nullptr;
  EntryPtr e = it->second;
  table_.erase(it);
  return e;
}

void SetController::onPeerLost(int peer, Status why) {
  if (stopping_) return;
  failSet(link_->describeLoss(peer, why), true);
}

void SetController::failSet(Status why, bool tellPeers) {
  // A framework thread inside its own submission (HORA_CALLER_DRIVES) runs
  // the set's logic: the failure's completions (the user's callbacks, which
  // may shut hora down) go to the control thread instead of running inside
  // hora_*_async under the drive lock.
  if (cp_.drivenHere() && submitting_ && !stopping_) {
    cp_.post([this, why = std::move(why), tellPeers]() mutable {
      health_.fail(std::move(why), tellPeers);
    });
    return;
  }
  health_.fail(std::move(why), tellPeers);
}

void SetController::dumpFlight(const std::string& why) {
  if (!opts_.telemetry || opts_.telemetry->options().flightEntries == 0) return;
  auto path = opts_.telemetry->dumpFlight(why);
  if (path.isOk())
    HORA_LOG(logger_, kWarning) << "flight recorder of set " << opts_.setName << " written to "
                                << path.value() << " (" << why << ")";
  else
    HORA_LOG(logger_, kWarning) << "flight recorder not written: " << path.status().message();
}

void SetController::telemetryTick() {
  const Clock::time_point now = Clock::now();
  Telemetry& t = *opts_.telemetry;
  if (opts_.dumpRequests) {
    const uint64_t n = opts_.dumpRequests->load();
    if (n != dumpRequestsSeen_) {
      dumpRequestsSeen_ = n;
      dumpFlight("SIGUSR1");
    }
  }
  if (opts_.metricsInterval.count() > 0 && now - lastMetrics_ >= opts_.metricsInterval) {
    lastMetrics_ = now;
    const MetricsSnapshot m = t.snapshot();
    if (logger_.level() != LogLevel::kOff)
      logger_.log(std::max(LogLevel::kInfo, logger_.level()), metricsSummaryLine(m));
    if (!opts_.prometheusDir.empty()) {
      auto path = t.dumpPrometheus(opts_.prometheusDir, metricsPrometheus(m));
      if (!path.isOk())
        HORA_LOG(logger_, kWarning) << "metrics file not written: " << path.status().message();
    }
  }
  // This rank's own view of a stall (the coordinator writes the cross-rank
  // report): one dump per tensor that waits past the warning time.
  if (opts_.stallWarning.count() > 0) {
    using std::chrono::duration_cast;
    using std::chrono::nanoseconds;
    const int64_t limit = duration_cast<nanoseconds>(now.time_since_epoch()).count() -
                          duration_cast<nanoseconds>(opts_.stallWarning).count();
    uint64_t stalled = 0;
    {
      std::lock_guard<std::mutex> lk(tableMu_);
      for (const auto& kv : table_)
        if (kv.second->trace.submitNs > 0 && kv.second->trace.submitNs < limit &&
            kv.second->trace.seq > stallDumpedSeq_)
          stalled = std::max(stalled, kv.second->trace.seq);
    }
    if (stalled) {
      stallDumpedSeq_ = stalled;
      dumpFlight("stall warning: a tensor of this rank has waited over " +
                 std::to_string(static_cast<int>(opts_.stallWarning.count())) +
                 " s for the other ranks");
    }
  }
  t.flushTimeline();
  telemetryTimer_.expires_after(std::chrono::milliseconds(100));
  telemetryTimer_.async_wait(cp_.locked([this](boost::system::error_code ec) {
    if (!ec && !stopping_) telemetryTick();
  }));
}

void SetController::onBroken(const Status& why, bool tellPeers) {
  // What this rank was doing when the set failed, for the post-mortem. A
  // peer that shut down cleanly is the normal end of a job unless this rank
  // still waits for it to negotiate something: what every rank agreed to
  // (queued or running on the executor) still completes after a goodbye.
  bool unagreed = false;
  {
    std::lock_guard<std::mutex> lk(tableMu_);
    unagreed = !table_.empty() || !inbox_.empty();
  }
  if (why.code() != Code::kShutDown || unagreed)
    dumpFlight("the process set failed: " + why.message());
  if (!tellPeers || size() <= 1) return failPending(why);
  // The peers learn of it before this rank's user does (SetHealth's hold):
  // the pending work fails once the abort is in the kernel, bounded for a
  // peer that reads nothing. Failures found off the control thread (the
  // executor's) reach the peers through it.
  auto tell = [this, why] {
    link_->reportFailure(why);
    cp_.whenSent(kTellPeersBound, [this, why] {
      health_.release();
      failPending(why);
    });
  };
  if (isControlThread()) return tell();
  if (!stopping_) return cp_.post(tell);
  // Shutting down: the control thread may be gone (shutdown releases too).
  health_.release();
  failPending(why);
}

void SetController::failPending(const Status& why) {
  std::vector<EntryPtr> victims;
  {
    std::lock_guard<std::mutex> lk(tableMu_);
    for (auto& kv : table_) victims.push_back(kv.second);
    table_.clear();
    inbox_.clear();
  }
  for (auto& e : victims) {
    if (opts_.telemetry && !e->completed) opts_.telemetry->abandoned(*e, why);
    e->complete(entryFailure(*e, myGlobalRank(), why));
  }
}

bool SetController::beginShutdown() { return !stopping_.exchange(true); }

void SetController::flush(Clock::time_point deadline) {
  auto flushed = std::make_shared<std::promise<void>>();
  auto done = flushed->get_future();
  cp_.post([this, flushed] {
    link_->flush();
    flushed->set_value();
  });
  done.wait_until(deadline);
}

void SetController::closeGracefully(Clock::time_point deadline) {
  cp_.post([this] {
    settleTimer_.cancel();
    link_->stop();
    cp_.closeGracefully();
  });
  while (!cp_.peersDone() && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

void SetController::stop() {
  cp_.stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace hora
