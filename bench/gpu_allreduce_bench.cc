// gpu-allreduce-bench: what hora adds to an allreduce of CUDA tensors over a
// direct ncclAllReduce on the same buffers, at world size 1 (issue 19:
// added latency per call <= 20 us, bandwidth ratio >= 0.97 from 64 MiB).
//
// One process, one GPU, one hora runtime of world size 1 (no store) and one
// NCCL communicator of one rank made here. Both sides reduce the same float32
// input (element i = (i % 1000) * 0.5) into the same output buffer, out of
// place, op sum:
//   hora  hora_allreduce_async (DLTensor on {kDLCUDA, 0}, one name per size)
//         + hora_wait + hora_request_free; hora_wait returns once the GPU
//         work completed (hora synchronizes its own stream)
//   nccl  ncclAllReduce on a non-blocking stream + cudaStreamSynchronize
// Two ways, both reported:
//  - one call at a time: each call synchronous (hora's request completes only
//    after its stream finished, NCCL is launch + synchronize), so a framework
//    waiting for the result pays the whole round trip. The difference is
//    what hora costs per call: negotiation, its threads, the completion poll
//    and any extra copy (the latency target).
//  - back to back, as nccl-tests times bandwidth: `iters` calls in flight
//    (hora: that many requests, one name each, then all waited for; NCCL:
//    that many launches, then one synchronize), so host costs hide behind
//    the GPU where they can (the bandwidth target). Below the fusion
//    threshold hora fuses such requests: fewer, larger launches.
//
// Timing: for each size, `warmup` calls of each untimed, then `reps` blocks;
// each block runs `iters` hora calls and `iters` NCCL calls, the first side
// alternating between blocks, so drift on a shared machine (clocks, other
// jobs) hits both alike. A block's time is wall clock over its calls / iters;
// the table shows the median block of each side. algbw = bytes / time.
// After each size, one more call of each is checked exactly against the
// input (a sum over one rank), the output poisoned with 0xff bytes before
// each, including the element after the last (must stay poisoned).
//
// HORA_GPU_BACKEND defaults to nccl here (world size 1 picks the NCCL
// communicator under auto too; nccl fails loudly instead of staging).
// Exit status: 0 results correct (targets met or not), 1 a wrong result or a
// failed call, 2 bad arguments, 77 no CUDA device.
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"

#ifndef HORA_CUDA_PLUGIN_PATH
#define HORA_CUDA_PLUGIN_PATH "libhora_cuda.so"
#endif

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
const char* const kProg = "gpu-allreduce-bench";
bench_util::Who gWho{kProg};

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", kProg, what.c_str());
  std::exit(1);
}
void checkHora(hora_status_t s, const std::string& what) {
  if (s != HORA_SUCCESS)
    fail(what + ": " + hora_status_string(s) + ": " + hora_last_error_message());
}
void checkCuda(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) fail(what + ": " + cudaGetErrorString(e));
}
void checkNccl(ncclResult_t r, const std::string& what) {
  if (r != ncclSuccess) fail(what + ": " + ncclGetErrorString(r));
}
[[noreturn]] void usage(const std::string& why) {
  if (!why.empty()) {
    std::fprintf(stderr, "%s: %s (-h for usage)\n", kProg, why.c_str());
    std::exit(2);
  }
  std::printf(
      "usage: %s [-sizes LIST] [-iters N] [-warmup N] [-reps R]\n"
      "  -sizes LIST  bytes, comma list with K/M suffixes, multiples of 4\n"
      "               (default 4,16,64,...,256M: powers of 4)\n"
      "  -iters N     calls per side per block (default 50)\n"
      "  -warmup N    untimed calls per side per size (default 10)\n"
      "  -reps R      blocks per size; the median block is shown (default 7)\n"
      "  (--flag works too; HORA_* variables pass through to hora)\n",
      kProg);
  std::exit(0);
}

struct Options {
  std::vector<size_t> sizes;
  int iters = 50;
  int warmup = 10;
  int reps = 7;
};

