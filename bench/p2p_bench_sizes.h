/*
 * The message sizes and iteration counts of the point-to-point ping-pong,
 * shared by hora-p2p-bench (p2p_bench.cc) and mpi-p2p-bench
 * (mpi_p2p_bench.c) so that both time exactly the same work. C99, header
 * only.
 *
 * Iterations: 64 MiB of one-way traffic per size, at least 20 and at most
 * 5000 round trips (small sizes get many, so the clock and the scheduler's
 * noise average out); warm-up: a tenth of that, 5..200. --quick divides
 * both by 10 (at least 5 and 2).
 */
#ifndef HORA_BENCH_P2P_BENCH_SIZES_H_
#define HORA_BENCH_P2P_BENCH_SIZES_H_

#include <stddef.h>

static const size_t kP2pBenchSizes[] = {4,         64,       1024,     16 << 10, 64 << 10,
                                        256 << 10, 1u << 20, 4u << 20, 16u << 20};
#define P2P_BENCH_NSIZES ((int)(sizeof(kP2pBenchSizes) / sizeof(kP2pBenchSizes[0])))

static inline int p2pBenchIters(size_t bytes, int quick) {
  size_t n = ((size_t)64 << 20) / bytes;
  if (n < 20) n = 20;
  if (n > 5000) n = 5000;
  if (quick) n = n / 10 < 5 ? 5 : n / 10;
  return (int)n;
}

static inline int p2pBenchWarmup(size_t bytes, int quick) {
  int n = p2pBenchIters(bytes, 0) / 10;
  if (n < 5) n = 5;
  if (n > 200) n = 200;
  if (quick) n = n / 10 < 2 ? 2 : n / 10;
  return n;
}

/* The byte rank 0 puts at offset i in round `round` (rank 1 echoes it back). */
static inline unsigned char p2pBenchByte(size_t i, int round) {
  return (unsigned char)((i * 131u + (size_t)round * 7u + 1u) & 0xffu);
}

#endif /* HORA_BENCH_P2P_BENCH_SIZES_H_ */
