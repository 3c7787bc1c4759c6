// hora-obs-bench: what observability costs (issue 16), measured in one run.
//
// Every rank runs rounds; each round runs three variants, in a rotating
// order, each in a fresh runtime of the same processes:
//   off       HORA_TELEMETRY=0 (no metrics, no flight recorder, no timeline)
//   on        the default: metrics, straggler ranking and flight recorder
//   timeline  the default plus a timeline written to --timeline FILE
// and times, per variant, the ResNet-50 step (161 gradients submitted one by
// one in backward order, then waited for, as a framework does) and the
// 4-byte allreduce latency. Medians over rounds; rank 0 prints them and the
// ratios to "off". Every result is checked (a wrong sum exits 1).
//
// The end-to-end differences are small next to this machine's noise, so rank
// 0 also times the hooks themselves: every Telemetry call one collective
// makes (submit, send, agree, start, finish), in a tight loop, with the
// flight recorder on and with a timeline recording too: nanoseconds per
// collective, repeatable.
//
// Start it like hora-bench (bench/observability_overhead.sh does).
#include <hora/hora.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/telemetry.h"
#include "core/timeline.h"
#include "shapes_file.h"

namespace {

using Clock = std::chrono::steady_clock;
int gRank = 0, gSize = 1;

[[noreturn]] void fatal(const std::string& what) {
  std::fprintf(stderr, "[hora-obs-bench rank %d] %s\n", gRank, what.c_str());
  std::exit(2);
}

void check(hora_status_t s, const std::string& what) {
  if (s != HORA_SUCCESS) fatal(what + ": " + hora_last_error_message());
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

DLTensor tensor(float* data, int ndim, int64_t* shape) {
  DLTensor t;
  std::memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = ndim;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

struct Result {
  std::vector<double> stepMs, latUs;
};

// One variant in a fresh runtime: `steps` ResNet-50 steps, `lat` latencies.
void runVariant(int variant, const std::string& timelinePath,
                std::vector<hora_bench::TensorShape>& shapes, int steps, int lat, Result* res,
                size_t* wrong) {
  setenv("HORA_TELEMETRY", variant == 0 ? "0" : "1", 1);
  hora_config_t cfg;
  hora_config_init(&cfg);
  hora_runtime_t rt = nullptr;
  check(hora_init(&cfg, &rt), "hora_init");
  if (variant == 2) check(hora_timeline_start(rt, timelinePath.c_str(), 0), "timeline");
  const int nt = static_cast<int>(shapes.size());
  std::vector<std::vector<float>> g(nt);
  for (int i = 0; i < nt; ++i) g[i].resize(shapes[i].count);
  std::vector<std::string> names(nt);
  for (int i = 0; i < nt; ++i) names[i] = "obs.grad." + std::to_string(i);
  std::vector<hora_request_t> reqs(nt);
  for (int step = 0; step < steps + 2; ++step) {  // 2 warm-up steps
    const float v = static_cast<float>(gRank + 1 + step);
    for (auto& t : g) std::fill(t.begin(), t.end(), v);
    const auto t0 = Clock::now();
    for (int i = nt - 1; i >= 0; --i) {
      DLTensor t =
          tensor(g[i].data(), static_cast<int>(shapes[i].dims.size()), shapes[i].dims.data());
      hora_options_t o;
      hora_options_init(&o);
      o.name = names[i].c_str();
      o.op = HORA_OP_SUM;
      check(hora_allreduce_async(rt, &t, &t, &o, &reqs[i]), "allreduce " + names[i]);
    }
    for (int i = nt - 1; i >= 0; --i) {
      check(hora_wait(reqs[i], -1), "wait " + names[i]);
      hora_request_free(reqs[i]);
    }
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    const float expect = static_cast<float>(gSize * (gSize + 1) / 2 + gSize * step);
    for (auto& t : g)
      if (t.front() != expect || t.back() != expect) ++*wrong;
    if (step >= 2) res->stepMs.push_back(ms);
  }
  float x = 0;
  int64_t one = 1;
  for (int it = 0; it < lat + 100; ++it) {  // 100 warm-up
    x = static_cast<float>(it);
    DLTensor t = tensor(&x, 1, &one);
    hora_options_t o;
    hora_options_init(&o);
    o.name = "obs.latency";
    o.op = HORA_OP_SUM;
    hora_request_t req = nullptr;
    const auto t0 = Clock::now();
    check(hora_allreduce_async(rt, &t, &t, &o, &req), "latency allreduce");
    check(hora_wait(req, -1), "latency wait");
    hora_request_free(req);
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (x != static_cast<float>(it * gSize)) ++*wrong;
    if (it >= 100) res->latUs.push_back(us);
  }
  if (variant == 2) check(hora_timeline_stop(rt), "timeline stop");
  check(hora_shutdown(rt), "hora_shutdown");
}

class NullSink : public hora::RequestSink {
 public:
  hora::Result<void*> allocateOutput(const std::vector<int64_t>&, hora::DataType,
                                     const hora::Device&, hora::DeviceMemory*) override {
    return hora::Status(hora::Code::kInternal, "unused");
  }
  void setReceivedSplits(std::vector<int64_t>) override {}
  void setLastJoinedRank(int32_t) override {}
  void completeEntry(const hora::Status&) override {}
};

// Nanoseconds of telemetry per single-tensor collective, `n` times over.
double hookNs(bool timeline, const std::string& path, int n) {
  hora::TelemetryOptions o;
  o.globalRanks = {0, 1};
  o.host = "bench";
  if (timeline) {
    o.timeline = std::make_shared<hora::Timeline>(hora::TimelineOptions{});
    if (!o.timeline->start(path, false).isOk()) fatal("cannot write " + path);
  }
  hora::Telemetry t(o);
  auto sink = std::make_shared<NullSink>();
  hora::Response r;
  r.name = "layer4.2.conv3.weight.grad";
  r.shape = {2048, 512, 1, 1};
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    hora::AgreedGroup g;
    auto e = std::make_shared<hora::TensorEntry>();
    e->request.name = r.name;
    e->request.shape = r.shape;
    e->sink = sink;
    t.submitted(*e);
    t.sent(*e, true);
    g.responses.push_back(r);
    g.entries.push_back(e);
    t.agreed(g);
    t.started(g);
    t.finished(g, hora::Status::ok(), "shm+gloo", false, 1000, 1000);
    if (timeline && i % 1000 == 999) t.flushTimeline();  // the control thread's tick
  }
  const double total = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  // The same loop without the Telemetry calls: what the entries themselves cost.
  const auto b0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    hora::AgreedGroup g;
    auto e = std::make_shared<hora::TensorEntry>();
    e->request.name = r.name;
    e->request.shape = r.shape;
    e->sink = sink;
    g.responses.push_back(r);
    g.entries.push_back(e);
  }
  const double base = std::chrono::duration<double, std::nano>(Clock::now() - b0).count();
  if (timeline) o.timeline->stop();
  return (total - base) / n;
}

}  // namespace

