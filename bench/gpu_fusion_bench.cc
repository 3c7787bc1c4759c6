// gpu-fusion-bench: how fast libhora_cuda.so packs ResNet-50's gradients
// into a fusion buffer and unpacks them again, against the device's own copy
// bandwidth.
//
// Three measurements on one stream of the plugin, all for the 161 float32
// gradients of bench/resnet50_grad_shapes.txt (102.2 MB):
//   reference   one cudaMemcpyAsync device-to-device of the whole 102.2 MB
//   fused       pack (161 tensors -> fusion buffer) + unpack (-> 161 tensors)
//               with batched_scale_copy: one kernel launch each; once with
//               scale 1 both ways, once with the unpack scaled by 1/8 (an
//               average over 8 ranks)
//   per-tensor  the same pack + unpack as 2 x 161 cudaMemcpyAsync calls
// Bandwidth counts bytes read plus bytes written: a copy of B bytes moves 2B,
// so pack + unpack of the gradients moves 4 x 102.2 MB per iteration. Times
// are wall-clock per iteration over back-to-back iterations on the stream
// (host launch cost included, as a training step sees it). The ratios printed
// last are fused / reference (the fusion kernel's share of the copy
// bandwidth) and fused / per-tensor.
//
// Everything goes through the plugin's C table (dlopen, like libhora), so
// this builds without CUDA headers. Exit status: 0 results correct, 1 wrong
// results or a plugin error, 2 bad arguments, 77 no CUDA device.
#include <dlfcn.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/shapes_file.h"
#include "ops/gpu/hora_gpu_plugin.h"

#ifndef HORA_CUDA_PLUGIN_PATH
#define HORA_CUDA_PLUGIN_PATH "libhora_cuda.so"
#endif
#ifndef HORA_BENCH_SHAPES_DEFAULT
#define HORA_BENCH_SHAPES_DEFAULT "bench/resnet50_grad_shapes.txt"
#endif

namespace {

const hora_gpu_plugin_v1_t* g = nullptr;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "gpu-fusion-bench: %s%s%s\n", what.c_str(), g ? ": " : "",
               g ? g->last_error() : "");
  std::exit(1);
}

void check(int rc, const char* what) {
  if (rc != 0) die(what);
}

struct Options {
  std::string plugin = HORA_CUDA_PLUGIN_PATH;
  std::string shapes = HORA_BENCH_SHAPES_DEFAULT;
  int iters = 100;
  int warmup = 10;
  int device = 0;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "gpu-fusion-bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    auto count = [&](long long lo, long long hi) {
      // Whole numbers only: atoi read "x" as 0 and "5x" as 5.
      const std::string t = next();
      char* end = nullptr;
      const long long v = std::strtoll(t.c_str(), &end, 10);
      if (t.empty() || *end != '\0' || v < lo || v > hi) {
        std::fprintf(stderr,
                     "gpu-fusion-bench: %s expects an integer from %lld to %lld, got '%s'\n",
                     a.c_str(), lo, hi, t.c_str());
        std::exit(2);
      }
      return static_cast<int>(v);
    };
    if (a == "--plugin") {
      o.plugin = next();
    } else if (a == "--shapes") {
      o.shapes = next();
    } else if (a == "--iters") {
      o.iters = count(1, 100000000);
    } else if (a == "--warmup") {
      o.warmup = count(0, 100000000);
    } else if (a == "--device") {
      o.device = count(0, 1023);
    } else {
      std::fprintf(stderr,
                   "usage: gpu-fusion-bench [--shapes FILE] [--iters N] [--warmup N] "
                   "[--device D] [--plugin PATH]\n"
                   "  --shapes FILE  gradient shapes (default %s)\n"
                   "  --iters N      timed iterations per measurement (default 100)\n"
                   "  --warmup N     untimed iterations first (default 10)\n"
                   "  --device D     CUDA device (default 0)\n"
                   "  --plugin PATH  libhora_cuda.so to load (default %s)\n",
                   HORA_BENCH_SHAPES_DEFAULT, HORA_CUDA_PLUGIN_PATH);
      std::exit(a == "--help" || a == "-h" ? 0 : 2);
    }
  }
  if (o.iters < 1 || o.warmup < 0) {
    std::fprintf(stderr, "gpu-fusion-bench: --iters must be >= 1 and --warmup >= 0\n");
    std::exit(2);
  }
  return o;
}

std::vector<size_t> readShapes(const std::string& path) {
  std::vector<hora_bench::TensorShape> shapes;
  std::string error;
  if (!hora_bench::readShapeFile(path, &shapes, &error)) die(error + " (use --shapes FILE)");
  std::vector<size_t> counts;
  for (const auto& t : shapes) counts.push_back(t.count);
  return counts;
}

// Seconds per iteration of `body` (which enqueues work on `stream`).
template <typename Body>
double timeIt(const Options& o, hora_gpu_stream_t stream, Body&& body) {
  for (int i = 0; i < o.warmup; ++i) body();
  check(g->stream_synchronize(stream), "stream_synchronize");
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.iters; ++i) body();
  check(g->stream_synchronize(stream), "stream_synchronize");
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(t1 - t0).count() / o.iters;
}

