#include "bench_options.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

namespace hora_bench {

void usage(const char* argv0) {
  std::printf(
      "usage: %s [--quick] [--sizes LIST] [--iters N] [--warmup N] [--steps N]\n"
      "          [--step-warmup N] [--lat-iters N] [--lat-warmup N] [--sections LIST]\n"
      "          [--shapes FILE] [--json FILE]\n"
      "  --sizes LIST     comma list of byte sizes or MIN:MAX[:FACTOR] ranges (suffix K/M/G),\n"
      "                   e.g. 4:64M (default, x4), 1M,4M, 4:1M:x2\n"
      "  --iters N        timed iterations per sweep size (default: by size, 10..200)\n"
      "  --steps N        timed ResNet-50 steps (default 10; warm-up 2)\n"
      "  --lat-iters N    timed 4-byte iterations (default 2000; warm-up 200)\n"
      "  --sections LIST  any of sweep,fused,latency (default all)\n"
      "  --shapes FILE    gradient shapes (default %s)\n"
      "  --json FILE      also write all results as JSON (rank 0)\n"
      "  --quick          fewer sizes and iterations (CI smoke)\n"
      "Run as N ranks with HORA_RANK/HORA_SIZE/HORA_STORE_ADDR/HORA_STORE_PORT set\n"
      "(bench/run_bench.sh -np N does that).\n",
      argv0, HORA_BENCH_SHAPES_DEFAULT);
}

namespace {

size_t parseBytes(const std::string& s) {
  if (s.empty()) throw std::runtime_error("empty size");
  size_t pos = 0;
  unsigned long long v = std::stoull(s, &pos);
  std::string suf = s.substr(pos);
  unsigned long long mul = 1;
  if (suf == "" || suf == "B" || suf == "b")
    mul = 1;
  else if (suf == "K" || suf == "k" || suf == "KiB")
    mul = 1ull << 10;
  else if (suf == "M" || suf == "m" || suf == "MiB")
    mul = 1ull << 20;
  else if (suf == "G" || suf == "g" || suf == "GiB")
    mul = 1ull << 30;
  else
    throw std::runtime_error("bad size suffix in '" + s + "'");
  return static_cast<size_t>(v * mul);
}

std::vector<size_t> parseSizes(const std::string& text) {
  std::vector<size_t> sizes;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    std::vector<std::string> parts;
    std::stringstream is(item);
    std::string p;
    while (std::getline(is, p, ':')) parts.push_back(p);
    if (parts.size() == 1) {
      sizes.push_back(parseBytes(parts[0]));
    } else if (parts.size() == 2 || parts.size() == 3) {
      size_t lo = parseBytes(parts[0]), hi = parseBytes(parts[1]);
      size_t f = 4;
      if (parts.size() == 3) {
        std::string fs = parts[2];
        if (!fs.empty() && (fs[0] == 'x' || fs[0] == 'X')) fs = fs.substr(1);
        f = std::stoull(fs);
      }
      if (f < 2 || lo == 0 || lo > hi) throw std::runtime_error("bad range '" + item + "'");
      for (size_t s = lo; s <= hi; s *= f) sizes.push_back(s);
    } else {
      throw std::runtime_error("bad size item '" + item + "'");
    }
  }
  for (size_t s : sizes)
    if (s < 4 || s % 4 != 0)
      throw std::runtime_error("sizes must be positive multiples of 4 bytes (float32)");
  if (sizes.empty()) throw std::runtime_error("no sizes");
  return sizes;
}

void parseOrThrow(int argc, char** argv, Options* out) {
  Options& o = *out;
  bool sizesGiven = false;
  std::string sizesText;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("option " + a + " needs a value");
      return argv[++i];
    };
    auto nextInt = [&]() -> int {
      std::string v = next();
      char* end = nullptr;
      long x = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || x < 0 || x > 100000000)
        throw std::runtime_error("option " + a + ": bad number '" + v + "'");
      return static_cast<int>(x);
    };
    if (a == "--quick")
      o.quick = true;
    else if (a == "--sizes")
      sizesGiven = true, sizesText = next();
    else if (a == "--iters")
      o.iters = nextInt();
    else if (a == "--warmup")
      o.warmup = nextInt();
    else if (a == "--steps")
      o.steps = nextInt();
    else if (a == "--step-warmup")
      o.stepWarmup = nextInt();
    else if (a == "--lat-iters")
      o.latIters = nextInt();
    else if (a == "--lat-warmup")
      o.latWarmup = nextInt();
    else if (a == "--json")
      o.json = next();
    else if (a == "--shapes")
      o.shapes = next();
    else if (a == "--sections") {
      std::string v = next();
      o.sweep = o.fused = o.latency = false;
      std::stringstream ss(v);
      std::string s;
      while (std::getline(ss, s, ',')) {
        if (s == "sweep")
          o.sweep = true;
        else if (s == "fused")
          o.fused = true;
        else if (s == "latency")
          o.latency = true;
        else
          throw std::runtime_error("unknown section '" + s + "' (expected sweep, fused, latency)");
      }
    } else if (a == "-h" || a == "--help") {
      o.help = true;
      return;
    } else {
      throw std::runtime_error("unknown argument '" + a + "'");
    }
  }
  try {
    o.sizes = parseSizes(sizesGiven ? sizesText : (o.quick ? "4:4M:16" : "4:64M:4"));
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("--sizes: ") + e.what());
  }
  if (o.steps == 0) o.steps = o.quick ? 2 : 10;
  if (o.stepWarmup < 0) o.stepWarmup = o.quick ? 1 : 2;
  if (o.latIters == 0) o.latIters = o.quick ? 200 : 2000;
  if (o.latWarmup < 0) o.latWarmup = o.quick ? 20 : 200;
}

}  // namespace

bool parseArgs(int argc, char** argv, Options* o, std::string* error) {
  try {
    parseOrThrow(argc, argv, o);
    return true;
  } catch (const std::exception& e) {
    *error = e.what();
    return false;
  }
}

}  // namespace hora_bench
