/*
 * launcher_probe.c: the worker program of the launcher tests
 * (the tests/launcher shell scripts). One binary, several behaviours:
 *
 *   launcher_probe env              print the HORA_* contract it received
 *                                   (the secret only as "set, N chars")
 *   launcher_probe lines N          write N stdout and N stderr lines of
 *                                   varying length (up to ~9 KB), each in
 *                                   several write() pieces, so lines from
 *                                   different ranks arrive interleaved and cut
 *                                   across reads
 *   launcher_probe verify NP N STREAM < output
 *                                   check horarun's forwarded output: every
 *                                   expected line exactly once, intact, with
 *                                   the right "[r]<STREAM>: " prefix
 *   launcher_probe train STEPS [fail R S CODE] [hang R S] [ignore-term] [sleep MS]
 *                                   allreduce STEPS times; rank R exits with
 *                                   CODE before step S, or hangs there
 *                                   (optionally ignoring SIGTERM); prints
 *                                   "probe ready rank R pid P" after step 1
 *   launcher_probe allreduce BYTES ITERS
 *                                   allreduce a float32 buffer of BYTES bytes
 *                                   (sum) ITERS times, checking every element
 *                                   (the multi-host tests count the bytes this
 *                                   puts on an emulated link)
 *   launcher_probe collectives BYTES ITERS
 *                                   allgather, reducescatter, broadcast (root
 *                                   rotating) and alltoall of BYTES-byte
 *                                   float32 buffers ITERS times, checking every
 *                                   element (the multi-host tests run it over
 *                                   the data plane across hosts)
 */
#include <hora/hora.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int env_int(const char* name) {
  const char* v = getenv(name);
  return v ? atoi(v) : -1;
}

static void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w <= 0) return;
    p += w;
    n -= (size_t)w;
  }
}

/* Line i of rank r on stream s (0 stdout, 1 stderr), without the newline. */
static size_t make_line(char* buf, int r, int s, int i) {
  int len = (i * 7919 + r * 131 + s * 17) % 9000;
  size_t n = (size_t)sprintf(buf, "L r=%d s=%d i=%d len=%d ", r, s, i, len);
  char c = (char)('a' + (r * 7 + i + s) % 26);
  memset(buf + n, c, (size_t)len);
  n += (size_t)len;
  buf[n++] = '|';
  return n;
}

static int do_lines(int n) {
  int r = env_int("HORA_RANK");
  static char buf[10000];
  for (int i = 0; i < n; ++i) {
    for (int s = 0; s < 2; ++s) {
      size_t len = make_line(buf, r, s, i);
      buf[len++] = '\n';
      int fd = s ? 2 : 1;
      /* Three pieces: the reader sees partial lines. */
      size_t a = len / 3, b = 2 * len / 3;
      write_all(fd, buf, a);
      write_all(fd, buf + a, b - a);
      write_all(fd, buf + b, len - b);
    }
  }
  return 0;
}

static int do_verify(int np, int n, const char* stream) {
  int s = strcmp(stream, "stderr") == 0;
  char* seen = calloc((size_t)np * (size_t)n, 1);
  static char line[20000], expect[10000], prefix[64];
  long good = 0, bad = 0;
  while (fgets(line, sizeof(line), stdin)) {
    size_t len = strlen(line);
    if (len && line[len - 1] == '\n') line[--len] = 0;
    int r = -1, i = -1;
    if (sscanf(line, "[%d]", &r) != 1 || r < 0 || r >= np) continue; /* not a probe line */
    snprintf(prefix, sizeof(prefix), "[%d]<%s>: ", r, stream);
    if (strncmp(line, prefix, strlen(prefix)) != 0) {
      if (bad++ < 5) fprintf(stderr, "bad prefix: %.120s\n", line);
      continue;
    }
    const char* body = line + strlen(prefix);
    int rr, ss;
    if (sscanf(body, "L r=%d s=%d i=%d", &rr, &ss, &i) != 3 || rr != r || ss != s || i < 0 ||
        i >= n) {
      if (bad++ < 5) fprintf(stderr, "garbled line: %.120s\n", line);
      continue;
    }
    size_t el = make_line(expect, r, s, i);
    if (strlen(body) != el || memcmp(body, expect, el) != 0) {
      if (bad++ < 5) fprintf(stderr, "corrupted line (rank %d line %d): %.120s\n", r, i, line);
      continue;
    }
    if (seen[r * n + i]++) {
      if (bad++ < 5) fprintf(stderr, "duplicate line rank %d line %d\n", r, i);
      continue;
    }
    ++good;
  }
  long missing = (long)np * n - good;
  printf("verify %s: %ld intact lines, %ld bad, %ld missing\n", stream, good, bad, missing);
  free(seen);
  return bad == 0 && missing == 0 ? 0 : 1;
}