Options parse(int argc, char** argv) {
  Options o;
  for (size_t b = 4; b <= (size_t{256} << 20); b *= 4) o.sizes.push_back(b);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.size() > 2 && a[0] == '-' && a[1] == '-') a.erase(0, 1);  // --iters = -iters
    if (a == "-h" || a == "-help") usage("");
    if (i + 1 >= argc) usage("unknown argument or missing value: '" + std::string(argv[i]) + "'");
    const std::string v = argv[++i];
    auto count = [&](long long lo, long long hi) {
      long long n = 0;
      if (!bench_util::readInt(v, lo, hi, &n))
        usage(bench_util::badNumber(a, v, static_cast<double>(lo), static_cast<double>(hi), true));
      return static_cast<int>(n);
    };
    if (a == "-sizes") {
      o.sizes.clear();
      for (const std::string& s : bench_util::splitList(v)) {
        const size_t at = s.find_first_not_of("0123456789");
        const std::string suffix = at == std::string::npos ? "" : s.substr(at);
        if (at == 0 ||
            (suffix != "" && suffix != "K" && suffix != "k" && suffix != "M" && suffix != "m") ||
            s.size() - suffix.size() > 12)
          usage("-sizes: bad size '" + s + "' (bytes, e.g. 4,64K,256M)");
        const size_t bytes = bench_util::parseBytes(gWho, s);
        if (bytes == 0 || bytes % 4 != 0 || bytes > (size_t{8} << 30))
          usage("-sizes: " + s + " must be a positive multiple of 4 bytes (float32), at most 8G");
        o.sizes.push_back(bytes);
      }
      if (o.sizes.empty()) usage("-sizes: empty list");
    } else if (a == "-iters") {
      o.iters = count(1, 10000000);
    } else if (a == "-warmup") {
      o.warmup = count(0, 10000000);
    } else if (a == "-reps") {
      o.reps = count(1, 100000);
    } else {
      usage("unknown argument '" + std::string(argv[i - 1]) + "'");
    }
  }
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

float pattern(size_t i) { return static_cast<float>(i % 1000) * 0.5f; }

struct Bench {
  hora_runtime_t rt = nullptr;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  float* in = nullptr;
  float* out = nullptr;
  size_t capacity = 0;  // elements of `out`, one more than the largest size

  // The input and output as CUDA float32 tensors of `shape` (one dimension).
  void describe(int64_t* shape, DLTensor* ti, DLTensor* to) const {
    std::memset(ti, 0, sizeof *ti);
    ti->device.device_type = kDLCUDA;
    ti->device.device_id = 0;
    ti->ndim = 1;
    ti->dtype = DLDataType{kDLFloat, 32, 1};
    ti->shape = shape;
    *to = *ti;
    ti->data = in;
    to->data = out;
  }

  void horaCall(size_t count, const std::string& name) {
    int64_t shape[1] = {static_cast<int64_t>(count)};
    DLTensor ti, to;
    describe(shape, &ti, &to);
    hora_options_t opts;
    hora_options_init(&opts);
    opts.op = HORA_OP_SUM;
    opts.name = name.c_str();
    hora_request_t req = nullptr;
    checkHora(hora_allreduce_async(rt, &ti, &to, &opts, &req), "hora_allreduce_async " + name);
    const hora_status_t s = hora_wait(req, 120.0);
    if (s != HORA_SUCCESS) {
      const std::string msg = std::string(hora_status_string(s)) + ": " + hora_last_error_message();
      hora_request_free(req);
      fail("hora_wait " + name + ": " + msg);
    }
    checkHora(hora_request_free(req), "hora_request_free");
  }

  // Back to back, as nccl-tests times bandwidth: `n` requests in flight at
  // once (one name each: a name has one request in flight), then all waited
  // for. Same-sized tensors of at least the fusion threshold stay apart;
  // smaller ones are fused by hora into fewer launches.
  void horaBatch(size_t count, const std::string& name, int n) {
    int64_t shape[1] = {static_cast<int64_t>(count)};
    DLTensor ti, to;
    describe(shape, &ti, &to);
    std::vector<hora_request_t> reqs(n, nullptr);
    std::vector<std::string> names(n);
    for (int k = 0; k < n; ++k) {
      names[k] = name + "." + std::to_string(k);
      hora_options_t opts;
      hora_options_init(&opts);
      opts.op = HORA_OP_SUM;
      opts.name = names[k].c_str();
      checkHora(hora_allreduce_async(rt, &ti, &to, &opts, &reqs[k]),
                "hora_allreduce_async " + names[k]);
    }
    for (int k = 0; k < n; ++k) {
      const hora_status_t s = hora_wait(reqs[k], 120.0);
      if (s != HORA_SUCCESS) fail("hora_wait " + names[k] + ": " + hora_last_error_message());
      checkHora(hora_request_free(reqs[k]), "hora_request_free");
    }
  }

