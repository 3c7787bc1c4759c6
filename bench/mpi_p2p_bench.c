/*
 * mpi-p2p-bench: the MPI half of bench/p2p_bench.sh. The same ping-pong as
 * hora-p2p-bench (p2p_bench.cc): rank 0 MPI_Send, rank 1 MPI_Recv and
 * MPI_Send back, rank 0 MPI_Recv; the same sizes, warm-up and iteration
 * counts (p2p_bench_sizes.h), the same buffers (uint8, MPI_BYTE), the same
 * check of every byte that came back, and the same output:
 *   RESULT impl=mpi bytes=B iters=N oneway_us=X median_us=Y gbps=Z wrong=W
 * Run with mpirun -np 2 (p2p_bench.sh picks shared memory: --mca pml ob1
 * --mca btl self,vader). Options: --quick, --sizes A,B,... (bytes, K/M).
 * Exit status: 0 ok, 1 a wrong byte, 2 bad usage.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "p2p_bench_sizes.h"

static double nowUs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmpDouble(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static size_t parseBytes(const char* s) {
  char* end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s) return 0;
  if (*end == 'K' || *end == 'k')
    v <<= 10, ++end;
  else if (*end == 'M' || *end == 'm')
    v <<= 20, ++end;
  if (*end != '\0' && *end != ',') return 0;
  return (size_t)v;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int quick = 0;
  size_t sizes[64];
  int nsizes = P2P_BENCH_NSIZES;
  for (int i = 0; i < nsizes; ++i) sizes[i] = kP2pBenchSizes[i];
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--quick") == 0) {
      quick = 1;
    } else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
      const char* p = argv[++i];
      nsizes = 0;
      while (*p && nsizes < 64) {
        size_t b = parseBytes(p);
        if (b == 0) break;
        sizes[nsizes++] = b;
        p = strchr(p, ',');
        if (!p) break;
        ++p;
      }
      if (nsizes == 0) {
        if (rank == 0) fprintf(stderr, "mpi-p2p-bench: bad --sizes\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
    } else {
      if (rank == 0) fprintf(stderr, "mpi-p2p-bench: unknown argument '%s'\n", argv[i]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  if (size != 2) {
    if (rank == 0) fprintf(stderr, "mpi-p2p-bench: needs exactly 2 ranks, got %d\n", size);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const int peer = 1 - rank;
  size_t maxBytes = 0;
  for (int i = 0; i < nsizes; ++i)
    if (sizes[i] > maxBytes) maxBytes = sizes[i];
  unsigned char* sbuf = malloc(maxBytes);
  unsigned char* rbuf = malloc(maxBytes);
  double* rtt = malloc(sizeof(double) * 5000);
  if (!sbuf || !rbuf || !rtt) MPI_Abort(MPI_COMM_WORLD, 2);
  memset(sbuf, 0, maxBytes);
  memset(rbuf, 0, maxBytes);

  if (rank == 0) {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    char* nl = strchr(version, '\n');
    if (nl) *nl = '\0';
    printf("# mpi-p2p-bench: 2 ranks, ping-pong through MPI_Send/MPI_Recv, MPI_BYTE (%s)\n",
           version);
    printf("# %10s %7s %12s %12s %10s %6s\n", "bytes", "iters", "oneway_us", "median_us", "GB/s",
           "wrong");
  }
  int failures = 0;
  for (int si = 0; si < nsizes; ++si) {
    const size_t bytes = sizes[si];
    const int iters = p2pBenchIters(bytes, quick);
    const int warmup = p2pBenchWarmup(bytes, quick);
    const int tag = si;
    const int count = (int)bytes;
    if (rank == 0) {
      for (size_t i = 0; i < bytes; ++i) sbuf[i] = p2pBenchByte(i, si);
      memset(rbuf, 0, bytes);
    }
    double start = 0;
    for (int it = 0; it < warmup + iters; ++it) {
      if (it == warmup) start = nowUs();
      const double t0 = nowUs();
      if (rank == 0) {
        MPI_Send(sbuf, count, MPI_BYTE, peer, tag, MPI_COMM_WORLD);
        MPI_Recv(rbuf, count, MPI_BYTE, peer, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else {
        MPI_Recv(rbuf, count, MPI_BYTE, peer, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(rbuf, count, MPI_BYTE, peer, tag, MPI_COMM_WORLD);
      }
      if (it >= warmup) rtt[it - warmup] = nowUs() - t0;
    }
    const double total = nowUs() - start;
    if (rank == 0) {
      size_t wrong = 0;
      for (size_t i = 0; i < bytes; ++i)
        if (rbuf[i] != p2pBenchByte(i, si)) ++wrong;
      if (wrong) ++failures;
      qsort(rtt, (size_t)iters, sizeof(double), cmpDouble);
      const double oneway = total / iters / 2;
      const double med = rtt[iters / 2] / 2;
      const double gbps = (double)bytes / (oneway * 1e3);
      printf("  %10zu %7d %12.2f %12.2f %10.3f %6zu\n", bytes, iters, oneway, med, gbps, wrong);
      printf(
          "RESULT impl=mpi bytes=%zu iters=%d oneway_us=%.3f median_us=%.3f gbps=%.4f "
          "wrong=%zu\n",
          bytes, iters, oneway, med, gbps, wrong);
      fflush(stdout);
    }
  }
  free(sbuf);
  free(rbuf);
  free(rtt);
  MPI_Finalize();
  return failures ? 1 : 0;
}
