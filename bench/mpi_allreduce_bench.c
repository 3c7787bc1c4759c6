/*
 * mpi-allreduce-bench: MPI_Allreduce (float32 sum, in place) over the same sizes,
 * iteration counts, data and checks as hora-bench's sweep section
 * (bench/hora_bench.cc), so that the two can be put side by side
 * (bench/multihost_bench.sh does, over the network-namespace test bed).
 *
 *   mpirun -np N mpi-allreduce-bench [--sizes LIST] [--iters N] [--warmup N]
 *
 * LIST: comma list of sizes and MIN:MAX[:xF] ranges, suffixes K/M/G; default
 * 4:64M (x4). Iterations per size: clamp(256 MiB / size, 10, 200), warm-up
 * clamp(iters / 10, 1, 10), as hora-bench.
 *
 * Data: integer-valued float32 in [-16, 15], a function of the element, the
 * iteration and the rank (hora-bench's pattern), refilled before every
 * iteration; every result element is compared exactly with the locally
 * computed sum. Timing: MPI_Wtime around MPI_Allreduce only; a barrier before
 * each size and before each iteration of 256 KiB or more; mean over the timed
 * iterations, maximum over ranks.
 *
 * Output (rank 0): a table and one line per size
 *   RESULT section=allreduce impl=mpi np=N bytes=B count=C iters=I warmup=W
 *     mpi_us=.. mpi_med_us=.. mpi_algbw=.. mpi_busbw=.. mpi_wrong=..
 * (one line). Exit status 1 if any element was wrong, 2 on a bad command line.
 * MPI_BENCH_CORRUPT=1 flips one result element on the last rank (the run must
 * then report it and exit 1: a check of the checker).
 *
 *   mpirun -np N mpi-allreduce-bench --shapes FILE [--steps N] [--step-warmup N]
 *
 * instead runs hora-bench's fused section's steps (bench/hora_bench.cc) on the
 * tensors of FILE (bench/resnet50_grad_shapes.txt: one shape per line, AxBxC,
 * '#' comments): each step fills every tensor with hora-bench's pattern for
 * the step, then, after a barrier, times (a) "pertensor": one blocking
 * MPI_Allreduce per tensor, in reverse order as a backward pass produces them,
 * and (b) "flat": one MPI_Allreduce of a buffer holding all of them; both
 * checked like the sweep. Defaults 10 steps after 2 warm-up, as hora-bench.
 * Output (rank 0): RESULT section=fused impl=mpi np=N tensors=T values=V
 *   steps=S mpi_pertensor_ms=.. mpi_pertensor_med_ms=.. mpi_flat_ms=..
 *   mpi_flat_med_ms=.. mpi_wrong=..  (means and medians over steps, max over ranks)
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int gRank, gSize;

static inline uint32_t patKey(uint64_t g, uint32_t salt) {
  return (uint32_t)(g * 5u + (g >> 5) + salt * 7u);
}
static inline float patVal(uint32_t key, int rank) {
  return (float)((int)((key + 3u * (uint32_t)rank) & 31u) - 16);
}

static int cmpDouble(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

/* "64M" -> bytes; 0 on error. */
static size_t parseSize(const char* s, const char** end) {
  char* e = NULL;
  unsigned long long v = strtoull(s, &e, 10);
  if (e == s) return 0;
  if (*e == 'K' || *e == 'k')
    v <<= 10, ++e;
  else if (*e == 'M' || *e == 'm')
    v <<= 20, ++e;
  else if (*e == 'G' || *e == 'g')
    v <<= 30, ++e;
  *end = e;
  return (size_t)v;
}

/* Parses LIST into sizes[] (at most max); returns the count, -1 on error. */
static int parseSizes(const char* list, size_t* sizes, int max) {
  int n = 0;
  const char* p = list;
  while (*p) {
    const char* e;
    size_t a = parseSize(p, &e);
    if (!a) return -1;
    if (*e == ':') {
      size_t b = parseSize(e + 1, &e);
      size_t f = 4;
      if (!b || b < a) return -1;
      if (*e == ':') {
        if (e[1] != 'x') return -1;
        f = strtoul(e + 2, (char**)&e, 10);
        if (f < 2) return -1;
      }
      for (size_t s = a; s <= b && n < max; s *= f) sizes[n++] = s;
    } else if (n < max) {
      sizes[n++] = a;
    }
    if (*e == ',')
      ++e;
    else if (*e)
      return -1;
    p = e;
  }
  for (int i = 0; i < n; ++i)
    if (sizes[i] % 4) return -1; /* whole float32 elements */
  return n;
}

