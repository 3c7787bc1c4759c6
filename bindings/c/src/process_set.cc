#include "process_set.h"

#include <algorithm>
#include <future>
#include <unordered_set>

#include "controllers/settings_agreement.h"
#include "core/wire.h"
#include "hora/version.h"
#include "ops/gloo/gloo_backend.h"
#include "ops/shm/shm_backend.h"

namespace hora {

namespace asio = boost::asio;

void RequestState::completeEntry(const Status& s) {
  hora_callback_t cb = nullptr;
  Status final;
  {
    std::lock_guard<std::mutex> lk(mu);
    if (!s.isOk() && status.isOk()) status = s;
    if (--remaining > 0) return;
    resultsReady = true;
    final = status;
    cb = callback;
  }
  // The callback runs before waiters wake, so a caller that frees the request
  // right after hora_wait cannot race it; results are readable inside it.
  if (cb) {
    std::lock_guard<std::recursive_mutex> lk(cbMu);
    if (handle) cb(callbackUser, handle, static_cast<hora_status_t>(final.code()));
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    done = true;
  }
  cv.notify_all();
}

ProcessSetImpl::ProcessSetImpl(std::string name, std::vector<int> globalRanks, int rank,
                               SetOptions options)
    : name_(std::move(name)),
      globalRanks_(std::move(globalRanks)),
      rank_(rank),
      opts_(std::move(options)),
      logger_(opts_.logger),
      cache_(static_cast<size_t>(std::max(0, opts_.cacheCapacity))) {}

Result<std::unique_ptr<ProcessSetImpl>> ProcessSetImpl::create(std::string name,
                                                               std::vector<int> globalRanks,
                                                               int myGlobalRank,
                                                               std::shared_ptr<Store> store,
                                                               SetOptions options) {
  auto it = std::find(globalRanks.begin(), globalRanks.end(), myGlobalRank);
  if (it == globalRanks.end())
    return invalidArgument("rank " + std::to_string(myGlobalRank) +
                           " is not a member of process set " + name);
  int rank = static_cast<int>(it - globalRanks.begin());
  std::unique_ptr<ProcessSetImpl> ps(
      new ProcessSetImpl(name, globalRanks, rank, std::move(options)));
  const SetOptions& o = ps->opts_;

  // Settings that change how a rank pairs its collectives with the others'
  // must be equal on every member: compared before anything connects, so a
  // difference fails every member at once with both values named. (The shm
  // settings are agreed by the shm set-up itself, which falls back to Gloo.)
  const SharedSettings shared = {
      {"hora version", std::to_string(HORA_VERSION_MAJOR) + "." +
                           std::to_string(HORA_VERSION_MINOR) + "." +
                           std::to_string(HORA_VERSION_PATCH)},
      // The response cache only works if every rank applies the same
      // operations to a cache of the same capacity.
      {"HORA_CACHE_CAPACITY", std::to_string(o.cacheCapacity)},
      {"HORA_GLOO_ALGORITHM", o.glooAlgorithm},
      {"HORA_GPU_BACKEND", o.gpuBackend},
  };
  HORA_RETURN_IF_ERROR(agreeOnSettings(
      *store, rank, globalRanks, shared,
      std::chrono::milliseconds(static_cast<int64_t>(o.startTimeoutS * 1000)), name));

  ControlPlaneOptions cpo;
  cpo.rank = rank;
  cpo.size = ps->size();
  cpo.globalRanks = globalRanks;
  cpo.hostname = o.hostname;
  cpo.startTimeout = std::chrono::milliseconds(static_cast<int64_t>(o.startTimeoutS * 1000));
  cpo.heartbeatInterval = std::chrono::milliseconds(o.heartbeatIntervalMs);
  cpo.peerTimeout = std::chrono::milliseconds(static_cast<int64_t>(o.peerTimeoutS * 1000));
  cpo.setName = name;
  auto cp = ControlPlane::create(std::make_shared<PrefixStore>(store, "ctrl"), cpo, ps->logger_);
  if (!cp.isOk()) return cp.status();
  ps->cp_ = cp.take();

  GlooBackendOptions go;
  go.hostname = o.hostname;
  go.iface = o.glooIface;
  go.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.peerTimeoutS * 1000));
  go.algorithm = o.glooAlgorithm;
  // With two ranks ring and bcube exchange the same data, and ring measured
  // about twice as fast for small messages here (bench/README.md).
  if (go.algorithm == "auto" && globalRanks.size() == 2) go.algorithm = "ring";
  auto be = createGlooBackend(store, "gloo", rank, ps->size(), go);
  if (!be.isOk())
    return be.status().withContext("process set " + name + ": connecting the Gloo data plane");
  // On one host, allreduce goes through shared memory (ops/shm); the ranks
  // agree on it at set-up, else the set stays on Gloo.
  ShmBackendOptions sho;
  sho.enabled = o.shm && o.shmChunkBytes > 0 && o.shmMinBytes >= 0;
  sho.chunkBytes = static_cast<size_t>(std::max<int64_t>(o.shmChunkBytes, 0));
  sho.minBytes = static_cast<size_t>(std::max<int64_t>(o.shmMinBytes, 0));
  sho.timeout = go.timeout;
  sho.startTimeout = cpo.startTimeout;
  std::string noShm;
  auto sb = createShmBackend(std::make_shared<PrefixStore>(store, "shm"), rank, ps->size(), sho,
                             be.take(), &noShm);
  if (!sb.isOk())
    return sb.status().withContext("process set " + name + ": setting up shared memory");
  ps->backend_ = sb.take();
  ps->store_ = store;
  if (ps->size() > 1)
    HORA_LOG(ps->logger_, kInfo) << "process set " << name << ": data plane "
                                 << ps->backend_->name()
                                 << (noShm.empty() ? "" : " (no shared memory: " + noShm + ")");

  if (rank == 0) {
    CoordinatorOptions co;
    co.size = ps->size();
    co.fusionThresholdBytes = o.fusionThresholdBytes;
    co.stallWarningS = o.stallWarningS;
    co.stallShutdownS = o.stallShutdownS;
    co.setName = name;
    co.globalRanks = globalRanks;
    ps->coordinator_ = std::make_unique<Coordinator>(co, &ps->cache_, ps->logger_);
  }
  ps->emitTimer_ = std::make_unique<asio::steady_timer>(ps->cp_->io());
  ps->stallTimer_ = std::make_unique<asio::steady_timer>(ps->cp_->io());

  ProcessSetImpl* self = ps.get();
  ControlPlaneCallbacks cbs;
  cbs.onFrame = [self](int from, FrameType t, std::string p) {
    self->onFrame(from, t, std::move(p));
  };
  cbs.onPeerLost = [self](int peer, Status why) { self->onPeerLost(peer, std::move(why)); };
  ps->cp_->start(std::move(cbs));
  if (rank == 0) self->stallTick();
  ps->controlThread_ = std::thread([self] {
    self->controlThreadId_ = std::this_thread::get_id();
    self->cp_->run();
  });
  ps->executorThread_ = std::thread([self] { self->executorLoop(); });
  return ps;
}

