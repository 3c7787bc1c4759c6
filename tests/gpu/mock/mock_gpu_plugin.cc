// A GPU plugin (ops/gpu/hora_gpu_plugin.h) whose "device memory" is host
// memory, so that libhora's GPU paths (plugin loading, device checks, the
// device fusion buffer with batched pack/unpack, the communicator path with
// ranks as threads of one process, staging through the CPU data plane, error
// mapping, point-to-point) are tested on machines without a GPU. Streams run
// synchronously, except point-to-point receives (below); events are complete
// once the receives enqueued before them are.
//
// Point-to-point (p2p_group): a send copies its bytes into the communicator's
// mailbox for (sender, receiver) and is done (as NCCL, which buffers what
// fits); a receive is queued on its stream and completes, in order, when
// event_query or stream_synchronize finds its message there. Blocking in the
// receive instead would deadlock two ranks' point-to-point threads that each
// wait in a receive for a send queued behind the other's receive, which
// real streams, running beside each other, never do.
//
// Test hooks (exported, C linkage, looked up with dlsym by the tests):
//   hora_gpu_mock_calls(name)  how often the named table function was called
//   hora_gpu_mock_reset()      zeroes the counters
//   hora_gpu_mock_seq()        how many calls so far (a call's place in order)
//   hora_gpu_mock_event_wait_seq(ev)  where the last wait on external event
//                              ev came in that order (0: never)
//   hora_gpu_mock_hold_events(1|0)  while 1, no event completes
//   hora_gpu_mock_fewest_init_cpus()  the fewest CPUs a comm_init caller's
//                              mask held since the last call (INT_MAX: none)
// HORA_GPU_MOCK_FAIL=<name> makes that function fail with an "injected"
// error; HORA_GPU_MOCK_DEVICES=<n> sets the device count (default 1);
// HORA_GPU_MOCK_REFUSE_ABI=1 makes the entry point refuse every ABI version
// (as a plugin of another hora version would); HORA_GPU_MOCK_STUCK=1 makes
// events never complete (GPU work that never ends);
// HORA_GPU_MOCK_WITHOUT_P2P=1 hands out a table as short as a plugin's built
// before p2p_group was appended.
//
// Process-wide counters are fine here: this is a test double, not hora.
#include <sched.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/reduce.h"
#include "core/types.h"
#include "ops/gpu/hora_gpu_plugin.h"

#define MOCK_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

thread_local std::string tlsError;
// Function-local statics, not globals: two runtimes in one process (ranks as
// threads) each dlopen this library, and a global's constructor, run inside
// one thread's dlopen, is ordered before the other thread's first call only
// by the dynamic loader's lock, which ThreadSanitizer does not see.
std::mutex countMu;
std::map<std::string, long>& counts() {
  static std::map<std::string, long> m;
  return m;
}
// Every call's place in one sequence (under countMu), and the place of the
// last stream_wait_external_event per event: enough for a test to see that a
// wait came right after something it did in a callback.
long& callSeq() {
  static long n = 0;
  return n;
}
std::map<const void*, long>& eventWaitSeq() {
  static std::map<const void*, long> m;
  return m;
}

int fail(const std::string& msg) {
  tlsError = msg;
  return 1;
}

// Counts the call; fails it when HORA_GPU_MOCK_FAIL names it.
bool enter(const char* fn) {
  {
    std::lock_guard<std::mutex> lk(countMu);
    ++counts()[fn];
    ++callSeq();
  }
  const char* f = std::getenv("HORA_GPU_MOCK_FAIL");
  if (f && std::strcmp(f, fn) == 0) {
    tlsError = std::string("mock: injected failure in ") + fn;
    return false;
  }
  return true;
}

#define ENTER(fn) \
  if (!enter(fn)) return 1

const char* lastError() { return tlsError.c_str(); }

int deviceCount(int* out) {
  ENTER("device_count");
  const char* n = std::getenv("HORA_GPU_MOCK_DEVICES");
  *out = n ? std::atoi(n) : 1;
  return 0;
}

int devicePciBusId(int device, char* out, size_t capacity) {
  ENTER("device_pci_bus_id");
  std::snprintf(out, capacity, "mock:%d", device);
  return 0;
}

