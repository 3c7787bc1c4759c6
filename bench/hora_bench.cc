// hora-bench: nccl-tests-style benchmark of hora's allreduce against raw Gloo.
//
// Run as N processes (bench/run_bench.sh does this) with HORA_RANK,
// HORA_SIZE, HORA_STORE_ADDR and HORA_STORE_PORT set; rank 0 hosts the
// rendezvous store (hora_init does that) and prints every table.
//
// Sections (all in one run, all on the same buffers and the same processes):
//   sweep    float32 sum allreduce, in place, 4 B .. 64 MiB (x4 steps), through
//            hora's C ABI and through raw Gloo (GlooBackend with algorithm
//            "ring" and "bcube", built over the same store under the prefix
//            "rawgloo"); time, algbw, busbw (factor 2(n-1)/n), #wrong, and
//            hora/raw busbw ratio against the faster raw algorithm per size.
//   fused    ResNet-50's 161 gradient tensors (bench/resnet50_grad_shapes.txt),
//            one "step" = allreduce all of them: hora grouped (one
//            hora_grouped_allreduce_async), hora individual (161
//            hora_allreduce_async, then wait all), raw Gloo per tensor, and raw
//            Gloo on one flat buffer of the same total; ms/step and ratios.
//   latency  4-byte allreduce, hora vs raw Gloo, mean / median / p99.
//
// Correctness: every buffer is refilled before every iteration (warm-up
// included) with integer-valued float32 data that depends on the element, the
// rank and the iteration, and every result is compared exactly with the sum
// computed locally (small integers: float sums are exact). Refill and check
// are outside the timed region. Any mismatch is counted in #wrong and makes the
// process exit with status 1; any hora/Gloo error aborts with status 2.
//
// Timing: steady_clock around the collective only (hora: enqueue + wait +
// request free). Each rank times every iteration; a table entry is the mean
// over iterations, maximum over ranks (medians are in the JSON/RESULT lines).
// Before each measured block (and before each iteration of payloads >= 256 KiB
// and of every fused step) the ranks meet in a Gloo barrier so one rank's
// refill/check does not show up as another rank's collective time.
//
// Machine-readable output: "RESULT section=... key=value ..." lines on rank
// 0's stdout, and --json FILE.
#include <hora/hora.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_options.h"
#include "core/store.h"
#include "core/tcp_store.h"
#include "ops/gloo/gloo_backend.h"
#include "shapes_file.h"