ProcessSetImpl::~ProcessSetImpl() { shutdown("the process set was destroyed"); }

std::string ProcessSetImpl::autoName(CollectiveKind kind) {
  uint64_t n = autoNameCounters_[static_cast<int>(kind)].fetch_add(1);
  return std::string(collectiveName(kind)) + ".noname." + std::to_string(n);
}

Status ProcessSetImpl::brokenStatus() {
  std::lock_guard<std::mutex> lk(tableMu_);
  return broken_;
}

Status ProcessSetImpl::enqueue(std::vector<std::shared_ptr<TensorEntry>> entries) {
  {
    std::lock_guard<std::mutex> lk(tableMu_);
    if (stopping_)
      return Status(Code::kShutDown, "process set " + name_ + " on rank " +
                                         std::to_string(globalRank(rank_)) +
                                         " is shut down; no new collectives can start");
    if (isBroken_) return broken_;
    std::unordered_set<std::string> inCall;
    for (size_t i = 0; i < entries.size(); ++i) {
      const std::string& n = entries[i]->request.name;
      if (table_.count(n) || !inCall.insert(n).second)
        return invalidUsage(std::string(collectiveName(entries[i]->request.kind)) + " \"" + n +
                            "\" on rank " + std::to_string(globalRank(rank_)) +
                            ": a request with this name is already in flight; wait for it or use a "
                            "different name");
    }
    for (auto& e : entries) {
      e->request.rank = rank_;
      table_[e->request.name] = e;
      inbox_.push_back(e);
    }
  }
  if (!drainPosted_.exchange(true)) asio::post(cp_->io(), [this] { drainInbox(); });
  return Status::ok();
}