// A stream: the point-to-point receives enqueued on it and not yet done
// (everything else ran when it was enqueued). An event: the stream and how
// many receives had been enqueued on it when it was recorded.
struct PendingRecv;
struct Stream {
  std::mutex mu;
  std::vector<std::shared_ptr<PendingRecv>> recvs;  // in enqueue order
  uint64_t enqueued = 0;
  uint64_t finished = 0;
  std::string error;  // a receive that failed: the stream is broken
};
struct Event {
  Stream* stream = nullptr;
  uint64_t upTo = 0;
};
// Completes what it can of s's receives (s.mu held); false with tlsError
// set once one failed.
bool progress(Stream& s);

int streamCreate(int, hora_gpu_stream_t* out) {
  ENTER("stream_create");
  *out = reinterpret_cast<hora_gpu_stream_t>(new Stream);
  return 0;
}
int streamDestroy(hora_gpu_stream_t s) {
  ENTER("stream_destroy");
  delete reinterpret_cast<Stream*>(s);
  return 0;
}
int streamSynchronize(hora_gpu_stream_t h) {
  ENTER("stream_synchronize");
  auto& s = *reinterpret_cast<Stream*>(h);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (;;) {
    {
      std::lock_guard<std::mutex> lk(s.mu);
      if (!progress(s)) return 1;
      if (s.recvs.empty()) return 0;
    }
    if (std::chrono::steady_clock::now() > deadline)
      return fail("mock: stream_synchronize: a receive never got its message");
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}
int streamWaitExternalEvent(hora_gpu_stream_t, void* ev) {
  ENTER("stream_wait_external_event");
  if (!ev) return fail("mock: NULL external event");
  std::lock_guard<std::mutex> lk(countMu);
  eventWaitSeq()[ev] = callSeq();
  return 0;
}
int eventCreate(int, hora_gpu_event_t* out) {
  ENTER("event_create");
  *out = reinterpret_cast<hora_gpu_event_t>(new Event);
  return 0;
}
int eventDestroy(hora_gpu_event_t e) {
  ENTER("event_destroy");
  delete reinterpret_cast<Event*>(e);
  return 0;
}
int eventRecord(hora_gpu_event_t e, hora_gpu_stream_t h) {
  ENTER("event_record");
  auto& ev = *reinterpret_cast<Event*>(e);
  auto& s = *reinterpret_cast<Stream*>(h);
  std::lock_guard<std::mutex> lk(s.mu);
  ev.stream = &s;
  ev.upTo = s.enqueued;
  return 0;
}
std::atomic<bool>& heldEvents() {
  static std::atomic<bool> held{false};
  return held;
}
int eventQuery(hora_gpu_event_t e, int* done) {
  ENTER("event_query");
  if (heldEvents().load()) {
    *done = 0;
    return 0;
  }
  const char* stuck = std::getenv("HORA_GPU_MOCK_STUCK");
  if (stuck && std::strcmp(stuck, "1") == 0) {
    *done = 0;
    return 0;
  }
  auto& ev = *reinterpret_cast<Event*>(e);
  *done = 1;
  if (!ev.stream) return 0;
  std::lock_guard<std::mutex> lk(ev.stream->mu);
  if (!progress(*ev.stream)) return 1;
  *done = ev.stream->finished >= ev.upTo ? 1 : 0;
  return 0;
}

int deviceAlloc(int, size_t bytes, void** out) {
  ENTER("device_alloc");
  *out = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  return *out ? 0 : fail("mock: out of memory");
}
int deviceFree(int, void* p) {
  ENTER("device_free");
  std::free(p);
  return 0;
}
int hostAllocPinned(size_t bytes, void** out) {
  ENTER("host_alloc_pinned");
  *out = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  return *out ? 0 : fail("mock: out of memory");
}
int hostFreePinned(void* p) {
  ENTER("host_free_pinned");
  std::free(p);
  return 0;
}
int memcpyAsync(void* dst, const void* src, size_t bytes, hora_gpu_stream_t) {
  ENTER("memcpy_async");
  if (bytes) std::memmove(dst, src, bytes);
  return 0;
}
int batchedScaleCopy(int32_t dtype, const hora_gpu_copy_t* copies, size_t n, double scale,
                     hora_gpu_stream_t) {
  ENTER("batched_scale_copy");
  auto dt = static_cast<hora::DataType>(dtype);
  for (size_t i = 0; i < n; ++i) {
    if (copies[i].dst == copies[i].src)
      hora::scaleInPlace(dt, copies[i].dst, copies[i].count, scale);
    else
      hora::scaleCopy(dt, copies[i].dst, copies[i].src, copies[i].count, scale);
  }
  return 0;
}

int commUniqueId(void* id) {
  ENTER("comm_unique_id");
  std::random_device rd;
  for (int i = 0; i < 16; ++i) static_cast<uint8_t*>(id)[i] = static_cast<uint8_t>(rd());
  return 0;
}

// Communicators across ranks that are threads of this process: the callers
// that pass one id share a Group. Like NCCL, one communicator may not have
// two ranks on one device (tests give rank i device i with
// HORA_GPU_MOCK_DEVICES). Streams are synchronous, so a collective blocks its
// caller until every rank arrived; an abort on any rank fails them all, and a
// wait gives up after kWait (NCCL would hang; hora aborts before that).
constexpr auto kWait = std::chrono::seconds(120);

// What one rank brings to a collective.
struct Slot {
  const char* op = nullptr;  // which collective: ranks that disagree fail cleanly
  const void* in = nullptr;
  void* out = nullptr;
  const size_t* counts = nullptr;  // allgatherv/reducescatter counts, alltoallv send
};

struct Group {
  std::mutex mu;
  std::condition_variable cv;
  int nranks = 0;
  int joined = 0;
  std::vector<int> devices;  // per rank
  int arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
  std::vector<Slot> slots;
  // Point-to-point: messages sent and not yet received, by (from, to).
  std::map<std::pair<int, int>, std::deque<std::vector<char>>> mail;
};

std::mutex groupsMu;
// By id, until every rank joined (function-local: see counts()).
std::map<std::string, std::shared_ptr<Group>>& pendingGroups() {
  static std::map<std::string, std::shared_ptr<Group>> m;
  return m;
}

struct Comm {
  std::shared_ptr<Group> group;
  int rank = 0;
};

// Every rank arrives before any leaves; false (with tlsError set) on abort or
// when a peer never arrives.
bool barrier(Group& g) {
  std::unique_lock<std::mutex> lk(g.mu);
  if (g.aborted) return fail("mock: communicator aborted") == 0;
  const uint64_t gen = g.generation;
  if (++g.arrived == g.nranks) {
    g.arrived = 0;
    ++g.generation;
    g.cv.notify_all();
    return true;
  }
  if (!g.cv.wait_for(lk, kWait, [&] { return g.generation != gen || g.aborted; }))
    return fail("mock: a peer never reached the collective") == 0;
  if (g.aborted) return fail("mock: communicator aborted") == 0;
  return true;
}

// Publishes this rank's slot, lets `compute` read every rank's inputs into
// private memory once all have published, and `write` store the result once
// all have read (so in-place collectives never read a peer's result).
template <typename Compute, typename Write>
int collective(hora_gpu_comm_t c, const Slot& mine, Compute compute, Write write) {
  auto* comm = reinterpret_cast<Comm*>(c);
  Group& g = *comm->group;
  {
    std::lock_guard<std::mutex> lk(g.mu);
    g.slots[comm->rank] = mine;
  }
  if (!barrier(g)) return 1;
  std::vector<Slot> all;
  {
    std::lock_guard<std::mutex> lk(g.mu);
    all = g.slots;
  }
  for (size_t r = 0; r < all.size(); ++r)
    if (std::strcmp(all[r].op, mine.op) != 0) {
      // Every rank sees the disagreement; all fail after the second barrier.
      barrier(g);
      return fail(std::string("mock: rank ") + std::to_string(comm->rank) + " called " + mine.op +
                  " while rank " + std::to_string(r) + " called " + all[r].op);
    }
  std::vector<char> result = compute(all, comm->rank);
  if (!barrier(g)) return 1;
  write(result);
  return 0;
}

std::atomic<int> fewestInitCpus{INT_MAX};

int commInit(int device, int nranks, int rank, const void* id, int64_t timeout_ms,
             hora_gpu_comm_t* out) {
  ENTER("comm_init");
  {
    // What threads NCCL would start here inherit.
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
      int n = CPU_COUNT(&set), seen = fewestInitCpus.load();
      while (n < seen && !fewestInitCpus.compare_exchange_weak(seen, n)) {
      }
    }
  }
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail("mock: rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  std::shared_ptr<Group> g;
  {
    std::lock_guard<std::mutex> lk(groupsMu);
    auto& slot = pendingGroups()[std::string(static_cast<const char*>(id), 16)];
    if (!slot) {
      slot = std::make_shared<Group>();
      slot->nranks = nranks;
      slot->devices.assign(nranks, -1);
      slot->slots.resize(nranks);
    }
    g = slot;
  }
  std::unique_lock<std::mutex> lk(g->mu);
  g->devices[rank] = device;
  if (++g->joined == g->nranks) {
    std::lock_guard<std::mutex> glk(groupsMu);
    pendingGroups().erase(std::string(static_cast<const char*>(id), 16));
    g->cv.notify_all();
  } else if (!g->cv.wait_for(lk, std::chrono::milliseconds(timeout_ms),
                             [&] { return g->joined == g->nranks; })) {
    lk.unlock();
    {
      std::lock_guard<std::mutex> glk(groupsMu);
      auto it = pendingGroups().find(std::string(static_cast<const char*>(id), 16));
      if (it != pendingGroups().end() && it->second == g) pendingGroups().erase(it);
    }
    return fail("mock: communicator init timed out after " + std::to_string(timeout_ms) +
                " ms (rank " + std::to_string(rank) + " of " + std::to_string(nranks) + ")");
  }
  for (int r = 0; r < nranks; ++r)
    if (r != rank && g->devices[r] == device)
      return fail("mock: ranks " + std::to_string(std::min(r, rank)) + " and " +
                  std::to_string(std::max(r, rank)) + " are both on device " +
                  std::to_string(device) +
                  " (as NCCL, one communicator cannot have two ranks on one GPU); "
                  "share a GPU through HORA_GPU_BACKEND=gloo");
  *out = reinterpret_cast<hora_gpu_comm_t>(new Comm{g, rank});
  return 0;
}
int commDestroy(hora_gpu_comm_t c) {
  ENTER("comm_destroy");
  delete reinterpret_cast<Comm*>(c);
  return 0;
}
int commAbort(hora_gpu_comm_t c) {
  ENTER("comm_abort");
  Group& g = *reinterpret_cast<Comm*>(c)->group;
  std::lock_guard<std::mutex> lk(g.mu);
  g.aborted = true;
  g.cv.notify_all();
  return 0;
}
int commAsyncError(hora_gpu_comm_t c, int* failed) {
  ENTER("comm_async_error");
  Group& g = *reinterpret_cast<Comm*>(c)->group;
  std::lock_guard<std::mutex> lk(g.mu);
  *failed = g.aborted ? 1 : 0;
  if (*failed) tlsError = "mock: communicator aborted";
  return 0;
}

size_t esize(int32_t dtype) { return hora::dataTypeSize(static_cast<hora::DataType>(dtype)); }

// Element-wise reduction over every rank's `in + offset` (count elements).
std::vector<char> reduceAll(const std::vector<Slot>& all, size_t offset, size_t count,
                            int32_t dtype, int32_t op) {
  const size_t es = esize(dtype);
  std::vector<char> acc(count * es);
  if (count == 0) return acc;
  std::memcpy(acc.data(), static_cast<const char*>(all[0].in) + offset * es, count * es);
  for (size_t r = 1; r < all.size(); ++r)
    hora::reduceInto(static_cast<hora::DataType>(dtype), static_cast<hora::ReduceOp>(op),
                     acc.data(), static_cast<const char*>(all[r].in) + offset * es, count);
  return acc;
}

void store(void* dst, const std::vector<char>& v) {
  if (!v.empty()) std::memcpy(dst, v.data(), v.size());
}

int allreduce(const void* in, void* out, size_t count, int32_t dtype, int32_t op, hora_gpu_comm_t c,
              hora_gpu_stream_t) {
  ENTER("allreduce");
  return collective(
      c, Slot{"allreduce", in, out, nullptr},
      [&](const std::vector<Slot>& all, int) { return reduceAll(all, 0, count, dtype, op); },
      [&](const std::vector<char>& v) { store(out, v); });
}
int broadcast(void* data, size_t count, int32_t dtype, int root, hora_gpu_comm_t c,
              hora_gpu_stream_t) {
  ENTER("broadcast");
  const int n = reinterpret_cast<Comm*>(c)->group->nranks;
  if (root < 0 || root >= n)
    return fail("mock: root " + std::to_string(root) + " outside a " + std::to_string(n) +
                "-rank communicator");
  return collective(
      c, Slot{"broadcast", data, data, nullptr},
      [&](const std::vector<Slot>& all, int) {
        const char* p = static_cast<const char*>(all[root].in);
        return std::vector<char>(p, p + count * esize(dtype));
      },
      [&](const std::vector<char>& v) { store(data, v); });
}
int allgatherv(const void* in, void* out, const size_t* counts, int32_t dtype, hora_gpu_comm_t c,
               hora_gpu_stream_t) {
  ENTER("allgatherv");
  return collective(
      c, Slot{"allgatherv", in, out, counts},
      [&](const std::vector<Slot>& all, int) {
        std::vector<char> v;
        for (size_t r = 0; r < all.size(); ++r) {
          const char* p = static_cast<const char*>(all[r].in);
          v.insert(v.end(), p, p + counts[r] * esize(dtype));
        }
        return v;
      },
      [&](const std::vector<char>& v) { store(out, v); });
}
int alltoallv(const void* in, const size_t* send, void* out, const size_t* recv, int32_t dtype,
              hora_gpu_comm_t c, hora_gpu_stream_t) {
  ENTER("alltoallv");
  bool disagree = false;
  int rc = collective(
      c, Slot{"alltoallv", in, out, send},
      [&](const std::vector<Slot>& all, int me) {
        const size_t es = esize(dtype);
        std::vector<char> v;
        for (size_t r = 0; r < all.size(); ++r) {
          size_t off = 0;
          for (int d = 0; d < me; ++d) off += all[r].counts[d];
          if (all[r].counts[me] != recv[r]) {
            disagree = true;
            continue;
          }
          const char* p = static_cast<const char*>(all[r].in) + off * es;
          v.insert(v.end(), p, p + recv[r] * es);
        }
        return v;
      },
      [&](const std::vector<char>& v) {
        if (!disagree) store(out, v);
      });
  if (rc == 0 && disagree) return fail("mock: alltoallv send and receive counts disagree");
  return rc;
}
int reducescatter(void* inout, const size_t* counts, int32_t dtype, int32_t op, hora_gpu_comm_t c,
                  hora_gpu_stream_t) {
  ENTER("reducescatter");
  size_t offset = 0;
  const int me = reinterpret_cast<Comm*>(c)->rank;
  for (int r = 0; r < me; ++r) offset += counts[r];
  return collective(
      c, Slot{"reducescatter", inout, inout, counts},
      [&](const std::vector<Slot>& all, int) {
        return reduceAll(all, offset, counts[me], dtype, op);
      },
      [&](const std::vector<char>& v) {
        store(static_cast<char*>(inout) + offset * esize(dtype), v);
      });
}

// A receive waiting on its stream for its message.
struct PendingRecv {
  std::shared_ptr<Group> group;
  int from = 0, to = 0;
  void* data = nullptr;
  size_t bytes = 0;
};

bool progress(Stream& s) {
  if (!s.error.empty()) return fail(s.error) == 0;
  while (!s.recvs.empty()) {
    PendingRecv& r = *s.recvs.front();
    Group& g = *r.group;
    std::lock_guard<std::mutex> lk(g.mu);
    auto& box = g.mail[{r.from, r.to}];
    if (box.empty() && g.aborted) {
      s.error = "mock: communicator aborted with a receive pending";
      return fail(s.error) == 0;
    }
    if (box.empty()) return true;
    if (box.front().size() != r.bytes) {
      s.error = "mock: rank " + std::to_string(r.to) + " receives " + std::to_string(r.bytes) +
                " bytes from rank " + std::to_string(r.from) + ", which sent " +
                std::to_string(box.front().size());
      return fail(s.error) == 0;
    }
    if (r.bytes) std::memcpy(r.data, box.front().data(), r.bytes);
    box.pop_front();
    s.recvs.erase(s.recvs.begin());
    ++s.finished;
  }
  return true;
}

int p2pGroup(const hora_gpu_p2p_op_t* ops, size_t n, hora_gpu_comm_t c, hora_gpu_stream_t h) {
  ENTER("p2p_group");
  auto* comm = reinterpret_cast<Comm*>(c);
  Group& g = *comm->group;
  auto& s = *reinterpret_cast<Stream*>(h);
  for (size_t i = 0; i < n; ++i)
    if (ops[i].peer < 0 || ops[i].peer >= g.nranks || ops[i].peer == comm->rank)
      return fail("mock: p2p_group: peer " + std::to_string(ops[i].peer) + " on rank " +
                  std::to_string(comm->rank) + " of a " + std::to_string(g.nranks) +
                  "-rank communicator");
  for (size_t i = 0; i < n; ++i) {
    const hora_gpu_p2p_op_t& op = ops[i];
    if (op.kind == HORA_GPU_P2P_SEND) {
      std::lock_guard<std::mutex> lk(g.mu);
      if (g.aborted) return fail("mock: communicator aborted");
      const char* p = static_cast<const char*>(op.data);
      g.mail[{comm->rank, op.peer}].emplace_back(p, p + op.bytes);
    } else {
      auto r = std::make_shared<PendingRecv>();
      r->group = comm->group;
      r->from = op.peer;
      r->to = comm->rank;
      r->data = op.data;
      r->bytes = op.bytes;
      std::lock_guard<std::mutex> lk(s.mu);
      s.recvs.push_back(std::move(r));
      ++s.enqueued;
    }
  }
  return 0;
}

const hora_gpu_plugin_v1_t kTable = {
    HORA_GPU_PLUGIN_ABI_VERSION,
    sizeof(hora_gpu_plugin_v1_t),
    "mock (host memory)",
    lastError,
    deviceCount,
    streamCreate,
    streamDestroy,
    streamSynchronize,
    streamWaitExternalEvent,
    eventCreate,
    eventDestroy,
    eventRecord,
    eventQuery,
    deviceAlloc,
    deviceFree,
    hostAllocPinned,
    hostFreePinned,
    memcpyAsync,
    batchedScaleCopy,
    16,
    commUniqueId,
    commInit,
    commDestroy,
    commAbort,
    commAsyncError,
    allreduce,
    broadcast,
    allgatherv,
    alltoallv,
    reducescatter,
    devicePciBusId,
    p2pGroup,
};

}  // namespace

