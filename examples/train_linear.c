/*
 * train_linear.c: the main example job. Each rank fits y = w.x + b by SGD on
 * its own shard of a synthetic data set, averaging gradients across ranks
 * through hora's C ABI every step, and prints its loss. All ranks end with
 * identical parameters; rank 0 checks them against the true ones.
 *
 * Pure C99: includes only hora.h, links only libhora. Start it with
 * scripts/run_example.sh (sets HORA_RANK/HORA_SIZE/HORA_STORE_ADDR), under
 * horarun, or by hand with those variables.
 */
#include <hora/hora.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIM 8
#define SAMPLES_PER_RANK 256
#define STEPS 60

static int check(hora_status_t s, const char* what) {
  if (s != HORA_SUCCESS) {
    fprintf(stderr, "%s failed: %s (%s)\n", what, hora_last_error_message(), hora_status_string(s));
    return 1;
  }
  return 0;
}

/* Deterministic per-rank data: x uniform in [-1, 1], y = true_w.x + true_b + noise. */
static double lcg(unsigned long long* state) {
  *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
  return ((*state >> 11) & ((1ULL << 53) - 1)) / (double)(1ULL << 53) * 2.0 - 1.0;
}

int main(void) {
  hora_runtime_t rt = NULL;
  if (check(hora_init(NULL, &rt), "hora_init")) return 1;
  int32_t rank = 0, size = 1;
  hora_rank(rt, &rank);
  hora_size(rt, &size);

  double true_w[DIM], x[SAMPLES_PER_RANK][DIM], y[SAMPLES_PER_RANK];
  for (int j = 0; j < DIM; ++j) true_w[j] = (j + 1) * 0.5 * (j % 2 ? -1 : 1);
  double true_b = 0.25;
  unsigned long long seed = 1234567ULL + 7919ULL * (unsigned long long)rank;
  for (int i = 0; i < SAMPLES_PER_RANK; ++i) {
    y[i] = true_b;
    for (int j = 0; j < DIM; ++j) {
      x[i][j] = lcg(&seed);
      y[i] += true_w[j] * x[i][j];
    }
    y[i] += 0.01 * lcg(&seed);
  }

  /* Parameters start equal everywhere: broadcast rank 0's. */
  double params[DIM + 1];
  for (int j = 0; j <= DIM; ++j) params[j] = rank == 0 ? 0.0 : 1e9; /* others overwritten */
  int64_t pshape[1] = {DIM + 1};
  DLTensor pt;
  memset(&pt, 0, sizeof(pt));
  pt.data = params;
  pt.device.device_type = kDLCPU;
  pt.ndim = 1;
  pt.dtype.code = kDLFloat;
  pt.dtype.bits = 64;
  pt.dtype.lanes = 1;
  pt.shape = pshape;
  hora_options_t opt;
  hora_options_init(&opt);
  opt.name = "params";
  opt.root = 0;
  hora_request_t req = NULL;
  if (check(hora_broadcast_async(rt, &pt, &opt, &req), "broadcast") ||
      check(hora_wait(req, 60.0), "broadcast wait"))
    return 1;
  hora_request_free(req);

  double grad[DIM + 2]; /* gradient of w and b, plus the loss (averaged too) */
  int64_t gshape[1] = {DIM + 2};
  DLTensor gt = pt;
  gt.data = grad;
  gt.shape = gshape;
  const double lr = 0.3;
  for (int step = 0; step < STEPS; ++step) {
    memset(grad, 0, sizeof(grad));
    for (int i = 0; i < SAMPLES_PER_RANK; ++i) {
      double pred = params[DIM];
      for (int j = 0; j < DIM; ++j) pred += params[j] * x[i][j];
      double err = pred - y[i];
      for (int j = 0; j < DIM; ++j) grad[j] += 2.0 * err * x[i][j] / SAMPLES_PER_RANK;
      grad[DIM] += 2.0 * err / SAMPLES_PER_RANK;
      grad[DIM + 1] += err * err / SAMPLES_PER_RANK;
    }
    double local_loss = grad[DIM + 1];
    hora_options_init(&opt);
    opt.name = "grad";
    opt.op = HORA_OP_AVERAGE;
    if (check(hora_allreduce_async(rt, &gt, &gt, &opt, &req), "allreduce") ||
        check(hora_wait(req, 120.0), "allreduce wait"))
      return 1;
    hora_request_free(req);
    for (int j = 0; j <= DIM; ++j) params[j] -= lr * grad[j];
    if (step % 10 == 0 || step == STEPS - 1)
      printf("rank %d/%d step %2d local loss %.6f global loss %.6f\n", rank, size, step, local_loss,
             grad[DIM + 1]);
    fflush(stdout);
  }

  int ok = 1;
  for (int j = 0; j < DIM; ++j) ok &= fabs(params[j] - true_w[j]) < 0.05;
  ok &= fabs(params[DIM] - true_b) < 0.05;
  printf("rank %d: %s (w[0]=%.4f, expected %.4f; b=%.4f, expected %.4f)\n", rank,
         ok ? "converged" : "DID NOT CONVERGE", params[0], true_w[0], params[DIM], true_b);
  if (check(hora_shutdown(rt), "hora_shutdown")) return 1;
  return ok ? 0 : 2;
}