void ProcessSetImpl::drainInbox() {
  drainPosted_ = false;
  std::vector<std::shared_ptr<TensorEntry>> batch;
  {
    std::lock_guard<std::mutex> lk(tableMu_);
    batch.swap(inbox_);
  }
  if (batch.empty() || isBroken_) return;
  RequestList list;
  for (auto& e : batch) {
    if (e->completed) continue;  // failed locally before it was sent (e.g. a stall error raced it)
    const Request& r = e->request;
    bool cacheableKind = r.kind == CollectiveKind::kAllreduce ||
                         r.kind == CollectiveKind::kBroadcast ||
                         r.kind == CollectiveKind::kReducescatter;
    int32_t bit = cacheableKind ? cache_.lookup(r.name, r.signature()) : -1;
    if (bit >= 0) {
      uint64_t sig = r.signature();
      list.hits.push_back(CacheHit{static_cast<uint32_t>(bit), sig});
      sentAsHits_[sig] = r;
    } else {
      list.requests.push_back(r);
    }
  }
  submit(std::move(list));
}

void ProcessSetImpl::submit(RequestList list) {
  if (coordinator_) {
    std::vector<CacheHit> nacks;
    Status s = coordinator_->onRequests(0, list, Clock::now(), &nacks);
    if (!s.isOk()) {
      abortSet(s);
      return;
    }
    if (!nacks.empty()) {
      RequestList again;
      for (const auto& h : nacks) {
        auto it = sentAsHits_.find(h.signature);
        if (it != sentAsHits_.end()) again.requests.push_back(it->second);
      }
      if (!again.requests.empty()) submit(std::move(again));
    }
    maybeEmit();
  } else {
    cp_->send(0, FrameType::kRequests, encode(list));
  }
}

void ProcessSetImpl::onFrame(int from, FrameType type, std::string payload) {
  bool fromCoordinator = !coordinator_;
  bool expected = coordinator_ ? (type == FrameType::kRequests || type == FrameType::kAbort)
                               : (type == FrameType::kResponses || type == FrameType::kNack ||
                                  type == FrameType::kAbort);
  if (!expected) {
    abortSet(protocolError(
        std::string("unexpected ") + frameTypeName(type) + " frame from " +
        (fromCoordinator ? "the coordinator" : "rank " + std::to_string(globalRank(from)))));
    return;
  }
  if (isBroken_) {
    // Keep answering: a rank that did not see the failure yet must learn it
    // instead of waiting for a response that will never come.
    if (coordinator_ && type == FrameType::kRequests) sendAbort(from, brokenStatus());
    return;
  }
  switch (type) {
    case FrameType::kRequests: {
      RequestList list;
      Status s = decode(payload, &list);
      std::vector<CacheHit> nacks;
      if (s.isOk()) s = coordinator_->onRequests(from, list, Clock::now(), &nacks);
      if (!s.isOk()) {
        abortSet(
            s.withContext("bad request message from rank " + std::to_string(globalRank(from))));
        return;
      }
      if (!nacks.empty()) {
        RequestList n;
        n.hits = std::move(nacks);
        cp_->send(from, FrameType::kNack, encode(n));
      }
      maybeEmit();
      return;
    }
    case FrameType::kResponses: {
      ResponseList list;
      Status s = decode(payload, &list);
      if (!s.isOk()) {
        abortSet(s.withContext("bad response message from the coordinator"));
        return;
      }
      applyResponses(list);
      return;
    }
    case FrameType::kNack: {
      RequestList n;
      Status ds = decode(payload, &n);
      if (!ds.isOk()) {
        abortSet(ds.withContext("bad nack from the coordinator"));
        return;
      }
      RequestList again;
      for (const auto& h : n.hits) {
        auto it = sentAsHits_.find(h.signature);
        if (it != sentAsHits_.end()) again.requests.push_back(it->second);
      }
      if (!again.requests.empty()) submit(std::move(again));
      return;
    }
    case FrameType::kAbort: {
      ByteReader rd(payload);
      int32_t code = 0;
      std::string msg;
      if (!rd.i32(&code, "abort code").isOk() || !rd.str(&msg, "abort message").isOk()) {
        code = static_cast<int32_t>(Code::kProtocolError);
        msg = "the coordinator aborted the job with a malformed message";
      }
      if (code <= 0 || code > static_cast<int32_t>(Code::kInternal))
        code = static_cast<int32_t>(Code::kRemoteError);
      if (coordinator_) {
        // A worker failed on its own (data plane, protocol): tell everyone, naming it.
        abortSet(Status(static_cast<Code>(code),
                        "rank " + std::to_string(globalRank(from)) + " failed: " + msg));
      } else {
        markBroken(Status(static_cast<Code>(code), msg));
      }
      return;
    }
    default:
      return;
  }
}

