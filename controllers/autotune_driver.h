// AutotuneDriver: runs hora's online autotune (core/autotune.h) on set rank
// 0's control thread, inside the CoordinatorService. After each emit it
// feeds the emitted responses to the StepMeter; each window the meter closes
// goes to the Autotuner, each trial to the CSV log (HORA_AUTOTUNE_LOG), and
// when the tuner's values change it returns them: the service applies the
// coordinator's part (fusion threshold, cycle time) to its next emit and
// sends all of them with its next response list, so that every rank applies
// the data-plane part at the same point (core/tuning.h).
//
// Control thread only. The CSV file is written line by line (one line per
// window, a few per second at most).
#pragma once

#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "core/autotune.h"
#include "core/clock.h"
#include "core/logging.h"
#include "core/message.h"
#include "core/telemetry.h"

namespace hora {

struct AutotuneDriverOptions {
  AutotuneOptions tuner;
  StepMeter::Options meter;
  std::string setName = "global";
  // CSV of every window (Horovod's HOROVOD_AUTOTUNE_LOG); "" = none. Sets
  // other than the global one write <path>.<set name>.
  std::string logPath;
  Telemetry* telemetry = nullptr;  // progress for the metrics; may be null
};

class AutotuneDriver {
 public:
  AutotuneDriver(AutotuneDriverOptions options, Logger logger);

  // The groups one emit produced (full responses) and when. Returns the new
  // values when the tuner changed them.
  std::optional<TuningValues> afterEmit(const std::vector<std::vector<Response>>& groups,
                                        Clock::time_point now);
  const Autotuner& tuner() const { return tuner_; }

 private:
  void window(const StepMeter::Window& w);

  const AutotuneDriverOptions opts_;
  Logger logger_;
  Autotuner tuner_;
  StepMeter meter_;
  std::ofstream log_;
  TuningValues sent_;
  bool wasSettled_ = false;
};

}  // namespace hora
