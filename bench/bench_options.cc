#include "bench_options.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

namespace hora_bench {

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

// A count: decimal digits only, 0..1e8 ("1e3", "0x10", "-1" and "" are refused).
int count(const std::string& flag, const std::string& v) {
  if (v.empty() || v.size() > 9 || v.find_first_not_of("0123456789") != std::string::npos ||
      std::stol(v) > 100000000)
    throw std::runtime_error(flag + " expects an integer from 0 to 100000000, got '" + v + "'");
  return static_cast<int>(std::stol(v));
}

// hora-bench's flags as a CLI11 App filling *o (and the --sizes text, parsed
// after every flag: its default depends on --quick).
void defineFlags(CLI::App& app, Options* o, std::string* sizesText) {
  app.set_help_flag();  // -h/--help sets Options::help (usage printed by the caller)
  app.footer(
      "Run as N ranks with HORA_RANK/HORA_SIZE/HORA_STORE_ADDR/HORA_STORE_PORT set\n"
      "(bench/run_bench.sh -np N does that).");
  app.add_flag("--quick", o->quick, "fewer sizes and iterations (CI smoke)");
  app.add_option("--sizes", *sizesText,
                 "comma list of byte sizes or MIN:MAX[:FACTOR] ranges (suffix K/M/G), e.g. 4:64M "
                 "(default, x4), 1M,4M, 4:1M:x2")
      ->type_name("LIST");
  struct Count {
    const char* flag;
    int* value;
    const char* doc;
  };
  const Count counts[] = {
      {"--iters", &o->iters, "timed iterations per sweep size (default: by size, 10..200)"},
      {"--warmup", &o->warmup, "sweep warm-up iterations (default: by size)"},
      {"--steps", &o->steps, "timed ResNet-50 steps (default 10)"},
      {"--step-warmup", &o->stepWarmup, "ResNet-50 warm-up steps (default 2)"},
      {"--lat-iters", &o->latIters, "timed 4-byte iterations (default 2000)"},
      {"--lat-warmup", &o->latWarmup, "4-byte warm-up iterations (default 200)"},
  };
  for (const Count& c : counts) {
    const std::string flag = c.flag;
    int* value = c.value;
    app.add_option_function<std::string>(
           flag, [flag, value](const std::string& v) { *value = count(flag, v); }, c.doc)
        ->type_name("N");
  }
  app.add_option_function<std::string>(
         "--sections",
         [o](const std::string& v) {
           o->sweep = o->fused = o->latency = false;
           std::stringstream ss(v);
           std::string s;
           while (std::getline(ss, s, ',')) {
             if (s == "sweep")
               o->sweep = true;
             else if (s == "fused")
               o->fused = true;
             else if (s == "latency")
               o->latency = true;
             else
               throw std::runtime_error("--sections: unknown section '" + s +
                                        "' (expected sweep, fused, latency)");
           }
         },
         "any of sweep,fused,latency (default all)")
      ->type_name("LIST");
  app.add_option("--shapes", o->shapes, "gradient shapes (default " HORA_BENCH_SHAPES_DEFAULT ")")
      ->type_name("FILE");
  app.add_option("--json", o->json, "also write all results as JSON (rank 0)")->type_name("FILE");
  app.add_flag("-h,--help", o->help, "print this help");
}

void parseOrThrow(int argc, char** argv, Options* out) {
  Options& o = *out;
  std::string sizesText;
  CLI::App app("hora-bench: allreduce sweep, fused ResNet-50 steps and latency", "hora-bench");
  defineFlags(app, &o, &sizesText);
  app.parse(argc, argv);
  if (o.help) return;
  const bool sizesGiven = app.count("--sizes") > 0;
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

void usage(const char* argv0) {
  Options o;
  std::string sizesText;
  CLI::App app("hora-bench: allreduce sweep, fused ResNet-50 steps and latency", argv0);
  defineFlags(app, &o, &sizesText);
  std::fputs(app.help().c_str(), stdout);
}

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