namespace {

using hora_bench::Options;
using Clock = std::chrono::steady_clock;

int gRank = 0;
int gSize = 1;

[[noreturn]] void fatal(const std::string& msg) {
  std::fprintf(stderr, "[hora-bench rank %d] FATAL: %s\n", gRank, msg.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(2);
}

void checkHora(hora_status_t s, const std::string& what) {
  if (s != HORA_SUCCESS)
    fatal(what + " failed: " + hora_status_string(s) + ": " + hora_last_error_message());
}

void checkStatus(const hora::Status& s, const std::string& what) {
  if (!s.isOk()) fatal(what + " failed: " + s.toString());
}

double usSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// Rank 0 prints; the others stay quiet (their stderr still shows errors).
void out(const char* fmt, ...) {
  if (gRank != 0) return;
  va_list ap;
  va_start(ap, fmt);
  std::vprintf(fmt, ap);
  va_end(ap);
  std::fflush(stdout);
}

// ---------------------------------------------------------------------------
// Data: integer-valued float32 in [-16, 15], a function of the global element
// index g, the iteration salt and the rank; the sum over ranks is exact.

inline uint32_t patKey(uint64_t g, uint32_t salt) {
  return static_cast<uint32_t>(g * 5u + (g >> 5) + salt * 7u);
}
inline float patVal(uint32_t key, int rank) {
  return static_cast<float>(static_cast<int>((key + 3u * static_cast<uint32_t>(rank)) & 31u) - 16);
}

struct Expected {
  float e[32];
  explicit Expected(int n) {
    for (uint32_t k = 0; k < 32; ++k) {
      float s = 0;
      for (int r = 0; r < n; ++r) s += patVal(k, r);
      e[k] = s;
    }
  }
};

void fill(float* p, size_t n, uint64_t base, uint32_t salt) {
  for (size_t i = 0; i < n; ++i) p[i] = patVal(patKey(base + i, salt), gRank);
}

size_t check(const float* p, size_t n, uint64_t base, uint32_t salt, const Expected& ex,
             const char* what) {
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += p[i] != ex.e[patKey(base + i, salt) & 31u];
  if (wrong) {
    for (size_t i = 0; i < n; ++i) {
      float want = ex.e[patKey(base + i, salt) & 31u];
      if (p[i] != want) {
        std::fprintf(stderr,
                     "[hora-bench rank %d] WRONG %s: %zu of %zu elements differ; first at %zu: got "
                     "%g want %g\n",
                     gRank, what, wrong, n, i, static_cast<double>(p[i]),
                     static_cast<double>(want));
        break;
      }
    }
  }
  return wrong;
}

DLTensor tensor1d(float* data, int64_t* shape) {
  DLTensor t;
  std::memset(&t, 0, sizeof(t));
  t.data = data;
  t.device.device_type = kDLCPU;
  t.device.device_id = 0;
  t.ndim = 1;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  return t;
}

// ---------------------------------------------------------------------------
// Statistics

struct Stats {
  double mean = 0, median = 0, p99 = 0, min = 0;
  size_t n = 0;
};

Stats stats(std::vector<double> v) {
  Stats s;
  s.n = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  s.p99 = v[std::min(v.size() - 1, static_cast<size_t>(std::ceil(0.99 * v.size())) - 1)];
  s.min = v.front();
  return s;
}

// ---------------------------------------------------------------------------
// The bench context

struct Bench {
  Options opt;
  hora_runtime_t rt = nullptr;
  std::shared_ptr<hora::Store> store;
  std::unique_ptr<hora::Backend> ring, bcube;
  Expected ex{1};
  size_t totalWrong = 0;
  std::ostringstream json;  // body of the "results" object
  bool jsonFirst = true;
  std::vector<std::string> targetLines;

  void barrier() { checkStatus(ring->barrier(), "gloo barrier"); }

  // Max over ranks, element-wise (uses the raw ring backend, outside timing).
  void maxOverRanks(std::vector<double>& v) {
    if (gSize > 1)
      checkStatus(
          ring->allreduce(v.data(), v.size(), hora::DataType::kFloat64, hora::ReduceOp::kMax),
          "gloo allreduce(max) of timings");
  }
  double sumOverRanks(double x) {
    if (gSize > 1)
      checkStatus(ring->allreduce(&x, 1, hora::DataType::kFloat64, hora::ReduceOp::kSum),
                  "gloo allreduce(sum) of wrong counts");
    return x;
  }
  // Aggregates per-rank stats: max over ranks of mean, median, p99; wrong summed.
  Stats aggregate(const Stats& local, size_t* wrong) {
    std::vector<double> v = {local.mean, local.median, local.p99, local.min};
    maxOverRanks(v);
    Stats s = local;
    s.mean = v[0], s.median = v[1], s.p99 = v[2], s.min = v[3];
    size_t w = static_cast<size_t>(sumOverRanks(static_cast<double>(*wrong)));
    *wrong = w;
    totalWrong += w;
    return s;
  }

  void jsonAdd(const std::string& obj) {
    json << (jsonFirst ? "\n    " : ",\n    ") << obj;
    jsonFirst = false;
  }

  // One timed hora allreduce in place; returns microseconds.
  double horaAllreduce(float* buf, size_t count, const char* name) {
    int64_t shape[1] = {static_cast<int64_t>(count)};
    DLTensor t = tensor1d(buf, shape);
    hora_options_t o;
    hora_options_init(&o);
    o.name = name;
    o.op = HORA_OP_SUM;
    hora_request_t req = nullptr;
    auto t0 = Clock::now();
    hora_status_t s = hora_allreduce_async(rt, &t, &t, &o, &req);
    if (s == HORA_SUCCESS) s = hora_wait(req, -1.0);
    if (req) hora_request_free(req);
    double us = usSince(t0);
    checkHora(s, std::string("hora allreduce '") + name + "'");
    return us;
  }
  double rawAllreduce(hora::Backend& b, float* buf, size_t count) {
    auto t0 = Clock::now();
    hora::Status s = b.allreduce(buf, count, hora::DataType::kFloat32, hora::ReduceOp::kSum);
    double us = usSince(t0);
    checkStatus(s, "raw gloo " + std::string(&b == ring.get() ? "ring" : "bcube") + " allreduce");
    return us;
  }

  void runSweep();
  void runFused();
  void runLatency();
};

const char* kVariantNames[3] = {"hora", "ring", "bcube"};

double busFactor() { return gSize > 1 ? 2.0 * (gSize - 1) / gSize : 0.0; }

std::string fmtBytes(size_t b) {
  char buf[32];
  if (b >= (1u << 20) && b % (1u << 20) == 0)
    std::snprintf(buf, sizeof buf, "%zuMiB", b >> 20);
  else if (b >= 1024 && b % 1024 == 0)
    std::snprintf(buf, sizeof buf, "%zuKiB", b >> 10);
  else
    std::snprintf(buf, sizeof buf, "%zuB", b);
  return buf;
}

void Bench::runSweep() {
  out("\n# ==== 1+2. allreduce sweep, hora vs raw Gloo: float32 sum, in place, %d ranks ====\n",
      gSize);
  out("# time = mean us per allreduce over the timed iterations, max over ranks; algbw = "
      "size/time;\n");
  out("# busbw = algbw * 2(n-1)/n; #wrong = mismatching elements summed over ranks and "
      "iterations.\n");
  out("# hora = hora_allreduce_async+hora_wait (C ABI); ring/bcube = raw Gloo (GlooBackend) on the "
      "same buffer.\n");
  out("# hora/raw = hora busbw / best raw busbw (>1: hora faster).\n");
  out("#%11s %10s %5s | %10s %8s %8s %6s | %10s %8s %8s %6s | %10s %8s %8s %6s | %5s %8s %8s\n",
      "size(B)", "count", "iters", "hora(us)", "algbw", "busbw", "#wrong", "ring(us)", "algbw",
      "busbw", "#wrong", "bcube(us)", "algbw", "busbw", "#wrong", "best", "busbw", "hora/raw");
  size_t maxBytes = *std::max_element(opt.sizes.begin(), opt.sizes.end());
  std::vector<float> buf(maxBytes / 4);
  double lastRatio = 0;
  size_t lastBytes = 0;
  const bool corrupt = std::getenv("HORA_BENCH_CORRUPT") != nullptr;
  for (size_t bytes : opt.sizes) {
    const size_t count = bytes / 4;
    int iters =
        opt.iters > 0
            ? opt.iters
            : static_cast<int>(std::clamp<size_t>((opt.quick ? (16u << 20) : (256u << 20)) / bytes,
                                                  opt.quick ? 3 : 10, opt.quick ? 20 : 200));
    int warmup = opt.warmup >= 0 ? opt.warmup : std::clamp(iters / 10, 1, 10);
    const bool syncEach = bytes >= (256u << 10);
    std::string name = "sweep." + std::to_string(bytes);
    Stats st[3];
    size_t wrong[3] = {0, 0, 0};
    for (int v = 0; v < 3; ++v) {
      std::vector<double> samples;
      samples.reserve(iters);
      barrier();
      for (int it = 0; it < warmup + iters; ++it) {
        uint32_t salt = static_cast<uint32_t>(it * 3 + v);
        fill(buf.data(), count, 0, salt);
        if (syncEach) barrier();
        double us = v == 0 ? horaAllreduce(buf.data(), count, name.c_str())
                           : rawAllreduce(v == 1 ? *ring : *bcube, buf.data(), count);
        if (it >= warmup) samples.push_back(us);
        // Self-test of the checker: HORA_BENCH_CORRUPT=1 flips one hora result on the last rank.
        if (corrupt && v == 0 && it == 0 && gRank == gSize - 1) buf[count / 2] += 1.0f;
        wrong[v] += check(buf.data(), count, 0, salt, ex,
                          (std::string(kVariantNames[v]) + " " + name).c_str());
      }
      st[v] = aggregate(stats(samples), &wrong[v]);
    }
    double algbw[3], busbw[3];
    for (int v = 0; v < 3; ++v) {
      algbw[v] = bytes / (st[v].mean * 1e-6) / 1e9;
      busbw[v] = algbw[v] * busFactor();
    }
    int best = st[1].mean <= st[2].mean ? 1 : 2;
    // busbw ratio == algbw ratio == time ratio inverted; use algbw so that n=1 is defined.
    double ratio = algbw[0] / algbw[best];
    lastRatio = ratio;
    lastBytes = bytes;
    out(" %11zu %10zu %5d | %10.1f %8.3f %8.3f %6zu | %10.1f %8.3f %8.3f %6zu | %10.1f %8.3f %8.3f "
        "%6zu | %5s %8.3f %8.3f\n",
        bytes, count, iters, st[0].mean, algbw[0], busbw[0], wrong[0], st[1].mean, algbw[1],
        busbw[1], wrong[1], st[2].mean, algbw[2], busbw[2], wrong[2], kVariantNames[best],
        busbw[best], ratio);
    char line[1024];
    std::snprintf(line, sizeof line,
                  "RESULT section=allreduce np=%d bytes=%zu count=%zu iters=%d warmup=%d"
                  " hora_us=%.2f hora_med_us=%.2f hora_algbw=%.4f hora_busbw=%.4f hora_wrong=%zu"
                  " ring_us=%.2f ring_med_us=%.2f ring_busbw=%.4f ring_wrong=%zu"
                  " bcube_us=%.2f bcube_med_us=%.2f bcube_busbw=%.4f bcube_wrong=%zu"
                  " best_raw=%s best_raw_busbw=%.4f hora_over_raw_busbw=%.4f\n",
                  gSize, bytes, count, iters, warmup, st[0].mean, st[0].median, algbw[0], busbw[0],
                  wrong[0], st[1].mean, st[1].median, busbw[1], wrong[1], st[2].mean, st[2].median,
                  busbw[2], wrong[2], kVariantNames[best], busbw[best], ratio);
    out("%s", line);
    std::ostringstream j;
    j << "{\"section\":\"allreduce\",\"bytes\":" << bytes << ",\"count\":" << count
      << ",\"iters\":" << iters << ",\"warmup\":" << warmup;
    for (int v = 0; v < 3; ++v)
      j << ",\"" << kVariantNames[v] << "\":{\"mean_us\":" << st[v].mean
        << ",\"median_us\":" << st[v].median << ",\"p99_us\":" << st[v].p99
        << ",\"min_us\":" << st[v].min << ",\"algbw_GBps\":" << algbw[v]
        << ",\"busbw_GBps\":" << busbw[v] << ",\"wrong\":" << wrong[v] << "}";
    j << ",\"best_raw\":\"" << kVariantNames[best] << "\",\"hora_over_raw_busbw\":" << ratio << "}";
    jsonAdd(j.str());
  }
  char line[512];
  std::snprintf(line, sizeof line,
                "TARGET allreduce busbw at %s: hora/best-raw = %.3f (target >= 0.95) %s",
                fmtBytes(lastBytes).c_str(), lastRatio, lastRatio >= 0.95 ? "PASS" : "FAIL");
  targetLines.push_back(line);
}

void Bench::runFused() {
  std::vector<hora_bench::TensorShape> shapes;
  std::string shapesError;
  if (!hora_bench::readShapeFile(opt.shapes, &shapes, &shapesError))
    fatal(shapesError + " (use --shapes FILE)");
  const int nt = static_cast<int>(shapes.size());
  std::vector<uint64_t> base(nt);
  uint64_t total = 0;
  for (int i = 0; i < nt; ++i) base[i] = total, total += shapes[i].count;
  out("\n# ==== 3. fused profile: ResNet-50 gradients, %d tensors, %" PRIu64
      " float32 (%.1f MB), %d ranks ====\n",
      nt, total, total * 4 / 1e6, gSize);
  if (nt != 161 || total != 25557032ull)
    out("# NOTE: expected 161 tensors / 25557032 values for ResNet-50; %s has %d / %" PRIu64 "\n",
        opt.shapes.c_str(), nt, total);
  out("# step = allreduce every gradient (reverse order, as in backward) and wait; ms/step = mean "
      "over %d steps\n"
      "# after %d warm-up, max over ranks. Each step's data differs; every result is checked.\n",
      opt.steps, opt.stepWarmup);

  // Separately allocated tensors (as a framework's gradients would be), plus a flat buffer.
  std::vector<std::vector<float>> t(nt);
  for (int i = 0; i < nt; ++i) t[i].resize(shapes[i].count);
  std::vector<float> flat(total);
  std::vector<DLTensor> dl(nt);
  std::vector<const DLTensor*> inPtrs;
  std::vector<DLTensor*> outPtrs;
  for (int k = nt - 1; k >= 0; --k) {  // backward order
    DLTensor& d = dl[k];
    std::memset(&d, 0, sizeof(d));
    d.data = t[k].data();
    d.device.device_type = kDLCPU;
    d.ndim = static_cast<int32_t>(shapes[k].dims.size());
    d.dtype.code = kDLFloat;
    d.dtype.bits = 32;
    d.dtype.lanes = 1;
    d.shape = shapes[k].dims.data();
    inPtrs.push_back(&dl[k]);
    outPtrs.push_back(&dl[k]);
  }
  std::vector<std::string> indivNames(nt);
  for (int i = 0; i < nt; ++i) indivNames[i] = "rn50.indiv." + std::to_string(i);

  enum { kGrouped, kIndiv, kPerRing, kPerBcube, kFlatRing, kFlatBcube, kNumV };
  const char* names[kNumV] = {"hora_grouped",        "hora_individual", "raw_pertensor_ring",
                              "raw_pertensor_bcube", "raw_flat_ring",   "raw_flat_bcube"};
  std::vector<double> samples[kNumV];
  size_t wrong[kNumV] = {};
  std::vector<hora_request_t> reqs(nt);

  for (int step = 0; step < opt.stepWarmup + opt.steps; ++step) {
    for (int v = 0; v < kNumV; ++v) {
      const uint32_t salt = static_cast<uint32_t>(step * 11 + v);
      const bool isFlat = v == kFlatRing || v == kFlatBcube;
      if (isFlat) {
        fill(flat.data(), total, 0, salt);
      } else {
        for (int i = 0; i < nt; ++i) fill(t[i].data(), t[i].size(), base[i], salt);
      }
      barrier();
      double us = 0;
      if (v == kGrouped) {
        hora_options_t o;
        hora_options_init(&o);
        o.name = "rn50.grouped";
        o.op = HORA_OP_SUM;
        hora_request_t req = nullptr;
        auto t0 = Clock::now();
        hora_status_t s =
            hora_grouped_allreduce_async(rt, nt, inPtrs.data(), outPtrs.data(), &o, &req);
        if (s == HORA_SUCCESS) s = hora_wait(req, -1.0);
        if (req) hora_request_free(req);
        us = usSince(t0);
        checkHora(s, "hora grouped allreduce of the ResNet-50 gradients");
      } else if (v == kIndiv) {
        auto t0 = Clock::now();
        hora_status_t first = HORA_SUCCESS;
        std::string firstWhat;
        int enq = 0;
        for (int k = nt - 1; k >= 0; --k) {
          hora_options_t o;
          hora_options_init(&o);
          o.name = indivNames[k].c_str();
          o.op = HORA_OP_SUM;
          reqs[k] = nullptr;
          hora_status_t s = hora_allreduce_async(rt, &dl[k], &dl[k], &o, &reqs[k]);
          if (s != HORA_SUCCESS) {
            first = s,
            firstWhat = std::string("enqueue ") + indivNames[k] + ": " + hora_last_error_message();
            break;
          }
          ++enq;
        }
        for (int k = nt - 1; k >= 0 && enq > 0; --k, --enq) {
          hora_status_t s = hora_wait(reqs[k], -1.0);
          if (s != HORA_SUCCESS && first == HORA_SUCCESS)
            first = s,
            firstWhat = std::string("wait ") + indivNames[k] + ": " + hora_last_error_message();
          hora_request_free(reqs[k]);
        }
        us = usSince(t0);
        if (first != HORA_SUCCESS)
          fatal("hora individual allreduce of the ResNet-50 gradients failed: " +
                std::string(hora_status_string(first)) + ": " + firstWhat);
      } else if (v == kPerRing || v == kPerBcube) {
        hora::Backend& b = v == kPerRing ? *ring : *bcube;
        auto t0 = Clock::now();
        for (int k = nt - 1; k >= 0; --k)
          checkStatus(
              b.allreduce(t[k].data(), t[k].size(), hora::DataType::kFloat32, hora::ReduceOp::kSum),
              std::string("raw gloo per-tensor allreduce (") + names[v] + ")");
        us = usSince(t0);
      } else {
        us = rawAllreduce(v == kFlatRing ? *ring : *bcube, flat.data(), total);
      }
      if (step >= opt.stepWarmup) samples[v].push_back(us);
      if (isFlat) {
        wrong[v] += check(flat.data(), total, 0, salt, ex, names[v]);
      } else {
        for (int i = 0; i < nt; ++i)
          wrong[v] +=
              check(t[i].data(), t[i].size(), base[i], salt, ex,
                    (std::string(names[v]) + " tensor " + std::to_string(i) + " " + shapes[i].text)
                        .c_str());
      }
    }
  }
  Stats st[kNumV];
  for (int v = 0; v < kNumV; ++v) st[v] = aggregate(stats(samples[v]), &wrong[v]);
  out("#%-22s %10s %10s %10s %10s %8s\n", "variant", "ms/step", "median", "min", "GB/s(alg)",
      "#wrong");
  for (int v = 0; v < kNumV; ++v)
    out(" %-22s %10.2f %10.2f %10.2f %10.3f %8zu\n", names[v], st[v].mean / 1e3, st[v].median / 1e3,
        st[v].min / 1e3, total * 4.0 / (st[v].mean * 1e-6) / 1e9, wrong[v]);
  int bestPer = st[kPerRing].mean <= st[kPerBcube].mean ? kPerRing : kPerBcube;
  int bestFlat = st[kFlatRing].mean <= st[kFlatBcube].mean ? kFlatRing : kFlatBcube;
  double gFlat = st[kGrouped].mean / st[bestFlat].mean, gPer = st[kGrouped].mean / st[bestPer].mean;
  double iFlat = st[kIndiv].mean / st[bestFlat].mean, iPer = st[kIndiv].mean / st[bestPer].mean;
  out("# best raw per-tensor: %s (%.2f ms); best raw flat: %s (%.2f ms)\n", names[bestPer],
      st[bestPer].mean / 1e3, names[bestFlat], st[bestFlat].mean / 1e3);
  out("# hora_grouped:    hora/flat = %.3f  hora/per-tensor = %.3f\n", gFlat, gPer);
  out("# hora_individual: hora/flat = %.3f  hora/per-tensor = %.3f\n", iFlat, iPer);
  out("RESULT section=fused np=%d tensors=%d values=%" PRIu64
      " steps=%d warmup=%d"
      " hora_grouped_ms=%.3f hora_individual_ms=%.3f raw_pertensor_ring_ms=%.3f "
      "raw_pertensor_bcube_ms=%.3f"
      " raw_flat_ring_ms=%.3f raw_flat_bcube_ms=%.3f best_pertensor=%s best_flat=%s"
      " grouped_over_flat=%.4f grouped_over_pertensor=%.4f individual_over_flat=%.4f"
      " individual_over_pertensor=%.4f wrong=%zu\n",
      gSize, nt, total, opt.steps, opt.stepWarmup, st[kGrouped].mean / 1e3, st[kIndiv].mean / 1e3,
      st[kPerRing].mean / 1e3, st[kPerBcube].mean / 1e3, st[kFlatRing].mean / 1e3,
      st[kFlatBcube].mean / 1e3, names[bestPer], names[bestFlat], gFlat, gPer, iFlat, iPer,
      wrong[0] + wrong[1] + wrong[2] + wrong[3] + wrong[4] + wrong[5]);
  std::ostringstream j;
  j << "{\"section\":\"fused\",\"tensors\":" << nt << ",\"values\":" << total
    << ",\"steps\":" << opt.steps << ",\"warmup\":" << opt.stepWarmup;
  for (int v = 0; v < kNumV; ++v)
    j << ",\"" << names[v] << "\":{\"mean_ms\":" << st[v].mean / 1e3
      << ",\"median_ms\":" << st[v].median / 1e3 << ",\"min_ms\":" << st[v].min / 1e3
      << ",\"wrong\":" << wrong[v] << "}";
  j << ",\"grouped_over_flat\":" << gFlat << ",\"grouped_over_pertensor\":" << gPer
    << ",\"individual_over_flat\":" << iFlat << ",\"individual_over_pertensor\":" << iPer << "}";
  jsonAdd(j.str());
  char line[512];
  for (int which = 0; which < 2; ++which) {
    double f = which ? iFlat : gFlat, p = which ? iPer : gPer;
    std::snprintf(line, sizeof line,
                  "TARGET ResNet-50 step (%s): hora/flat = %.3f (target <= 1.1) %s; "
                  "hora/per-tensor = %.3f (target <= 0.5) %s",
                  which ? "individual" : "grouped", f, f <= 1.1 ? "PASS" : "FAIL", p,
                  p <= 0.5 ? "PASS" : "FAIL");
    targetLines.push_back(line);
  }
}

void Bench::runLatency() {
  const int iters = opt.latIters, warmup = opt.latWarmup;
  out("\n# ==== 4. latency: 4-byte float32 allreduce, %d ranks, %d iterations after %d warm-up "
      "====\n",
      gSize, iters, warmup);
  out("# back to back (no barrier between iterations); run in blocks of 25 alternating "
      "hora/ring/bcube;\n"
      "# per-iteration times, statistic per rank, then max over ranks.\n");
  float x = 0;
  std::vector<double> samples[3];
  size_t wrong[3] = {};
  const int block = 25;
  int done[3] = {0, 0, 0};
  std::string name = "latency.4";
  // Warm-up first (all variants), then blocks.
  for (int v = 0; v < 3; ++v) {
    barrier();
    for (int it = 0; it < warmup; ++it) {
      uint32_t salt = static_cast<uint32_t>(1000000 + it);
      fill(&x, 1, 7, salt);
      if (v == 0)
        horaAllreduce(&x, 1, name.c_str());
      else
        rawAllreduce(v == 1 ? *ring : *bcube, &x, 1);
      wrong[v] +=
          check(&x, 1, 7, salt, ex, (std::string(kVariantNames[v]) + " latency warm-up").c_str());
    }
  }
  while (done[0] < iters) {
    for (int v = 0; v < 3; ++v) {
      barrier();
      int n = std::min(block, iters - done[v]);
      for (int it = 0; it < n; ++it) {
        uint32_t salt = static_cast<uint32_t>(done[v] + it);
        fill(&x, 1, 7, salt);
        double us = v == 0 ? horaAllreduce(&x, 1, name.c_str())
                           : rawAllreduce(v == 1 ? *ring : *bcube, &x, 1);
        samples[v].push_back(us);
        wrong[v] += check(&x, 1, 7, salt, ex, (std::string(kVariantNames[v]) + " latency").c_str());
      }
      done[v] += n;
    }
  }
  Stats st[3];
  for (int v = 0; v < 3; ++v) st[v] = aggregate(stats(samples[v]), &wrong[v]);
  out("#%-10s %10s %10s %10s %10s %8s\n", "variant", "mean(us)", "median(us)", "p99(us)", "min(us)",
      "#wrong");
  for (int v = 0; v < 3; ++v)
    out(" %-10s %10.1f %10.1f %10.1f %10.1f %8zu\n", kVariantNames[v], st[v].mean, st[v].median,
        st[v].p99, st[v].min, wrong[v]);
  int best = st[1].mean <= st[2].mean ? 1 : 2;
  int bestMed = st[1].median <= st[2].median ? 1 : 2;
  double rMean = st[0].mean / st[best].mean, rMed = st[0].median / st[bestMed].median;
  out("# hora/best raw: mean %.2fx (vs %s), median %.2fx (vs %s)\n", rMean, kVariantNames[best],
      rMed, kVariantNames[bestMed]);
  out("RESULT section=latency np=%d bytes=4 iters=%d warmup=%d hora_mean_us=%.2f "
      "hora_median_us=%.2f hora_p99_us=%.2f"
      " ring_mean_us=%.2f ring_median_us=%.2f bcube_mean_us=%.2f bcube_median_us=%.2f best_raw=%s"
      " hora_over_raw_mean=%.3f hora_over_raw_median=%.3f wrong=%zu\n",
      gSize, iters, warmup, st[0].mean, st[0].median, st[0].p99, st[1].mean, st[1].median,
      st[2].mean, st[2].median, kVariantNames[best], rMean, rMed, wrong[0] + wrong[1] + wrong[2]);
  std::ostringstream j;
  j << "{\"section\":\"latency\",\"bytes\":4,\"iters\":" << iters << ",\"warmup\":" << warmup;
  for (int v = 0; v < 3; ++v)
    j << ",\"" << kVariantNames[v] << "\":{\"mean_us\":" << st[v].mean
      << ",\"median_us\":" << st[v].median << ",\"p99_us\":" << st[v].p99
      << ",\"min_us\":" << st[v].min << ",\"wrong\":" << wrong[v] << "}";
  j << ",\"hora_over_raw_mean\":" << rMean << ",\"hora_over_raw_median\":" << rMed << "}";
  jsonAdd(j.str());
  char line[512];
  std::snprintf(line, sizeof line,
                "TARGET 4-byte latency: hora/best-raw mean = %.2fx (target <= 3) %s; median = "
                "%.2fx (target <= 3) %s",
                rMean, rMean <= 3.0 ? "PASS" : "FAIL", rMed, rMed <= 3.0 ? "PASS" : "FAIL");
  targetLines.push_back(line);
}

std::string envOr(const char* name, const std::string& dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : dflt;
}

}  // namespace

int main(int argc, char** argv) {
  // Identity from the environment first, so argument errors are reported by rank.
  gRank = std::atoi(envOr("HORA_RANK", "0").c_str());
  Bench b;
  std::string argError;
  if (!hora_bench::parseArgs(argc, argv, &b.opt, &argError)) {
    if (gRank == 0) hora_bench::usage(argv[0]);
    fatal(argError);
  }
  if (b.opt.help) {
    if (gRank == 0) hora_bench::usage(argv[0]);
    return 0;
  }
  const Options& opt = b.opt;

  auto tStart = Clock::now();
  hora_config_t cfg;
  hora_config_init(&cfg);
  checkHora(hora_init(&cfg, &b.rt), "hora_init");
  int32_t r = 0, n = 1;
  checkHora(hora_rank(b.rt, &r), "hora_rank");
  checkHora(hora_size(b.rt, &n), "hora_size");
  gRank = r, gSize = n;
  b.ex = Expected(gSize);

  // Raw Gloo peer: its own namespace ("rawgloo/...") in the same store that rank
  // 0's runtime hosts, its own TCP pairs.
  const auto timeout = std::chrono::milliseconds(
      static_cast<int64_t>(1000 * std::atof(envOr("HORA_BENCH_GLOO_TIMEOUT_S", "300").c_str())));
  if (gSize > 1) {
    std::string addr = envOr("HORA_STORE_ADDR", "");
    if (addr.empty()) fatal("HORA_STORE_ADDR is not set (start with bench/run_bench.sh -np N)");
    int port = std::atoi(envOr("HORA_STORE_PORT", "29500").c_str());
    std::string secret = envOr("HORA_SECRET", "");
    if (secret.empty() && !envOr("HORA_SECRET_FILE", "").empty()) {
      std::ifstream f(envOr("HORA_SECRET_FILE", ""));
      if (!f) fatal("cannot read HORA_SECRET_FILE");
      std::getline(f, secret);
    }
    auto c = hora::TcpStoreClient::connect(
        addr, port, secret, timeout, hora::Logger(hora::LogLevel::kWarning, "[hora-bench store]"));
    if (!c.isOk()) fatal("raw gloo store client: " + c.status().toString());
    b.store = std::make_shared<hora::PrefixStore>(c.take(), "rawgloo");
  }
  hora::GlooBackendOptions go;
  go.hostname = envOr("HORA_HOSTNAME", "127.0.0.1");
  go.timeout = timeout;
  go.algorithm = hora::GlooAlgorithm::kRing;
  auto ring = hora::createGlooBackend(b.store, "ring", gRank, gSize, go);
  if (!ring.isOk()) fatal("raw gloo ring backend: " + ring.status().toString());
  b.ring = ring.take();
  go.algorithm = hora::GlooAlgorithm::kBcube;
  auto bcube = hora::createGlooBackend(b.store, "bcube", gRank, gSize, go);
  if (!bcube.isOk()) fatal("raw gloo bcube backend: " + bcube.status().toString());
  b.bcube = bcube.take();
  b.barrier();

  int32_t vmaj = 0, vmin = 0, vpat = 0;
  hora_get_version(&vmaj, &vmin, &vpat);
  out("# hora-bench: hora %d.%d.%d, %d ranks, %u hardware threads on rank 0's host, mode %s\n",
      vmaj, vmin, vpat, gSize, std::thread::hardware_concurrency(), opt.quick ? "quick" : "full");
  out("# hora tunables (env; empty = default): HORA_CYCLE_TIME_MS=%s HORA_FUSION_THRESHOLD_BYTES=%s"
      " HORA_GLOO_ALGORITHM=%s HORA_CACHE_CAPACITY=%s\n",
      envOr("HORA_CYCLE_TIME_MS", "").c_str(), envOr("HORA_FUSION_THRESHOLD_BYTES", "").c_str(),
      envOr("HORA_GLOO_ALGORITHM", "").c_str(), envOr("HORA_CACHE_CAPACITY", "").c_str());
  out("# raw gloo peer: GlooBackend (ring and bcube) over its own TCP pairs, rendezvous prefix "
      "'rawgloo'\n");

  if (opt.sweep) b.runSweep();
  if (opt.fused) b.runFused();
  if (opt.latency) b.runLatency();

  double elapsed = usSince(tStart) / 1e6;
  out("\n# ==== summary (%d ranks) ====\n", gSize);
  for (const auto& l : b.targetLines) out("%s\n", l.c_str());
  out("RESULT section=summary np=%d total_wrong=%zu elapsed_s=%.1f\n", gSize, b.totalWrong,
      elapsed);
  out("# total #wrong = %zu; %s; elapsed %.1f s\n", b.totalWrong,
      b.totalWrong ? "RESULTS WRONG" : "all results correct", elapsed);

  if (gRank == 0 && !opt.json.empty()) {
    std::ofstream f(opt.json);
    if (!f) {
      std::fprintf(stderr, "[hora-bench rank 0] cannot write --json %s\n", opt.json.c_str());
    } else {
      f << "{\n  \"np\": " << gSize << ",\n  \"quick\": " << (opt.quick ? "true" : "false")
        << ",\n  \"hora_version\": \"" << vmaj << "." << vmin << "." << vpat
        << "\",\n  \"total_wrong\": " << b.totalWrong << ",\n  \"elapsed_s\": " << elapsed
        << ",\n  \"results\": [" << b.json.str() << "\n  ]\n}\n";
    }
  }

  // Tear down: everyone finished every collective; raw pairs first, then hora.
  b.barrier();
  b.bcube.reset();
  b.ring.reset();
  b.store.reset();
  checkHora(hora_shutdown(b.rt), "hora_shutdown");
  return b.totalWrong ? 1 : 0;
}
