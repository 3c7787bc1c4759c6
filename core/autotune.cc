#include "core/autotune.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace hora {

std::vector<int64_t> tuneGrid(TuneDim d, int64_t start, int64_t shmSlotBytes) {
  std::vector<int64_t> g;
  switch (d) {
    case TuneDim::kFusionThreshold:
      for (int s = 16; s <= 28; ++s) g.push_back(int64_t{1} << s);  // 64 KiB .. 256 MiB
      break;
    case TuneDim::kCycleTime:
      g = {0, 250, 500, 1000, 2000, 4000, 8000, 16000, 32000};
      break;
    case TuneDim::kShmChunk:
      // The segments hold two slots of the configured chunk: only smaller
      // chunks fit (set HORA_SHM_CHUNK_BYTES higher to let it try larger).
      for (int s = 18; s <= 30 && (int64_t{1} << s) <= shmSlotBytes; ++s)
        g.push_back(int64_t{1} << s);
      if (start > shmSlotBytes) start = shmSlotBytes;
      break;
    case TuneDim::kShmMinBytes:
      g = {0, 4096, 65536, 1 << 20};
      break;
    case TuneDim::kGlooBcubeMax:
      g = {0, 64 << 10, 256 << 10, 1 << 20, 4 << 20};
      break;
  }
  g.push_back(start);
  std::sort(g.begin(), g.end());
  g.erase(std::unique(g.begin(), g.end()), g.end());
  return g;
}

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t m = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + m, v.end());
  const double hi = v[m];
  if (v.size() % 2) return hi;
  return (hi + *std::max_element(v.begin(), v.begin() + m)) / 2;
}

}  // namespace

Autotuner::Autotuner(AutotuneOptions options)
    : opts_(std::move(options)), rng_(opts_.seed), current_(opts_.start), best_(opts_.start) {
  for (int i = 0; i < kTuneDims; ++i) {
    const TuneDim d = TuneDim(i);
    grid_[i] = tuneGrid(d, opts_.start.get(d), opts_.shmSlotBytes);
    if (d == TuneDim::kShmChunk && best_.shmChunkBytes > opts_.shmSlotBytes)
      best_.shmChunkBytes = current_.shmChunkBytes = opts_.shmSlotBytes;
  }
  for (TuneDim d : opts_.order) {
    const int i = static_cast<int>(d);
    if (opts_.tune[i] && grid_[i].size() > 1) order_.push_back(d);
  }
  beginSearch();
}

double Autotuner::bestCost() const {
  // The last few only: a machine whose load changes makes older windows
  // of the incumbent wrong for comparing the candidates measured now.
  const size_t k = std::min<size_t>(incumbentCosts_.size(), kIncumbentSamples);
  return median(std::vector<double>(incumbentCosts_.end() - static_cast<std::ptrdiff_t>(k),
                                    incumbentCosts_.end()));
}

int Autotuner::index(TuneDim d, int64_t v) const {
  const auto& g = grid_[static_cast<int>(d)];
  return static_cast<int>(std::lower_bound(g.begin(), g.end(), v) - g.begin());
}

void Autotuner::addIncumbentSample(double cost) {
  incumbentAt_ = searchWindows_;
  incumbentCosts_.push_back(cost);
  if (incumbentCosts_.size() > 9) incumbentCosts_.erase(incumbentCosts_.begin());
}

void Autotuner::beginSearch() {
  ++searches_;
  searchWindows_ = 0;
  warmupLeft_ = opts_.warmupWindows;
  incumbentCosts_.clear();
  recent_.clear();
  pass_ = 0;
  passMoved_ = false;
  rescanned_ = false;
  dimPos_ = 0;
  current_ = best_;
  if (order_.empty()) return settle();
  phase_ = warmupLeft_ > 0 ? Phase::kWarmup : Phase::kIncumbent;
}

void Autotuner::restart() {
  searchFromDrift_ = false;
  driftHold_ = 0;
  beginSearch();
}

