// hora-negotiation-probe: where the time of one small allreduce goes (issue 20).
//
//   bench/negotiation_probe.sh -np 2 [--bytes 4] [--iters 2000] [--warmup 200]
//   (or N copies with HORA_RANK, HORA_SIZE, HORA_STORE_ADDR, HORA_STORE_PORT)
//
// Every rank runs `iters` float32 sum allreduces of `bytes` back to back
// (one stable name, so the response cache is hit as in training) through the
// C ABI, timing hora_allreduce_async + hora_wait + hora_request_free (not the
// buffer's fill and check; from 256 KiB after a barrier, as
// mpi-allreduce-bench times MPI_Allreduce), then
// reads its own set's metrics (core/telemetry.h), which split each tensor's
// life on the runtime's threads:
//   negotiation  submit (framework thread) -> agreed (control thread applied
//                the coordinator's response), per tensor;
//   queue        agreed -> the executor starts the group;
//   data plane   the group on the data plane (shared memory / Gloo);
//   rest         total - the three: enqueue, completion and the waiter's
//                wake-up, request create/free.
// From 256 KiB the metrics also count the barriers (negotiation and data
// plane); the split is meant for the small sizes.
// Before that it measures the costs of the hops those stages are made of on
// this machine, each as a ping-pong between two threads (half a round trip):
// a condition-variable wake-up, a Boost.Asio post to a sleeping io_context,
// and a TCP loopback message (both ends in this process).
//
// Output: one line per rank ("PROBE rank=.. median_us=.. p10_us=.. total_us=..
// negotiation_us=.."; total and the split are means, median and p10 of the
// per-iteration times; with --deciles also "DECILES rank=.. us=d0,..,d9
// max_us=..", with --windows N also "WINDOWS rank=.. every=N us@cpu=t@c .."
// per window of N iterations: median time and the CPU the rank ran on),
// rank 0 first prints the hop costs ("HOP ..."). Means over the timed
// iterations. Exit 1 if a result is wrong.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "hora/hora.h"

namespace {

using Clock = std::chrono::steady_clock;
double usSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

void check(hora_status_t s, const char* what) {
  if (s == HORA_SUCCESS) return;
  std::fprintf(stderr, "negotiation-probe: %s failed: %s\n", what, hora_last_error_message());
  std::exit(2);
}

// Half a round trip of a condition-variable ping-pong between two threads.
double hopCondvar(int rounds) {
  std::mutex mu;
  std::condition_variable cv;
  int turn = 0;
  std::thread other([&] {
    for (int i = 0; i < rounds; ++i) {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return turn == 1; });
      turn = 0;
      cv.notify_all();
    }
  });
  auto t0 = Clock::now();
  for (int i = 0; i < rounds; ++i) {
    std::unique_lock<std::mutex> lk(mu);
    turn = 1;
    cv.notify_all();
    cv.wait(lk, [&] { return turn == 0; });
  }
  double us = usSince(t0) / rounds / 2;
  other.join();
  return us;
}

// Half a round trip of posting to an io_context that sleeps in run().
double hopAsioPost(int rounds) {
  boost::asio::io_context io;
  auto guard = boost::asio::make_work_guard(io);
  std::thread runner([&] { io.run(); });
  std::mutex mu;
  std::condition_variable cv;
  bool back = false;
  auto t0 = Clock::now();
  for (int i = 0; i < rounds; ++i) {
    boost::asio::post(io, [&] {
      std::lock_guard<std::mutex> lk(mu);
      back = true;
      cv.notify_all();
    });
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return back; });
    back = false;
  }
  double us = usSince(t0) / rounds / 2;
  guard.reset();
  io.stop();
  runner.join();
  return us;
}

// Half a round trip of a small TCP message over loopback, between threads.
double hopTcp(int rounds) {
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(ls, 1) != 0 ||
      getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return -1;
  int c = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return -1;
  int s = accept(ls, nullptr, nullptr);
  int one = 1;
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::thread echo([&] {
    char b[64];
    for (int i = 0; i < rounds; ++i) {
      if (read(s, b, 32) != 32 || write(s, b, 32) != 32) return;
    }
  });
  char b[64] = {};
  auto t0 = Clock::now();
  for (int i = 0; i < rounds; ++i)
    if (write(c, b, 32) != 32 || read(c, b, 32) != 32) break;
  double us = usSince(t0) / rounds / 2;
  echo.join();
  close(c);
  close(s);
  close(ls);
  return us;
}

