// HierBackend: the data plane of a process set that spans several hosts with
// several ranks on each. Allreduce is hierarchical; so are allgather and
// reducescatter from HierBackendOptions::collectiveMinBytes up (below it
// they, and the other collectives always, run on the flat backend over all
// ranks: Gloo, or a tcp ring over all ranks that process_set puts in front
// of it, HierBackendOptions::wrapFlat).
//
// Hierarchical allgather (rank (h, l): local rank l on host h): (1) each
// rank allgathers its block across hosts with the ranks of its local index
// (cross), (2) the host's ranks allgather those through shared memory
// (local), (3) each rank puts the blocks in set-rank order. Reducescatter
// runs the other way: (1) each rank orders its input by local index, (2) the
// host reduce-scatters it through shared memory, local rank l keeping the
// blocks of local index l of every host, (3) it reduce-scatters those across
// hosts, keeping its own. Each host's link carries (H-1)/H of the payload
// (allgather's output, reducescatter's input) instead of the flat ring's
// (n-1)/n with n-1 hops through every rank.
//
// Why: the flat Gloo ring over 2 hosts x 2 ranks sends 2(n-1)/n = 1.5x the
// payload each way over each host's link, and moves the bytes between the
// two ranks of one host through TCP. Here each host's ranks reduce through
// shared memory first, so only host-reduced data crosses: each host sends
// about 1.0x the payload each way (2(H-1)/H for H hosts), whatever the ranks
// per host.
//
// Algorithm, per shared-memory chunk (ShmBackend::allreduceCross):
//   1. every local rank packs the chunk into its slot; each local rank
//      reduces its own part (1/L of the chunk) over the host's ranks;
//   2. each local rank allreduces its part with the ranks of the same local
//      index on the other hosts, over its own communicator ("cross":
//      HORA_HIER_CROSS, a ring over hora's sockets, ops/tcp/tcp_ring.h, or
//      Gloo), so every local rank (its core, its TCP streams) works at once;
//   3. every local rank copies all parts out of the slots that hold them.
// With overlap (HORA_HIER_OVERLAP, default) stage 2 of chunk k runs on the
// cross thread while the executor does stage 1 of chunk k+1 in the other of
// its segment's two slots, then stage 3 of chunk k: the link stays busy
// while the host reduces. Measured: bench/results/2026-11-24-hier-allreduce.md.
//
// Results: integer ops give the flat path's bits (the reduction is
// associative); float sums are those of another summation order (rounding
// only). Every rank gets the same bits: each part is reduced once, in a
// fixed order along the cross ring, then copied.
//
// Threads: created on the process set's init thread; collectives from its
// executor thread; abort() from any thread (aborts all three backends). The
// cross communicator runs on a thread of its own (one per HierBackend), fed
// by the executor thread one part at a time, so that with overlap on chunk
// k crosses hosts while the executor packs and reduces chunk k+1.
//
// Failure model: a failure in any stage (a lost local peer, a lost peer on
// another host, abort) makes this and every later call fail at once; the
// other stages' backends are aborted so that no rank waits for one that
// gave up.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.h"
#include "core/status.h"
#include "core/store.h"
#include "ops/shm/shm_backend.h"

