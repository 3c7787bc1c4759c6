// hora-coll-bench: reducescatter, alltoall, barrier, allgather, broadcast and
// allreduce (sum, in place) through hora's C ABI, over the sizes of the
// allreduce sweep, for
// bench/collectives_bench.sh (one host: HORA_SHM=1 and HORA_SHM=0) and
// bench/multihost_coll_bench.sh (across emulated hosts), which run
// mpi-coll-bench (MPI_Reduce_scatter_block, MPI_Alltoall, MPI_Barrier,
// MPI_Allgather, MPI_Bcast, MPI_Allreduce) on the same sizes and data in the
// same run (allreduce only when --ops names it).
//
//   HORA_RANK=.. HORA_SIZE=.. HORA_STORE_ADDR=.. hora-coll-bench
//       [--ops reducescatter,alltoall,barrier] [--sizes 4,64K,1M] [--iters N]
//
// Sizes are the whole buffer of the collective (reducescatter: the input of
// `size` equal blocks; alltoall: the send buffer, one block per rank;
// allgather: the output, one block per rank; broadcast: the buffer, from
// rank 0; allreduce: the buffer), rounded down to a multiple of 4 * size bytes. Data:
// integer-valued float32 that depends on the element, rank and iteration, refilled before each
// iteration; every result element is checked exactly (outside the timing).
// Timing: steady_clock around submit + wait + free; a barrier before each
// size; mean and median over iterations, maximum over ranks (rank 0 prints).
//
// Output (rank 0): RESULT op=.. impl=hora plane=shm|gloo|$BENCH_PLANE np=N bytes=B iters=I
//   us=.. med_us=.. wrong=.. ; exit 1 on any wrong element, 2 on an error.
#include <hora/hora.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.h"

namespace {

using Clock = std::chrono::steady_clock;
bench_util::Who gWho{"hora-coll-bench"};

[[noreturn]] void fatal(const std::string& what) { bench_util::fatal(gWho, what); }
void check(hora_status_t s, const std::string& what) { bench_util::check(gWho, s, what); }

struct Tensor : bench_util::Tensor1d {
  Tensor(float* data, size_t count) : Tensor1d(data, count, DLDataType{kDLFloat, 32, 1}) {}
};

// Element i of rank r's input in iteration it: small integers, exact sums.
float value(size_t i, int r, int it) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<size_t>(r) * 13 + it * 5) % 32) -
                            16);
}

void barrier(hora_runtime_t rt) {
  hora_request_t req = nullptr;
  check(hora_barrier_async(rt, nullptr, &req), "barrier");
  check(hora_wait(req, -1), "barrier wait");
  hora_request_free(req);
}

