/*
 * mpi-coll-bench: Open MPI's MPI_Reduce_scatter_block, MPI_Alltoall,
 * MPI_Barrier, MPI_Allgather and MPI_Bcast (root 0) over the same sizes, data
 * and checks as hora-coll-bench (bench/collectives_bench.cc), for
 * bench/collectives_bench.sh and bench/multihost_coll_bench.sh.
 *
 *   mpirun -np N mpi-coll-bench [--ops LIST] [--sizes LIST] [--iters N]
 *
 * Output (rank 0): RESULT op=.. impl=mpi plane=mpi np=N bytes=B iters=I
 *   us=.. med_us=.. wrong=.. ; exit 1 on any wrong element, 2 on bad usage.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float value(size_t i, int r, int it) {
  return (float)((int)((i * 7 + (size_t)r * 13 + (size_t)it * 5) % 32) - 16);
}

static int cmpd(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static size_t parse_bytes(const char* s) {
  char* end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (*end == 'K' || *end == 'k')
    v <<= 10, ++end;
  else if (*end == 'M' || *end == 'm')
    v <<= 20, ++end;
  if (end == s || *end != '\0') {
    fprintf(stderr, "mpi-coll-bench: bad size '%s'\n", s);
    exit(2);
  }
  return (size_t)v;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const char* ops = "reducescatter,alltoall,barrier";
  size_t sizes[64];
  int nsizes = 0, iters_override = 0;
  for (size_t b = 4; b <= ((size_t)16 << 20); b *= 16) sizes[nsizes++] = b;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--ops") && i + 1 < argc) {
      ops = argv[++i];
    } else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
      char* list = strdup(argv[++i]);
      nsizes = 0;
      for (char* tok = strtok(list, ","); tok && nsizes < 64; tok = strtok(NULL, ","))
        sizes[nsizes++] = parse_bytes(tok);
    } else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
      iters_override = atoi(argv[++i]);
    } else {
      if (rank == 0) fprintf(stderr, "mpi-coll-bench: unknown argument '%s'\n", argv[i]);
      MPI_Finalize();
      return 2;
    }
  }
  long wrong_total = 0;
  const char* names[6] = {"reducescatter", "alltoall",  "barrier",
                          "allgather",     "broadcast", "allreduce"};
  for (int o = 0; o < 6; ++o) {
    if (!strstr(ops, names[o])) continue;
    int n = o == 2 ? 1 : nsizes;
    for (int s = 0; s < n; ++s) {
      size_t bytes = o == 2 ? 0 : sizes[s];
      size_t unit = 4 * (size_t)size;
      size_t count = bytes / unit * unit / 4;
      if (o != 2 && count == 0) continue;
      size_t want_iters = bytes ? ((size_t)256 << 20) / bytes : 500;
      int iters = iters_override > 0 ? iters_override
                                     : (int)(want_iters < 10    ? 10
                                             : want_iters > 500 ? 500
                                                                : want_iters);
      int warmup = iters / 10 > 2 ? iters / 10 : 2;
      size_t block = count / (size_t)size;
      float* in = malloc((count ? count : 1) * sizeof(float));
      float* out = malloc((count ? count : 1) * sizeof(float));
      double* times = malloc(sizeof(double) * (size_t)iters);
      long wrong = 0;
      MPI_Barrier(MPI_COMM_WORLD);
      for (int it = 0; it < warmup + iters; ++it) {
        /* allgather: this rank's block of the global vector; broadcast: the
         * root's vector, garbage elsewhere (in place, in `out`). */
        if (o == 3) {
          for (size_t i = 0; i < block; ++i) in[i] = value(block * (size_t)rank + i, rank, it);
        } else if (o == 4) {
          for (size_t i = 0; i < count; ++i) out[i] = rank == 0 ? value(i, 0, it) : -99.0f;
        } else {
          for (size_t i = 0; i < count; ++i) in[i] = value(i, rank, it);
        }
        double t0 = MPI_Wtime();
        if (o == 0)
          MPI_Reduce_scatter_block(in, out, (int)block, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        else if (o == 1)
          MPI_Alltoall(in, (int)block, MPI_FLOAT, out, (int)block, MPI_FLOAT, MPI_COMM_WORLD);
        else if (o == 3)
          MPI_Allgather(in, (int)block, MPI_FLOAT, out, (int)block, MPI_FLOAT, MPI_COMM_WORLD);
        else if (o == 4)
          MPI_Bcast(out, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD);
        else if (o == 5)
          MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        else
          MPI_Barrier(MPI_COMM_WORLD);
        double t1 = MPI_Wtime();
        for (size_t i = 0; i < block && o != 2; ++i) {
          if (o == 3 || o == 4) {
            for (int q = 0; q < size; ++q) {
              size_t g = block * (size_t)q + i;
              if (out[g] != value(g, o == 3 ? q : 0, it)) ++wrong;
            }
          } else if (o == 0 || o == 5) {
            /* allreduce: every rank checks its block of the sum, together all of it */
            float want = 0;
            for (int q = 0; q < size; ++q) want += value(block * (size_t)rank + i, q, it);
            if (out[o == 5 ? block * (size_t)rank + i : i] != want) ++wrong;
          } else {
            for (int q = 0; q < size; ++q)
              if (out[(size_t)q * block + i] != value(block * (size_t)rank + i, q, it)) ++wrong;
          }
        }
        if (it >= warmup) times[it - warmup] = (t1 - t0) * 1e6;
      }
      double mean = 0;
      for (int i = 0; i < iters; ++i) mean += times[i];
      mean /= iters;
      qsort(times, (size_t)iters, sizeof(double), cmpd);
      double med = times[iters / 2], gmean, gmed;
      long gwrong;
      MPI_Reduce(&mean, &gmean, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      MPI_Reduce(&med, &gmed, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      MPI_Allreduce(&wrong, &gwrong, 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
      wrong_total += gwrong;
      if (rank == 0)
        printf(
            "RESULT op=%s impl=mpi plane=mpi np=%d bytes=%zu iters=%d us=%.2f med_us=%.2f "
            "wrong=%ld\n",
            names[o], size, count * 4, iters, gmean, gmed, gwrong);
      fflush(stdout);
      free(in);
      free(out);
      free(times);
    }
  }
  MPI_Finalize();
  return wrong_total ? 1 : 0;
}
