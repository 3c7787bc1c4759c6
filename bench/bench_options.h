// hora-bench's command line (bench/hora_bench.cc has the benchmark itself),
// parsed with CLI11 (as horarun's is) once on every rank before the benchmark
// starts: --flag value or --flag=value.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#ifndef HORA_BENCH_SHAPES_DEFAULT
#define HORA_BENCH_SHAPES_DEFAULT "bench/resnet50_grad_shapes.txt"
#endif

namespace hora_bench {

struct Options {
  bool quick = false;
  std::vector<size_t> sizes;  // bytes; empty: default sweep
  int iters = 0;              // sweep timed iterations per size; 0: by size
  int warmup = -1;            // sweep warm-up iterations; -1: by size
  int steps = 0;              // fused timed steps; 0: default
  int stepWarmup = -1;
  int latIters = 0;  // latency timed iterations; 0: default
  int latWarmup = -1;
  std::string json;
  std::string shapes = HORA_BENCH_SHAPES_DEFAULT;
  bool sweep = true, fused = true, latency = true;
  bool help = false;  // -h/--help: usage printed, exit 0
};

void usage(const char* argv0);
// false with *error set on a bad command line (usage is printed by the caller).
bool parseArgs(int argc, char** argv, Options* o, std::string* error);

}  // namespace hora_bench