void Autotuner::beginDim() {
  queue_.clear();
  tried_.clear();
  refineStep_ = 0;
  if (dimPos_ >= order_.size()) return;
  const TuneDim d = order_[dimPos_];
  const int n = static_cast<int>(grid_[static_cast<int>(d)].size());
  const int i = index(d, best_.get(d));
  if (pass_ > 0) {
    refineStep_ = 1;  // later passes: the neighbours only
    return;
  }
  // A coarse scan: every stride-th point from the incumbent both ways, and
  // the ends when the scan stops short of them.
  const int stride = std::max(1, (n - 1 + 3) / 4);
  std::vector<int> scan;
  for (int j = i - stride; j >= 0; j -= stride) scan.push_back(j);
  for (int j = i + stride; j < n; j += stride) scan.push_back(j);
  auto near = [&](int e) {
    int dist = std::abs(e - i);
    for (int j : scan) dist = std::min(dist, std::abs(e - j));
    return dist * 2 <= stride;
  };
  if (!near(0)) scan.push_back(0);
  if (!near(n - 1)) scan.push_back(n - 1);
  // The order does not change the result, only when each point is tried:
  // shuffled, so that a job with a periodic disturbance does not always
  // hit the same candidates.
  for (size_t k = scan.size(); k > 1; --k) std::swap(scan[k - 1], scan[rng_() % k]);
  queue_.assign(scan.begin(), scan.end());
  refineStep_ = stride / 2;
}

void Autotuner::settle() {
  if (searchFromDrift_)
    driftHold_ = std::min(kMaxDriftHold, std::max(2 * driftHold_, opts_.driftWindows));
  searchFromDrift_ = false;
  phase_ = Phase::kWatch;
  current_ = best_;
  recent_.clear();
  watchWindows_ = 0;
  heldWindows_ = 0;
}

int Autotuner::bestIndex() const {
  const TuneDim d = order_[dimPos_];
  int b = index(d, best_.get(d));
  double cost = bestCost() * (1 - opts_.margin);
  for (const auto& kv : tried_)
    if (kv.second < cost) {
      b = kv.first;
      cost = kv.second;
    }
  return b;
}

void Autotuner::next() {
  if (searchWindows_ >= opts_.maxTuningWindows) return settle();
  while (true) {
    while (dimPos_ < order_.size()) {
      const TuneDim d = order_[dimPos_];
      const auto& g = grid_[static_cast<int>(d)];
      const int n = static_cast<int>(g.size());
      const int i = index(d, best_.get(d));
      if (!queue_.empty()) {
        const int j = queue_.front();
        queue_.pop_front();
        if (j == i || tried_.count(j)) continue;
        current_ = best_;
        current_.set(d, g[j]);
        phase_ = Phase::kProbe;
        return;
      }
      if (refineStep_ > 0) {
        const int b = bestIndex();
        for (int j : {b - refineStep_, b + refineStep_})
          if (j >= 0 && j < n) queue_.push_back(j);
        refineStep_ /= 2;
        continue;
      }
      const int b = bestIndex();
      ++dimPos_;
      if (b != i) {
        const double cost = tried_[b];
        best_.set(d, g[b]);
        incumbentCosts_.assign(1, cost);
        passMoved_ = true;
        // One more window of the new incumbent before the next dimension.
        beginDim();
        current_ = best_;
        phase_ = Phase::kRemeasure;
        remeasureAccepted_ = true;
        return;
      }
      beginDim();
      if (dimPos_ < order_.size() && searchWindows_ - incumbentAt_ > kIncumbentStaleWindows) {
        // The incumbent was last measured long ago: measure it again before
        // the next dimension's candidates are compared with it.
        current_ = best_;
        phase_ = Phase::kRemeasure;
        remeasureAccepted_ = false;
        return;
      }
    }
    ++pass_;
    if (!passMoved_ || pass_ >= opts_.maxPasses) return settle();
    passMoved_ = false;
    dimPos_ = 0;
    beginDim();
  }
}

