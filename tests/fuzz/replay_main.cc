// The fuzz targets without libFuzzer: replays each seed, then N deterministic
// mutations of them (bit flips, interesting lengths, truncation, insertion,
// splicing), so every build (gcc in CI included) runs the decoders on garbage.
// Built with -DHORA_SANITIZE=address, ASan/UBSan check every run.
//
// Usage: hora_fuzz_<target> [--iterations N] [--seconds S] [--seed X]
//                           [--only I] [--write-seeds DIR] [FILE...]
//   FILE...         also replay these inputs (e.g. a crash file from libFuzzer)
//   --only I        run mutation I alone (what a failure report names)
//   --write-seeds   write the seeds as files into DIR (a libFuzzer corpus) and exit
// On a crash the input is written to ./fuzz-crash-<pid> first.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_target.h"

extern "C" void __sanitizer_set_death_callback(void (*)(void)) __attribute__((weak));

namespace {

std::string g_current;  // the input being run, dumped by the crash handler
long g_iteration = -1;

void dumpCurrent() {
  char name[64];
  std::snprintf(name, sizeof name, "fuzz-crash-%d", static_cast<int>(getpid()));
  int fd = ::open(name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    ssize_t ignored = ::write(fd, g_current.data(), g_current.size());
    (void)ignored;
    ::close(fd);
  }
  char msg[160];
  int n = std::snprintf(msg, sizeof msg,
                        "fuzz replay: failed on mutation %ld (rerun with --only %ld); input saved "
                        "to %s\n",
                        g_iteration, g_iteration, name);
  ssize_t ignored = ::write(2, msg, static_cast<size_t>(n));
  (void)ignored;
}

void onSignal(int sig) {
  dumpCurrent();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

// splitmix64: tiny, seedable, the same sequence everywhere.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return n ? static_cast<size_t>(next() % n) : 0; }
};

void putU32(std::string& s, size_t at, uint32_t v, bool bigEndian) {
  for (int i = 0; i < 4 && at + i < s.size(); ++i)
    s[at + i] = static_cast<char>(bigEndian ? v >> (8 * (3 - i)) : v >> (8 * i));
}

std::string mutate(const std::vector<std::string>& seeds, Rng& rng) {
  std::string s = seeds.empty() ? std::string() : seeds[rng.below(seeds.size())];
  static const uint32_t kInteresting[] = {
      0,     1,      2,       4,          8,          0x7f,       0x80,       0xff,
      0x100, 0xffff, 0x10000, 0x7fffffff, 0x80000000, 0xfffffffe, 0xffffffff, 64u << 20};
  int rounds = 1 + static_cast<int>(rng.below(4));
  for (int k = 0; k < rounds; ++k) {
    switch (rng.below(8)) {
      case 0:  // flip a bit
        if (!s.empty()) s[rng.below(s.size())] ^= static_cast<char>(1u << rng.below(8));
        break;
      case 1:  // a random byte
        if (!s.empty()) s[rng.below(s.size())] = static_cast<char>(rng.next());
        break;
      case 2:  // an interesting 32-bit value (a length, a count), either byte order
        if (!s.empty())
          putU32(s, rng.below(s.size()), kInteresting[rng.below(std::size(kInteresting))],
                 rng.below(2));
        break;
      case 3:  // truncate
        s.resize(rng.below(s.size() + 1));
        break;
      case 4: {  // insert random bytes
        std::string ins(1 + rng.below(16), '\0');
        for (auto& c : ins) c = static_cast<char>(rng.next());
        s.insert(rng.below(s.size() + 1), ins);
        break;
      }
      case 5:  // erase a range
        if (!s.empty()) {
          size_t at = rng.below(s.size());
          s.erase(at, 1 + rng.below(s.size() - at));
        }
        break;
      case 6:  // duplicate a chunk
        if (!s.empty()) {
          size_t at = rng.below(s.size());
          std::string chunk = s.substr(at, 1 + rng.below(32));
          s.insert(rng.below(s.size() + 1), chunk);
        }
        break;
      default:  // splice with another seed
        if (!seeds.empty()) {
          const std::string& o = seeds[rng.below(seeds.size())];
          s = s.substr(0, rng.below(s.size() + 1)) + o.substr(rng.below(o.size() + 1));
        }
        break;
    }
  }
  return s;
}

void runOne(const std::string& input) {
  g_current = input;
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(g_current.data()), g_current.size());
}

}  // namespace

int main(int argc, char** argv) {
  long iterations = 20000;
  double seconds = 5;
  uint64_t seed = 14;
  long only = -1;
  std::string writeSeeds;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--iterations")
      iterations = std::atol(value());
    else if (a == "--seconds")
      seconds = std::atof(value());
    else if (a == "--seed")
      seed = std::strtoull(value(), nullptr, 0);
    else if (a == "--only")
      only = std::atol(value());
    else if (a == "--write-seeds")
      writeSeeds = value();
    else
      files.push_back(a);
  }
  std::vector<std::string> seeds = horaFuzzSeeds();
  if (!writeSeeds.empty()) {
    for (size_t i = 0; i < seeds.size(); ++i) {
      std::ofstream(writeSeeds + "/seed-" + std::to_string(i), std::ios::binary) << seeds[i];
    }
    std::printf("wrote %zu seeds to %s\n", seeds.size(), writeSeeds.c_str());
    return 0;
  }
  if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(dumpCurrent);
  for (int sig : {SIGSEGV, SIGABRT, SIGFPE, SIGBUS, SIGILL}) std::signal(sig, onSignal);

  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    runOne(std::string(std::istreambuf_iterator<char>(in), {}));
  }
  for (const auto& s : seeds) runOne(s);
  auto start = std::chrono::steady_clock::now();
  long done = 0;
  for (long i = only >= 0 ? only : 0; i < (only >= 0 ? only + 1 : iterations); ++i) {
    if (only < 0 && (i & 255) == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds)
      break;
    Rng rng{seed * 0x100000001b3ull + static_cast<uint64_t>(i)};  // mutation i alone decides it
    g_iteration = i;
    runOne(mutate(seeds, rng));
    ++done;
  }
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%zu seeds, %zu files and %ld mutations (seed %llu) ran clean in %.2f s\n",
              seeds.size(), files.size(), done, static_cast<unsigned long long>(seed), took);
  return 0;
}