void report(const char* what, double seconds, double bytesMoved) {
  std::printf("  %-46s %10.1f us %10.1f GB/s\n", what, seconds * 1e6, bytesMoved / seconds / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  void* lib = dlopen(o.plugin.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) die(std::string("dlopen: ") + dlerror());
  auto get = reinterpret_cast<hora_gpu_plugin_get_fn>(dlsym(lib, HORA_GPU_PLUGIN_ENTRY));
  if (get == nullptr || (g = get(HORA_GPU_PLUGIN_ABI_VERSION)) == nullptr) {
    die(o.plugin + " does not provide GPU plugin ABI version 1");
  }
  int devices = 0;
  if (g->device_count(&devices) != 0 || devices <= o.device) {
    std::printf("gpu-fusion-bench: skipped, no CUDA device %d: %s\n", o.device,
                devices > 0 ? "out of range" : g->last_error());
    return 77;
  }

  const std::vector<size_t> counts = readShapes(o.shapes);
  std::vector<size_t> at;  // each gradient 256-byte aligned, like a caching allocator
  size_t arena = 0;
  size_t total = 0;
  for (size_t n : counts) {
    at.push_back(arena);
    arena += (n * 4 + 255) / 256 * 256;
    total += n;
  }
  const size_t payload = total * 4;

  hora_gpu_stream_t stream = nullptr;
  check(g->stream_create(o.device, &stream), "stream_create");
  char* grads = nullptr;
  char* out = nullptr;
  char* fusion = nullptr;
  check(g->device_alloc(o.device, arena, reinterpret_cast<void**>(&grads)), "device_alloc");
  check(g->device_alloc(o.device, arena, reinterpret_cast<void**>(&out)), "device_alloc");
  check(g->device_alloc(o.device, payload, reinterpret_cast<void**>(&fusion)), "device_alloc");
  float* host = nullptr;
  check(g->host_alloc_pinned(arena, reinterpret_cast<void**>(&host)), "host_alloc_pinned");
  for (size_t i = 0; i < arena / 4; ++i) host[i] = static_cast<float>(i % 4093) - 2046.0f;
  check(g->memcpy_async(grads, host, arena, stream), "memcpy_async");

  std::vector<hora_gpu_copy_t> pack;
  std::vector<hora_gpu_copy_t> unpack;
  size_t offset = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    pack.push_back({fusion + offset, grads + at[i], counts[i]});
    unpack.push_back({out + at[i], fusion + offset, counts[i]});
    offset += counts[i] * 4;
  }

  std::printf("gpu-fusion-bench: %s, device %d of %d\n", g->name, o.device, devices);
  std::printf(
      "ResNet-50 gradients: %zu tensors, %zu float32 values (%.1f MB); %d iterations "
      "after %d warm-up\n",
      counts.size(), total, payload / 1e6, o.iters, o.warmup);
  std::printf("GB/s counts bytes read + bytes written (a copy of B bytes moves 2B)\n\n");

  const double ref = timeIt(
      o, stream, [&] { check(g->memcpy_async(out, fusion, payload, stream), "memcpy_async"); });
  report("reference: 1 cudaMemcpyAsync D2D (102 MB)", ref, 2.0 * payload);

  auto fused = [&](double unpackScale) {
    check(g->batched_scale_copy(HORA_GPU_DTYPE_FLOAT32, pack.data(), pack.size(), 1.0, stream),
          "batched_scale_copy (pack)");
    check(g->batched_scale_copy(HORA_GPU_DTYPE_FLOAT32, unpack.data(), unpack.size(), unpackScale,
                                stream),
          "batched_scale_copy (unpack)");
  };
  const double fusedCopy = timeIt(o, stream, [&] { fused(1.0); });
  report("fused pack + unpack (batched_scale_copy)", fusedCopy, 4.0 * payload);
  const double fusedScaled = timeIt(o, stream, [&] { fused(0.125); });
  report("fused pack + unpack, unpack scaled by 1/8", fusedScaled, 4.0 * payload);

  // The scaled run went last: check what it left in `out`.
  std::vector<float> got(arena / 4);
  check(g->memcpy_async(got.data(), out, arena, stream), "memcpy_async");
  check(g->stream_synchronize(stream), "stream_synchronize");
  size_t wrong = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    for (size_t j = 0; j < counts[i]; ++j) {
      const size_t k = at[i] / 4 + j;
      if (got[k] != host[k] * 0.125f) ++wrong;
    }
  }

  const double perTensor = timeIt(o, stream, [&] {
    for (const hora_gpu_copy_t& c : pack) {
      check(g->memcpy_async(c.dst, c.src, c.count * 4, stream), "memcpy_async");
    }
    for (const hora_gpu_copy_t& c : unpack) {
      check(g->memcpy_async(c.dst, c.src, c.count * 4, stream), "memcpy_async");
    }
  });
  report("per-tensor: 2 x 161 cudaMemcpyAsync", perTensor, 4.0 * payload);

  const double fusedGBs = 4.0 * payload / fusedCopy;
  const double refGBs = 2.0 * payload / ref;
  const double perTensorGBs = 4.0 * payload / perTensor;
  std::printf("\nfused / reference bandwidth:  %.2f (target >= 0.75)\n", fusedGBs / refGBs);
  std::printf("fused / per-tensor bandwidth: %.2f\n", fusedGBs / perTensorGBs);
  if (wrong != 0) std::printf("WRONG: %zu elements differ after the scaled unpack\n", wrong);

  g->host_free_pinned(host);
  g->device_free(o.device, grads);
  g->device_free(o.device, out);
  g->device_free(o.device, fusion);
  g->stream_destroy(stream);
  return wrong == 0 ? 0 : 1;
}