Autotuner::Trial Autotuner::report(double cost) {
  ++windows_;
  Trial t;
  t.window = windows_;
  t.search = searches_;
  t.values = current_;
  t.cost = cost;
  const double inc = bestCost();
  const bool outlier =
      !(cost > 0) || !std::isfinite(cost) || (inc > 0 && cost > opts_.outlierRatio * inc);
  switch (phase_) {
    case Phase::kWarmup:
      t.event = Event::kWarmup;
      if (--warmupLeft_ <= 0) phase_ = Phase::kIncumbent;
      return t;
    case Phase::kIncumbent:
      ++searchWindows_;
      if (!(cost > 0) || !std::isfinite(cost)) {
        t.event = Event::kOutlier;
        return t;
      }
      t.event = Event::kIncumbent;
      addIncumbentSample(cost);
      pass_ = 0;
      dimPos_ = 0;
      beginDim();
      next();
      return t;
    case Phase::kRemeasure:
      ++searchWindows_;
      // The first window of newly accepted values, or the incumbent again.
      t.event = outlier              ? Event::kOutlier
                : remeasureAccepted_ ? Event::kAccepted
                                     : Event::kIncumbent;
      if (!outlier && !remeasureAccepted_ && !rescanned_ && cost > inc * (1 + kLoadShift)) {
        // The incumbent costs clearly more than when the candidates so far
        // were compared with it: the load changed under the scan. Those
        // comparisons were unfair to the candidates: scan this pass's
        // dimensions again against what the incumbent costs now (once per
        // search, so noise cannot keep it scanning).
        rescanned_ = true;
        incumbentCosts_.assign(1, cost);
        incumbentAt_ = searchWindows_;
        dimPos_ = 0;
        beginDim();
      } else if (!outlier) {
        addIncumbentSample(cost);
      }
      next();
      return t;
    case Phase::kProbe: {
      ++searchWindows_;
      const TuneDim d = order_[dimPos_];
      // An outlier counts against the candidate: either the setting is that
      // bad, or the job paused; not taking it is right in both cases.
      tried_[index(d, current_.get(d))] = std::isfinite(cost) && cost > 0 ? cost : 1e300;
      t.event = Event::kCandidate;
      current_ = best_;
      next();
      if (phase_ == Phase::kWatch) t.event = Event::kSettled;
      return t;
    }
    case Phase::kWatch:
      t.event = outlier ? Event::kOutlier : Event::kWatch;
      // The first windows after settling sharpen the settled cost; later
      // ones are compared with it (outliers too: the median of several
      // ignores one pause, not a lasting change).
      if (watchWindows_ < opts_.driftWindows) {
        if (!outlier) {
          ++watchWindows_;
          addIncumbentSample(cost);
        }
        return t;
      }
      if (heldWindows_ < driftHold_) {
        ++heldWindows_;
        return t;
      }
      if (!(cost > 0) || !std::isfinite(cost)) return t;
      recent_.push_back(cost);
      if (recent_.size() > static_cast<size_t>(opts_.driftWindows)) recent_.erase(recent_.begin());
      if (recent_.size() == static_cast<size_t>(opts_.driftWindows)) {
        const double m = median(recent_);
        if (m > inc * opts_.driftRatio || m * opts_.driftRatio < inc) {
          searchFromDrift_ = true;
          beginSearch();
          // The drift itself is the warm-up: measure the incumbent at once.
          phase_ = Phase::kIncumbent;
        }
      }
      return t;
  }
  return t;
}

const char* autotuneEventName(Autotuner::Event e) {
  switch (e) {
    case Autotuner::Event::kWarmup:
      return "warmup";
    case Autotuner::Event::kIncumbent:
      return "incumbent";
    case Autotuner::Event::kCandidate:
      return "candidate";
    case Autotuner::Event::kAccepted:
      return "accepted";
    case Autotuner::Event::kSettled:
      return "settled";
    case Autotuner::Event::kWatch:
      return "watch";
    case Autotuner::Event::kOutlier:
      return "outlier";
  }
  return "?";
}

std::string autotuneCsvHeader() {
  std::string h = "window,search,event";
  for (int i = 0; i < kTuneDims; ++i) h += std::string(",") + tuneDimColumn(TuneDim(i));
  return h + ",cost,unit";
}