namespace hora {

// HORA_HIER_ALLREDUCE.
enum class HierMode { kAuto, kHier, kFlat };
bool parseHierMode(const std::string& text, HierMode* out);

// Where each rank of a set runs: which ranks share a host (pure logic).
struct HostLayout {
  int hosts = 0;           // distinct host identities
  int perHost = 0;         // ranks on every host; 0 when hosts differ in it
  int hostIndex = -1;      // this rank's host, numbered by first appearance
  int localRank = -1;      // this rank among its host's ranks, in set order
  std::vector<int> local;  // set ranks on this rank's host, in set order
};
HostLayout layoutHosts(const std::vector<std::string>& hostIds, int rank);

// Whether `layout` gets the hierarchical allreduce under `mode`; if not,
// *whyNot says why (for the log).
bool wantsHierarchy(const HostLayout& layout, HierMode mode, std::string* whyNot);

class HierBackend : public Backend {
 public:
  // `local`: this host's ranks (size > 1); `cross`: the ranks with this
  // rank's local index on every host, in host order; `flat`: all ranks.
  // `overlap`: chunk k crosses hosts while chunk k+1 is reduced inside the
  // host (ShmBackend::allreduceCross).
  // `at[h][l]`: the set rank of local rank l on host h (every host has as
  // many); `collectiveMinBytes`: allgather and reducescatter payloads from
  // which they run hierarchically, in pieces of `collectivePieceBytes`
  // (HierBackendOptions) when `overlap`.
  HierBackend(std::unique_ptr<ShmBackend> local, std::unique_ptr<Backend> cross,
              std::unique_ptr<Backend> flat, int rank, int size, int hosts, bool overlap,
              std::vector<std::vector<int>> at, size_t collectiveMinBytes,
              size_t collectivePieceBytes = size_t{512} << 10);
  ~HierBackend() override;

  std::string name() const override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status allreduce(void* data, size_t count, DataType dtype, ReduceOp op) override;
  Status allreduceGather(void* staging, size_t count, DataType dtype, ReduceOp op,
                         const PackFn& pack, const UnpackFn& unpack) override;
  Status allreduceGatherCombine(void* staging, size_t count, DataType dtype, ReduceOp op,
                                const PackFn& pack, const UnpackFn& unpack,
                                const CombineFn& combine) override;
  bool needsStaging(size_t, DataType) const override { return false; }
  Status allgatherv(const void* in, void* out, const std::vector<size_t>& counts,
                    DataType dtype) override;
  Status broadcast(void* data, size_t count, DataType dtype, int root) override;
  Status alltoallv(const void* in, const std::vector<int64_t>& send, void* out,
                   const std::vector<int64_t>& recv, DataType dtype) override;
  Status reducescatter(void* inout, const std::vector<size_t>& counts, DataType dtype,
                       ReduceOp op) override;
  Status barrier() override;
  void abort() noexcept override;

 private:
  // The cross stage's thread: runs cross_->allreduce on the parts handed to
  // it (or a job of a hierarchical allgather or reducescatter), in order, so
  // that the executor thread can go on with the next chunk.
  void crossLoop();
  void crossStart(void* part, size_t count, DataType dtype, ReduceOp op);
  void crossStartJob(std::function<Status()> run);
  Status crossWait();
  // Waits for every job started (after a failure: they end at once, the
  // cross communicator being aborted).
  void crossDrain();
  // Pieces of a hierarchical allgather or reducescatter of `bytes` over all
  // ranks: the same on every rank.
  size_t collectivePieces(size_t bytes) const;
  Status checkUsable(const std::string& what) const;
  // Runs `call` (a hierarchical allgatherv or reducescatter): an exception
  // (out of memory for its scratch) becomes an error instead of leaving the
  // thread; scratch above 64 MiB is given back afterwards.
  Status guarded(const std::string& what, const std::function<Status()>& call);
  // The hierarchical allgatherv and reducescatter (hier_collectives.cc).
  Status hierAllgatherv(const void* in, void* out, const std::vector<size_t>& counts,
                        DataType dtype, const std::string& what);
  Status hierReducescatter(void* inout, const std::vector<size_t>& counts, DataType dtype,
                           ReduceOp op, const std::string& what);
  // Byte offsets of every set rank's block, and the counts by local index
  // (the local stage's) and by host for this rank's local index (the cross
  // stage's).
  void layoutCounts(const std::vector<size_t>& counts, size_t es, std::vector<size_t>* offset,
                    std::vector<size_t>* byLocal, std::vector<size_t>* byHost) const;
  Status fail(Status s);  // records the first failure, aborts every stage
  Status delegate(const std::string& what, const std::function<Status()>& call);

