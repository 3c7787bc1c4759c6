// Unit tests for core/autotune.h: the tuner against fake cost functions (a
// bad start converges within 5% of the best grid point in 30 windows, with
// noise; a changed cost function is tuned again; the same seed gives the same
// trials) and the step meter (steps learned from recurring names, workload
// changes, the fallback for names that never recur). Pure logic, no clock.
#include "core/autotune.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

namespace hora {
namespace {

// A step of a data-parallel job: compute, then the gradients' allreduces.
// Many small groups pay latency, a long cycle adds waiting per group, too
// little cycle fuses less, the shm chunk has a sweet spot, and a huge fusion
// buffer delays the first allreduce (a pipeline bubble).
struct FakeJob {
  double computeS = 0.040;
  double bytes = 100e6;
  int tensors = 160;
  double latencyS = 60e-6;
  double bandwidth = 5e9;
  double bestChunk = 1 << 20;
  double bubbleShare = 0.5;

  double cost(const TuningValues& v) const {
    const double fusion = std::max<double>(1, v.fusionThresholdBytes);
    const double groups = std::min<double>(tensors, std::ceil(bytes / fusion));
    double perGroup = latencyS + 0.25 * v.cycleTimeUs * 1e-6;
    if (v.cycleTimeUs < 500) perGroup += 20e-6;
    const double chunkOff = std::fabs(std::log2(v.shmChunkBytes / bestChunk));
    const double bw = bandwidth * (1 - 0.04 * chunkOff);
    double c = computeS + groups * perGroup + bytes / bw +
               bubbleShare * std::min<double>(fusion, bytes) / bandwidth;
    if (v.shmMinBytes == 4096) c -= 0.0002;
    if (v.shmMinBytes >= (1 << 20)) c += 0.001;
    return c;
  }
};

// The best noise-free cost over every combination of the grids.
double bestCost(const FakeJob& job, const AutotuneOptions& o) {
  std::vector<int64_t> g[kTuneDims];
  for (int i = 0; i < kTuneDims; ++i) {
    g[i] = o.tune[i] ? tuneGrid(TuneDim(i), o.start.get(TuneDim(i)), o.shmSlotBytes)
                     : std::vector<int64_t>{o.start.get(TuneDim(i))};
  }
  double best = 1e9;
  TuningValues v;
  std::function<void(int)> walk = [&](int d) {
    if (d == kTuneDims) {
      best = std::min(best, job.cost(v));
      return;
    }
    for (int64_t x : g[d]) {
      v.set(TuneDim(d), x);
      walk(d + 1);
    }
  };
  walk(0);
  return best;
}

AutotuneOptions badStart() {
  AutotuneOptions o;
  o.start.fusionThresholdBytes = 64 << 10;  // tiny
  o.start.cycleTimeUs = 32000;              // long
  o.start.shmChunkBytes = 4 << 20;
  o.shmSlotBytes = 4 << 20;
  // On one host the data plane is shared memory: the Gloo cut-over is not
  // tuned there (controllers/autotune_driver.cc).
  o.tune[static_cast<int>(TuneDim::kGlooBcubeMax)] = false;
  return o;
}

// Runs `windows` windows with lognormal noise of `sigma`; returns the trials.
std::vector<Autotuner::Trial> run(Autotuner& t, const FakeJob& job, int windows, double sigma,
                                  uint64_t noiseSeed) {
  std::mt19937_64 rng(noiseSeed);
  std::normal_distribution<double> noise(0, sigma);
  std::vector<Autotuner::Trial> trials;
  for (int w = 0; w < windows; ++w)
    trials.push_back(t.report(job.cost(t.current()) * std::exp(noise(rng))));
  return trials;
}

TEST(Autotune, GridsHoldTheStartAndRespectTheShmSlot) {
  auto g = tuneGrid(TuneDim::kFusionThreshold, 3000000, 4 << 20);
  EXPECT_TRUE(std::is_sorted(g.begin(), g.end()));
  EXPECT_NE(std::find(g.begin(), g.end(), 3000000), g.end());
  auto c = tuneGrid(TuneDim::kShmChunk, 1 << 20, 1 << 20);
  EXPECT_EQ(c.back(), 1 << 20);  // nothing larger than the slot
  EXPECT_EQ(c.front(), 256 << 10);
}

TEST(Autotune, BadStartConvergesWithin5PercentIn30WindowsNoiseFree) {
  FakeJob job;
  Autotuner t(badStart());
  const double start = job.cost(t.current());
  run(t, job, 30, 0, 1);
  const double best = bestCost(job, badStart());
  EXPECT_GT(start, 1.5 * best) << "the start must be bad for the test to mean anything";
  EXPECT_LE(job.cost(t.best()), 1.05 * best) << t.best().describe();
}

TEST(Autotune, BadStartConvergesWithin5PercentIn30WindowsUnderNoise) {
  // 3% lognormal noise per window, 200 seeds (tuner and noise): at least 90%
  // of the runs end within 5% of the best, none beyond 10%. (Measured: 186
  // within 5%, worst 6.8%; with 10% noise 124 and 37%: noise that large
  // needs longer windows, docs/performance.md. With the incumbent measured
  // again before stale dimensions: 187, worst 6.8%.)
  FakeJob job;
  const double best = bestCost(job, badStart());
  int within = 0;
  double worst = 0;
  for (uint64_t s = 0; s < 200; ++s) {
    AutotuneOptions o = badStart();
    o.seed = s;
    Autotuner t(o);
    run(t, job, 30, 0.03, 100 + s);
    const double ratio = job.cost(t.best()) / best;
    within += ratio <= 1.05;
    worst = std::max(worst, ratio);
  }
  EXPECT_GE(within, 180);
  EXPECT_LE(worst, 1.10);
}

TEST(Autotune, ALoadThatChangesDuringTheScanDoesNotKeepABadStart) {
  // The machine gets slower by a third right after the incumbent's first
  // window (another job starts): every candidate then looks worse than that
  // one lucky window of the bad start. The incumbent is measured again
  // before each dimension, so the scans compare like with like. 200 seeds,
  // 2% noise; the bad start costs 1.21x the best here (a realistic one,
  // bench/results/2026-11-24-autotune.md). Measured: 196 of 200 within 5%;
  // without the re-measure, 0.
  FakeJob job;
  job.computeS = 0.100;
  AutotuneOptions start = badStart();
  start.start.fusionThresholdBytes = 8 << 20;
  start.start.cycleTimeUs = 8000;
  const double best = bestCost(job, start);
  int within = 0;
  for (uint64_t s = 0; s < 200; ++s) {
    AutotuneOptions o = start;
    o.seed = s;
    Autotuner t(o);
    std::mt19937_64 rng(300 + s);
    std::normal_distribution<double> noise(0, 0.02);
    for (int w = 0; w < 40; ++w) {
      const double load = t.windows() < 2 ? 1.0 : 1.33;
      t.report(job.cost(t.current()) * load * std::exp(noise(rng)));
    }
    within += job.cost(t.best()) <= 1.05 * best;
  }
  EXPECT_GT(job.cost(start.start), 1.15 * best)
      << "the start must be bad for the test to mean anything";
  EXPECT_GE(within, 180) << "of 200 runs within 5% of the best after 40 windows";
}

TEST(Autotune, SettlesAndWatchesWithoutMoving) {
  FakeJob job;
  Autotuner t(badStart());
  run(t, job, 60, 0.02, 7);
  ASSERT_TRUE(t.settled());
  const TuningValues settled = t.current();
  auto trials = run(t, job, 40, 0.02, 8);
  for (const auto& tr : trials) {
    EXPECT_EQ(tr.event, Autotuner::Event::kWatch);
    EXPECT_EQ(tr.values, settled);
  }
  EXPECT_EQ(t.searches(), 1);
}

TEST(Autotune, RetunesWhenTheCostFunctionChanges) {
  FakeJob a;
  Autotuner t(badStart());
  run(t, a, 60, 0.02, 3);
  ASSERT_TRUE(t.settled());
  // The job moved to a slower data plane whose best chunk is smaller and
  // whose first allreduce waits longer for a big fusion buffer: the step
  // takes longer (the drift is seen) and the best settings moved.
  FakeJob b = a;
  b.bandwidth = 1.5e9;
  b.bestChunk = 256 << 10;
  b.bubbleShare = 2.0;
  const double bestB = bestCost(b, badStart());
  ASSERT_GT(b.cost(t.best()), 1.05 * bestB) << "the old best must be wrong for the new job";
  run(t, b, 60, 0.02, 4);  // the drift is seen within ~12, the search takes ~30
  EXPECT_GE(t.searches(), 2);
  EXPECT_LE(b.cost(t.best()), 1.05 * bestB) << t.best().describe();
}

TEST(Autotune, ANoisyJobDoesNotSpendItsTimeSearching) {
  // A microbenchmark's windows are one allreduce each, and on this machine
  // they come in two modes 3-4x apart: the median of a few windows flips
  // between them, which looks like drift. Searches that end on the same
  // values back the drift check off, so over a long run the tuner mostly
  // watches. (Without the back-off: a search every ~30 windows.)
  FakeJob job;
  AutotuneOptions o = badStart();
  Autotuner t(o);
  std::mt19937_64 rng(7);
  std::bernoulli_distribution slow(0.45);
  int searching = 0;
  for (int w = 0; w < 4000; ++w) {
    if (!t.settled()) ++searching;
    t.report(job.cost(t.current()) * (slow(rng) ? 3.5 : 1.0));
  }
  EXPECT_LE(t.searches(), 16);  // 80 without the back-off
  EXPECT_LE(searching, 4000 / 4) << "searched in " << searching << " of 4000 windows";
}

TEST(Autotune, RestartSearchesAgainFromTheSettledValues) {
  FakeJob job;
  Autotuner t(badStart());
  run(t, job, 60, 0, 1);
  ASSERT_TRUE(t.settled());
  const TuningValues settled = t.best();
  t.restart();
  EXPECT_FALSE(t.settled());
  EXPECT_EQ(t.current(), settled);
  run(t, job, 30, 0, 1);
  EXPECT_LE(job.cost(t.best()), job.cost(settled) * 1.0001);
}

TEST(Autotune, SameSeedSameTrials) {
  FakeJob job;
  AutotuneOptions o;  // the defaults: the seed picks first directions
  o.seed = 42;
  Autotuner a(o), b(o);
  auto ta = run(a, job, 50, 0.05, 9);
  auto tb = run(b, job, 50, 0.05, 9);
  ASSERT_EQ(ta.size(), tb.size());
  for (size_t i = 0; i < ta.size(); ++i) {
    EXPECT_EQ(ta[i].values, tb[i].values) << i;
    EXPECT_EQ(ta[i].event, tb[i].event) << i;
  }
}

TEST(Autotune, PinnedDimensionsNeverMove) {
  FakeJob job;
  AutotuneOptions o = badStart();
  o.tune[static_cast<int>(TuneDim::kFusionThreshold)] = false;
  Autotuner t(o);
  for (const auto& tr : run(t, job, 60, 0.02, 5))
    EXPECT_EQ(tr.values.fusionThresholdBytes, 64 << 10);
  AutotuneOptions none;
  for (bool& b : none.tune) b = false;
  Autotuner off(none);
  EXPECT_FALSE(off.active());
  for (const auto& tr : run(off, job, 5, 0, 1)) EXPECT_EQ(tr.values, none.start);
}

TEST(Autotune, OutlierWindowDoesNotMakeABadCandidateStick) {
  // A pause in the incumbent's first window would make every candidate look
  // good; the outlier ratio and the re-measure keep the search sane.
  FakeJob job;
  Autotuner t(badStart());
  t.report(1.0);                    // warm-up
  t.report(job.cost(t.current()));  // incumbent
  for (int w = 0; w < 40; ++w) {
    const double c = job.cost(t.current()) * (w == 3 ? 10 : 1);  // one pause
    t.report(c);
  }
  EXPECT_LE(job.cost(t.best()), 1.05 * bestCost(job, badStart()));
}

TEST(Autotune, CsvLines) {
  Autotuner::Trial tr;
  tr.window = 3;
  tr.search = 1;
  tr.cost = 0.125;
  tr.event = Autotuner::Event::kAccepted;
  EXPECT_EQ(autotuneCsvHeader(),
            "window,search,event,fusion_threshold_bytes,cycle_time_us,shm_chunk_bytes,"
            "shm_min_bytes,gloo_bcube_max_bytes,cost,unit");
  EXPECT_EQ(autotuneCsvLine(tr, "s/step"),
            "3,1,accepted,134217728,1000,1048576,0,1048576,0.125,s/step");
}

// ---- StepMeter ----

TEST(StepMeter, WindowsAreStepsFromTheFirstRecurringName) {
  StepMeter m;
  StepMeter::Window w;
  int64_t t = 0;
  int windows = 0;
  for (int step = 0; step < 5; ++step) {
    for (int i = 0; i < 10; ++i) {
      // Steps of 100 ms; the first name of a step comes at its start.
      if (m.observe("g" + std::to_string(i), 1000, step * 100000000 + i * 1000000, &w)) {
        ++windows;
        EXPECT_NEAR(w.cost, 0.1, 1e-9);
        EXPECT_EQ(w.tensors, 10u);
        EXPECT_EQ(w.bytes, 10000);
        EXPECT_TRUE(w.steps);
        EXPECT_FALSE(w.workloadChanged);
        EXPECT_EQ(i, 0);
      }
    }
    (void)t;
  }
  // Step 0 learns, step 1 starts the first window, steps 2..4 close one each.
  EXPECT_EQ(windows, 3);
  EXPECT_STREQ(m.unit(), "s/step");
}

TEST(StepMeter, AChangedStepIsAWorkloadChange) {
  StepMeter m;
  StepMeter::Window w;
  int64_t now = 0;
  auto step = [&](int n, int64_t bytes) {
    bool changed = false, closed = false;
    for (int i = 0; i < n; ++i) {
      if (m.observe("g" + std::to_string(i), bytes, now, &w)) {
        closed = true;
        changed |= w.workloadChanged;
      }
      now += 1000000;
    }
    return std::make_pair(closed, changed);
  };
  for (int s = 0; s < 4; ++s) EXPECT_FALSE(step(10, 1000).second);
  // Twice the tensors per step: the next window is flagged.
  EXPECT_TRUE(step(20, 1000).first);
  EXPECT_TRUE(step(20, 1000).second);
  EXPECT_FALSE(step(20, 1000).second);
  // Larger tensors, same names.
  EXPECT_FALSE(step(20, 2000).second);  // closes the last step of 1000s
  EXPECT_TRUE(step(20, 2000).second);
}

TEST(StepMeter, AVanishedAnchorRelearns) {
  StepMeter::Options o;
  o.minWindowNs = 0;  // steps of 10 us, one window each
  StepMeter m(o);
  StepMeter::Window w;
  int64_t now = 0;
  for (int s = 0; s < 3; ++s)
    for (int i = 0; i < 10; ++i) m.observe("a" + std::to_string(i), 8, now += 1000, &w);
  bool changed = false;
  for (int i = 0; i < 2000 && !changed; ++i)
    if (m.observe("b" + std::to_string(i % 10), 8, now += 1000, &w)) changed = w.workloadChanged;
  EXPECT_TRUE(changed);
  int windows = 0;
  for (int s = 0; s < 4; ++s)
    for (int i = 0; i < 10; ++i) windows += m.observe("b" + std::to_string(i), 8, now += 1000, &w);
  EXPECT_GE(windows, 2);
}

TEST(StepMeter, ShortStepsAreGroupedIntoWindowsOfAtLeastTheMinimum) {
  StepMeter m;  // minWindowNs 10 ms
  StepMeter::Window w;
  int64_t now = 0;
  std::vector<StepMeter::Window> got;
  // Steps of 3 tensors (100, 200, 300 bytes) taking 1 ms, then 0.5 ms.
  for (int s = 0; s < 60; ++s)
    for (int i = 0; i < 3; ++i) {
      if (m.observe("t" + std::to_string(i), 100 * (i + 1), now, &w)) got.push_back(w);
      now += s < 30 ? 333334 : 166667;
    }
  // Step 0 learns, the window starts at step 1's anchor.
  ASSERT_GE(got.size(), 3u);
  for (const auto& x : got) {
    EXPECT_GE(x.seconds, 0.010);
    EXPECT_LT(x.seconds, 0.0111);  // whole steps: closed at the first anchor past 10 ms
    EXPECT_EQ(x.tensors, 3u);      // per step
    EXPECT_EQ(x.bytes, 600);
    EXPECT_NEAR(x.cost, x.seconds / static_cast<double>(x.stepCount), 1e-12);
    EXPECT_FALSE(x.workloadChanged);  // the same step, only faster
  }
  EXPECT_EQ(got.front().stepCount, 10);
  EXPECT_NEAR(got.front().cost, 0.001, 1e-5);
  EXPECT_EQ(got.back().stepCount, 20);
  EXPECT_NEAR(got.back().cost, 0.0005, 1e-5);
  // A step longer than the minimum is a window of its own (the first test: 100 ms steps).
}

TEST(StepMeter, NamesThatNeverRecurFallBackToByteWindows) {
  StepMeter::Options o;
  o.maxStepTensors = 100;
  o.fallbackTensors = 50;
  StepMeter m(o);
  StepMeter::Window w;
  int windows = 0;
  for (int i = 0; i < 301; ++i)
    if (m.observe("noname." + std::to_string(i), 1000, int64_t{i} * 1000000, &w)) {
      ++windows;
      EXPECT_FALSE(w.steps);
      EXPECT_NEAR(w.cost, 0.05 * 1e9 / 50000, 1e-6);  // 50 ms per 50 kB, in s/GB
    }
  EXPECT_EQ(windows, 4);  // 101 learning, then 50 each
  EXPECT_STREQ(m.unit(), "s/GB");
}

}  // namespace
}  // namespace hora
