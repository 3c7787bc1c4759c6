// hora-mpi-p2p-bench: hora's send/recv and Open MPI's MPI_Send/MPI_Recv
// ping-pong in one pair of processes, in alternating batches.
//
// Why one process for both: on this machine (a 2-vCPU guest) the time for
// one cache line to go from one CPU to the other changes by up to 10x from
// one second to the next (the host moves the vCPUs): a plain two-thread
// ping-pong on one line measured 28, 66 and 250-310 ns one-way within a
// minute. Runs of hora-p2p-bench and mpi-p2p-bench one after the other (bench/p2p_bench.sh)
// therefore compare different machines. Here each batch of round trips of
// one peer is followed by a batch of the other (the order flips every
// batch), and the ratio is taken per pair of batches: both sides of each
// ratio saw the same machine.
//
// Started by mpirun with hora's store given (its identity comes from Open
// MPI's environment):
//   mpirun -np 2 --bind-to core -x HORA_STORE_ADDR=127.0.0.1
//     -x HORA_STORE_PORT=<free port> -x HORA_SECRET=<any>
//     build/bench/hora-mpi-p2p-bench [--sizes 4,32,1K] [--batches N] [--batch-iters N]
// Each round trip is rank 0 -> rank 1 -> rank 0 of a uint8 buffer (hora:
// hora_send_async + hora_wait, hora_recv_async + hora_wait, each request
// freed; MPI: MPI_Send, MPI_Recv), and every echoed byte is checked.
// Output (rank 0): per size, the median over the batches of each side's
// median round trip / 2, and the median and range of the per-batch ratios;
// one line per size:
//   RESULT bytes=B batches=N hora_us=X mpi_us=Y ratio=R ratio_lo=L ratio_hi=H wrong=W
// Exit status: 0 ok, 1 a wrong byte, 2 a call failed.
#include <hora/hora.h>
// MPI's C interface only (Open MPI's and MPICH's C++ bindings need their own library).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "p2p_bench_util.h"

namespace {

using Clock = std::chrono::steady_clock;
bench_util::Who gWho{"hora-mpi-p2p-bench"};

void check(hora_status_t s, const std::string& what) { bench_util::check(gWho, s, what); }
void checkMpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) bench_util::fatal(gWho, std::string(what) + " failed");
}