  void ncclBatch(size_t count, int n) {
    for (int k = 0; k < n; ++k)
      checkNccl(ncclAllReduce(in, out, count, ncclFloat, ncclSum, comm, stream), "ncclAllReduce");
    checkCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }

  void ncclCall(size_t count) {
    checkNccl(ncclAllReduce(in, out, count, ncclFloat, ncclSum, comm, stream), "ncclAllReduce");
    checkCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }

  // Poisons the output, runs `call` once and checks every element; returns
  // the number of wrong elements (the one after the last must stay poisoned).
  template <typename Call>
  size_t verify(size_t count, Call&& call) {
    checkCuda(cudaMemset(out, 0xff, (count + 1) * sizeof(float)), "cudaMemset");
    checkCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    call();
    std::vector<uint32_t> got(count + 1);
    checkCuda(cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    size_t wrong = got[count] == 0xffffffffu ? 0 : 1;
    for (size_t i = 0; i < count; ++i) {
      float f;
      std::memcpy(&f, &got[i], 4);
      if (f != pattern(i)) ++wrong;
    }
    return wrong;
  }
};

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);

  int devices = 0;
  const cudaError_t de = cudaGetDeviceCount(&devices);
  if (de != cudaSuccess || devices == 0) {
    std::printf("%s: skipped, no CUDA device (%s)\n", kProg,
                de != cudaSuccess ? cudaGetErrorString(de) : "none visible");
    return 77;
  }
  checkCuda(cudaSetDevice(0), "cudaSetDevice(0)");
  // libhora loads the plugin itself: the one built with this binary unless
  // the caller names one (or the built one is gone: libhora's own search).
  if (!std::getenv("HORA_GPU_PLUGIN") && ::access(HORA_CUDA_PLUGIN_PATH, R_OK) == 0)
    ::setenv("HORA_GPU_PLUGIN", HORA_CUDA_PLUGIN_PATH, 1);
  ::setenv("HORA_GPU_BACKEND", "nccl", 0);

  Bench b;
  hora_config_t cfg;
  hora_config_init(&cfg);
  cfg.rank = 0;
  cfg.size = 1;
  checkHora(hora_init(&cfg, &b.rt), "hora_init (world size 1)");

  ncclUniqueId id;
  checkNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  checkNccl(ncclCommInitRank(&b.comm, 1, id, 0), "ncclCommInitRank");
  checkCuda(cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking), "cudaStreamCreate");

  const size_t maxCount = *std::max_element(o.sizes.begin(), o.sizes.end()) / 4;
  b.capacity = maxCount + 1;
  checkCuda(cudaMalloc(&b.in, b.capacity * 4), "cudaMalloc (input)");
  checkCuda(cudaMalloc(&b.out, b.capacity * 4), "cudaMalloc (output)");
  {
    std::vector<float> host(b.capacity);
    for (size_t i = 0; i < host.size(); ++i) host[i] = pattern(i);
    checkCuda(cudaMemcpy(b.in, host.data(), host.size() * 4, cudaMemcpyHostToDevice),
              "cudaMemcpy (input)");
  }

  cudaDeviceProp prop;
  checkCuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  int ncclVersion = 0, driver = 0, runtime = 0;
  checkNccl(ncclGetVersion(&ncclVersion), "ncclGetVersion");
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  int32_t hmaj = 0, hmin = 0, hpat = 0;
  hora_get_version(&hmaj, &hmin, &hpat);
  std::printf("# %s: hora allreduce vs ncclAllReduce, world size 1, float32 sum, out of place\n",
              kProg);
  std::printf("# device 0 of %d: %s (sm_%d%d), driver %d, CUDA runtime %d\n", devices, prop.name,
              prop.major, prop.minor, driver, runtime);
  std::printf("# NCCL %d.%d.%d, hora %d.%d.%d\n", ncclVersion / 10000, ncclVersion / 100 % 100,
              ncclVersion % 100, hmaj, hmin, hpat);
  std::printf("# HORA_* set:");
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "HORA_", 5) == 0) std::printf(" %s", *e);
  std::printf("\n# %d blocks of %d calls per side and size after %d warm-up; median block\n",
              o.reps, o.iters, o.warmup);
  std::printf("# one call at a time (us, GB/s) | back to back, %d in flight (GB/s)\n", o.iters);
  std::printf("#%12s %10s %10s %10s %10s %10s %8s | %10s %10s %8s %6s\n", "bytes", "hora us",
              "nccl us", "added us", "hora GB/s", "nccl GB/s", "ratio", "hora GB/s", "nccl GB/s",
              "ratio", "check");

  double maxAdded = -1e300, minRatio = 1e300, minPipeRatio = 1e300;
  bool anySmall = false, anyLarge = false;
  size_t wrongTotal = 0;
  for (const size_t bytes : o.sizes) {
    const size_t count = bytes / 4;
    const std::string name = "bench.gpu_allreduce." + std::to_string(bytes);
    auto hora = [&] { b.horaCall(count, name); };
    auto nccl = [&] { b.ncclCall(count); };
    for (int i = 0; i < o.warmup; ++i) hora(), nccl();
    std::vector<double> horaUs, ncclUs;
    auto block = [&](auto&& call, std::vector<double>* into) {
      const auto t0 = Clock::now();
      for (int i = 0; i < o.iters; ++i) call();
      into->push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                      o.iters);
    };
    for (int r = 0; r < o.reps; ++r) {
      if (r % 2 == 0) {
        block(hora, &horaUs);
        block(nccl, &ncclUs);
      } else {
        block(nccl, &ncclUs);
        block(hora, &horaUs);
      }
    }
    std::vector<double> horaPipeUs, ncclPipeUs;
    auto batch = [&](auto&& run, std::vector<double>* into) {
      const auto t0 = Clock::now();
      run();
      into->push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                      o.iters);
    };
    auto horaPipe = [&] { b.horaBatch(count, name, o.iters); };
    auto ncclPipe = [&] { b.ncclBatch(count, o.iters); };
    horaPipe(), ncclPipe();  // warm-up (the batch's names, fusion)
    for (int r = 0; r < o.reps; ++r) {
      if (r % 2 == 0) {
        batch(horaPipe, &horaPipeUs);
        batch(ncclPipe, &ncclPipeUs);
      } else {
        batch(ncclPipe, &ncclPipeUs);
        batch(horaPipe, &horaPipeUs);
      }
    }
    const size_t wrongHora = b.verify(count, hora);
    const size_t wrongNccl = b.verify(count, nccl);
    wrongTotal += wrongHora + wrongNccl;
    const double h = median(horaUs), n = median(ncclUs);
    const double hp = median(horaPipeUs), np = median(ncclPipeUs);
    const double added = h - n, ratio = n / h, pipeRatio = np / hp;
    if (bytes <= (size_t{64} << 10)) anySmall = true, maxAdded = std::max(maxAdded, added);
    if (bytes >= (size_t{64} << 20)) {
      anyLarge = true;
      minRatio = std::min(minRatio, ratio);
      minPipeRatio = std::min(minPipeRatio, pipeRatio);
    }
    std::printf(" %12zu %10.2f %10.2f %10.2f %10.2f %10.2f %8.3f | %10.2f %10.2f %8.3f %6s\n",
                bytes, h, n, added, bytes / h / 1e3, bytes / n / 1e3, ratio, bytes / hp / 1e3,
                bytes / np / 1e3, pipeRatio, wrongHora + wrongNccl == 0 ? "ok" : "WRONG");
    if (wrongHora + wrongNccl != 0)
      std::printf("# WRONG at %zu bytes: %zu elements from hora, %zu from NCCL\n", bytes, wrongHora,
                  wrongNccl);
    std::fflush(stdout);
  }

  std::printf("\n");
  if (anySmall)
    std::printf("max added latency at <= 64 KiB: %.2f us (target <= 20) %s\n", maxAdded,
                maxAdded <= 20.0 ? "MET" : "NOT MET");
  else
    std::printf("max added latency at <= 64 KiB: n/a (no size <= 64 KiB ran)\n");
  if (anyLarge) {
    std::printf(
        "min bandwidth ratio at >= 64 MiB, back to back (as nccl-tests): %.3f "
        "(target >= 0.97) %s\n",
        minPipeRatio, minPipeRatio >= 0.97 ? "MET" : "NOT MET");
    std::printf("min bandwidth ratio at >= 64 MiB, one call at a time: %.3f\n", minRatio);
  } else
    std::printf("min bandwidth ratio at >= 64 MiB: n/a (no size >= 64 MiB ran)\n");
  if (wrongTotal) std::printf("WRONG: %zu elements in all\n", wrongTotal);

  checkHora(hora_shutdown(b.rt), "hora_shutdown");
  checkNccl(ncclCommDestroy(b.comm), "ncclCommDestroy");
  checkCuda(cudaStreamDestroy(b.stream), "cudaStreamDestroy");
  cudaFree(b.in);
  cudaFree(b.out);
  return wrongTotal == 0 ? 0 : 1;
}