MOCK_EXPORT const hora_gpu_plugin_v1_t* hora_gpu_plugin_get(uint32_t abi_version) {
  const char* refuse = std::getenv("HORA_GPU_MOCK_REFUSE_ABI");
  if (refuse && std::strcmp(refuse, "1") == 0) return nullptr;
  if (abi_version != HORA_GPU_PLUGIN_ABI_VERSION) return nullptr;
  const char* old = std::getenv("HORA_GPU_MOCK_WITHOUT_P2P");
  if (old && std::strcmp(old, "1") == 0) {
    // A plugin built before point-to-point: its table ends at device_pci_bus_id.
    static const hora_gpu_plugin_v1_t shorter = [] {
      hora_gpu_plugin_v1_t t = kTable;
      t.struct_size = HORA_GPU_PLUGIN_V1_MIN_SIZE;
      t.p2p_group = nullptr;
      return t;
    }();
    return &shorter;
  }
  return &kTable;
}

MOCK_EXPORT int hora_gpu_mock_fewest_init_cpus() { return fewestInitCpus.exchange(INT_MAX); }

MOCK_EXPORT long hora_gpu_mock_calls(const char* name) {
  std::lock_guard<std::mutex> lk(countMu);
  auto it = counts().find(name);
  return it == counts().end() ? 0 : it->second;
}

// 1: no event completes until called with 0 (GPU work that is still running).
MOCK_EXPORT void hora_gpu_mock_hold_events(int hold) { heldEvents().store(hold != 0); }

// The number of plugin calls so far (the last call's place in the sequence).
MOCK_EXPORT long hora_gpu_mock_seq() {
  std::lock_guard<std::mutex> lk(countMu);
  return callSeq();
}

// The place of the last wait on `ev` (stream_wait_external_event), 0 if none.
MOCK_EXPORT long hora_gpu_mock_event_wait_seq(const void* ev) {
  std::lock_guard<std::mutex> lk(countMu);
  auto it = eventWaitSeq().find(ev);
  return it == eventWaitSeq().end() ? 0 : it->second;
}

MOCK_EXPORT void hora_gpu_mock_reset() {
  std::lock_guard<std::mutex> lk(countMu);
  counts().clear();
}