std::string autotuneCsvLine(const Autotuner::Trial& t, const std::string& unit) {
  std::string l =
      std::to_string(t.window) + "," + std::to_string(t.search) + "," + autotuneEventName(t.event);
  for (int i = 0; i < kTuneDims; ++i) l += "," + std::to_string(t.values.get(TuneDim(i)));
  char cost[32];
  std::snprintf(cost, sizeof cost, "%.6g", t.cost);
  return l + "," + cost + "," + unit;
}

void StepMeter::reset() {
  seen_.clear();
  anchor_.clear();
  fallback_ = false;
  windowStartNs_ = -1;
  windowBytes_ = 0;
  windowTensors_ = 0;
  windowSteps_ = 0;
  sinceAnchor_ = 0;
  lastTensors_ = 0;
  lastBytes_ = -1;
}

bool StepMeter::close(int64_t nowNs, Window* out) {
  Window w;
  w.seconds = static_cast<double>(nowNs - windowStartNs_) / 1e9;
  w.steps = !fallback_;
  const int64_t steps = std::max<int64_t>(windowSteps_, 1);
  w.stepCount = fallback_ ? 0 : steps;
  w.bytes = fallback_ ? windowBytes_ : windowBytes_ / steps;
  w.tensors = fallback_ ? windowTensors_
                        : static_cast<size_t>((windowTensors_ + static_cast<size_t>(steps) / 2) /
                                              static_cast<size_t>(steps));
  w.cost = fallback_ ? w.seconds * 1e9 / static_cast<double>(std::max<int64_t>(windowBytes_, 1))
                     : w.seconds / static_cast<double>(steps);
  if (!fallback_ && lastBytes_ >= 0) {
    const auto differs = [](double a, double b) { return std::fabs(a - b) > 0.05 * b; };
    w.workloadChanged =
        differs(static_cast<double>(w.tensors), static_cast<double>(lastTensors_)) ||
        differs(static_cast<double>(w.bytes), static_cast<double>(lastBytes_));
  }
  lastTensors_ = w.tensors;
  lastBytes_ = w.bytes;
  *out = w;
  return true;
}

bool StepMeter::observe(const std::string& name, int64_t bytes, int64_t nowNs, Window* out) {
  if (fallback_) {
    windowBytes_ += bytes;
    if (++windowTensors_ < opts_.fallbackTensors) return false;
    close(nowNs, out);
    windowStartNs_ = nowNs;
    windowBytes_ = 0;
    windowTensors_ = 0;
    return true;
  }
  if (anchor_.empty()) {
    // Learning the step: the first name that comes back starts one.
    if (seen_.count(name)) {
      anchor_ = name;
      seen_.clear();
      windowStartNs_ = nowNs;
      windowBytes_ = bytes;
      windowTensors_ = 1;
      windowSteps_ = 0;
      sinceAnchor_ = 1;
      return false;
    }
    seen_.emplace(name, 0);
    if (seen_.size() > opts_.maxStepTensors) {
      seen_.clear();
      fallback_ = true;
      windowStartNs_ = nowNs;
      windowBytes_ = 0;
      windowTensors_ = 0;
    }
    return false;
  }
  if (name == anchor_) {
    ++windowSteps_;
    sinceAnchor_ = 1;
    if (nowNs - windowStartNs_ < opts_.minWindowNs) {  // a short step: the window goes on
      windowBytes_ += bytes;
      ++windowTensors_;
      return false;
    }
    close(nowNs, out);
    windowStartNs_ = nowNs;
    windowBytes_ = bytes;
    windowTensors_ = 1;
    windowSteps_ = 0;
    return true;
  }
  windowBytes_ += bytes;
  ++windowTensors_;
  ++sinceAnchor_;
  if (lastBytes_ >= 0 && sinceAnchor_ > 4 * lastTensors_ + 1000) {
    // The anchor stopped coming: a different workload. Learn it again.
    Window w;
    w.workloadChanged = true;
    reset();
    *out = w;
    return true;
  }
  return false;
}

}  // namespace hora
