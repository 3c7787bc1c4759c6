// GlooBackend: the CPU data plane. Runs hora's collectives over a Gloo full
// mesh of TCP pairs (one per peer) that it builds at creation time through
// hora's rendezvous Store.
//
// Created by the runtime (or a process set) on its init thread with
// createGlooBackend; afterwards every collective is called from the runtime's
// single executor thread, in the same order on every rank, as the Backend
// contract requires. abort() may come from any thread.
//
// Only Gloo's "new-style" collectives (gloo::allreduce with AllreduceOptions,
// allgatherv, broadcast, alltoallv, barrier) run on the context, plus hora's
// own ring reduce-scatter and ring allreduce (allreduceGather, gloo_ring.cc)
// on the context's unbound buffers; the old Algorithm classes are never mixed
// in (mixing them on one context stalled at 4 ranks). Every call takes a
// fresh tag so its slots cannot match a previous call's.
//
// Failure model: any Gloo exception becomes a Status naming the collective,
// count and dtype (kRemoteError when a peer closed the connection, kTimeout
// when a wait expired, kBackendError otherwise). After such a failure, or
// after abort(), the pairs are closed and every later call fails immediately:
// the ranks can no longer be assumed to agree on what was exchanged. abort()
// also fails every unbound buffer in use, since Gloo's pair signal misses a
// transfer cut part-way (gloo_mesh.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/status.h"
#include "core/store.h"
#include "core/types.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace hora {

class AbortableBuffers;

// HORA_GLOO_ALGORITHM: allreduce by size (auto), always ring, always bcube.
enum class GlooAlgorithm { kAuto, kRing, kBcube };
bool parseGlooAlgorithm(const std::string& text, GlooAlgorithm* out);
const char* glooAlgorithmName(GlooAlgorithm algorithm);

struct GlooBackendOptions {
  // Address the TCP device binds to and advertises; ignored when `iface` is set.
  std::string hostname = "127.0.0.1";
  // Network interface to bind to (e.g. "eth0"); takes precedence over hostname.
  std::string iface;
  // Bounds rendezvous and every wait inside a collective.
  std::chrono::milliseconds timeout{30000};
  GlooAlgorithm algorithm = GlooAlgorithm::kAuto;
  // Asked every 100 ms while the pairs connect (may be empty): an error (a
  // peer known to be gone) makes every pending connect fail at once and is
  // what createGlooBackend returns, instead of waiting for a dead peer's
  // connection until the connect's bound (`timeout`, gloo_mesh.h). Called on
  // a thread of createGlooBackend's own.
  std::function<Status()> setUpWatch;
};

// Allreduce payloads below this many bytes use bcube under "auto"; larger ones
// use ring (see the measurements in gloo_backend.cc).
constexpr size_t kGlooBcubeMaxBytes = 1024 * 1024;
// Below this ring wins again for tiny messages (4 ranks on 2 cores, bench/README.md).
constexpr size_t kGlooBcubeMinBytes = 1024;

class GlooBackend : public Backend {
 public:
  using Algorithm = GlooAlgorithm;

  // Use createGlooBackend. `context` is null for size 1 (no peers, no sockets).
  // `buffers`: the unbound buffers of `context` (gloo_mesh.h), failed by
  // abort(); null with `context` for a single rank.
  GlooBackend(std::shared_ptr<gloo::Context> context, std::shared_ptr<AbortableBuffers> buffers,
              int rank, int size, std::chrono::milliseconds timeout, Algorithm algorithm);
  ~GlooBackend() override;

  std::string name() const override { return "gloo"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status allreduce(void* data, size_t count, DataType dtype, ReduceOp op) override;
  // Where allreduce() would run bcube (algorithm "bcube", or "auto" up to
  // kGlooBcubeMaxBytes) this is Backend's default (pack all, allreduce, unpack
  // all): small payloads are latency-bound and bcube wins there. Otherwise it
  // runs hora's ring allreduce (gloo_ring.cc), the same schedule as Gloo's
  // ring, packing each segment just before it is first sent or reduced into
  // and unpacking it as soon as it is final, so the copies run while this
  // rank waits for the network.
  Status allreduceGather(void* staging, size_t count, DataType dtype, ReduceOp op,
                         const PackFn& pack, const UnpackFn& unpack) override;
  Status allgatherv(const void* in, void* out, const std::vector<size_t>& counts,
                    DataType dtype) override;
  Status broadcast(void* data, size_t count, DataType dtype, int root) override;
  Status alltoallv(const void* in, const std::vector<int64_t>& send, void* out,
                   const std::vector<int64_t>& recv, DataType dtype) override;
  Status reducescatter(void* inout, const std::vector<size_t>& counts, DataType dtype,
                       ReduceOp op) override;
  Status barrier() override;
  void abort() noexcept override;
  // The cut-over between Gloo's own allreduce (bcube under "auto") and the
  // overlapped ring (kGlooBcubeMaxBytes until autotune moves it).
  void tune(const TuningValues& values) override;

 private:
  // Fails fast when aborted or broken; otherwise OK.
  Status checkUsable(const std::string& what) const;
  // Runs `body` (which talks to Gloo), converting any exception into a Status
  // prefixed by `what` and marking the backend broken.
  template <typename F>
  Status guarded(const std::string& what, F&& body);
  // Closes every pair, waking any thread blocked in a Gloo wait. Idempotent.
  void closePairs(const std::string& reason) noexcept;
  uint32_t nextTag() { return ++tag_; }
  // A Gloo wait that returned false (aborted through abortWait*, which
  // nothing in hora calls) fails the transfer instead of trusting the data.
  static void checkWait(bool completed, const char* what);
  void ringReduceScatter(uint8_t* data, const std::vector<size_t>& counts, DataType dtype,
                         ReduceOp op, uint32_t tag);
  // The ring behind allreduceGather (gloo_ring.cc); size_ > 1, count > 0.
  // Throws Gloo's exceptions; the caller wraps it in guarded().
  void ringAllreduce(uint8_t* data, size_t count, DataType dtype, ReduceOp op, uint32_t tag,
                     const PackFn& pack, const UnpackFn& unpack);

  const std::shared_ptr<gloo::Context> context_;
  const std::shared_ptr<AbortableBuffers> buffers_;
  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  const Algorithm algorithm_;
  uint32_t tag_ = 0;                           // executor thread only
  size_t bcubeMaxBytes_ = kGlooBcubeMaxBytes;  // executor thread only
  // The ring's receive scratch, kept across calls: a fresh buffer would pay
  // first-touch page faults (~12 us per 4 KiB page here) on every call.
  std::vector<uint8_t> ringScratch_;  // executor thread only

  std::atomic<bool> aborted_{false};
  std::mutex closeMu_;  // serializes closePairs
  mutable std::mutex brokenMu_;
  Status broken_;  // guarded by brokenMu_; first failure that made the backend unusable
};

// Builds the TCP device, rendezvouses through `store` under `prefix` (keys
// "<prefix>/<rank>") and connects the full mesh. Blocks until every rank of
// the communicator has arrived or opts.timeout passes (kTimeout). Errors:
// kInvalidArgument for bad rank/size/algorithm, kBackendError when Gloo
// cannot create the device or connect, or the store's own error.
// Side effect (size > 1): if SIGPIPE still has its default disposition
// (terminate the process) it is set to ignored, because Gloo's socket writes
// would otherwise kill the process when a peer closes its connection.
Result<std::unique_ptr<Backend>> createGlooBackend(std::shared_ptr<Store> store,
                                                   const std::string& prefix, int rank, int size,
                                                   const GlooBackendOptions& opts);

}  // namespace hora
