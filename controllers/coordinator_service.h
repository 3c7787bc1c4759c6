// CoordinatorService: the coordinator side of a process set, hosted by set
// rank 0's control thread; that rank's own SetController reaches it through
// this same object (the CoordinatorLink of rank 0), the other ranks through
// frames.
//
// It drives the Coordinator (coordinator.h, pure negotiation logic) with
// real time and real peers:
//  - requests arrive from every rank (rank 0's directly, the others' as
//    frames); stale cache hits are nacked back to their sender;
//  - emit: what is ready goes out as one response list to every rank (rank
//    0's controller gets the same list by a direct call). It emits at once
//    while this rank's executor is idle (lowest latency); while it is busy,
//    ready work waits at most HORA_CYCLE_TIME_MS so more of it fuses;
//  - a stall tick inspects tensors waiting on missing ranks (warning, then
//    an error response after the shutdown time);
//  - a worker's abort is relayed to every rank, naming that worker; a worker
//    that still sends requests after the set broke is answered with the
//    failure, so it learns it instead of waiting for a response;
//  - autotune (when on): each emit feeds the AutotuneDriver; new values
//    change the fusion threshold and cycle time of the next emit and travel
//    with the next response list to every rank.
//
// The Coordinator keeps its own response cache: rank 0's controller applies
// every response list to its cache exactly as the workers do, so the two
// caches see the same operations in the same order and agree.
//
// Control thread only.
#pragma once

#include <atomic>
#include <boost/asio/steady_timer.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "controllers/autotune_driver.h"
#include "controllers/coordinator.h"
#include "controllers/coordinator_link.h"
#include "core/clock.h"
#include "core/group_queue.h"
#include "core/response_cache.h"
#include "core/set_health.h"

namespace hora {

struct CoordinatorServiceOptions {
  CoordinatorOptions coordinator;
  int cacheCapacity = 1024;
  std::chrono::microseconds cycleTime{1000};
  // Online autotune (controllers/autotune_driver.h); null: off.
  std::shared_ptr<const AutotuneDriverOptions> autotune;
};

class CoordinatorService : public CoordinatorLink {
 public:
  // `queue`: this rank's agreed-group queue (is its executor busy?);
  // `health`: the set's (is it broken, and why?).
  CoordinatorService(CoordinatorServiceOptions options, ControlPlane& cp, const SetHealth& health,
                     const GroupQueue& queue, Logger logger);

  void attach(Client* client) override { client_ = client; }
  void start() override { stallTick(); }
  void submit(RequestList list) override;
  void reportFailure(const Status& why) override;
  void onFrame(int from, FrameType type, std::string payload) override;
  Status describeLoss(int peer, const Status& why) const override;
  bool wantsExecutorIdle() const override { return true; }
  bool executorIdleWanted() const override { return heldForBusy_.load(); }
  void executorIdle() override { maybeEmit(false); }
  void flush() override { maybeEmit(true); }
  void stop() override;

 private:
  // Records rank `from`'s submissions; nacks go back to it.
  void receive(int from, const RequestList& list);
  void maybeEmit(bool force);
  void stallTick();
  int size() const { return opts_.coordinator.size; }
  int globalRank(int setRank) const { return opts_.coordinator.globalRanks[setRank]; }

  const CoordinatorServiceOptions opts_;
  ControlPlane& cp_;
  const SetHealth& health_;
  const GroupQueue& queue_;
  Logger logger_;
  Client* client_ = nullptr;
  ResponseCache cache_;
  Coordinator coordinator_;
  boost::asio::steady_timer emitTimer_, stallTimer_;
  bool emitTimerArmed_ = false;
  // Which arming of emitTimer_ is current: a handler asio had already
  // queued when the timer was cancelled (or re-armed) still runs with
  // success, and must then do nothing.
  uint64_t emitTimerGen_ = 0;
  // Ready tensors held back because the executor was busy: its done hook
  // then wakes the control thread to emit them (read on the executor).
  std::atomic<bool> heldForBusy_{false};
  Clock::time_point firstReady_{};
  std::chrono::microseconds cycleTime_;       // autotune may change it
  std::unique_ptr<AutotuneDriver> autotune_;  // null: off
  std::optional<TuningValues> sendTuning_;    // with the next response list
};

}  // namespace hora
