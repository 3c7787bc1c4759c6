// Executor (the executor thread) and dataPlaneFailure (exec_context.h), the rule every
// path follows when the data plane fails.
#include "ops/executor/executor.h"

#include <cstdint>

#include "core/check.h"
#include "core/cpu_affinity.h"

namespace hora {

Status dataPlaneFailure(const ExecContext& ctx, const Status& s, const std::string& what) {
  if (ctx.health->broken()) return ctx.health->status();
  Status named = s.withContext(what);
  ctx.health->suspect(named);
  return named;
}

Executor::Executor(ExecContext ctx, GroupQueue& queue, GpuPathOptions gpu)
    : ctx_(std::move(ctx)), queue_(queue), cpu_(ctx_), gpu_(ctx_, std::move(gpu)) {}

Executor::~Executor() { join(); }

void Executor::start() {
  thread_ = std::thread([this] { run(); });
  // Named and bound from here rather than by the thread itself: once the
  // set is created its executor is where it will stay (tests and tools that
  // read the threads' masks right after init see the final state).
  nameThread(thread_.native_handle(), "hora-exec");
  if (ctx_.cpu >= 0) {
    Status s = bindThread(thread_.native_handle(), ctx_.cpu);
    if (!s.isOk())
      HORA_LOG(ctx_.logger, kWarning)
          << "process set " << ctx_.setName << ": " << s.message()
          << "; the executor runs unbound (HORA_BIND_EXECUTOR=0 skips binding)";
  }
}

void Executor::join() {
  if (thread_.joinable()) thread_.join();
}

void Executor::releaseGpu() { gpu_.release(); }

void Executor::run() {
  for (;;) {
    AgreedGroup group;
    if (launched_.empty()) {
      if (!queue_.pop(&group)) break;
    } else {
      // GPU work in flight: complete what is done, launch what comes next
      // (at most kMaxLaunchedGroups at once).
      reapLaunched(launched_.size() >= kMaxLaunchedGroups ? kMaxLaunchedGroups - 1 : SIZE_MAX);
      const int got = launched_.empty() ? 0 : queue_.tryPop(&group);
      if (got < 0) break;
      if (got == 0) {
        if (!launched_.empty()) {
          gpuPollPause(ctx_.spin, Clock::now() - gpu_.oldestLaunch());
        }
        continue;
      }
    }
    const bool done = execute(group);
    group = AgreedGroup();  // the entries go before the next wait
    if (done)
      queue_.finished();
    else
      queue_.launched();
  }
  reapLaunched(0);  // closed: what was launched still completes
}

bool Executor::reapLaunched(size_t keepAtMost) {
  bool any = false;
  while (!launched_.empty()) {
    auto state = gpu_.pollLaunched();
    if (!state.isOk()) {
      // The communicator failed or was aborted: every launched group fails.
      const Status why = state.status();
      while (!launched_.empty()) {
        LaunchedGroup l = std::move(launched_.front());
        launched_.pop_front();
        finishLaunched(l, &why);
      }
      return true;
    }
    if (!state.value()) {
      if (launched_.size() <= keepAtMost) return any;
      gpuPollPause(ctx_.spin, Clock::now() - gpu_.oldestLaunch());
      continue;
    }
    LaunchedGroup l = std::move(launched_.front());
    launched_.pop_front();
    finishLaunched(l, nullptr);
    any = true;
  }
  return any;
}

void Executor::finishLaunched(LaunchedGroup& l, const Status* failure) {
  if (ctx_.telemetry)
    ctx_.telemetry->finished(l.group, failure ? *failure : l.outputLost, l.plane, true, -1, -1);
  if (failure)
    fail(l.group, *failure);
  else
    complete(l.group, l.outputLost);
  l.group = AgreedGroup();
  queue_.finishedLaunched();
}

bool Executor::canRunHere(const AgreedGroup& group) const {
  if (!ctx_.backend || group.tuning || group.responses.empty()) return false;
  int64_t elements = 0;
  for (const Response& r : group.responses) elements += r.numElements();
  return ctx_.backend->callsWaitHook(static_cast<size_t>(elements), group.responses[0].dtype);
}

bool Executor::runHere(AgreedGroup& group, std::function<void()> whileWaiting) {
  if (!canRunHere(group)) return false;
  // Counted before it runs: its requests complete inside execute(), and a
  // caller may read the metrics the moment they do.
  if (ctx_.telemetry) ctx_.telemetry->ranOnControl();
  ctx_.backend->setWaitHook(std::move(whileWaiting));
  // Host groups only, and nothing launched on the GPU (tryBeginInline counts
  // launched groups in flight), so execute() never leaves this one launched.
  const bool done = execute(group);
  HORA_CHECK(done) << "a group run on the control thread was left launched";
  ctx_.backend->setWaitHook(nullptr);
  return true;
}

bool Executor::prepareHere(TensorEntry& entry, const std::function<bool()>& stop) {
  if (!ctx_.backend || ctx_.health->suspected()) return false;
  const bool packed = cpu_.prepack(entry, stop);
  if (packed && ctx_.telemetry) ctx_.telemetry->packedAhead();
  return packed;
}

bool Executor::execute(AgreedGroup& g) {
  HORA_CHECK(!g.responses.empty() && g.entries.size() == g.responses.size())
      << g.entries.size() << " entries for " << g.responses.size() << " responses";
  const bool onGpu = g.responses.front().device.kind == DeviceKind::kCuda;
  // Only GPU groups go on behind launched ones (their stream orders them);
  // anything else completes after them, as it would have without pipelining.
  if (!onGpu || !needsDataPlane(g)) reapLaunched(0);
  if (!needsDataPlane(g)) {
    completeWithoutDataPlane(g, ctx_.rank, ctx_.globalRanks, [&](const std::vector<Status>& o) {
      if (ctx_.telemetry) ctx_.telemetry->inlineDone(g, &o);
    });
    return true;
  }
  // Autotune: every rank applies the same values before the same group.
  if (g.tuning) {
    if (ctx_.backend) ctx_.backend->tune(*g.tuning);
    if (ctx_.telemetry) ctx_.telemetry->tuned(*g.tuning);
  }
  // A collective before this one failed on the data plane and the set's
  // status is not final yet: this one cannot run either (its peers are
  // failing too), and it reports whatever that status becomes.
  if (ctx_.health->suspected()) {
    reapLaunched(0);
    const Status s(Code::kRemoteError, "the data plane failed");
    if (ctx_.telemetry) ctx_.telemetry->finished(g, s, "-", false);
    fail(g, s);
    return true;
  }
  const Response& first = g.responses.front();
  if (ctx_.telemetry) ctx_.telemetry->started(g);
  CollectivePath& path =
      first.device.kind == DeviceKind::kCuda ? static_cast<CollectivePath&>(gpu_) : cpu_;
  TensorEntry* e = g.entries[0].get();
  Status s, outputLost;
  switch (first.kind) {
    case ResponseKind::kAllreduce:
      s = path.allreduce(g.responses, g.entries);
      break;
    case ResponseKind::kBroadcast:
      s = path.broadcast(first, e);
      break;
    case ResponseKind::kAllgather:
      s = path.allgather(first, e, &outputLost);
      break;
    case ResponseKind::kAlltoall:
      s = path.alltoall(first, e, &outputLost);
      break;
    case ResponseKind::kReducescatter:
      s = path.reducescatter(first, e, &outputLost);
      break;
    default:
      s = internalError("unexpected response kind " + std::to_string(static_cast<int>(first.kind)));
      break;
  }
  if (onGpu && gpu_.tookLaunch()) {  // completed by reapLaunched once its event fires
    HORA_CHECK(s.isOk()) << "a GPU group failed after it was launched";
    launched_.push_back(LaunchedGroup{std::move(g), outputLost, gpu_.planeName()});
    return false;
  }
  if (onGpu) reapLaunched(0);  // those launched before it complete first
  if (ctx_.telemetry) {
    const bool cpuAllreduce = !onGpu && first.kind == ResponseKind::kAllreduce;
    const CpuPath::Phases ph = cpuAllreduce ? cpu_.lastPhases() : CpuPath::Phases{-1, -1};
    ctx_.telemetry->finished(g, s.isOk() ? outputLost : s,
                             onGpu          ? gpu_.planeName()
                             : ctx_.backend ? ctx_.backend->name()
                                            : "cpu",
                             onGpu, ph.packNs, ph.unpackNs);
  }
  if (!s.isOk())
    fail(g, s);
  else
    complete(g, outputLost);
  return true;
}

void Executor::complete(AgreedGroup& g, const Status& outputLost) {
  for (auto& e : g.entries)
    if (e)
      e->complete(outputLost.isOk() ? outputLost
                                    : entryFailure(*e, ctx_.myGlobalRank(), outputLost));
}

void Executor::fail(AgreedGroup& g, const Status& why) {
  const int me = ctx_.myGlobalRank();
  // The post-mortem is written before anyone learns of the failure: a
  // program that exits on the error it gets would leave none otherwise.
  if (ctx_.telemetry && ctx_.telemetry->options().flightEntries > 0)
    (void)ctx_.telemetry->dumpFlight("a collective failed on rank " + std::to_string(me) + ": " +
                                     why.message());
  if (ctx_.health->suspected() || ctx_.health->broken()) {
    // The data plane failed: the entries get the set's final status (the
    // lost peer, named by the control thread) when there is one. Broken
    // counts too: the control thread may break the set between the data
    // plane's failure and here, and a set that is broken has no suspicion
    // left (dataPlaneFailure's suspect() came too late), only its status.
    ctx_.health->whenBroken([entries = g.entries, me](const Status& final) {
      for (auto& e : entries)
        if (e) e->complete(entryFailure(*e, me, final));
    });
    return;
  }
  // A failure only this rank saw (out of memory, a plugin call) leaves the
  // others inside the collective, and letting this rank go on would pair its
  // next collective with their current one: the set is done (this tells the
  // peers; a no-op if the set is already broken).
  // The entries fail once the peers were told (SetHealth::holdForPeers).
  ctx_.health->fail(why, /*tellPeers=*/true);
  ctx_.health->whenBroken([entries = g.entries, me](const Status& final) {
    for (auto& e : entries)
      if (e) e->complete(entryFailure(*e, me, final));
  });
}

}  // namespace hora
