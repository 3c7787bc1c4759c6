// Autotune: hora's online tuner of the performance settings (core/tuning.h)
// and the meter that turns the coordinator's stream of responses into the
// cost it minimizes. Pure logic: no threads, no clock, no I/O; set rank 0's
// control thread drives both (controllers/autotune_driver.h) and every rank
// applies what the tuner picks at the same point of the response stream.
//
// What is measured (StepMeter). hora does not see the training loop, but a
// training loop submits the same tensor names every step. The meter learns
// the step from the names: the first name that comes back marks the start of
// a step (the anchor), and one evaluation window is the time from one
// emission of the anchor to the next, i.e. one training step as the slowest
// rank paces it, whatever the fusion made of it. The cost is seconds per
// step: lower is better, and it includes everything a setting changes
// (latency, fusion, copies), which bytes per second over a fixed number of
// responses (Horovod's score) cannot: a setting that fuses more emits fewer,
// larger responses and changes what "a window of responses" means. New
// values take effect right after the anchor's emission, so a window measures
// one setting only and needs no warm-up. Steps shorter than 10 ms are
// grouped: a window then spans whole steps until it lasted that long, and
// its cost is its mean step time (single microbenchmark steps are noise).
// When names never come back
// (auto-named tensors), windows fall back to a fixed number of tensors and
// the cost is seconds per GB moved. A step whose tensor count or bytes differ
// from the previous one marks a workload change.
//
// How it searches (Autotuner). Each tuned dimension has a grid of values
// (powers of two, plus the starting value). The tuner searches one dimension
// at a time, the cycle time first (it scales the cost of every response, so
// the best fusion depends on it, not the other way round), then the fusion
// threshold, the shm chunk and the cut-overs: a coarse scan of the grid (about
// four points spread over it, in an order the seed shuffles), then a
// refinement around the best point with halving steps. The best point
// replaces the incumbent only if it is cheaper by more than `margin`; then
// one window re-measures it, and the incumbent's cost is the median of its
// windows, so one lucky window cannot make a bad setting stick; before a
// dimension whose predecessor took several windows, the incumbent is
// measured again, and only its last three windows count; when it then costs
// more than 10% above what the scans compared with, the load changed under
// them and the pass starts over from that cost (once per search). Coarse scans
// cross plateaus (fusion changes nothing until the threshold passes the
// typical tensor) that a step-by-step search takes for an optimum. A window
// more than `outlierRatio` times the incumbent's cost (a pause for
// evaluation or a checkpoint) never counts for a candidate. A second pass
// refines every dimension by one grid step if the first pass moved any. Then
// (or after `maxTuningWindows`) it settles on the best values and only
// watches: when the median of the last `driftWindows` windows moves more
// than `driftRatio` away from the settled cost, or the meter reports a new
// workload, it searches again from the settled values. Drift is also what
// noise looks like (a microbenchmark's windows of one allreduce each vary
// 2-4x here, and searches under such noise rarely end on the same values),
// so each drift-started search doubles the windows watched before the next
// drift check, up to 512; a new workload resets that. The same seed and the
// same costs give the same sequence of values.
//
// Why not Horovod's Bayesian optimisation: its Gaussian process needs many
// samples (warm-up, 20+ after it) to model five dimensions under ±20-30%
// noise, while the costs here are close to separable and unimodal in each
// dimension on a log scale (more fusion helps until the buffer stops fitting
// the pipeline; a shorter cycle helps until fusion suffers), which a line
// search exploits in ~15-25 windows.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tuning.h"

namespace hora {

struct AutotuneOptions {
  TuningValues start;  // the configured values (the first incumbent)
  bool tune[kTuneDims] = {true, true, true, true, true};  // false: pinned at start
  // Search order (TuneDim values); the cycle time first, see above.
  TuneDim order[kTuneDims] = {TuneDim::kCycleTime, TuneDim::kFusionThreshold, TuneDim::kShmChunk,
                              TuneDim::kShmMinBytes, TuneDim::kGlooBcubeMax};
  int64_t shmSlotBytes = int64_t{4} << 20;  // the largest shm chunk the segments hold
  uint64_t seed = 0;
  int warmupWindows = 1;      // discarded at the start of every search
  int maxTuningWindows = 40;  // per search; then it settles on the best
  int maxPasses = 2;          // passes over the dimensions per search
  double margin = 0.01;       // a candidate must be this much cheaper
  double outlierRatio = 4.0;
  int driftWindows = 8;
  double driftRatio = 1.5;
};

// The grid of dimension `d` (sorted, distinct, holding `start`).
std::vector<int64_t> tuneGrid(TuneDim d, int64_t start, int64_t shmSlotBytes);

class Autotuner {
 public:
  enum class Event { kWarmup, kIncumbent, kCandidate, kAccepted, kSettled, kWatch, kOutlier };
  struct Trial {
    int window = 0;  // windows reported so far, this one included
    int search = 0;  // searches begun so far (1 for the first)
    TuningValues values;
    double cost = 0;
    Event event = Event::kWarmup;
  };

  explicit Autotuner(AutotuneOptions options);

