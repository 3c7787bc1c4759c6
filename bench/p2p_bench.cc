// hora-p2p-bench: point-to-point ping-pong between two ranks through hora's
// C ABI, the hora half of bench/p2p_bench.sh (the other half is
// mpi_p2p_bench.c, MPI_Send/MPI_Recv on the same sizes and iteration counts,
// bench/p2p_bench_sizes.h).
//
// For each size, rank 0 sends a uint8 buffer to rank 1 (hora_send_async +
// hora_wait), rank 1 receives it (hora_recv_async + hora_wait) and sends the
// same buffer back, rank 0 receives it: one round trip. Warm-up round trips
// first, then timed ones; rank 0 reports the one-way latency as the mean
// round trip / 2 (as the OSU latency test does; the median round trip / 2
// too) and the bandwidth as bytes / one-way time. After the last round trip
// rank 0 compares every byte it got back with what it sent (the receive
// buffer is zeroed before the warm-up), so a message that never arrived or
// arrived wrong counts in `wrong`.
//
// Started like hora-bench (HORA_RANK, HORA_SIZE=2, HORA_STORE_ADDR,
// HORA_STORE_PORT, HORA_SECRET; bench/p2p_bench.sh or bench/run_bench.sh
// with HORA_BENCH=). Options:
//   --quick          a tenth of the iterations (smoke test)
//   --sizes A,B,...  only these sizes (bytes, K/M suffixes), default all
//   --mode M         blocking (default: send+wait, then recv+wait) or
//                    prepost (each side posts its next receive before it
//                    sends: what a tuned application does)
// Output (rank 0): a table, and one line per size
//   RESULT impl=hora bytes=B iters=N oneway_us=X median_us=Y gbps=Z wrong=W
// Exit status: 0 ok, 1 a wrong byte, 2 a hora call failed.
#include <hora/hora.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "p2p_bench_sizes.h"
#include "p2p_bench_util.h"

namespace {

using Clock = std::chrono::steady_clock;
bench_util::Who gWho{"hora-p2p-bench"};

[[noreturn]] void fatal(const std::string& what) { bench_util::fatal(gWho, what); }
void check(hora_status_t s, const std::string& what) { bench_util::check(gWho, s, what); }

using Tensor = p2p_bench::ByteTensor;

void sendWait(hora_runtime_t rt, Tensor& b, int peer, int64_t tag) {
  p2p_bench::sendWait(gWho, rt, b, peer, tag);
}
void recvWait(hora_runtime_t rt, Tensor& b, int peer, int64_t tag) {
  p2p_bench::recvWait(gWho, rt, b, peer, tag);
}
hora_request_t postRecv(hora_runtime_t rt, Tensor& b, int peer, int64_t tag) {
  return p2p_bench::postRecv(gWho, rt, b, peer, tag);
}

void finish(hora_request_t r, const char* what) {
  check(hora_wait(r, -1), what);
  hora_request_free(r);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, prepost = false;
  std::vector<size_t> sizes(kP2pBenchSizes, kP2pBenchSizes + P2P_BENCH_NSIZES);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--sizes" && i + 1 < argc) {
      sizes = bench_util::parseSizes(gWho, argv[++i]);
    } else if (a == "--mode" && i + 1 < argc) {
      std::string m = argv[++i];
      if (m != "blocking" && m != "prepost") fatal("--mode is blocking or prepost");
      prepost = m == "prepost";
    } else {
      fatal("unknown argument '" + a + "' (--quick, --sizes LIST, --mode blocking|prepost)");
    }
  }

  int32_t rank = 0, size = 0;
  hora_runtime_t rt = bench_util::initRuntime(&gWho, &rank, &size);
  if (size != 2) fatal("needs exactly 2 ranks (HORA_SIZE=2), got " + std::to_string(size));
  const int peer = 1 - rank;

  size_t maxBytes = 0;
  for (size_t s : sizes) maxBytes = std::max(maxBytes, s);
  std::vector<unsigned char> sbuf(maxBytes), rbuf(maxBytes), rbuf2(maxBytes);

  if (rank == 0) {
    std::printf("# hora-p2p-bench: 2 ranks, ping-pong through hora_%s, uint8 CPU buffers\n",
                prepost ? "recv_async (posted first) + hora_send_async"
                        : "send_async/hora_recv_async + hora_wait");
    std::printf("# %10s %7s %12s %12s %10s %6s\n", "bytes", "iters", "oneway_us", "median_us",
                "GB/s", "wrong");
  }
  int failures = 0;
  for (size_t si = 0; si < sizes.size(); ++si) {
    const size_t bytes = sizes[si];
    const int iters = p2pBenchIters(bytes, quick);
    const int warmup = p2pBenchWarmup(bytes, quick);
    const int64_t tag = static_cast<int64_t>(si);
    Tensor s(sbuf.data(), bytes), r(rbuf.data(), bytes), r2(rbuf2.data(), bytes);
    hora_request_t pending = nullptr;  // rank 1, prepost: the receive of the next round trip
    std::vector<double> rtt;
    rtt.reserve(iters);
    if (rank == 0) {
      for (size_t i = 0; i < bytes; ++i) sbuf[i] = p2pBenchByte(i, static_cast<int>(si));
      std::memset(rbuf.data(), 0, bytes);
    }
    Clock::time_point start;
    for (int it = 0; it < warmup + iters; ++it) {
      if (it == warmup) start = Clock::now();
      const auto t0 = Clock::now();
      if (rank == 0) {
        if (prepost) {
          hora_request_t rr = postRecv(rt, r, peer, tag);
          sendWait(rt, s, peer, tag);
          finish(rr, "hora_wait (recv)");
        } else {
          sendWait(rt, s, peer, tag);
          recvWait(rt, r, peer, tag);
        }
      } else {
        // Rank 1 echoes what it received. prepost: the next receive goes
        // into the other buffer, posted before the echo is sent.
        Tensor& cur = (prepost && it % 2) ? r2 : r;
        if (prepost) {
          if (it == 0) pending = postRecv(rt, r, peer, tag);
          finish(pending, "hora_wait (recv)");
          pending = it + 1 < warmup + iters ? postRecv(rt, it % 2 ? r : r2, peer, tag) : nullptr;
          sendWait(rt, cur, peer, tag);
        } else {
          recvWait(rt, cur, peer, tag);
          sendWait(rt, cur, peer, tag);
        }
      }
      if (it >= warmup)
        rtt.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    const double total = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    if (rank == 0) {
      size_t wrong = 0;
      for (size_t i = 0; i < bytes; ++i)
        if (rbuf[i] != p2pBenchByte(i, static_cast<int>(si))) ++wrong;
      if (wrong) ++failures;
      const double oneway = total / iters / 2;
      const double med = median(rtt) / 2;
      const double gbps = bytes / (oneway * 1e3);  // bytes per us / 1e3 = GB/s
      std::printf("  %10zu %7d %12.2f %12.2f %10.3f %6zu\n", bytes, iters, oneway, med, gbps,
                  wrong);
      std::printf(
          "RESULT impl=hora bytes=%zu iters=%d oneway_us=%.3f median_us=%.3f gbps=%.4f "
          "wrong=%zu\n",
          bytes, iters, oneway, med, gbps, wrong);
      std::fflush(stdout);
    }
  }
  check(hora_shutdown(rt), "hora_shutdown");
  return failures ? 1 : 0;
}