using Tensor = p2p_bench::ByteTensor;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One batch of `iters` round trips through hora (mpi false) or MPI; returns
// the median round trip / 2 in microseconds (rank 0; rank 1 returns 0).
double batch(bool mpi, hora_runtime_t rt, int rank, std::vector<unsigned char>& sbuf,
             std::vector<unsigned char>& rbuf, size_t bytes, int iters, int tag) {
  const int peer = 1 - rank;
  Tensor s(sbuf.data(), bytes), r(rbuf.data(), bytes);
  std::vector<double> rtt;
  rtt.reserve(iters);
  for (int it = 0; it < iters; ++it) {
    const auto t0 = Clock::now();
    if (rank == 0) {
      if (mpi) {
        checkMpi(
            MPI_Send(sbuf.data(), static_cast<int>(bytes), MPI_BYTE, peer, tag, MPI_COMM_WORLD),
            "MPI_Send");
        checkMpi(MPI_Recv(rbuf.data(), static_cast<int>(bytes), MPI_BYTE, peer, tag, MPI_COMM_WORLD,
                          MPI_STATUS_IGNORE),
                 "MPI_Recv");
      } else {
        p2p_bench::sendWait(gWho, rt, s, peer, tag);
        p2p_bench::recvWait(gWho, rt, r, peer, tag);
      }
      rtt.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    } else if (mpi) {
      checkMpi(MPI_Recv(rbuf.data(), static_cast<int>(bytes), MPI_BYTE, peer, tag, MPI_COMM_WORLD,
                        MPI_STATUS_IGNORE),
               "MPI_Recv");
      checkMpi(MPI_Send(rbuf.data(), static_cast<int>(bytes), MPI_BYTE, peer, tag, MPI_COMM_WORLD),
               "MPI_Send");
    } else {
      p2p_bench::recvWait(gWho, rt, r, peer, tag);
      p2p_bench::sendWait(gWho, rt, r, peer, tag);
    }
  }
  return rank == 0 ? median(rtt) / 2 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  checkMpi(MPI_Init(&argc, &argv), "MPI_Init");
  std::vector<size_t> sizes{4, 32, 1024};
  int batches = 20, batchIters = 2000;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--sizes" && i + 1 < argc) {
      sizes = bench_util::parseSizes(gWho, argv[++i]);
    } else if (a == "--batches" && i + 1 < argc) {
      batches = static_cast<int>(bench_util::intFlag(gWho, a, argv[++i], 1, 100000));
    } else if (a == "--batch-iters" && i + 1 < argc) {
      batchIters = static_cast<int>(bench_util::intFlag(gWho, a, argv[++i], 1, 100000000));
    } else {
      bench_util::fatal(
          gWho, "unknown argument '" + a + "' (--sizes LIST, --batches N, --batch-iters N)");
    }
  }
  int mpiRank = 0, mpiSize = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &mpiRank);
  MPI_Comm_size(MPI_COMM_WORLD, &mpiSize);
  int32_t rank = 0, size = 0;
  hora_runtime_t rt = bench_util::initRuntime(&gWho, &rank, &size);
  if (size != 2 || mpiSize != 2 || rank != mpiRank)
    bench_util::fatal(gWho, "needs exactly 2 ranks with the same numbering in MPI and hora (got " +
                                std::to_string(mpiSize) + " MPI ranks, hora rank " +
                                std::to_string(rank) + " of " + std::to_string(size) + ")");

  size_t maxBytes = 0;
  for (size_t s : sizes) maxBytes = std::max(maxBytes, s);
  std::vector<unsigned char> sbuf(maxBytes), rbuf(maxBytes);
  if (rank == 0)
    std::printf(
        "# hora-mpi-p2p-bench: 2 ranks, %d batches of %d round trips per size and peer, "
        "alternating\n# %10s %10s %10s %8s %17s %6s\n",
        batches, batchIters, "bytes", "hora_us", "mpi_us", "ratio", "ratio range", "wrong");
  int failures = 0;
  for (size_t si = 0; si < sizes.size(); ++si) {
    const size_t bytes = sizes[si];
    for (size_t i = 0; i < bytes; ++i) sbuf[i] = static_cast<unsigned char>(i * 131u + si + 1);
    std::vector<double> hora, mpi, ratio;
    size_t wrong = 0;
    // A warm-up batch of each first.
    for (int b = -1; b < batches; ++b) {
      double h = 0, m = 0;
      for (int k = 0; k < 2; ++k) {
        const bool useMpi = (k == 0) == (b % 2 == 0);
        std::memset(rbuf.data(), 0, bytes);
        const double t = batch(useMpi, rt, rank, sbuf, rbuf, bytes,
                               b < 0 ? batchIters / 4 + 1 : batchIters, static_cast<int>(si));
        (useMpi ? m : h) = t;
        if (rank == 0)
          for (size_t i = 0; i < bytes; ++i) wrong += rbuf[i] != sbuf[i];
      }
      if (b >= 0 && rank == 0) {
        hora.push_back(h);
        mpi.push_back(m);
        ratio.push_back(m > 0 ? h / m : 0);
      }
    }
    if (rank == 0) {
      if (wrong) ++failures;
      std::vector<double> sorted = ratio;
      std::sort(sorted.begin(), sorted.end());
      const double lo = sorted.front(), hi = sorted.back();
      std::printf("  %10zu %10.3f %10.3f %7.2fx %7.2fx-%6.2fx %6zu\n", bytes, median(hora),
                  median(mpi), median(ratio), lo, hi, wrong);
      std::printf(
          "RESULT bytes=%zu batches=%d hora_us=%.3f mpi_us=%.3f ratio=%.3f ratio_lo=%.3f "
          "ratio_hi=%.3f wrong=%zu\n",
          bytes, batches, median(hora), median(mpi), median(ratio), lo, hi, wrong);
      std::fflush(stdout);
    }
  }
  check(hora_shutdown(rt), "hora_shutdown");
  MPI_Finalize();
  return failures ? 1 : 0;
}
