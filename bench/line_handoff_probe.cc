// hora-line-handoff-probe: what it costs a core to write memory that another
// core has just read, and whether the reader storing each line back
// (HORA_SHM_CLAIM_LINES, ShmBackend::claimRead) makes that write cheaper.
//
// Two threads on two CPUs hand one buffer back and forth, as a shared-memory
// slot goes between its owner and a peer: the owner copies its input into
// the buffer, the reader adds the buffer to its own data; then again. With
// --claim the reader then stores one byte of each 64-byte line back
// unchanged. Prints per size the owner's copy and the reader's pass, in
// microseconds (means over the rounds), for both ways in one run.
//
//   hora-line-handoff-probe [--sizes-kib 16,64,256,1024] [--rounds N] [--cpus A,B]
//
// No hora code: it measures the machine, not hora.
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

std::vector<long> parseList(const char* s) {
  std::vector<long> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::strtol(item.c_str(), nullptr, 10));
  return out;
}

bool pinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

// Vectorized as hora's reduction kernels are (core/reduce.cc): a scalar loop
// reads too slowly for the effect to show.
__attribute__((noinline, optimize("tree-vectorize", "vect-cost-model=dynamic"))) void addInto(
    float* out, const float* a, const float* b, size_t n) {
  for (size_t k = 0; k < n; ++k) out[k] = a[k] + b[k];
}

__attribute__((noinline)) void claim(uint8_t* p, size_t bytes) {
  for (size_t k = 0; k < bytes; k += 64)
    __atomic_store_n(p + k, __atomic_load_n(p + k, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
}

struct Result {
  double ownerUs = 0, readerUs = 0;
  bool pinned = true;
};

Result run(size_t bytes, int rounds, bool withClaim, int cpuA, int cpuB) {
  const size_t n = bytes / sizeof(float);
  std::vector<float> input(n, 1.0f), own(n, 2.0f), out(n, 0.0f);
  // The buffer both touch, aligned as a slot is.
  auto* shared = static_cast<float*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
  std::memset(shared, 0, bytes);
  std::atomic<int> written{0}, read{0};
  std::atomic<bool> pinned{true};
  Result r;
  double ownerNs = 0, readerNs = 0;
  std::thread owner([&] {
    if (!pinTo(cpuA)) pinned = false;
    for (int i = 1; i <= rounds; ++i) {
      while (read.load(std::memory_order_acquire) != i - 1) {
      }
      const auto t0 = Clock::now();
      std::memcpy(shared, input.data(), bytes);
      ownerNs += std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
      written.store(i, std::memory_order_release);
    }
  });
  std::thread reader([&] {
    if (!pinTo(cpuB)) pinned = false;
    for (int i = 1; i <= rounds; ++i) {
      while (written.load(std::memory_order_acquire) != i) {
      }
      const auto t0 = Clock::now();
      addInto(out.data(), own.data(), shared, n);
      if (withClaim) claim(reinterpret_cast<uint8_t*>(shared), bytes);
      readerNs += std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
      read.store(i, std::memory_order_release);
    }
  });
  owner.join();
  reader.join();
  std::free(shared);
  r.pinned = pinned.load();
  r.ownerUs = ownerNs / rounds / 1000.0;
  r.readerUs = readerNs / rounds / 1000.0;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<long> sizes{16, 64, 256, 1024};
  int rounds = 2000, cpuA = 0, cpuB = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--sizes-kib") {
      sizes = parseList(argv[i + 1]);
    } else if (flag == "--rounds") {
      rounds = std::atoi(argv[i + 1]);
    } else if (flag == "--cpus") {
      const std::vector<long> c = parseList(argv[i + 1]);
      if (c.size() != 2) {
        std::fprintf(stderr, "--cpus takes two CPUs, e.g. 0,1\n");
        return 2;
      }
      cpuA = static_cast<int>(c[0]);
      cpuB = static_cast<int>(c[1]);
    } else {
      std::fprintf(stderr, "usage: %s [--sizes-kib 16,64,256,1024] [--rounds N] [--cpus A,B]\n",
                   argv[0]);
      return 2;
    }
  }
  if (argc % 2 == 0 || rounds <= 0) {
    std::fprintf(stderr, "usage: %s [--sizes-kib 16,64,256,1024] [--rounds N] [--cpus A,B]\n",
                 argv[0]);
    return 2;
  }
  std::printf(
      "| KiB | owner copy, plain (us) | owner copy, claimed (us) | reader, plain (us) | "
      "reader, claiming (us) |\n|---|---|---|---|---|\n");
  for (long kib : sizes) {
    if (kib <= 0) continue;
    const size_t bytes = static_cast<size_t>(kib) << 10;
    // Interleaved: plain, claimed, plain, claimed; the mean of each pair.
    Result plain, claimed;
    for (int rep = 0; rep < 2; ++rep) {
      const Result p = run(bytes, rounds, false, cpuA, cpuB);
      const Result c = run(bytes, rounds, true, cpuA, cpuB);
      if (!p.pinned || !c.pinned) {
        std::fprintf(stderr, "could not pin to CPUs %d and %d (--cpus)\n", cpuA, cpuB);
        return 1;
      }
      plain.ownerUs += p.ownerUs / 2;
      plain.readerUs += p.readerUs / 2;
      claimed.ownerUs += c.ownerUs / 2;
      claimed.readerUs += c.readerUs / 2;
    }
    std::printf("| %ld | %.2f | %.2f | %.2f | %.2f |\n", kib, plain.ownerUs, claimed.ownerUs,
                plain.readerUs, claimed.readerUs);
  }
  return 0;
}