void ProcessSetImpl::applyResponses(const ResponseList& list) {
  for (const auto& g : list.groups) {
    std::vector<Response> resolved;
    resolved.reserve(g.items.size());
    for (const auto& item : g.items) {
      if (item.cacheBit >= 0) {
        const Response* r = cache_.touch(static_cast<uint32_t>(item.cacheBit));
        if (!r) {
          abortSet(
              protocolError("response cache out of step with the coordinator (bit " +
                            std::to_string(item.cacheBit) +
                            " unknown here): are all ranks using the same HORA_CACHE_CAPACITY?"));
          return;
        }
        resolved.push_back(*r);
      } else {
        if (item.response.cacheable()) cache_.put(item.response);
        resolved.push_back(item.response);
      }
      sentAsHits_.erase(resolved.back().signature);
      Status v = validateResponse(resolved.back());
      if (!v.isOk()) {
        abortSet(v);
        return;
      }
    }
    queueGroup(std::move(resolved));
  }
}

// Groups this small run on the control thread itself when the executor is
// idle: one thread hand-off less on the latency-critical path, and short
// enough not to delay heartbeats noticeably.
namespace {
bool touchesBackend(ResponseKind k) {
  return k != ResponseKind::kError && k != ResponseKind::kBarrier && k != ResponseKind::kJoin;
}
}  // namespace

Status ProcessSetImpl::claimEntries(const std::vector<Response>& responses, ExecGroup* g) {
  for (const auto& r : responses) {
    std::shared_ptr<TensorEntry> e;
    bool joined = std::find(r.joined.begin(), r.joined.end(), rank_) != r.joined.end();
    if (!joined) e = takeEntry(r.name);
    if (touchesBackend(r.kind) && !joined) {
      // Every rank not listed as joined must take part with its own tensor:
      // contributing anything else would hand the others a wrong result.
      if (!e)
        // kRemoteError (not kShutDown) so the peers abort their data plane
        // instead of waiting in this collective for the peer timeout.
        return Status(Code::kRemoteError,
                      std::string(collectiveName(static_cast<CollectiveKind>(r.kind))) + " \"" +
                          r.name + "\" was agreed by all ranks but rank " +
                          std::to_string(globalRank(rank_)) +
                          " no longer has it (it shut down or it failed locally); the collective "
                          "cannot run");
      bool sameKind = static_cast<uint8_t>(e->request.kind) == static_cast<uint8_t>(r.kind);
      bool exact = r.kind == ResponseKind::kAllreduce || r.kind == ResponseKind::kBroadcast ||
                   r.kind == ResponseKind::kReducescatter;
      if (!sameKind || (exact && e->request.signature() != r.signature) ||
          e->request.dtype != r.dtype) {
        e->complete(entryStatus(
            *e, protocolError("the coordinator's response does not match this request")));
        return protocolError(
            "response for \"" + r.name + "\" does not match rank " +
            std::to_string(globalRank(rank_)) + "'s request (" + e->request.describe() +
            "): the response caches are out of step or the coordinator misbehaved");
      }
    }
    g->entries.push_back(std::move(e));
  }
  return Status::ok();
}

Status ProcessSetImpl::validateResponse(const Response& r) const {
  auto bad = [&](const std::string& why) {
    return protocolError("malformed response for \"" + r.name + "\" from the coordinator of set " +
                         name_ + ": " + why);
  };
  size_t n = static_cast<size_t>(size());
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
      if (r.errorCode <= 0 || r.errorCode > static_cast<int32_t>(Code::kInternal))
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
  for (int64_t d : r.sizes)
    if (d < 0) return bad("negative size");
  return Status::ok();
}

