#include "controllers/coordinator_service.h"

#include <algorithm>

namespace hora {

CoordinatorService::CoordinatorService(CoordinatorServiceOptions options, ControlPlane& cp,
                                       const SetHealth& health, const GroupQueue& queue,
                                       Logger logger)
    : opts_(std::move(options)),
      cp_(cp),
      health_(health),
      queue_(queue),
      logger_(std::move(logger)),
      cache_(static_cast<size_t>(std::max(0, opts_.cacheCapacity))),
      coordinator_(opts_.coordinator, &cache_, logger_),
      emitTimer_(cp.io()),
      stallTimer_(cp.io()),
      cycleTime_(opts_.cycleTime) {
  if (opts_.autotune) autotune_ = std::make_unique<AutotuneDriver>(*opts_.autotune, logger_);
}

void CoordinatorService::submit(RequestList list) {
  receive(0, list);
  maybeEmit(false);
}

void CoordinatorService::receive(int from, const RequestList& list) {
  std::vector<CacheHit> nacks;
  Status s = coordinator_.onRequests(from, list, Clock::now(), &nacks);
  if (!s.isOk()) {
    if (from != 0)
      s = s.withContext("bad request message from rank " + std::to_string(globalRank(from)));
    return client_->failSet(s, true);
  }
  if (nacks.empty()) return;
  if (from == 0) return client_->onNacks(nacks);
  RequestList n;
  n.hits = std::move(nacks);
  for (auto& h : n.hits) h.payload.clear();  // the worker resends its own
  cp_.send(from, FrameType::kNack, encode(n));
}

void CoordinatorService::onFrame(int from, FrameType type, std::string payload) {
  if (type != FrameType::kRequests && type != FrameType::kAbort)
    return client_->failSet(protocolError(std::string("unexpected ") + frameTypeName(type) +
                                          " frame from rank " + std::to_string(globalRank(from))),
                            true);
  if (health_.broken()) {
    // Keep answering: a rank that did not see the failure yet must learn it
    // instead of waiting for a response that will never come.
    if (type == FrameType::kRequests)
      cp_.send(from, FrameType::kAbort, encodeAbort(health_.status()));
    return;
  }
  if (type == FrameType::kAbort) {
    // A worker failed on its own (data plane, protocol): tell everyone, naming it.
    Status why = decodeAbort(payload);
    return client_->failSet(Status(why.code(), "rank " + std::to_string(globalRank(from)) +
                                                   " failed: " + why.message()),
                            true);
  }
  RequestList list;
  Status s = decode(payload, &list);
  if (!s.isOk())
    return client_->failSet(
        s.withContext("bad request message from rank " + std::to_string(globalRank(from))), true);
  receive(from, list);
  maybeEmit(false);
}

void CoordinatorService::reportFailure(const Status& why) {
  // Every failure goes to every worker, a goodbye included: the workers
  // learn from it that the set is over.
  if (size() > 1) cp_.broadcast(FrameType::kAbort, encodeAbort(why));
}

Status CoordinatorService::describeLoss(int, const Status& why) const {
  if (why.code() == Code::kShutDown) return peerShutDown(why);
  // A peer lost in the middle of a collective leaves nothing to negotiate:
  // say what was running on the data plane instead of "no tensors pending".
  const std::string running = queue_.runningSummary();
  std::string report = coordinator_.pendingSummary();
  if (!running.empty()) {
    // Keep what follows "no tensors pending; " (what the stall check failed).
    const std::string none = "no tensors pending";
    if (report.rfind(none, 0) == 0)
      report = report.size() > none.size() + 2 ? report.substr(none.size() + 2) : "";
    report = "running on the data plane: " + running + (report.empty() ? "" : "; " + report);
  }
  return Status(why.code(), why.message() + " [" + report + "]");
}

void CoordinatorService::maybeEmit(bool force) {
  if (!coordinator_.hasReady() || health_.broken()) return;
  auto now = Clock::now();
  if (!emitTimerArmed_) firstReady_ = now;
  // Emit at once when the executor is idle (lowest latency); while it is
  // busy, let more tensors become ready so they fuse, for at most one cycle.
  // The hold is published before busy() is read again, and the executor's
  // done hook reads it after busy() dropped: one of the two sees the other
  // (both are ordered by the queue's mutex), so held tensors are never left
  // for the timer alone.
  bool hold = !force && queue_.busy() > 0 && now - firstReady_ < cycleTime_;
  if (hold) {
    heldForBusy_.store(true);
    hold = queue_.busy() > 0;
  }
  if (hold) {
    if (!emitTimerArmed_) {
      emitTimerArmed_ = true;
      const uint64_t gen = ++emitTimerGen_;
      emitTimer_.expires_after(cycleTime_);
      emitTimer_.async_wait(cp_.locked([this, gen](boost::system::error_code ec) {
        // Cancelled, or already queued when an emit (or a newer arming)
        // made it stale: a newer timer owns the flag, or none is needed.
        if (ec == boost::asio::error::operation_aborted || gen != emitTimerGen_) return;
        emitTimerArmed_ = false;
        // A cycle held: emit now, busy or not. Asking again would start a
        // new cycle from here (firstReady_), holding until the executor
        // idles however long that takes.
        maybeEmit(true);
      }));
    }
    return;
  }
  heldForBusy_.store(false);
  if (emitTimerArmed_) {
    emitTimer_.cancel();
    emitTimerArmed_ = false;
    ++emitTimerGen_;
  }
  std::vector<std::vector<Response>> emitted;
  ResponseList list = coordinator_.emit(autotune_ ? &emitted : nullptr);
  list.tuning = std::move(sendTuning_);
  sendTuning_.reset();
  if (size() > 1) cp_.broadcast(FrameType::kResponses, encode(list));
  client_->onResponses(list);
  if (!autotune_) return;
  if (auto v = autotune_->afterEmit(emitted, now)) {
    coordinator_.setFusionThreshold(v->fusionThresholdBytes);
    cycleTime_ = std::chrono::microseconds(v->cycleTimeUs);
    sendTuning_ = *v;
  }
}

void CoordinatorService::stallTick() {
  if (health_.broken() || client_->stopping()) return;
  const Clock::time_point now = Clock::now();
  const std::string report = coordinator_.hangReport(now);
  const std::vector<std::string> warnings = coordinator_.inspectStalls(now);
  for (const auto& w : warnings) HORA_LOG(logger_, kWarning) << w;
  if (!warnings.empty() && opts_.coordinator.telemetry) {
    // The cross-rank report, taken before the stall check failed anything,
    // and this rank's flight recorder beside it.
    Telemetry& t = *opts_.coordinator.telemetry;
    for (const auto& w : warnings) t.stall(w);
    auto path = t.dumpText("hang-report", report);
    auto flight = t.dumpFlight("stall warning (see the hang report beside this file)");
    if (path.isOk())
      HORA_LOG(logger_, kWarning) << "hang report: " << path.value()
                                  << (flight.isOk() ? "; flight recorder: " + flight.value() : "");
    else
      HORA_LOG(logger_, kWarning) << "could not write the hang report: " << path.status().message()
                                  << "\n"
                                  << report;
  }
  maybeEmit(false);
  const Seconds warn = opts_.coordinator.stallWarning;
  const Seconds shut =
      opts_.coordinator.stallShutdown.count() > 0 ? opts_.coordinator.stallShutdown : Seconds(1e9);
  // A quarter of the shortest stall time, between 50 ms and 1 s.
  const Seconds period = std::clamp(std::min(warn, shut) / 4, Seconds(0.05), Seconds(1));
  stallTimer_.expires_after(toMillis(period));
  stallTimer_.async_wait(cp_.locked([this](boost::system::error_code ec) {
    if (!ec) stallTick();
  }));
}

void CoordinatorService::stop() {
  emitTimer_.cancel();
  emitTimerArmed_ = false;
  ++emitTimerGen_;  // a handler already queued emits nothing
  stallTimer_.cancel();
}

}  // namespace hora
