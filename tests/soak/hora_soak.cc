// hora_soak: one rank of the fault-injecting soak (issue 14), a program over the public C ABI
// only (hora/hora.h and DLPack), started by horarun; scripts/soak.py drives many jobs of it.
//
// Every rank draws the same schedule from --seed: each step is a batch of 1-6 collectives in
// flight at once (allreduce, so fusion happens, grouped allreduce, allgather with uneven rows,
// broadcast from a random root, alltoall with uneven splits, reducescatter, and a ring exchange
// through point-to-point send/recv posted as one batch) over the global set or one of two sub-sets,
// with every dtype and valid op, 0..64 Ki elements, names from a small pool (a pool name always
// carries the same signature, so the response cache hits) or fresh. Ranks outside a step's set skip
// it. Inputs are small integers, so sums are exact in every dtype: each rank computes every peer's
// input and checks every element of every result.
//
// --fault KIND --fault-rank F --fault-step K makes rank F misbehave at step K (a global step):
//   kill9 / sigstop: raise SIGKILL / SIGSTOP on itself, before or after submitting the step;
//   mismatch: submit the step's first tensor with another trailing dimension or dtype;
//   missing: never submit that tensor; then wait until every survivor has written its stall
//     error to the shared report file (all ranks run on one host) before going on. Going on
//     earlier would be a race in the test, not in hora: the step's pool name, submitted again
//     by this rank a few steps later, legitimately completes the survivors' pending request
//     (names identify tensors), with data of another step.
// A fault's step has no point-to-point exchange (two survivors' exchange may complete before
// they learn of the fault; every survivor must fail in that step).
// The faulty rank writes its wall-clock fault time first. The others must get an error (never a
// hang or a wrong result); they write it with its wall-clock time, and the driver checks that
// it names rank F (and the tensor) and computes the time to error. After a mismatch or a missing
// tensor the job goes on and must stay exact; after kill9/sigstop the survivors stop.
//
// Output: one line per event, each a single write(2) (so a rank killed later loses nothing), to
// --report FILE (appended; "-" = stdout). Exit status: 0, 1 if any result was wrong, 2 on a
// usage error or a failed call outside the schedule, 3 when a failure ended the schedule.
// Single-threaded except hora's own threads.
#include <dlpack/dlpack.h>
#include <fcntl.h>
#include <hora/hora.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

// ---- deterministic randomness: every rank draws the same values from the same key ----
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(mix(seed)) {}
  uint64_t next() { return s = mix(s); }
  int64_t below(int64_t n) { return n > 0 ? static_cast<int64_t>(next() % uint64_t(n)) : 0; }
  bool chance(int percent) { return below(100) < percent; }
};