  std::unique_ptr<ShmBackend> local_;
  std::unique_ptr<Backend> cross_;
  std::unique_ptr<Backend> flat_;
  const int rank_;
  const int size_;
  const int hosts_;
  const bool overlap_;
  const std::vector<std::vector<int>> at_;  // at_[host][local] = set rank
  const size_t collectiveMinBytes_;
  const size_t collectivePieceBytes_;
  int myLocal_ = 0, myHost_ = 0;
  std::vector<uint8_t> scratchA_, scratchB_;  // the executor thread's

  struct CrossJob {
    std::function<Status()> run;  // set: this instead of an allreduce of `part`
    void* part = nullptr;
    size_t count = 0;
    DataType dtype = DataType::kFloat32;
    ReduceOp op = ReduceOp::kSum;
    bool done = false;
    Status status;
  };
  std::mutex crossMu_;
  std::condition_variable crossCv_;
  std::deque<CrossJob> crossJobs_;  // guarded by crossMu_; started, not yet waited for
  bool crossStop_ = false;          // guarded by crossMu_
  std::thread crossThread_;

  mutable std::mutex brokenMu_;
  Status broken_;  // guarded by brokenMu_
};

// Connects a Gloo (or, in tests, fake) communicator of `size` ranks whose
// keys live under `store`; `rank` is this rank's index in it.
using ConnectFn = std::function<Result<std::unique_ptr<Backend>>(std::shared_ptr<Store> store,
                                                                 int rank, int size)>;

struct HierBackendOptions {
  HierMode mode = HierMode::kAuto;
  // The local stage's shared memory (enabled, chunk, timeouts, hostId: this
  // rank's host identity, which decides the layout).
  ShmBackendOptions shm;
  // HORA_HIER_OVERLAP: cross hosts with chunk k while chunk k+1 is reduced
  // inside the host.
  bool overlap = true;
  // HORA_HIER_CROSS, compared between ranks like the rest ("tcp" or "gloo";
  // the ConnectFn builds it).
  std::string cross = "gloo";
  // Allgather and reducescatter payloads (bytes, over all ranks) from which
  // they run hierarchically; below, on the flat backend
  // (HORA_HIER_COLLECTIVE_MIN_BYTES, compared between ranks like the rest).
  size_t collectiveMinBytes = size_t{1} << 20;
  // With `overlap`, a hierarchical allgather or reducescatter runs in pieces
  // of about this many bytes per local rank of the payload (at most 8), the
  // cross stage of one piece beside the local stage of the next. Not a
  // HORA_* parameter (tests set it small); every rank must cut alike, so it
  // is compared between ranks like the rest.
  size_t collectivePieceBytes = size_t{512} << 10;
  // Called on every rank once the hierarchy is chosen, after the cross
  // communicator: may wrap `flat`, which carries every collective but the
  // allreduce (process_set puts it behind a tcp ring over all ranks). An
  // error fails the set-up. Empty: `flat` as it is.
  std::function<Result<std::unique_ptr<Backend>>(std::unique_ptr<Backend> flat)> wrapFlat;
};

enum class HierOutcome {
  kHierarchical,  // the result is a HierBackend
  kOneHost,       // every rank on one host: the caller sets up plain shm
  kFlat,          // the result is `flat`, unchanged; *whyNot says why
};

// Collective over the set's ranks (keys under `store`). Every rank publishes
// its host identity; all compute the same layout and decision. For a
// hierarchy every host sets up shared memory among its ranks, all ranks
// agree that every host succeeded (else all stay flat), and each rank
// connects its cross communicator with `connect`. Fails only when an
// exchange or a connection fails (then the set cannot start).
Result<std::unique_ptr<Backend>> createHierBackend(std::shared_ptr<Store> store, int rank, int size,
                                                   const HierBackendOptions& opts,
                                                   std::unique_ptr<Backend> flat,
                                                   const ConnectFn& connect, HierOutcome* outcome,
                                                   std::string* whyNot);

}  // namespace hora