// Max over ranks of `v` through a hora allreduce (max).
double maxOverRanks(hora_runtime_t rt, double v) {
  float x = static_cast<float>(v);
  Tensor t(&x, 1);
  hora_options_t o;
  hora_options_init(&o);
  o.op = HORA_OP_MAX;
  o.name = "bench.max";
  hora_request_t req = nullptr;
  check(hora_allreduce_async(rt, &t.t, &t.t, &o, &req), "max allreduce");
  check(hora_wait(req, -1), "max allreduce wait");
  hora_request_free(req);
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> ops = {"reducescatter", "alltoall", "barrier"};
  std::vector<size_t> sizes;
  for (size_t b = 4; b <= (size_t{16} << 20); b *= 16) sizes.push_back(b);
  int itersOverride = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--ops" && i + 1 < argc) {
      ops = bench_util::splitList(argv[++i]);
    } else if (a == "--sizes" && i + 1 < argc) {
      sizes = bench_util::parseSizes(gWho, argv[++i]);
    } else if (a == "--iters" && i + 1 < argc) {
      itersOverride = static_cast<int>(bench_util::intFlag(gWho, a, argv[++i], 1, 100000000));
    } else {
      fatal("unknown argument '" + a + "' (--ops LIST, --sizes LIST, --iters N)");
    }
  }
  int32_t rank = 0, size = 1;
  hora_runtime_t rt = bench_util::initRuntime(&gWho, &rank, &size);
  const char* shm = std::getenv("HORA_SHM");
  // BENCH_PLANE: the label of this run's configuration (multihost_coll_bench.sh).
  const char* label = std::getenv("BENCH_PLANE");
  const std::string plane = label && *label                    ? std::string(label)
                            : (shm && std::string(shm) == "0") ? "gloo"
                                                               : "shm";
  long wrongTotal = 0;
  for (const std::string& op : ops) {
    if (op != "reducescatter" && op != "alltoall" && op != "barrier" && op != "allgather" &&
        op != "broadcast" && op != "allreduce")
      fatal("unknown op " + op);
    const std::vector<size_t> opSizes = op == "barrier" ? std::vector<size_t>{0} : sizes;
    for (size_t bytes : opSizes) {
      const size_t unit = 4 * static_cast<size_t>(size);
      const size_t count = bytes / unit * unit / 4;  // elements, a multiple of size
      if (op != "barrier" && count == 0) continue;
      const int iters = itersOverride > 0
                            ? itersOverride
                            : static_cast<int>(std::clamp<size_t>(
                                  (256u << 20) / std::max<size_t>(bytes, 1), 10, 500));
      const int warmup = std::max(2, iters / 10);
      const size_t block = count / static_cast<size_t>(size);
      std::vector<float> in(count), out(count);
      std::vector<int64_t> splits(size, static_cast<int64_t>(block));
      std::vector<double> times;
      long wrong = 0;
      barrier(rt);
      for (int it = 0; it < warmup + iters; ++it) {
        // allgather: this rank's block of the global vector; broadcast: the
        // root's vector, garbage elsewhere; the others: this rank's input.
        if (op == "allgather") {
          for (size_t i = 0; i < block; ++i) in[i] = value(block * rank + i, rank, it);
        } else if (op == "broadcast") {
          for (size_t i = 0; i < count; ++i) in[i] = rank == 0 ? value(i, 0, it) : -99.0f;
        } else {
          for (size_t i = 0; i < count; ++i) in[i] = value(i, rank, it);
        }
        Tensor t(in.data(), op == "allgather" ? block : count);
        hora_options_t o;
        hora_options_init(&o);
        const std::string name = "bench." + op;
        o.name = name.c_str();
        hora_request_t req = nullptr;
        const auto t0 = Clock::now();
        if (op == "reducescatter") {
          check(hora_reducescatter_async(rt, &t.t, &o, &req), "reducescatter");
        } else if (op == "alltoall") {
          check(hora_alltoall_async(rt, &t.t, splits.data(), size, &o, &req), "alltoall");
        } else if (op == "allgather") {
          check(hora_allgather_async(rt, &t.t, &o, &req), "allgather");
        } else if (op == "broadcast") {
          o.root = 0;
          check(hora_broadcast_async(rt, &t.t, &o, &req), "broadcast");
        } else if (op == "allreduce") {
          check(hora_allreduce_async(rt, &t.t, &t.t, &o, &req), "allreduce");
        } else {
          check(hora_barrier_async(rt, &o, &req), "barrier");
        }
        check(hora_wait(req, -1), op + " wait");
        const auto t1 = Clock::now();
        if (op != "barrier") {
          const float* r = in.data();  // broadcast, allreduce: in place
          if (op != "broadcast" && op != "allreduce") {
            const DLTensor* res = nullptr;
            check(hora_request_output(req, &res), "output");
            r = static_cast<const float*>(res->data);
          }
          // The op decided once, not per element: a slow check here delays this
          // rank's next call, which its peers' timings would then include
          // (mpi-coll-bench's check loop switches on an int the same way).
          const bool reduced = op == "reducescatter" || op == "allreduce";
          // allreduce: every rank checks its block of the sum, together all of it.
          const size_t at = op == "allreduce" ? block * rank : 0;
          const bool gathered = op == "allgather" || op == "broadcast";
          for (size_t i = 0; i < block; ++i) {
            if (gathered) {
              // Element q*block+i: rank q's block (allgather), the root's vector (broadcast).
              for (int q = 0; q < size; ++q) {
                const size_t g = block * q + i;
                if (r[g] != value(g, op == "allgather" ? q : 0, it)) ++wrong;
              }
            } else if (reduced) {
              float want = 0;
              for (int q = 0; q < size; ++q) want += value(block * rank + i, q, it);
              if (r[at + i] != want) ++wrong;
            } else {
              for (int q = 0; q < size; ++q)
                if (r[q * block + i] != value(block * rank + i, q, it)) ++wrong;
            }
          }
        }
        hora_request_free(req);
        if (it >= warmup)
          times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
      double mean = 0;
      for (double x : times) mean += x;
      mean /= static_cast<double>(times.size());
      std::sort(times.begin(), times.end());
      double med = times[times.size() / 2];
      mean = maxOverRanks(rt, mean);
      med = maxOverRanks(rt, med);
      wrong = static_cast<long>(maxOverRanks(rt, static_cast<double>(wrong)));
      wrongTotal += wrong;
      if (rank == 0)
        std::printf(
            "RESULT op=%s impl=hora plane=%s np=%d bytes=%zu iters=%d us=%.2f med_us=%.2f "
            "wrong=%ld\n",
            op.c_str(), plane.c_str(), size, count * 4, iters, mean, med, wrong);
      std::fflush(stdout);
    }
  }
  check(hora_shutdown(rt), "hora_shutdown");
  return wrongTotal ? 1 : 0;
}