/* The shapes of FILE as element counts; returns how many (-1: unreadable or
 * malformed). At most max tensors. */
static int readShapes(const char* path, size_t* counts, int max) {
  FILE* f = fopen(path, "r");
  if (!f) return -1;
  char line[512];
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    char* p = line;
    while (*p == ' ' || *p == '\t') ++p;
    if (*p == '#' || *p == '\n' || *p == 0) continue;
    size_t c = 1;
    for (;;) {
      char* e = NULL;
      unsigned long long d = strtoull(p, &e, 10);
      if (e == p || d == 0) {
        fclose(f);
        return -1;
      }
      c *= (size_t)d;
      p = e;
      if (*p != 'x') break;
      ++p;
    }
    if (n == max) {
      fclose(f);
      return -1;
    }
    counts[n++] = c;
  }
  fclose(f);
  return n;
}

static double meanOf(const double* v, int n) {
  double m = 0;
  for (int i = 0; i < n; ++i) m += v[i];
  return n ? m / n : 0;
}

static double medianOf(double* v, int n) {
  if (n == 0) return 0;
  qsort(v, (size_t)n, sizeof(double), cmpDouble);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* hora-bench's fused section, with MPI (see the header). Returns the wrong
 * element count over all ranks (on every rank). */
static unsigned long long fusedSteps(const char* path, int steps, int warm, const float* expect) {
  enum { kMaxTensors = 4096 };
  static size_t counts[kMaxTensors];
  int nt = readShapes(path, counts, kMaxTensors);
  int bad = nt <= 0;
  MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (bad) {
    if (gRank == 0) fprintf(stderr, "mpi-allreduce-bench: cannot read shapes from %s\n", path);
    MPI_Finalize();
    exit(2);
  }
  size_t total = 0, base[kMaxTensors];
  float* t[kMaxTensors];
  for (int i = 0; i < nt; ++i) {
    base[i] = total;
    total += counts[i];
    t[i] = malloc(counts[i] * sizeof(float) + 4); /* separately, as a framework's gradients */
    if (!t[i]) MPI_Abort(MPI_COMM_WORLD, 2);
  }
  float* flat = malloc(total * sizeof(float));
  double* per = malloc(sizeof(double) * (size_t)(steps + 1));
  double* fl = malloc(sizeof(double) * (size_t)(steps + 1));
  if (!flat || !per || !fl) MPI_Abort(MPI_COMM_WORLD, 2);
  unsigned long long wrong = 0;
  int n = 0;
  for (int step = 0; step < warm + steps; ++step) {
    for (int v = 0; v < 2; ++v) {
      const uint32_t salt = (uint32_t)(step * 11 + v);
      if (v == 0) {
        for (int i = 0; i < nt; ++i)
          for (size_t j = 0; j < counts[i]; ++j) t[i][j] = patVal(patKey(base[i] + j, salt), gRank);
      } else {
        for (size_t j = 0; j < total; ++j) flat[j] = patVal(patKey(j, salt), gRank);
      }
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      if (v == 0) {
        for (int i = nt - 1; i >= 0; --i)
          MPI_Allreduce(MPI_IN_PLACE, t[i], (int)counts[i], MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      } else {
        MPI_Allreduce(MPI_IN_PLACE, flat, (int)total, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      }
      double ms = (MPI_Wtime() - t0) * 1e3;
      if (step >= warm) (v == 0 ? per : fl)[n] = ms;
      size_t w = 0;
      if (v == 0) {
        for (int i = 0; i < nt; ++i)
          for (size_t j = 0; j < counts[i]; ++j)
            w += t[i][j] != expect[patKey(base[i] + j, salt) & 31u];
      } else {
        for (size_t j = 0; j < total; ++j) w += flat[j] != expect[patKey(j, salt) & 31u];
      }
      if (w)
        fprintf(stderr, "[mpi-allreduce-bench rank %d] WRONG step %d (%s): %zu elements\n", gRank,
                step, v == 0 ? "pertensor" : "flat", w);
      wrong += w;
    }
    if (step >= warm) ++n;
  }
  double local[4] = {meanOf(per, n), medianOf(per, n), meanOf(fl, n), medianOf(fl, n)}, g[4];
  MPI_Reduce(local, g, 4, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  unsigned long long wsum = 0;
  MPI_Allreduce(&wrong, &wsum, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (gRank == 0) {
    printf(
        "# ResNet-50 step through MPI_Allreduce: %d tensors, %zu float32, %d steps after %d "
        "warm-up\n",
        nt, total, steps, warm);
    printf(
        "#  per tensor (blocking, reverse order): %.2f ms mean, %.2f median; one flat buffer: "
        "%.2f ms mean, %.2f median; #wrong %llu\n",
        g[0], g[1], g[2], g[3], wsum);
    printf(
        "RESULT section=fused impl=mpi np=%d tensors=%d values=%zu steps=%d mpi_pertensor_ms=%.3f "
        "mpi_pertensor_med_ms=%.3f mpi_flat_ms=%.3f mpi_flat_med_ms=%.3f mpi_wrong=%llu\n",
        gSize, nt, total, steps, g[0], g[1], g[2], g[3], wsum);
    fflush(stdout);
  }
  for (int i = 0; i < nt; ++i) free(t[i]);
  free(flat);
  free(per);
  free(fl);
  return wsum;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &gRank);
  MPI_Comm_size(MPI_COMM_WORLD, &gSize);
  size_t sizes[64];
  int nSizes = parseSizes("4:64M", sizes, 64);
  int optIters = 0, optWarmup = -1, steps = 10, stepWarmup = 2;
  const char* shapes = NULL;
  for (int a = 1; a < argc; ++a) {
    if (!strcmp(argv[a], "--shapes") && a + 1 < argc) {
      shapes = argv[++a];
    } else if (!strcmp(argv[a], "--steps") && a + 1 < argc) {
      steps = atoi(argv[++a]);
    } else if (!strcmp(argv[a], "--step-warmup") && a + 1 < argc) {
      stepWarmup = atoi(argv[++a]);
    } else if (!strcmp(argv[a], "--sizes") && a + 1 < argc) {
      nSizes = parseSizes(argv[++a], sizes, 64);
    } else if (!strcmp(argv[a], "--iters") && a + 1 < argc) {
      optIters = atoi(argv[++a]);
    } else if (!strcmp(argv[a], "--warmup") && a + 1 < argc) {
      optWarmup = atoi(argv[++a]);
    } else {
      if (gRank == 0)
        fprintf(stderr,
                "usage: %s [--sizes LIST] [--iters N] [--warmup N] | --shapes FILE [--steps N] "
                "[--step-warmup N] (bad: %s)\n",
                argv[0], argv[a]);
      MPI_Finalize();
      return 2;
    }
  }
  if (nSizes <= 0) {
    if (gRank == 0) fprintf(stderr, "mpi-allreduce-bench: bad --sizes (multiples of 4 bytes)\n");
    MPI_Finalize();
    return 2;
  }
  float expect[32];
  for (uint32_t k = 0; k < 32; ++k) {
    float s = 0;
    for (int r = 0; r < gSize; ++r) s += patVal(k, r);
    expect[k] = s;
  }
  if (shapes) {
    if (steps < 1 || steps > 100000 || stepWarmup < 0 || stepWarmup > 100000) {
      if (gRank == 0)
        fprintf(stderr, "mpi-allreduce-bench: --steps 1..100000, --step-warmup 0..100000\n");
      MPI_Finalize();
      return 2;
    }
    unsigned long long w = fusedSteps(shapes, steps, stepWarmup, expect);
    MPI_Finalize();
    return w ? 1 : 0;
  }
  size_t maxBytes = 0;
  for (int i = 0; i < nSizes; ++i)
    if (sizes[i] > maxBytes) maxBytes = sizes[i];
  float* buf = malloc(maxBytes);
  double* samples = malloc(sizeof(double) * 10000);
  if (!buf || !samples) MPI_Abort(MPI_COMM_WORLD, 2);
  const double busFactor = gSize > 1 ? 2.0 * (gSize - 1) / gSize : 0.0;
  unsigned long long totalWrong = 0;
  const int corrupt = getenv("MPI_BENCH_CORRUPT") != NULL;
  if (gRank == 0) {
    int len = 0;
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    MPI_Get_library_version(lib, &len);
    char* nl = strchr(lib, '\n');
    if (nl) *nl = 0;
    printf("# mpi-allreduce-bench: %d ranks, %s\n", gSize, lib);
    printf(
        "# MPI_Allreduce float32 sum in place; time = mean us, max over ranks; busbw = algbw "
        "* 2(n-1)/n\n");
    printf("#%11s %10s %5s | %10s %8s %8s %6s\n", "size(B)", "count", "iters", "mpi(us)", "algbw",
           "busbw", "#wrong");
    fflush(stdout);
  }
  for (int si = 0; si < nSizes; ++si) {
    size_t bytes = sizes[si], count = bytes / 4;
    size_t byIters = (256u << 20) / bytes;
    int iters = optIters > 0 ? optIters : (int)(byIters < 10 ? 10 : byIters > 200 ? 200 : byIters);
    int warmup = optWarmup >= 0 ? optWarmup
                                : (iters / 10 < 1    ? 1
                                   : iters / 10 > 10 ? 10
                                                     : iters / 10);
    if (iters > 10000) iters = 10000;
    int syncEach = bytes >= (256u << 10);
    unsigned long long wrong = 0;
    int n = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    for (int it = 0; it < warmup + iters; ++it) {
      uint32_t salt = (uint32_t)(it * 3 + 3); /* any salt: the data differs per iteration */
      for (size_t i = 0; i < count; ++i) buf[i] = patVal(patKey(i, salt), gRank);
      if (syncEach) MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double us = (MPI_Wtime() - t0) * 1e6;
      if (it >= warmup) samples[n++] = us;
      if (corrupt && si == 0 && it == 0 && gRank == gSize - 1) buf[count / 2] += 1.0f;
      size_t w = 0;
      for (size_t i = 0; i < count; ++i) w += buf[i] != expect[patKey(i, salt) & 31u];
      if (w)
        fprintf(stderr, "[mpi-allreduce-bench rank %d] WRONG %zu B iteration %d: %zu elements\n",
                gRank, bytes, it, w);
      wrong += w;
    }
    double mean = 0;
    for (int i = 0; i < n; ++i) mean += samples[i];
    mean /= n;
    qsort(samples, (size_t)n, sizeof(double), cmpDouble);
    double med = n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
    double local[2] = {mean, med}, global[2];
    MPI_Reduce(local, global, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    unsigned long long wsum = 0;
    MPI_Reduce(&wrong, &wsum, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (gRank == 0) {
      totalWrong += wsum;
      double algbw = bytes / (global[0] * 1e-6) / 1e9;
      printf(" %11zu %10zu %5d | %10.1f %8.3f %8.3f %6llu\n", bytes, count, iters, global[0], algbw,
             algbw * busFactor, wsum);
      printf(
          "RESULT section=allreduce impl=mpi np=%d bytes=%zu count=%zu iters=%d warmup=%d"
          " mpi_us=%.2f mpi_med_us=%.2f mpi_algbw=%.4f mpi_busbw=%.4f mpi_wrong=%llu\n",
          gSize, bytes, count, iters, warmup, global[0], global[1], algbw, algbw * busFactor, wsum);
      fflush(stdout);
    }
  }
  MPI_Bcast(&totalWrong, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  if (gRank == 0)
    printf("# total #wrong = %llu; %s\n", totalWrong,
           totalWrong ? "RESULTS WRONG" : "all results correct");
  free(buf);
  free(samples);
  MPI_Finalize();
  return totalWrong ? 1 : 0;
}