void ProcessSetImpl::queueGroup(std::vector<Response> responses) {
  ExecGroup g;
  Status s = claimEntries(responses, &g);
  if (!s.isOk()) {
    for (auto& e : g.entries)
      if (e) e->complete(entryStatus(*e, s));
    abortSet(s);
    return;
  }
  bool runHere = true;
  for (const auto& r : responses) runHere &= !touchesBackend(r.kind);
  g.responses = std::move(responses);
  {
    std::lock_guard<std::mutex> lk(execMu_);
    // Barrier/join/error groups need no data plane: complete them right here
    // when nothing is queued ahead (one thread hand-off less). Collectives
    // always go to the executor so this thread keeps heartbeats and loss
    // detection running while they wait on peers.
    runHere = runHere && execQueue_.empty() && execInFlight_ == 0 && !stopping_;
    if (!runHere) execQueue_.push_back(std::move(g));
    ++execInFlight_;
  }
  if (!runHere) {
    execCv_.notify_one();
    return;
  }
  execute(g);
  {
    std::lock_guard<std::mutex> lk(execMu_);
    --execInFlight_;
  }
  execIdleCv_.notify_all();
}

void ProcessSetImpl::maybeEmit(bool force) {
  if (!coordinator_ || !coordinator_->hasReady() || isBroken_) return;
  auto now = Clock::now();
  if (!emitTimerArmed_) firstReady_ = now;
  auto cycle = std::chrono::microseconds(static_cast<int64_t>(opts_.cycleTimeMs * 1000));
  // Emit at once when the executor is idle (lowest latency); while it is
  // busy, let more tensors become ready so they fuse, for at most one cycle.
  if (!force && execInFlight_ > 0 && now - firstReady_ < cycle) {
    if (!emitTimerArmed_) {
      emitTimerArmed_ = true;
      emitTimer_->expires_after(cycle);
      emitTimer_->async_wait([this](boost::system::error_code ec) {
        if (ec == boost::asio::error::operation_aborted)
          return;  // cancelled: a newer timer owns the flag
        emitTimerArmed_ = false;
        maybeEmit();
      });
    }
    return;
  }
  if (emitTimerArmed_) {
    emitTimer_->cancel();
    emitTimerArmed_ = false;
  }
  std::vector<std::vector<Response>> resolved;
  ResponseList list = coordinator_->emit(&resolved);
  if (size() > 1) cp_->broadcast(FrameType::kResponses, encode(list));
  for (auto& g : resolved) {
    for (const auto& r : g) sentAsHits_.erase(r.signature);
    queueGroup(std::move(g));
  }
}

void ProcessSetImpl::stallTick() {
  if (!coordinator_ || isBroken_ || stopping_) return;
  for (const auto& w : coordinator_->inspectStalls(Clock::now())) HORA_LOG(logger_, kWarning) << w;
  maybeEmit();
  double period =
      std::min(1.0, std::max(0.05, std::min(opts_.stallWarningS,
                                            opts_.stallShutdownS > 0 ? opts_.stallShutdownS : 1e9) /
                                       4));
  stallTimer_->expires_after(std::chrono::milliseconds(static_cast<int64_t>(period * 1000)));
  stallTimer_->async_wait([this](boost::system::error_code ec) {
    if (!ec) stallTick();
  });
}

void ProcessSetImpl::onPeerLost(int peer, Status why) {
  if (stopping_) return;
  Status s = why;
  if (coordinator_ && why.code() != Code::kShutDown)
    s = Status(why.code(), why.message() + " [" + coordinator_->pendingSummary() + "]");
  if (!cp_->isCoordinator() && why.code() != Code::kShutDown)
    s = Status(why.code(), "lost the coordinator of set " + name_ + ": " + why.message());
  if (why.code() == Code::kShutDown)
    s = Status(Code::kShutDown,
               why.message() +
                   "; collectives that need it can no longer complete (did ranks run "
                   "different numbers of steps? see hora_join for uneven data)");
  abortSet(s);
}

void ProcessSetImpl::sendAbort(int peer, const Status& why) {
  ByteWriter w;
  w.i32(static_cast<int32_t>(why.code()));
  w.str(why.message());
  std::string payload = w.take();
  if (peer >= 0)
    cp_->send(peer, FrameType::kAbort, payload);
  else
    cp_->broadcast(FrameType::kAbort, payload);
}

void ProcessSetImpl::abortSet(Status why) {
  // Coordinator: tell every worker. Worker: tell the coordinator, which
  // tells the others naming this rank (a goodbye needs no abort: the peers
  // already learn it from the goodbye itself).
  if (size() > 1 && why.code() != Code::kShutDown) sendAbort(cp_->isCoordinator() ? -1 : 0, why);
  if (size() > 1 && why.code() == Code::kShutDown && cp_->isCoordinator()) sendAbort(-1, why);
  markBroken(std::move(why));
}

