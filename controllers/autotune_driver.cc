#include "controllers/autotune_driver.h"

#include <chrono>

namespace hora {

namespace {

std::string tunedList(const AutotuneOptions& o) {
  std::string tuned, pinned;
  for (TuneDim d : o.order) {
    std::string& to = o.tune[static_cast<int>(d)] ? tuned : pinned;
    to += (to.empty() ? "" : ", ") + std::string(tuneDimColumn(d));
  }
  return "tuning " + (tuned.empty() ? std::string("nothing") : tuned) +
         (pinned.empty() ? "" : "; fixed: " + pinned);
}

}  // namespace

AutotuneDriver::AutotuneDriver(AutotuneDriverOptions options, Logger logger)
    : opts_(std::move(options)),
      logger_(std::move(logger)),
      tuner_(opts_.tuner),
      meter_(opts_.meter),
      sent_(opts_.tuner.start) {
  if (!opts_.logPath.empty()) {
    const std::string path =
        opts_.setName == "global" ? opts_.logPath : opts_.logPath + "." + opts_.setName;
    log_.open(path, std::ios::out | std::ios::trunc);
    if (log_)
      log_ << autotuneCsvHeader() << '\n' << std::flush;
    else
      HORA_LOG(logger_, kWarning) << "autotune: cannot write HORA_AUTOTUNE_LOG file " << path
                                  << "; going on without it";
  }
  HORA_LOG(logger_, kInfo) << "autotune on for process set " << opts_.setName << ": "
                           << tunedList(opts_.tuner) << "; starting from "
                           << opts_.tuner.start.describe();
  if (opts_.telemetry) opts_.telemetry->autotuneProgress(false, 0, 0, 0, meter_.unit());
}

std::optional<TuningValues> AutotuneDriver::afterEmit(
    const std::vector<std::vector<Response>>& groups, Clock::time_point now) {
  const int64_t ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  StepMeter::Window w;
  for (const auto& g : groups)
    for (const auto& r : g) {
      if (r.kind == ResponseKind::kBarrier || r.kind == ResponseKind::kJoin ||
          r.kind == ResponseKind::kError)
        continue;
      if (meter_.observe(r.name, r.byteSize(), ns, &w)) window(w);
    }
  if (tuner_.current() == sent_) return std::nullopt;
  sent_ = tuner_.current();
  return sent_;
}

void AutotuneDriver::window(const StepMeter::Window& w) {
  if (w.workloadChanged) {
    HORA_LOG(logger_, kInfo) << "autotune (set " << opts_.setName << "): the workload changed ("
                             << w.tensors << " tensors, " << w.bytes
                             << " bytes per step); tuning again from " << tuner_.best().describe();
    tuner_.restart();
    return;
  }
  const Autotuner::Trial t = tuner_.report(w.cost);
  if (log_) log_ << autotuneCsvLine(t, meter_.unit()) << '\n' << std::flush;
  if (tuner_.settled() != wasSettled_) {
    wasSettled_ = tuner_.settled();
    if (wasSettled_)
      HORA_LOG(logger_, kInfo) << "autotune (set " << opts_.setName << "): settled after "
                               << tuner_.windows() << " windows on " << tuner_.best().describe()
                               << " (" << tuner_.bestCost() << " " << meter_.unit() << ")";
    else
      HORA_LOG(logger_, kInfo) << "autotune (set " << opts_.setName
                               << "): the step time drifted; tuning again from "
                               << tuner_.best().describe();
  }
  if (opts_.telemetry)
    opts_.telemetry->autotuneProgress(tuner_.settled(), tuner_.windows(), tuner_.searches(),
                                      tuner_.bestCost(), meter_.unit());
}

}  // namespace hora