double jsonNumber(const std::string& j, const std::string& key) {
  auto p = j.find("\"" + key + "\":");
  if (p == std::string::npos) return -1;
  return std::atof(j.c_str() + p + key.size() + 3);
}

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = 4;
  int iters = 2000, warmup = 200;
  bool hops = true;
  bool deciles = false;  // print the per-iteration deciles too
  int windows = 0;       // iterations per window of the WINDOWS line (0: none)
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s: %s needs a value\n", argv[0], a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    auto count = [&](long long lo, long long hi) {
      const std::string t = next();
      long long v = 0;
      if (!bench_util::readInt(t, lo, hi, &v)) {
        std::fprintf(
            stderr, "%s: %s\n", argv[0],
            bench_util::badNumber(a, t, static_cast<double>(lo), static_cast<double>(hi), true)
                .c_str());
        std::exit(2);
      }
      return v;
    };
    if (a == "--bytes")
      bytes = static_cast<size_t>(count(0, int64_t{1} << 40));
    else if (a == "--iters")
      iters = static_cast<int>(count(1, 100000000));
    else if (a == "--warmup")
      warmup = static_cast<int>(count(0, 100000000));
    else if (a == "--deciles")
      deciles = true;
    else if (a == "--windows")
      windows = static_cast<int>(count(1, 100000000));
    else if (a == "--no-hops")
      hops = false;
    else {
      std::fprintf(stderr,
                   "usage: %s [--bytes N] [--iters N] [--warmup N] [--no-hops] [--deciles] "
                   "[--windows N]\n",
                   argv[0]);
      return 2;
    }
  }
  hora_config_t cfg;
  hora_config_init(&cfg);
  hora_runtime_t rt = nullptr;
  check(hora_init(&cfg, &rt), "hora_init");
  int32_t rank = 0, size = 1;
  hora_rank(rt, &rank);
  hora_size(rt, &size);
  if (rank == 0 && hops)
    std::printf("HOP condvar_us=%.2f asio_post_us=%.2f tcp_loopback_us=%.2f\n", hopCondvar(5000),
                hopAsioPost(5000), hopTcp(5000));

  const size_t count = std::max<size_t>(1, bytes / 4);
  std::vector<float> buf(count);
  int64_t shape[1] = {static_cast<int64_t>(count)};
  DLTensor t{};
  t.data = buf.data();
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  hora_options_t o;
  hora_options_init(&o);
  o.name = "probe";
  o.op = HORA_OP_SUM;
  size_t wrong = 0;
  // As mpi-allreduce-bench times MPI_Allreduce: the fill and the check stay
  // outside the timed part (at 1 MiB they took longer than the allreduce),
  // and from 256 KiB a barrier lines the ranks up before each timed call,
  // so that no rank's time includes a peer still checking the last result.
  const bool syncEach = bytes >= (256u << 10);
  hora_options_t bo;
  hora_options_init(&bo);
  auto barrier = [&] {
    hora_request_t req = nullptr;
    check(hora_barrier_async(rt, &bo, &req), "hora_barrier_async");
    check(hora_wait(req, -1.0), "hora_wait (barrier)");
    hora_request_free(req);
  };
  // Returns the microseconds of the allreduce alone.
  auto one = [&](int it) {
    // Values and expected sums depend on (it + i) mod 7 only: a 7-entry
    // table and a running index, no division per element (as
    // mpi-allreduce-bench's table), so that a rank still checking keeps the
    // core from a peer on it as briefly as there.
    float fill[7], want[7];
    for (int k = 0; k < 7; ++k) {
      fill[k] = static_cast<float>((rank + k) % 7);
      want[k] = 0;
      for (int r = 0; r < size; ++r) want[k] += static_cast<float>((r + k) % 7);
    }
    for (size_t i = 0, k = static_cast<size_t>(it) % 7; i < count; ++i, k = k == 6 ? 0 : k + 1)
      buf[i] = fill[k];
    if (syncEach) barrier();
    const auto s0 = Clock::now();
    hora_request_t req = nullptr;
    check(hora_allreduce_async(rt, &t, &t, &o, &req), "hora_allreduce_async");
    check(hora_wait(req, -1.0), "hora_wait");
    hora_request_free(req);
    const double us = usSince(s0);
    for (size_t i = 0, k = static_cast<size_t>(it) % 7; i < count; ++i, k = k == 6 ? 0 : k + 1)
      wrong += buf[i] != want[k];
    return us;
  };
  for (int it = 0; it < warmup; ++it) one(it);
  auto metrics = [&] {
    size_t need = 0;
    hora_metrics_snapshot(rt, nullptr, HORA_METRICS_JSON, nullptr, 0, &need);
    std::string s(need + 4096, '\0');
    check(hora_metrics_snapshot(rt, nullptr, HORA_METRICS_JSON, &s[0], s.size(), &need),
          "hora_metrics_snapshot");
    return s;
  };
  std::string m0 = metrics();
  std::vector<double> samples(iters);
  std::vector<int> cpus(iters, -1);  // the CPU this thread ran on after each
  double total = 0;                  // mean, of the timed parts only
  for (int it = 0; it < iters; ++it) {
    samples[it] = one(warmup + it);
    total += samples[it] / iters;
    if (windows > 0) cpus[it] = ::sched_getcpu();
  }
  // Per window of `windows` iterations, in order: the median time and the
  // CPU this rank's thread ran on (its most frequent one; "*" when no CPU
  // held 90% of the window). Where a run changes mode, the placement that
  // goes with it shows (bench/results/2026-11-28-caller-home.md).
  std::string windowLine;
  if (windows > 0) {
    char buf[64];
    for (int at = 0; at + windows <= iters; at += windows) {
      std::vector<double> w(samples.begin() + at, samples.begin() + at + windows);
      std::nth_element(w.begin(), w.begin() + windows / 2, w.end());
      std::map<int, int> seen;
      for (int k = at; k < at + windows; ++k) ++seen[cpus[k]];
      auto top = std::max_element(seen.begin(), seen.end(),
                                  [](const auto& x, const auto& y) { return x.second < y.second; });
      if (top->second * 10 >= windows * 9)
        std::snprintf(buf, sizeof(buf), " %.1f@%d", w[windows / 2], top->first);
      else
        std::snprintf(buf, sizeof(buf), " %.1f@*", w[windows / 2]);
      windowLine += buf;
    }
  }
  std::sort(samples.begin(), samples.end());
  const double median = samples[samples.size() / 2], p10 = samples[samples.size() / 10];
  std::string m1 = metrics();
  auto d = [&](const char* k) { return (jsonNumber(m1, k) - jsonNumber(m0, k)) * 1e6 / iters; };
  double neg = d("negotiation_s"), q = d("queue_s"), dp = d("data_plane_s");
  // Per iteration: groups the control thread ran itself, those a framework
  // thread ran while it drove the set, allreduces packed ahead.
  auto per = [&](const char* k) { return (jsonNumber(m1, k) - jsonNumber(m0, k)) / iters; };
  // Ranks print in order (rank r after r-1's line is out), best effort.
  std::this_thread::sleep_for(std::chrono::milliseconds(50 * rank));
  if (windows > 0)
    std::printf("WINDOWS rank=%d every=%d us@cpu=%s\n", rank, windows, windowLine.c_str() + 1);
  if (deciles) {
    std::printf("DECILES rank=%d us=", rank);
    for (int k = 0; k < 10; ++k)
      std::printf("%s%.1f", k ? "," : "", samples[samples.size() * k / 10]);
    std::printf(" max_us=%.1f\n", samples.back());
  }
  std::printf(
      "PROBE rank=%d size=%d bytes=%zu iters=%d median_us=%.2f p10_us=%.2f total_us=%.2f "
      "negotiation_us=%.2f queue_us=%.2f "
      "data_plane_us=%.2f rest_us=%.2f on_control=%.2f by_caller=%.2f packed_ahead=%.2f "
      "wrong=%zu\n",
      rank, size, bytes, iters, median, p10, total, neg, q, dp, total - neg - q - dp,
      per("control_thread_groups"), per("caller_driven_groups"), per("packed_ahead"), wrong);
  std::fflush(stdout);
  check(hora_shutdown(rt), "hora_shutdown");
  return wrong ? 1 : 0;
}