int main(int argc, char** argv) {
  gRank = std::atoi(std::getenv("HORA_RANK") ? std::getenv("HORA_RANK") : "0");
  gSize = std::atoi(std::getenv("HORA_SIZE") ? std::getenv("HORA_SIZE") : "1");
  int rounds = 5, steps = 3, lat = 500;
  std::string shapesPath = HORA_BENCH_SHAPES_DEFAULT, timeline = "/tmp/hora-obs-bench-trace.json";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) fatal(a + " needs a value");
      return argv[++i];
    };
    auto count = [&](long long lo, long long hi) {
      const std::string t = next();
      long long v = 0;
      if (!bench_util::readInt(t, lo, hi, &v))
        fatal(bench_util::badNumber(a, t, static_cast<double>(lo), static_cast<double>(hi), true));
      return static_cast<int>(v);
    };
    if (a == "--rounds")
      rounds = count(1, 1000);
    else if (a == "--steps")
      steps = count(1, 1000000);
    else if (a == "--lat-iters")
      lat = count(0, 100000000);
    else if (a == "--shapes")
      shapesPath = next();
    else if (a == "--timeline")
      timeline = next();
    else
      fatal("unknown option " + a +
            " (--rounds N --steps N --lat-iters N --shapes FILE --timeline FILE)");
  }
  if (rounds < 1 || steps < 1 || lat < 1) fatal("--rounds, --steps, --lat-iters must be >= 1");
  std::vector<hora_bench::TensorShape> shapes;
  std::string err;
  if (!hora_bench::readShapeFile(shapesPath, &shapes, &err)) fatal(err);

  const char* names[3] = {"off", "on", "timeline"};
  Result res[3];
  size_t wrong = 0;
  for (int round = 0; round < rounds; ++round)
    for (int k = 0; k < 3; ++k) {
      const int v = (round + k) % 3;  // rotate: no variant always runs first
      runVariant(v, timeline, shapes, steps, lat, &res[v], &wrong);
    }
  if (gRank == 0) {
    const double step0 = median(res[0].stepMs), lat0 = median(res[0].latUs);
    std::printf(
        "# hora-obs-bench: %d ranks, %d rounds x (%d ResNet-50 steps, %d 4-byte "
        "allreduces) per variant, medians\n",
        gSize, rounds, steps, lat);
    std::printf("#%-9s %12s %10s %14s %10s %14s\n", "variant", "step(ms)", "vs off", "latency(us)",
                "vs off", "extra us/coll");
    for (int v = 0; v < 3; ++v) {
      const double s = median(res[v].stepMs), l = median(res[v].latUs);
      std::printf(" %-9s %12.2f %10.3f %14.2f %10.3f %14.2f\n", names[v], s, s / step0, l, l / lat0,
                  l - lat0);
    }
    for (int v = 1; v < 3; ++v)
      std::printf(
          "RESULT variant=%s np=%d step_ms=%.3f step_over_off=%.4f latency_us=%.3f "
          "latency_over_off=%.4f extra_us_per_collective=%.3f\n",
          names[v], gSize, median(res[v].stepMs), median(res[v].stepMs) / step0,
          median(res[v].latUs), median(res[v].latUs) / lat0, median(res[v].latUs) - lat0);
    const int n = 200000;
    const double flightNs = hookNs(false, "", n), tlNs = hookNs(true, timeline + ".hooks", n);
    std::printf(
        "# telemetry hooks per single-tensor collective (rank 0, %d collectives, minus "
        "the same loop without them): metrics + flight recorder %.0f ns; with a timeline "
        "recording %.0f ns\n",
        n, flightNs, tlNs);
    std::printf("RESULT section=hooks ns_per_collective_on=%.1f ns_per_collective_timeline=%.1f\n",
                flightNs, tlNs);
    std::printf("# results %s\n", wrong ? "WRONG" : "all correct");
  }
  return wrong ? 1 : 0;
}