void ProcessSetImpl::markBroken(Status why) {
  {
    std::lock_guard<std::mutex> lk(tableMu_);
    if (isBroken_) return;
    broken_ = why;
    isBroken_ = true;
  }
  if (why.code() != Code::kShutDown)
    HORA_LOG(logger_, kError) << "process set " << name_ << " failed: " << why.message();
  // Failures found off the control thread (the executor's data plane) reach
  // the peers through it; abortSet() on the control thread already did this.
  if (size() > 1 && cp_ && std::this_thread::get_id() != controlThreadId_.load() && !stopping_)
    boost::asio::post(cp_->io(), [this, why] { sendAbort(cp_->isCoordinator() ? -1 : 0, why); });
  // A collective stuck on a vanished peer must not wait for the data-plane
  // timeout. A goodbye is different: that peer finished everything agreed
  // before it, so queued work may still complete.
  if (why.code() != Code::kShutDown) backend_->abort();
  failAllPending(why);
  execCv_.notify_all();
}

Status ProcessSetImpl::entryStatus(const TensorEntry& e, const Status& why) const {
  return Status(why.code(), std::string(collectiveName(e.request.kind)) + " \"" + e.request.name +
                                "\" on rank " + std::to_string(globalRanks_[rank_]) + ": " +
                                why.message());
}

void ProcessSetImpl::failAllPending(const Status& why) {
  std::vector<std::shared_ptr<TensorEntry>> victims;
  {
    std::lock_guard<std::mutex> lk(tableMu_);
    for (auto& kv : table_) victims.push_back(kv.second);
    table_.clear();
    inbox_.clear();
  }
  for (auto& e : victims) e->complete(entryStatus(*e, why));
}

std::shared_ptr<TensorEntry> ProcessSetImpl::takeEntry(const std::string& name) {
  std::lock_guard<std::mutex> lk(tableMu_);
  auto it = table_.find(name);
  if (it == table_.end()) return nullptr;
  auto e = it->second;
  table_.erase(it);
  return e;
}

void ProcessSetImpl::shutdown(const std::string& reason) {
  std::lock_guard<std::mutex> once(shutdownMu_);  // concurrent destroy/shutdown calls run it once
  if (std::this_thread::get_id() == controlThreadId_.load()) {
    // Called from a completion callback on the control thread: joining itself would crash.
    HORA_LOG(logger_, kError)
        << "hora_shutdown called from a completion callback; ignored (callbacks must not "
           "call blocking hora functions)";
    return;
  }
  if (stopping_.exchange(true)) return;
  Status why(Code::kShutDown, reason);
  bool running = controlThread_.joinable();
  // Graceful order, so that the last collectives complete on every rank:
  // 1. emit what is ready (other ranks may be waiting for it), 2. let the
  // executor finish every agreed group, 3. fail what was never negotiated,
  // 4. say goodbye and keep the data plane open until every peer is done.
  // Each wait is bounded, so a hung peer delays shutdown but never blocks it.
  double lingerS = std::min(30.0, std::max(1.0, opts_.peerTimeoutS));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(lingerS);
  if (running) {
    auto emitted = std::make_shared<std::promise<void>>();
    auto done = emitted->get_future();
    asio::post(cp_->io(), [this, emitted] {
      maybeEmit(true);
      emitted->set_value();
    });
    done.wait_until(deadline);
    std::unique_lock<std::mutex> lk(execMu_);
    execIdleCv_.wait_until(lk, deadline, [&] { return execQueue_.empty() && execInFlight_ == 0; });
  }
  failAllPending(why);
  if (running) {
    asio::post(cp_->io(), [this] {
      emitTimer_->cancel();
      stallTimer_->cancel();
      cp_->closeGracefully();
    });
    while (!cp_->peersDone() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (cp_) cp_->stop();
  if (controlThread_.joinable()) controlThread_.join();
  {
    std::lock_guard<std::mutex> lk(execMu_);
    executorExit_ = true;
  }
  execCv_.notify_all();
  if (executorThread_.joinable()) executorThread_.join();
  gpuRelease();
  std::deque<ExecGroup> left;
  {
    std::lock_guard<std::mutex> lk(execMu_);
    left.swap(execQueue_);
  }
  for (auto& g : left)
    for (auto& e : g.entries)
      if (e) e->complete(entryStatus(*e, why));
}

}  // namespace hora