double wallNow() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return double(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

int gReport = 1;
// One event line, written whole.
void report(const std::string& line) {
  std::string s = line + "\n";
  const char* p = s.data();
  size_t n = s.size();
  while (n > 0) {
    ssize_t w = write(gReport, p, n);
    if (w <= 0) return;
    p += w;
    n -= size_t(w);
  }
}

// ---- dtypes and values ----
struct Dtype {
  const char* name;
  uint8_t code;
  uint8_t bits;
};
const Dtype kDtypes[] = {{"uint8", kDLUInt, 8},       {"int8", kDLInt, 8},
                         {"int16", kDLInt, 16},       {"int32", kDLInt, 32},
                         {"int64", kDLInt, 64},       {"float16", kDLFloat, 16},
                         {"bfloat16", kDLBfloat, 16}, {"float32", kDLFloat, 32},
                         {"float64", kDLFloat, 64},   {"bool", 6 /* kDLBool, DLPack 0.8 */, 8}};
constexpr int kNumDtypes = 10;
constexpr int kBool = 9, kUint8 = 0;
const char* kOpNames[] = {"sum", "average", "min", "max", "product"};

// Small integers only, so every conversion below is exact.
uint16_t toHalf(double v) {
  if (v == 0) return 0;
  uint16_t sign = v < 0 ? 0x8000 : 0;
  double a = std::fabs(v);
  int e = 0;
  double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  return uint16_t(sign | ((e - 1 + 15) << 10) |
                  (uint16_t(std::lround((m * 2 - 1) * 1024)) & 0x3ff));
}
double fromHalf(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}
uint16_t toBf16(double v) {
  float f = float(v);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t(u >> 16);
}
double fromBf16(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
void store(int dt, void* base, int64_t i, double v) {
  switch (dt) {
    case 0:
      static_cast<uint8_t*>(base)[i] = uint8_t(v);
      break;
    case 1:
      static_cast<int8_t*>(base)[i] = int8_t(v);
      break;
    case 2:
      static_cast<int16_t*>(base)[i] = int16_t(v);
      break;
    case 3:
      static_cast<int32_t*>(base)[i] = int32_t(v);
      break;
    case 4:
      static_cast<int64_t*>(base)[i] = int64_t(v);
      break;
    case 5:
      static_cast<uint16_t*>(base)[i] = toHalf(v);
      break;
    case 6:
      static_cast<uint16_t*>(base)[i] = toBf16(v);
      break;
    case 7:
      static_cast<float*>(base)[i] = float(v);
      break;
    case 8:
      static_cast<double*>(base)[i] = v;
      break;
    default:
      static_cast<uint8_t*>(base)[i] = v != 0;
      break;
  }
}
double load(int dt, const void* base, int64_t i) {
  switch (dt) {
    case 0:
      return static_cast<const uint8_t*>(base)[i];
    case 1:
      return static_cast<const int8_t*>(base)[i];
    case 2:
      return static_cast<const int16_t*>(base)[i];
    case 3:
      return static_cast<const int32_t*>(base)[i];
    case 4:
      return double(static_cast<const int64_t*>(base)[i]);
    case 5:
      return fromHalf(static_cast<const uint16_t*>(base)[i]);
    case 6:
      return fromBf16(static_cast<const uint16_t*>(base)[i]);
    case 7:
      return static_cast<const float*>(base)[i];
    case 8:
      return static_cast<const double*>(base)[i];
    default:
      return static_cast<const uint8_t*>(base)[i];
  }
}

// ---- the schedule ----
// kP2p: a ring exchange through point-to-point (each set rank sends its input
// to the next and receives the previous one's), posted as one batch.
enum Kind {
  kAllreduce,
  kGrouped,
  kAllgather,
  kBroadcast,
  kAlltoall,
  kReducescatter,
  kP2p,
  kNumKinds
};
const char* kKindNames[] = {"allreduce", "grouped",       "allgather", "broadcast",
                            "alltoall",  "reducescatter", "p2p"};

// One collective of a step, identical on every rank (rank-dependent parts are functions of it).
struct Op {
  Kind kind;
  int dtype;
  int op;                       // reductions only
  int groupSize;                // grouped: tensors
  int64_t rows, cols;           // allreduce/broadcast/reducescatter/alltoall shape per rank
  std::vector<int64_t> rowsOf;  // allgather: rows of each set rank
  std::vector<int64_t> splits;  // alltoall: splits[src * n + dst]
  int root;
  uint64_t dataKey;  // inputs of this step's op
  std::string name;
};

int64_t drawCount(Rng& r) {
  if (r.chance(8)) return 0;
  int k = int(r.below(17));  // log-uniform up to 64 Ki
  return r.below(int64_t(1) << k) + (k > 0 ? 1 : 0);
}

// The signature of an op (everything but data), drawn from key; n = set size.
Op drawOp(uint64_t key, int n) {
  Rng r(key);
  Op o{};
  static const int kKindWeights[kNumKinds] = {25, 10, 15, 14, 12, 14, 10};
  int64_t w = r.below(100);
  int k = 0;
  while (w >= kKindWeights[k]) w -= kKindWeights[k++];
  o.kind = Kind(k);
  if (o.kind == kP2p && n < 2) o.kind = kAllreduce;  // no peer in a set of one
  o.dtype = int(r.below(kNumDtypes));
  o.groupSize = 2 + int(r.below(3));
  const bool reduces = o.kind == kAllreduce || o.kind == kGrouped || o.kind == kReducescatter;
  if (o.kind == kReducescatter) {
    o.op = r.chance(50) ? 0 : 1;
  } else {
    o.op = int(r.below(5));
  }
  if (reduces && o.dtype == kBool && o.op == 1) o.op = 0;  // bool averages are not meaningful
  int64_t count = drawCount(r);
  o.cols = 1 + r.below(4);
  o.rows = count / o.cols;
  o.root = int(r.below(n));
  o.rowsOf.resize(n);
  for (int s = 0; s < n; ++s) o.rowsOf[s] = r.chance(15) ? 0 : r.below(o.rows / n + 2);
  o.splits.resize(size_t(n) * n);
  for (int s = 0; s < n; ++s) {
    // Uneven: random cut points of a per-sender row count.
    int64_t left = r.below(o.rows / n + 2);
    for (int d = 0; d < n; ++d) {
      int64_t take = d == n - 1 ? left : r.below(left + 1);
      o.splits[size_t(s) * n + d] = take;
      left -= take;
    }
  }
  return o;
}

// Input element i of set rank s (of n), of tensor t of an op: small integers chosen so that
// sums, products and averages are exact in every dtype.
double inputValue(const Op& o, int t, int s, int n, int64_t i) {
  uint64_t h = mix(o.dataKey ^ (uint64_t(t) << 48) ^ (uint64_t(s) << 40));
  uint64_t v = (uint64_t(i) * (h | 1) + (h >> 20)) >> 7;
  if (o.dtype == kBool) return double(v & 1);
  const bool reduces = o.kind == kAllreduce || o.kind == kGrouped || o.kind == kReducescatter;
  const bool unsignedType = o.dtype == kUint8;
  if (reduces && o.op == 4) {  // product: |result| <= 16
    static const int kSigned[3] = {1, 2, -1}, kUnsigned[3] = {1, 2, 1};
    return (unsignedType ? kUnsigned : kSigned)[v % 3];
  }
  double x = unsignedType ? double(v % 16) : double(int(v % 17) - 8);
  if (reduces && o.op == 1) x = unsignedType ? double(v % 8) * n : double(int(v % 9) - 4) * n;
  return x;
}

// The reduced value at element i over the n set ranks, as hora documents it (core/reduce.h);
// with `from`, over the ranks it marks only (a join step: joined ranks contribute the op's
// identity; never an average there).
double reduced(const Op& o, int t, int n, int64_t i, const std::vector<bool>* from = nullptr) {
  int first = 0;
  while (from && !(*from)[size_t(first)]) ++first;
  double acc = inputValue(o, t, first, n, i);
  for (int s = first + 1; s < n; ++s) {
    if (from && !(*from)[size_t(s)]) continue;
    double x = inputValue(o, t, s, n, i);
    switch (o.op) {
      case 0:
      case 1:
        acc = o.dtype == kBool ? double(acc != 0 || x != 0) : acc + x;
        break;
      case 2:
        acc = o.dtype == kBool ? double(acc != 0 && x != 0) : std::min(acc, x);
        break;
      case 3:
        acc = o.dtype == kBool ? double(acc != 0 || x != 0) : std::max(acc, x);
        break;
      default:
        acc = o.dtype == kBool ? double(acc != 0 && x != 0) : acc * x;
        break;
    }
  }
  if (o.op == 1) {
    // Inputs are multiples of n, so the quotient is exact; float32 multiplies by (float)(1/n).
    if (o.dtype == 7) return double(float(acc) * float(1.0 / n));
    if (o.dtype == 8) return acc * (1.0 / n);
    return std::trunc(acc / n);
  }
  return acc;
}

size_t elemBytes(int dt) { return kDtypes[dt].bits / 8; }

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;
  DLTensor dl{};
  void make(int dt, std::vector<int64_t> s) {
    shape = std::move(s);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    bytes.assign(size_t(n) * elemBytes(dt) + 1, 0);  // +1: never a NULL data pointer
    dl = DLTensor{};
    dl.data = bytes.data();
    dl.device = {kDLCPU, 0};
    dl.ndim = int32_t(shape.size());
    dl.dtype = {kDtypes[dt].code, kDtypes[dt].bits, 1};
    dl.shape = shape.data();
  }
  int64_t count() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

struct Args {
  uint64_t seed = 1;
  int64_t steps = 1000;
  std::string fault = "none";
  int faultRank = -1;
  int64_t faultStep = -1;
  std::string reportPath = "-";
};

struct Counters {
  int64_t collectives = 0, wrong = 0, failed = 0;
  int64_t led = 0;  // completed collectives of sets this rank leads (set rank 0): summed over
                    // ranks, each collective of the job counts once
};

// A submitted collective of this rank, checked once it completes.
struct Pending {
  Op op;
  int index;               // position in the step
  std::vector<Tensor> in;  // inputs (allreduce/broadcast: also the outputs)
  hora_request_t req = nullptr;
  bool faultTensor = false;  // the tensor the fault is about (mismatch/missing)
};

}  // namespace

namespace {

struct Set {
  hora_process_set_t handle = nullptr;
  std::vector<int> members;  // global ranks, sorted
  int rank = -1;             // this rank's rank in the set, -1 if not a member
};

struct Soak {
  Args args;
  hora_runtime_t rt = nullptr;
  int rank = 0, size = 0;
  Set sets[3];  // global, the even ranks, {1, size-1} (single-rank sets when size is 2)
  Counters c;
  bool stop = false;  // a failure ended the schedule on this rank

  std::string tag(int64_t step) const {
    return "rank=" + std::to_string(rank) + " step=" + std::to_string(step);
  }

  // The step's set and ops, the same on every rank.
  int drawStep(int64_t step, std::vector<Op>* ops) const {
    Rng r(args.seed * 0x100000001b3ull ^ uint64_t(step));
    const bool faultHere = args.fault != "none" && step == args.faultStep;
    int set = 0;
    int64_t w = r.below(100);
    if (!faultHere && w >= 60) set = w < 80 ? 1 : 2;
    const int n = int(sets[set].members.size());
    const int m = 1 + int(r.below(6));
    std::vector<bool> used(24, false);
    ops->clear();
    for (int j = 0; j < m; ++j) {
      Op o;
      if (r.chance(60)) {
        int p = int(r.below(24));
        while (used[size_t(p)]) p = (p + 1) % 24;
        used[size_t(p)] = true;
        o = drawOp(mix(args.seed ^ (uint64_t(set) << 56) ^ (uint64_t(p) << 32) ^ 0x5eedull), n);
        o.name = "s" + std::to_string(set) + ".p" + std::to_string(p) + "." + kKindNames[o.kind];
        // The fault is about one tensor: not a group.
        if (faultHere && j == 0 && o.kind == kGrouped) used[size_t(p)] = false;
        if (faultHere && j == 0 && o.kind == kGrouped) o.kind = kAllreduce, o.name += ".single";
      } else {
        o = drawOp(mix(args.seed ^ (uint64_t(step) << 8) ^ uint64_t(j) ^ 0xf1e5ull), n);
        if (faultHere && j == 0 && o.kind == kGrouped) o.kind = kAllreduce;
        o.name = "u" + std::to_string(step) + "." + std::to_string(j) + "." + kKindNames[o.kind];
      }
      // A fault's first op is a collective: every survivor must fail in that step, and a ring
      // exchange between two survivors may complete before they learn of the fault. Later ring
      // exchanges stay: the ones with the faulty rank must fail (or, for mismatch and missing,
      // complete exactly), never hang.
      if (faultHere && j == 0 && o.kind == kP2p) o.kind = kAllreduce, o.name += ".allreduce";
      o.dataKey = mix(args.seed ^ (uint64_t(step) << 16) ^ (uint64_t(j) << 4) ^ 0xda7aull);
      ops->push_back(std::move(o));
    }
    return set;
  }

  void fillInput(const Op& o, int t, int s, int n, Tensor* x) {
    const int64_t count = x->count();
    for (int64_t i = 0; i < count; ++i) store(o.dtype, x->dl.data, i, inputValue(o, t, s, n, i));
  }

  // Submits op o on set `set`; *p gets the request and the buffers. Returns the call's status.
  hora_status_t submit(const Op& o, int set, bool mismatch, Pending* p) {
    const Set& S = sets[set];
    const int s = S.rank, n = int(S.members.size());
    hora_options_t opt;
    hora_options_init(&opt);
    opt.process_set = S.handle;
    opt.name = o.name.c_str();
    opt.op = o.op;
    opt.root = o.root;
    // The mismatch fault: another dtype or trailing dimension; `m` describes what is submitted
    // (its dtype sizes the buffer and the values written into it).
    Op m = o;
    if (mismatch && (o.dataKey & 1)) m.dtype = o.dtype == 7 ? 8 : 7;
    const int dt = m.dtype;
    const int64_t cols = o.cols + (mismatch && !(o.dataKey & 1) ? 1 : 0);
    auto one = [&](int64_t rows) {
      p->in.emplace_back();
      p->in.back().make(dt, {rows, cols});
      fillInput(m, 0, s, n, &p->in.back());
    };
    switch (o.kind) {
      case kAllreduce:
        one(o.rows);
        return hora_allreduce_async(rt, &p->in[0].dl, &p->in[0].dl, &opt, &p->req);
      case kGrouped: {
        std::vector<DLTensor*> ts;
        for (int t = 0; t < o.groupSize; ++t) {
          p->in.emplace_back();
          p->in.back().make(dt, {o.rows + t, cols});
        }
        for (int t = 0; t < o.groupSize; ++t) {
          fillInput(m, t, s, n, &p->in[size_t(t)]);
          ts.push_back(&p->in[size_t(t)].dl);
        }
        return hora_grouped_allreduce_async(rt, o.groupSize, ts.data(), ts.data(), &opt, &p->req);
      }
      case kAllgather:
        one(o.rowsOf[size_t(s)]);
        return hora_allgather_async(rt, &p->in[0].dl, &opt, &p->req);
      case kBroadcast:
        one(o.rows);
        return hora_broadcast_async(rt, &p->in[0].dl, &opt, &p->req);
      case kAlltoall: {
        int64_t rows = 0;
        for (int d = 0; d < n; ++d) rows += o.splits[size_t(s) * n + d];
        one(rows);
        return hora_alltoall_async(rt, &p->in[0].dl, &o.splits[size_t(s) * n], n, &opt, &p->req);
      }
      case kP2p: {
        one(o.rows);
        p->in.emplace_back();
        p->in.back().make(dt, {o.rows, cols});  // the receive buffer, zeroed
        hora_p2p_op_t ops[2];
        for (hora_p2p_op_t& x : ops) {
          std::memset(&x, 0, sizeof x);
          x.struct_size = sizeof x;
        }
        const int64_t tag = int64_t(o.dataKey >> 2);
        ops[0].kind = HORA_P2P_SEND;
        ops[0].peer = (s + 1) % n;
        ops[0].tag = tag;
        ops[0].tensor = &p->in[0].dl;
        ops[1].kind = HORA_P2P_RECV;
        ops[1].peer = (s + n - 1) % n;
        ops[1].tag = tag;
        ops[1].tensor = &p->in[1].dl;
        return hora_p2p_batch_async(rt, 2, ops, &opt, &p->req);
      }
      default:
        one(o.rows);
        return hora_reducescatter_async(rt, &p->in[0].dl, &opt, &p->req);
    }
  }

  // Compares n elements at `got` with want(i); reports the first difference.
  template <typename Want>
  bool same(int64_t step, const Op& o, const void* got, int64_t first, int64_t n, Want want) {
    for (int64_t i = 0; i < n; ++i) {
      const double g = load(o.dtype, got, first + i), w = want(i);
      if (g != w) {
        char buf[160];
        std::snprintf(buf, sizeof buf, " index=%lld got=%.17g want=%.17g", (long long)(first + i),
                      g, w);
        report("soak-wrong " + tag(step) + " name=" + o.name + " dtype=" + kDtypes[o.dtype].name +
               " op=" + kOpNames[o.op] + buf);
        return false;
      }
    }
    return true;
  }

  // Checks a completed request's results against the local reference.
  bool check(int64_t step, int set, Pending& p) {
    const Op& o = p.op;
    const int s = sets[set].rank, n = int(sets[set].members.size());
    const int64_t cols = o.cols;
    switch (o.kind) {
      case kAllreduce:
      case kGrouped: {
        bool ok = true;
        for (size_t t = 0; t < p.in.size() && ok; ++t)
          ok = same(step, o, p.in[t].dl.data, 0, p.in[t].count(),
                    [&](int64_t i) { return reduced(o, int(t), n, i); });
        return ok;
      }
      case kBroadcast:
        return same(step, o, p.in[0].dl.data, 0, p.in[0].count(),
                    [&](int64_t i) { return inputValue(o, 0, o.root, n, i); });
      case kP2p:  // the previous rank's input arrived; ours was not touched
        return same(step, o, p.in[1].dl.data, 0, p.in[1].count(),
                    [&](int64_t i) { return inputValue(o, 0, (s + n - 1) % n, n, i); }) &&
               same(step, o, p.in[0].dl.data, 0, p.in[0].count(),
                    [&](int64_t i) { return inputValue(o, 0, s, n, i); });
      default:
        break;
    }
    const DLTensor* out = nullptr;
    if (hora_request_output(p.req, &out) != HORA_SUCCESS || !out) {
      report("soak-wrong " + tag(step) + " name=" + o.name +
             " no output: " + hora_last_error_message());
      return false;
    }
    int64_t at = 0;
    if (o.kind == kAllgather) {
      for (int src = 0; src < n; ++src) {
        const int64_t k = o.rowsOf[size_t(src)] * cols;
        if (!same(step, o, out->data, at, k,
                  [&](int64_t i) { return inputValue(o, 0, src, n, i); }))
          return false;
        at += k;
      }
    } else if (o.kind == kAlltoall) {
      const int64_t* got = nullptr;
      int32_t nsplits = 0;
      hora_request_received_splits(p.req, &got, &nsplits);
      for (int src = 0; src < n; ++src) {
        const int64_t k = o.splits[size_t(src) * n + s] * cols;
        if (nsplits != n || got[src] != o.splits[size_t(src) * n + s]) {
          report("soak-wrong " + tag(step) + " name=" + o.name + " received splits differ");
          return false;
        }
        int64_t off = 0;  // where src's block for this rank starts in src's input
        for (int d = 0; d < s; ++d) off += o.splits[size_t(src) * n + d] * cols;
        if (!same(step, o, out->data, at, k,
                  [&](int64_t i) { return inputValue(o, 0, src, n, off + i); }))
          return false;
        at += k;
      }
    } else {  // reducescatter: rows [start, start + mine)
      const int64_t base = o.rows / n, extra = o.rows % n;
      const int64_t start = s * base + std::min<int64_t>(s, extra);
      at = (base + (s < extra ? 1 : 0)) * cols;
      if (!same(step, o, out->data, 0, at,
                [&](int64_t i) { return reduced(o, 0, n, start * cols + i); }))
        return false;
    }
    int64_t total = 1;
    for (int d = 0; d < out->ndim; ++d) total *= out->shape[d];
    if (total != at) {
      report("soak-wrong " + tag(step) + " name=" + o.name + " output has " +
             std::to_string(total) + " elements, want " + std::to_string(at));
      return false;
    }
    return true;
  }

  void fault(int64_t step, const char* when) {
    char buf[96];
    std::snprintf(buf, sizeof buf, " t=%.6f", wallNow());
    report("soak-fault " + tag(step) + " kind=" + args.fault + " when=" + when + buf);
    if (args.fault == "kill9") raise(SIGKILL);
    if (args.fault == "sigstop") raise(SIGSTOP);
  }

  // The missing fault: waits until every other rank wrote "soak-error ... step=K" to the report
  // file, at most 2 * HORA_STALL_SHUTDOWN_TIME_S + 10 s (a survivor without its error is then
  // the driver's to report). Without a report file, sleeps the stall shutdown time.
  void awaitSurvivorErrors(int64_t step) {
    const char* v = std::getenv("HORA_STALL_SHUTDOWN_TIME_S");
    const double stall = v ? std::atof(v) : 0;
    if (args.reportPath == "-") {
      if (stall > 0) usleep(useconds_t(stall * 1e6));
      return;
    }
    const double until = wallNow() + 2 * stall + 10;
    const std::string want = " step=" + std::to_string(step) + " ";
    while (wallNow() < until) {
      std::vector<bool> seen(size_t(size), false);
      int count = 0;
      if (FILE* f = std::fopen(args.reportPath.c_str(), "r")) {
        char line[512];
        int r = -1;
        while (std::fgets(line, sizeof line, f))
          if (std::sscanf(line, "soak-error rank=%d", &r) == 1 && r >= 0 && r < size && r != rank &&
              !seen[size_t(r)] && std::strstr(line, want.c_str()))
            seen[size_t(r)] = true, ++count;
        std::fclose(f);
      }
      if (count == size - 1) return;
      usleep(20000);
    }
  }

  // A join step (the global set, never a fault's step, about 1 step in 25): rank r runs k_r
  // allreduces (0-3, drawn alike on every rank) and then joins, as a rank with uneven data
  // does after its last batch. Allreduce i is agreed once every rank has submitted it or
  // joined, so it reduces over the ranks with k_r > i; a rank with the largest k_r finishes
  // its last allreduce only after every other rank joined, so the join names one of those
  // as the last to join.
  bool joinStepAt(int64_t step) const {
    if (size < 2 || (args.fault != "none" && step == args.faultStep)) return false;
    Rng r(args.seed * 0x9e3779b97f4a7c15ull ^ uint64_t(step) ^ 0x70142ull);
    return r.chance(4);
  }

  void runJoinStep(int64_t step) {
    Rng r(args.seed ^ (uint64_t(step) << 20) ^ 0x70143ull);
    std::vector<int> k(size_t(size), 0);
    int most = 0;
    for (int q = 0; q < size; ++q) most = std::max(most, k[size_t(q)] = int(r.below(4)));
    std::vector<Pending> pending;
    for (int i = 0; i < k[size_t(rank)]; ++i) {
      Pending p;
      p.op = drawOp(mix(args.seed ^ (uint64_t(step) << 8) ^ uint64_t(i) ^ 0x70144ull), size);
      p.op.kind = kAllreduce;
      if (p.op.op == 1) p.op.op = 0;  // no average: its quotient would depend on who joined
      p.op.dataKey = mix(args.seed ^ (uint64_t(step) << 16) ^ (uint64_t(i) << 4) ^ 0x70145ull);
      p.op.name = "j" + std::to_string(step) + "." + std::to_string(i) + ".allreduce";
      p.index = i;
      const hora_status_t st = submit(p.op, 0, false, &p);
      if (st != HORA_SUCCESS) {
        ++c.failed;
        report("soak-error " + tag(step) + " name=" + p.op.name +
               " submit status=" + std::to_string(st) + " msg=" + hora_last_error_message());
        stop = true;
        break;
      }
      pending.push_back(std::move(p));
    }
    for (Pending& p : pending) {
      const hora_status_t st = hora_wait(p.req, -1);
      if (st == HORA_SUCCESS) {
        ++c.collectives;
        // Counted once per job: by the lowest rank that submitted it.
        int lowest = 0;
        while (k[size_t(lowest)] <= p.index) ++lowest;
        if (lowest == rank) ++c.led;
        std::vector<bool> from(static_cast<size_t>(size));
        for (int q = 0; q < size; ++q) from[size_t(q)] = k[size_t(q)] > p.index;
        bool ok = true;
        for (size_t t = 0; t < p.in.size() && ok; ++t)
          ok = same(step, p.op, p.in[t].dl.data, 0, p.in[t].count(),
                    [&](int64_t i) { return reduced(p.op, int(t), size, i, &from); });
        if (!ok) ++c.wrong;
      } else {
        ++c.failed;
        report("soak-error " + tag(step) + " name=" + p.op.name + " status=" + std::to_string(st) +
               " expected=0 msg=" + hora_last_error_message());
        stop = true;
      }
      hora_request_free(p.req);
    }
    hora_request_t join = nullptr;
    hora_options_t opt;
    hora_options_init(&opt);
    if (!stop && hora_join_async(rt, &opt, &join) != HORA_SUCCESS) {
      ++c.failed;
      report("soak-error " + tag(step) + " name=join submit msg=" + hora_last_error_message());
      stop = true;
    }
    if (!join) return;
    const hora_status_t st = hora_wait(join, -1);
    int32_t last = -1;
    if (st == HORA_SUCCESS) {
      ++c.collectives;
      if (rank == 0) ++c.led;
      if (hora_request_join_last_rank(join, &last) != HORA_SUCCESS || last < 0 || last >= size ||
          k[size_t(last)] != most) {
        ++c.wrong;
        report("soak-wrong " + tag(step) + " name=join last joined rank " + std::to_string(last) +
               " submitted " + (last >= 0 && last < size ? std::to_string(k[size_t(last)]) : "?") +
               " allreduces; the last to join submitted " + std::to_string(most));
      }
    } else {
      ++c.failed;
      report("soak-error " + tag(step) + " name=join status=" + std::to_string(st) +
             " expected=0 msg=" + hora_last_error_message());
      stop = true;
    }
    hora_request_free(join);
  }

  void runStep(int64_t step) {
    if (joinStepAt(step)) return runJoinStep(step);
    std::vector<Op> ops;
    const int set = drawStep(step, &ops);
    if (sets[set].rank < 0) return;
    const bool faulty = args.faultRank == rank && step == args.faultStep;
    const bool signalFault = faulty && (args.fault == "kill9" || args.fault == "sigstop");
    const bool late = (mix(args.seed ^ uint64_t(step)) & 1) != 0;  // with tensors in flight
    if (signalFault && !late) fault(step, "before-submit");
    std::vector<Pending> pending;
    for (size_t j = 0; j < ops.size(); ++j) {
      const bool faultTensor =
          args.faultStep == step && j == 0 && (args.fault == "mismatch" || args.fault == "missing");
      if (faulty && faultTensor && args.fault == "missing") {
        fault(step, "skipped");
        continue;
      }
      if (faulty && faultTensor) fault(step, "submitted");
      Pending p;
      p.op = ops[j];
      p.index = int(j);
      p.faultTensor = faultTensor;
      const hora_status_t st = submit(ops[j], set, faulty && faultTensor, &p);
      if (st != HORA_SUCCESS) {
        ++c.failed;
        report("soak-error " + tag(step) + " name=" + ops[j].name +
               " submit status=" + std::to_string(st) + " msg=" + hora_last_error_message());
        stop = true;
        break;
      }
      pending.push_back(std::move(p));
    }
    if (signalFault && late) fault(step, "in-flight");
    for (Pending& p : pending) {
      const hora_status_t st = hora_wait(p.req, -1);
      const double t = wallNow();
      if (st == HORA_SUCCESS) {
        ++c.collectives;
        if (sets[set].rank == 0) ++c.led;
        if (!check(step, set, p)) ++c.wrong;
      } else {
        ++c.failed;
        const bool expected = p.faultTensor;
        char buf[64];
        std::snprintf(buf, sizeof buf, " t=%.6f", t);
        report("soak-error " + tag(step) + " name=" + p.op.name + " kind=" + kKindNames[p.op.kind] +
               " status=" + std::to_string(st) + " expected=" + (expected ? "1" : "0") + buf +
               " msg=" + hora_last_error_message());
        if (!expected) stop = true;
      }
      hora_request_free(p.req);
    }
    if (faulty && args.fault == "missing") awaitSurvivorErrors(step);
  }

  int run() {
    hora_config_t cfg;
    hora_config_init(&cfg);
    if (hora_init(&cfg, &rt) != HORA_SUCCESS) {
      report(std::string("soak-error init msg=") + hora_last_error_message());
      return 2;
    }
    hora_rank(rt, &rank);
    hora_size(rt, &size);
    for (int r = 0; r < size; ++r) sets[0].members.push_back(r);
    for (int r = 0; r < size; r += 2) sets[1].members.push_back(r);
    if (size == 2)
      sets[2].members = {1};
    else
      sets[2].members = {1, size - 1};
    hora_global_process_set(rt, &sets[0].handle);
    for (int k = 1; k < 3; ++k) {
      Set& S = sets[k];
      if (std::find(S.members.begin(), S.members.end(), rank) == S.members.end()) continue;
      if (hora_process_set_create(rt, S.members.data(), int32_t(S.members.size()), &S.handle) !=
          HORA_SUCCESS) {
        report(std::string("soak-error process set msg=") + hora_last_error_message());
        return 2;
      }
    }
    for (Set& S : sets) {
      S.rank = -1;
      for (size_t i = 0; i < S.members.size(); ++i)
        if (S.members[i] == rank) S.rank = int(i);
    }
    report("soak-start rank=" + std::to_string(rank) + " size=" + std::to_string(size) +
           " pid=" + std::to_string(getpid()) + " seed=" + std::to_string(args.seed));
    const double t0 = wallNow();
    int64_t step = 0;
    for (; step < args.steps && !stop; ++step) runStep(step);
    char buf[64];
    std::snprintf(buf, sizeof buf, " seconds=%.3f", wallNow() - t0);
    report("soak-done rank=" + std::to_string(rank) + " steps=" + std::to_string(step) +
           " collectives=" + std::to_string(c.collectives) + " led=" + std::to_string(c.led) +
           " wrong=" + std::to_string(c.wrong) + " failed=" + std::to_string(c.failed) + buf);
    hora_shutdown(rt);
    // After the shutdown a set handle is only released (no teardown to agree on with peers).
    for (int k = 1; k < 3; ++k)
      if (sets[k].handle) hora_process_set_destroy(sets[k].handle);
    // Non-zero after a failure, as a real program would, so horarun ends the job (a stopped
    // rank would otherwise keep it waiting).
    return c.wrong > 0 ? 1 : stop ? 3 : 0;
  }
};

void onTerm(int) {
  // horarun stops the survivors when a rank dies; they keep going until they saw the error.
  static const char kMsg[] = "soak-sigterm (ignored: waiting for the error)\n";
  ssize_t ignored = write(gReport, kMsg, sizeof kMsg - 1);
  (void)ignored;
}

int usage(const char* why) {
  std::fprintf(stderr,
               "hora_soak: %s\nusage: hora_soak [--seed N] [--steps N] [--report FILE]\n"
               "       [--fault kill9|sigstop|mismatch|missing --fault-rank R --fault-step K]\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Soak soak;
  Args& a = soak.args;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (i + 1 >= argc) return usage(("missing value of " + k).c_str());
    const char* v = argv[++i];
    if (k == "--seed")
      a.seed = std::strtoull(v, nullptr, 10);
    else if (k == "--steps")
      a.steps = std::atoll(v);
    else if (k == "--report")
      a.reportPath = v;
    else if (k == "--fault")
      a.fault = v;
    else if (k == "--fault-rank")
      a.faultRank = std::atoi(v);
    else if (k == "--fault-step")
      a.faultStep = std::atoll(v);
    else
      return usage(("unknown flag " + k).c_str());
  }
  if (a.fault != "none" && a.fault != "kill9" && a.fault != "sigstop" && a.fault != "mismatch" &&
      a.fault != "missing")
    return usage("unknown fault kind");
  if (a.fault != "none" && (a.faultRank < 0 || a.faultStep < 0))
    return usage("a fault needs --fault-rank and --fault-step");
  if (a.reportPath != "-") {
    gReport = open(a.reportPath.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (gReport < 0) return usage("cannot open the report file");
  }
  signal(SIGTERM, onTerm);
  return soak.run();
}