static int check(hora_status_t s, const char* what) {
  if (s == HORA_SUCCESS) return 0;
  fprintf(stderr, "probe: %s failed: %s\n", what, hora_last_error_message());
  return 1;
}

static int do_train(int argc, char** argv) {
  int steps = atoi(argv[2]);
  int fail_rank = -1, fail_step = -1, fail_code = 0, hang_rank = -1, hang_step = -1,
      ignore_term = 0;
  int sleep_ms = 0;
  for (int a = 3; a < argc; ++a) {
    if (!strcmp(argv[a], "fail") && a + 3 < argc) {
      fail_rank = atoi(argv[a + 1]), fail_step = atoi(argv[a + 2]), fail_code = atoi(argv[a + 3]);
      a += 3;
    } else if (!strcmp(argv[a], "hang") && a + 2 < argc) {
      hang_rank = atoi(argv[a + 1]), hang_step = atoi(argv[a + 2]);
      a += 2;
    } else if (!strcmp(argv[a], "ignore-term")) {
      ignore_term = 1;
    } else if (!strcmp(argv[a], "sleep") && a + 1 < argc) {
      sleep_ms = atoi(argv[++a]);
    }
  }
  hora_runtime_t rt = NULL;
  if (check(hora_init(NULL, &rt), "hora_init")) return 1;
  int32_t rank = 0;
  hora_rank(rt, &rank);
  float data[64];
  int64_t shape[1] = {64};
  DLTensor t;
  memset(&t, 0, sizeof(t));
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  for (int step = 0; step < steps; ++step) {
    if (rank == fail_rank && step == fail_step) {
      fprintf(stderr, "probe: rank %d exiting with code %d on purpose at step %d\n", rank,
              fail_code, step);
      exit(fail_code);
    }
    if (rank == hang_rank && step == hang_step) {
      if (ignore_term) signal(SIGTERM, SIG_IGN);
      fprintf(stderr, "probe: rank %d hanging on purpose at step %d%s\n", rank, step,
              ignore_term ? " (ignoring SIGTERM)" : "");
      for (;;) pause();
    }
    for (int j = 0; j < 64; ++j) data[j] = (float)(rank + j);
    hora_options_t opt;
    hora_options_init(&opt);
    opt.name = "probe.grad";
    hora_request_t req = NULL;
    if (check(hora_allreduce_async(rt, &t, &t, &opt, &req), "allreduce") ||
        check(hora_wait(req, 60.0), "allreduce wait"))
      return 1;
    hora_request_free(req);
    if (step == 1) {
      printf("probe ready rank %d pid %d\n", rank, (int)getpid());
      fflush(stdout);
    }
    if (sleep_ms) {
      struct timespec ts = {sleep_ms / 1000, (sleep_ms % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    }
  }
  printf("probe rank %d done after %d steps\n", rank, steps);
  return check(hora_shutdown(rt), "hora_shutdown");
}

/* Integer-valued float32 in [-16, 15]: sums over ranks are exact. */
static float pattern(long j, int it, int rank) {
  return (float)((int)((j * 5 + it * 7 + rank * 3) & 31) - 16);
}

static int do_allreduce(long bytes, int iters) {
  hora_runtime_t rt = NULL;
  if (check(hora_init(NULL, &rt), "hora_init")) return 1;
  int32_t rank = 0, size = 1;
  hora_rank(rt, &rank);
  hora_size(rt, &size);
  long count = bytes / 4;
  float* data = malloc((size_t)count * sizeof(float));
  if (!data) return 1;
  int64_t shape[1] = {count};
  DLTensor t;
  memset(&t, 0, sizeof(t));
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  for (int it = 0; it < iters; ++it) {
    for (long j = 0; j < count; ++j) data[j] = pattern(j, it, rank);
    hora_options_t opt;
    hora_options_init(&opt);
    opt.name = "probe.big";
    hora_request_t req = NULL;
    if (check(hora_allreduce_async(rt, &t, &t, &opt, &req), "allreduce") ||
        check(hora_wait(req, 60.0), "allreduce wait"))
      return 1;
    hora_request_free(req);
    for (long j = 0; j < count; ++j) {
      float want = 0;
      for (int r = 0; r < size; ++r) want += pattern(j, it, r);
      if (data[j] != want) {
        fprintf(stderr, "probe: rank %d iteration %d element %ld: got %g want %g\n", rank, it, j,
                (double)data[j], (double)want);
        return 1;
      }
    }
  }
  printf("probe allreduce rank %d: %ld bytes x %d ok\n", rank, bytes, iters);
  free(data);
  return check(hora_shutdown(rt), "hora_shutdown");
}

static void tensor_1d(DLTensor* t, float* data, int64_t* shape) {
  memset(t, 0, sizeof(*t));
  t->data = data;
  t->device.device_type = kDLCPU;
  t->ndim = 1;
  t->dtype.code = kDLFloat;
  t->dtype.bits = 32;
  t->dtype.lanes = 1;
  t->shape = shape;
}

/* 0 when the submission succeeded and *req completed (req by address: the
 * submission, another argument, fills it in); 1 on failure, reported. */
static int run_op(const char* what, hora_status_t submitted, const hora_request_t* req) {
  return check(submitted, what) || check(hora_wait(*req, 60.0), what);
}

static int bad(int rank, const char* op, int it, long j, float got, float want) {
  fprintf(stderr, "probe: rank %d %s iteration %d element %ld: got %g want %g\n", rank, op, it, j,
          (double)got, (double)want);
  return 1;
}

static int do_collectives(long bytes, int iters) {
  hora_runtime_t rt = NULL;
  if (check(hora_init(NULL, &rt), "hora_init")) return 1;
  int32_t rank = 0, size = 1;
  hora_rank(rt, &rank);
  hora_size(rt, &size);
  long block = bytes / 4 / size, count = block * size;
  float* in = malloc((size_t)(count ? count : 1) * sizeof(float));
  if (!in || block == 0) {
    fprintf(stderr, "probe: collectives of %ld bytes over %d ranks: nothing to do or no memory\n",
            bytes, size);
    return 1;
  }
  for (int it = 0; it < iters; ++it) {
    DLTensor t;
    int64_t shape[1];
    hora_options_t opt;
    hora_request_t req = NULL;
    const DLTensor* out = NULL;
    const float* o;
    /* allgather: rank r gives block elements pattern(r * block + j). */
    for (long j = 0; j < block; ++j) in[j] = pattern(rank * block + j, it, rank);
    shape[0] = block;
    tensor_1d(&t, in, shape);
    hora_options_init(&opt);
    opt.name = "probe.allgather";
    req = NULL;
    if (run_op("allgather", hora_allgather_async(rt, &t, &opt, &req), &req) ||
        check(hora_request_output(req, &out), "allgather output"))
      return 1;
    o = (const float*)out->data;
    for (long j = 0; j < count; ++j)
      if (o[j] != pattern(j, it, (int)(j / block))) return bad(rank, "allgather", it, j, o[j], 0);
    hora_request_free(req);
    /* reducescatter: every rank's pattern summed; rank r keeps block r. */
    for (long j = 0; j < count; ++j) in[j] = pattern(j, it, rank);
    shape[0] = count;
    tensor_1d(&t, in, shape);
    hora_options_init(&opt);
    opt.name = "probe.reducescatter";
    req = NULL;
    if (run_op("reducescatter", hora_reducescatter_async(rt, &t, &opt, &req), &req) ||
        check(hora_request_output(req, &out), "reducescatter output"))
      return 1;
    o = (const float*)out->data;
    for (long j = 0; j < block; ++j) {
      float want = 0;
      for (int r = 0; r < size; ++r) want += pattern(rank * block + j, it, r);
      if (o[j] != want) return bad(rank, "reducescatter", it, j, o[j], want);
    }
    hora_request_free(req);
    /* broadcast from a rotating root, in place. */
    int root = it % size;
    for (long j = 0; j < count; ++j) in[j] = rank == root ? pattern(j, it, root) : -99.0f;
    hora_options_init(&opt);
    opt.name = "probe.broadcast";
    opt.root = root;
    req = NULL;
    if (run_op("broadcast", hora_broadcast_async(rt, &t, &opt, &req), &req)) return 1;
    for (long j = 0; j < count; ++j)
      if (in[j] != pattern(j, it, root)) return bad(rank, "broadcast", it, j, in[j], 0);
    hora_request_free(req);
    /* alltoall, equal splits: block d goes to rank d. */
    for (long j = 0; j < count; ++j) in[j] = pattern(rank * count + j, it, rank);
    hora_options_init(&opt);
    opt.name = "probe.alltoall";
    req = NULL;
    if (run_op("alltoall", hora_alltoall_async(rt, &t, NULL, size, &opt, &req), &req) ||
        check(hora_request_output(req, &out), "alltoall output"))
      return 1;
    o = (const float*)out->data;
    for (long j = 0; j < count; ++j) {
      int src = (int)(j / block);
      float want = pattern(src * count + rank * block + j % block, it, src);
      if (o[j] != want) return bad(rank, "alltoall", it, j, o[j], want);
    }
    hora_request_free(req);
  }
  printf("probe collectives rank %d: %ld bytes x %d ok\n", rank, bytes, iters);
  free(in);
  return check(hora_shutdown(rt), "hora_shutdown");
}

static int do_env(void) {
  static const char* names[] = {"HORA_RANK",
                                "HORA_SIZE",
                                "HORA_LOCAL_RANK",
                                "HORA_LOCAL_SIZE",
                                "HORA_CROSS_RANK",
                                "HORA_CROSS_SIZE",
                                "HORA_STORE_ADDR",
                                "HORA_STORE_PORT",
                                "HORA_STORE_EXTERNAL",
                                "HORA_HOSTNAME",
                                "HORA_FUSION_THRESHOLD_BYTES",
                                "HORA_CYCLE_TIME_MS",
                                "HORA_CACHE_CAPACITY",
                                "HORA_LOG_LEVEL",
                                "HORA_START_TIMEOUT_S",
                                "HORA_STALL_SHUTDOWN_TIME_S",
                                "HORA_STALL_CHECK",
                                "HORA_PEER_TIMEOUT_S",
                                "HORA_TIMELINE",
                                "HORA_TIMELINE_MARK_CYCLES",
                                "HORA_AUTOTUNE",
                                "HORA_AUTOTUNE_LOG",
                                "PROBE_EXTRA"};
  for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); ++k) {
    const char* v = getenv(names[k]);
    printf("%s=%s\n", names[k], v ? v : "<unset>");
  }
  const char* secret = getenv("HORA_SECRET");
  printf("HORA_SECRET=%s\n", secret && *secret ? "set" : "<unset>");
  printf("HORA_SECRET_LEN=%d\n", secret ? (int)strlen(secret) : 0);
  fflush(stdout);
  return 0;
}

int main(int argc, char** argv) {
  if (argc >= 2 && !strcmp(argv[1], "env")) return do_env();
  if (argc >= 3 && !strcmp(argv[1], "lines")) return do_lines(atoi(argv[2]));
  if (argc >= 5 && !strcmp(argv[1], "verify"))
    return do_verify(atoi(argv[2]), atoi(argv[3]), argv[4]);
  if (argc >= 3 && !strcmp(argv[1], "train")) return do_train(argc, argv);
  if (argc >= 4 && !strcmp(argv[1], "allreduce")) return do_allreduce(atol(argv[2]), atoi(argv[3]));
  if (argc >= 4 && !strcmp(argv[1], "collectives"))
    return do_collectives(atol(argv[2]), atoi(argv[3]));
  fprintf(stderr, "usage: see the comment at the top of launcher_probe.c\n");
  return 2;
}