  // Values to run the next window with.
  const TuningValues& current() const { return current_; }
  // The incumbent (while searching) or the settled values.
  const TuningValues& best() const { return best_; }
  double bestCost() const;  // median of the incumbent's windows; 0 before any
  bool settled() const { return phase_ == Phase::kWatch; }
  int windows() const { return windows_; }
  int searches() const { return searches_; }
  // Whether any dimension is tuned at all.
  bool active() const { return !order_.empty(); }

  // The cost of the window just run with current(). Returns what became of
  // it; current() may have changed.
  Trial report(double cost);
  // The workload changed: search again from best().
  void restart();

 private:
  enum class Phase { kWarmup, kIncumbent, kProbe, kRemeasure, kWatch };
  void beginSearch();
  void beginDim();
  // Picks the next candidate of the current dimension, or moves on; sets current_.
  void next();
  // The best index of the current dimension so far (the incumbent's cost
  // handicapped by the margin).
  int bestIndex() const;
  void settle();
  int index(TuneDim d, int64_t v) const;
  void addIncumbentSample(double cost);

  const AutotuneOptions opts_;
  std::mt19937_64 rng_;
  std::vector<int64_t> grid_[kTuneDims];
  std::vector<TuneDim> order_;  // tuned dimensions with more than one value
  TuningValues current_, best_;
  std::vector<double> incumbentCosts_;
  std::vector<double> recent_;  // watch phase
  Phase phase_ = Phase::kWarmup;
  int windows_ = 0, searches_ = 0, searchWindows_ = 0, warmupLeft_ = 0;
  int pass_ = 0;
  int watchWindows_ = 0;
  // Each search that drift started makes the next drift check wait twice
  // as long (driftHold_ more windows, up to kMaxDriftHold); a new workload
  // (restart) resets the wait.
  static constexpr int kMaxDriftHold = 512;
  int driftHold_ = 0, heldWindows_ = 0;
  bool searchFromDrift_ = false;
  bool passMoved_ = false;
  // The incumbent's cost is the median of its last kIncumbentSamples
  // windows, and it is measured again before a dimension's scan when its
  // last window is more than kIncumbentStaleWindows old: candidates are
  // compared with what the incumbent costs now (a load that changed during
  // a scan made a lucky first window of a bad start look unbeatable).
  static constexpr size_t kIncumbentSamples = 3;
  static constexpr int kIncumbentStaleWindows = 8;
  // A stale incumbent found this much dearer than it was: the load changed,
  // and the pass's dimensions are scanned again (once per search).
  static constexpr double kLoadShift = 0.10;
  int incumbentAt_ = 0;  // searchWindows_ at its last sample
  bool remeasureAccepted_ = false;
  bool rescanned_ = false;
  // The current dimension's line search.
  size_t dimPos_ = 0;
  std::deque<int> queue_;        // grid indices still to try
  int refineStep_ = 0;           // next refinement around the best so far (0: none)
  std::map<int, double> tried_;  // grid index -> cost, this dimension
};

const char* autotuneEventName(Autotuner::Event e);
// The CSV header and one line per trial (HORA_AUTOTUNE_LOG).
std::string autotuneCsvHeader();
std::string autotuneCsvLine(const Autotuner::Trial& t, const std::string& unit);

class StepMeter {
 public:
  struct Options {
    size_t maxStepTensors = 20000;  // no name back after this many: fallback windows
    size_t fallbackTensors = 256;   // tensors per fallback window
    // A step window spans whole steps and lasts at least this long: a
    // microbenchmark's "step" (one small allreduce, tens of microseconds)
    // varies 2-4x from one to the next, and searching on single ones was
    // searching noise (measured: up to 2x slower sweeps, a cut-over tuned to
    // 1 MiB). Training steps (tens of milliseconds and up) stay one each.
    int64_t minWindowNs = 10'000'000;
  };
  struct Window {
    double cost = 0;  // seconds per step, or (fallback) seconds per GB
    double seconds = 0;
    int64_t bytes = 0;             // step windows: per step (the window's mean)
    size_t tensors = 0;            // step windows: per step (the window's mean)
    int64_t stepCount = 0;         // step windows: the steps it spans
    bool steps = true;             // false: fallback windows
    bool workloadChanged = false;  // differs from the previous window's step
  };

  StepMeter() : StepMeter(Options{}) {}
  explicit StepMeter(Options options) : opts_(options) {}

  // One response emitted at `nowNs` (nanoseconds of any monotonic clock).
  // True when it closed a window (then *out holds it).
  bool observe(const std::string& name, int64_t bytes, int64_t nowNs, Window* out);
  // Forget the step; learn it again from the next responses.
  void reset();
  const char* unit() const { return fallback_ ? "s/GB" : "s/step"; }

 private:
  bool close(int64_t nowNs, Window* out);

  const Options opts_;
  std::unordered_map<std::string, int> seen_;  // learning: names of the step so far
  std::string anchor_;
  bool fallback_ = false;
  int64_t windowStartNs_ = -1, windowBytes_ = 0;
  size_t windowTensors_ = 0;
  int64_t windowSteps_ = 0;
  size_t sinceAnchor_ = 0;  // tensors since the anchor last came back
  size_t lastTensors_ = 0;
  int64_t lastBytes_ = -1;
};

}  // namespace hora
