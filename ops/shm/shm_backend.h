// ShmBackend: every collective through shared memory for a communicator whose
// ranks all run on one host (allreduce, broadcast and allgather here;
// reducescatter, alltoallv and barrier in shm_exchange.cc); a communicator of
// one rank, and allreduces below HORA_SHM_MIN_BYTES, use the fallback (Gloo).
//
// Why: on one host Gloo moves every byte through loopback TCP (user -> kernel
// -> user copies plus the reduction), and that path is slower than the memory
// copies an allreduce needs at minimum. Here each rank packs its input (the
// fused tensors, straight from their own memory) into its own segment, each
// rank reduces 1/n of every chunk reading all segments, and each rank unpacks
// every part straight from the segment that holds it into its outputs: two
// copies and one reduction per byte, no kernel in between, no staging buffer.
// Multi-host communicators never get here (createShmBackend checks the host
// of every rank) and stay on Gloo.
//
// Protocol per chunk c (at most the slot size; two slots alternate so a fast
// rank can pack chunk c+1 while slow peers still read chunk c):
//   1. wait until every peer has consumed chunk c-2 (the slot is free again),
//      pack, publish packed = c+1;
//   2. wait until every rank has packed c, reduce this rank's part of the
//      chunk from all slots into its own slot (own value first, then the
//      others in rank order: the bits do not depend on timing, and each part
//      is computed once, so every rank gets the same bits), publish
//      reduced = c+1 (small chunks skip the split: every rank reduces the
//      whole chunk itself, in rank order, into private scratch, saving one
//      round of waiting);
//   3. wait until each part is reduced, unpack it from the slot that holds
//      it, publish consumed = c+1.
// Broadcast and allgather use the same slots and counters: the root (every
// rank, for its own part) copies chunk c into its slot after the same
// slot-free wait and publishes packed; the others wait for it and copy out;
// everyone publishes every counter every chunk.
//
// Threads: created on the process set's init thread; every collective is
// called from its executor thread as the Backend contract requires; abort()
// from any thread (it wakes a waiting executor at once).
//
// Failure model: as GlooBackend's. A wait gives up when abort() is called,
// when a peer's process no longer exists (kRemoteError naming the rank), or
// after the timeout (kTimeout naming the rank that did not progress). After
// any failure every later call, delegated ones included, fails at once.
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
#include "core/reduce.h"
#include "core/status.h"
#include "core/store.h"
#include "ops/shm/shm_segment.h"

namespace hora {

struct ShmBackendOptions {
  // false: this rank takes part in the set-up exchange but refuses, so the
  // whole communicator stays on the fallback.
  bool enabled = true;
  // The pipeline's chunk of allreduce, broadcast and allgather at start
  // (autotune may change it, up to the slot).
  size_t chunkBytes = 1 << 20;
  // Non-zero: the chunk instead of chunkBytes when every rank of the set has
  // a CPU of its own (the ranks' affinity masks together hold at least
  // `size` CPUs; decided at set-up from every rank's mask, so all ranks pick
  // alike). With a core per rank, smaller chunks keep a chunk's copies in that
  // core's cache; with more ranks than cores every chunk is a round of
  // sleeps and wake-ups, and fewer rounds win
  // (bench/results/2026-11-27-chunk-by-cores.md).
  size_t chunkBytesWhenRanksFit = 0;
  // Bytes per slot; each rank's segment holds two. Reducescatter and
  // alltoall use whole slots. 0, or less than chunkBytes: chunkBytes.
  size_t slotBytes = 0;
  // Allreduce payloads below this many bytes go to the fallback.
  size_t minBytes = 0;
  // Where every rank has the same CPU mask and the ranks outnumber its CPUs
  // evenly (size a multiple of them: each shares its CPU with a peer, as
  // HORA_HOME_CALLER places them; decided at set-up from every rank's mask),
  // a wait for a peer gives the CPU away (sched_yield) between looks for up
  // to this long before it sleeps: the core goes straight to a rank with
  // work, with no futex wake-up on either side. With uneven shares (3 ranks
  // on 2 CPUs) or per-rank masks (a launcher's CPUs per rank) waiters do not
  // yield to peers (they sleep at once, or poll: peerSpin): there a rank's
  // idle CPU takes work from a crowded one, and
  // yielding made 4 MiB allreduces up to 1.6x slower at 3 ranks on 2 CPUs.
  // 0: always sleep at once (HORA_SPIN_US=0).
  std::chrono::microseconds peerYield{0};
  // Where this rank's own CPU mask holds the communicator's ranks, a wait
  // for a peer polls (without giving the CPU away) for up to this long
  // before it sleeps; where no other rank's mask holds this rank's CPUs
  // (ShmPlacement::ownCpusAlone) it polls too, giving the CPU to this
  // rank's own threads between looks. The peer is usually
  // microseconds behind; when it is further behind, another busy process
  // (data-loader workers, a second job) has usually pushed it off its CPU,
  // and it comes back within about one scheduler time slice. A waiter that
  // slept meanwhile lost its own turn to such a process too (likely why):
  // 4 MiB allreduces at 2 ranks next to two busy loops took 2-4 ms with the
  // short spin alone and about 0.6 ms polling 0.55 ms or more
  // (HORA_SHM_WAIT_SPIN_US, 1 ms; bench/results/2026-11-28-peer-spin.md).
  // The short spin always runs; 0 adds nothing to it.
  std::chrono::microseconds peerSpin{0};
  // Where the ranks outnumber the CPUs unevenly (3 on 2, or per-rank masks
  // that together hold fewer CPUs than ranks; ShmPlacement), chunks up to
  // this size are reduced whole by every rank instead of up to 64 KiB: there
  // every wait sleeps, and the split path's second round of waiting costs a
  // round of wake-ups. 3 ranks on 2 CPUs at 256 KiB: 128 KiB 146 -> 111 us,
  // 256 KiB 210 -> 194; with even shares (4 on 2, waits yield) it was slower
  // (bench/results/2026-11-28-caller-home.md). 0: 64 KiB there too.
  size_t smallChunkBytesWhenCrowded = 0;
  // Where the ranks' masks together hold a CPU per rank (ShmPlacement::
  // ranksFit; masks {0}, {0}, {1,2} count too), a rank
  // that has read a range of a peer's slot no other rank reads stores each
  // of its cache lines back unchanged: the lines then sit modified in the
  // reader's cache, and the owner's next write takes them over in one
  // transfer. Left shared by both cores, the owner's write must first
  // invalidate the reader's copy of every line, and on the AMD EPYC VM here
  // that made copying 64 KiB into a slot the peer had read cost 7-31 us
  // instead of 1.6-4.6 us; 2-rank allreduces at 64 KiB took 10.3 against
  // 19.0 us and 8.3 against 13.7 us in two runs (medians; 7-62% less time
  // from 64 KiB to 4 MiB; bench/results/2026-11-28-claim-lines.md). Where ranks
  // share CPUs the lines mostly stay in one core and the pass is pure cost
  // (3 ranks on 2 CPUs, 4 MiB: 15% slower). HORA_SHM_CLAIM_LINES.
  bool claimLines = true;
  // Tests: claim wherever claimLines is set, whatever the placement (so that
  // 3 and 4 ranks on a 2-CPU machine run the claiming paths too).
  bool claimLinesAnyPlacement = false;
  // Tests, non-zero: a claim loads its bytes, waits this long, then stores
  // them (a claim placed where the owner may already write would then undo
  // the write often enough for a test to see).
  std::chrono::microseconds claimHoldForTests{0};
  // Bounds every wait for a peer.
  std::chrono::milliseconds timeout{30000};
  // Bounds the start-up exchange through the store.
  std::chrono::milliseconds startTimeout{120000};
  // Where segments are created (tmpfs). Tests point one rank elsewhere to
  // simulate a rank that cannot use shared memory.
  std::string dir = "/dev/shm";
  // This rank's host identity as its peers must see it (HORA_HOST_ID);
  // empty: hostIdentity().
  std::string hostId;
  // Ranks of the whole process set that run on this machine's kernel
  // (ControlPlane::kernelMates): more than this communicator's where
  // emulated or container hosts share the machine, and then its CPUs too.
  // 0: this communicator's ranks only. The most any rank reports counts.
  int kernelRanks = 0;
  // Tests: the machine's online CPUs as seen by the set-up (0: sysconf).
  int onlineCpusForTests = 0;
  // How errors name each rank of this communicator: rankNames[r] is rank
  // r's rank in the process set (HierBackend's host-local communicator);
  // empty: r itself.
  std::vector<int> rankNames;
};

// How a communicator's ranks sit on the CPUs: decided by createShmBackend
// from every rank's affinity mask; the same on every rank except
// ownCpusAlone.
struct ShmPlacement {
  // One mask on every rank, the ranks a multiple of its CPUs: waits yield
  // (peerYield), callers are homed (HORA_HOME_CALLER).
  bool evenShare = false;
  // More ranks than their masks together hold CPUs, not evenShare, every
  // mask known: chunks up to smallChunkBytesWhenCrowded are reduced whole.
  bool crowdedUnevenly = false;
  // Every rank's mask known and together they hold a CPU per rank
  // (ShmBackendOptions::claimLines).
  bool ranksFit = false;
  // This rank's mask shares no CPU with any other rank's of the communicator
  // (a launcher's core or cores per rank; may differ between ranks): its
  // waits poll as where its own mask holds the ranks, since no peer of the
  // communicator needs its CPUs, but give the CPU to this rank's own
  // threads between looks (a peer may wait for one of them). Ranks outside
  // the communicator (another process set, another job) are not seen.
  bool ownCpusAlone = false;
  // Whether ranks beyond the communicator on this kernel
  // (ShmBackendOptions::kernelRanks, the most any rank reports) outnumber
  // the machine's online CPUs with it: then some ranks share a
  // CPU whatever their masks (which are not exchanged beyond the
  // communicator), so no rank counts as fitting (ranksFit, ownCpusAlone)
  // nor polls, and waits yield as evenShare's do, without homing callers.
  // Mates within the machine's CPUs may have CPUs of their own (pods with
  // exclusive cpusets): not counted. 2 hosts x 2 ranks emulated on 2 CPUs:
  // line claims took 28% of the executor's samples at 64 MiB
  // (bench/results/2026-11-29-hier-kernel-mates.md).
  bool matesCrowd = false;
};

class ShmBackend : public Backend {
 public:
  // Use createShmBackend. segments[r] is rank r's segment (own one included).
  ShmBackend(std::vector<std::unique_ptr<ShmSegment>> segments, int rank,
             std::unique_ptr<Backend> fallback, const ShmBackendOptions& opts,
             const ShmPlacement& placement);
  ~ShmBackend() override;

  std::string name() const override { return "shm+" + fallback_->name(); }
  int rank() const override { return rank_; }
  // The chunk picked at set-up (before autotune changes it); the set's
  // assembly reads it once, before the executor starts.
  size_t initialChunkBytes() const { return opts_.chunkBytes; }
  int size() const override { return size_; }

  Status allreduce(void* data, size_t count, DataType dtype, ReduceOp op) override;
  Status allreduceGather(void* staging, size_t count, DataType dtype, ReduceOp op,
                         const PackFn& pack, const UnpackFn& unpack) override;
  Status allreduceGatherCombine(void* staging, size_t count, DataType dtype, ReduceOp op,
                                const PackFn& pack, const UnpackFn& unpack,
                                const CombineFn& combine) override;
  // Only where allreduceGather delegates (one rank, or below minBytes).
  bool needsStaging(size_t count, DataType dtype) const override;
  // Packs the first chunk of the allreduce into this rank's slot for the
  // next chunk when every peer is done with that slot now; the allreduce
  // then publishes it at once, without packing. With a peer key, a complete
  // pack is published in the header (ShmHeader::prepackedChunk).
  bool prepackAllreduce(uint64_t token, uint64_t peerKey, size_t count, DataType dtype, ReduceOp op,
                        const PackFn& pack, const std::function<bool()>& stop) override;
  void expectPrepacked(uint64_t token) override { expected_ = token; }
  void expectPeersPrepacked(uint64_t peerKey) override { peerKey_ = peerKey; }
  void withdrawPrepacked() noexcept override;
  uint64_t prepacksUsed() const override { return prepacksUsed_.load(std::memory_order_relaxed); }
  uint64_t peerPrepacksRead() const override {
    return peerPrepacksRead_.load(std::memory_order_relaxed);
  }
  // Whether the ranks share one CPU mask and outnumber its CPUs evenly (see
  // ShmBackendOptions::peerYield; decided at set-up, the same on every
  // rank). Any thread.
  bool ranksShareCpusEvenly() const { return evenShare_; }
  // Whether this rank claims the lines it alone read
  // (ShmBackendOptions::claimLines and ShmPlacement::ranksFit), and whether
  // its waits for a peer poll before they sleep (its own mask holds the
  // ranks, or ShmPlacement::ownCpusAlone); set at construction, any thread.
  bool claimsLines() const { return claim_; }
  bool pollsPeers() const { return spinIterations_ > 0; }
  // Whether its waits yield the CPU before they sleep (evenShare, or
  // ShmPlacement::matesCrowd). Any thread.
  bool yieldsToPeers() const { return yieldWindow_.count() > 0; }
  // Chunks up to this many bytes are reduced whole by every rank (set-up's
  // pick: 64 KiB, or smallChunkBytesWhenCrowded). Any thread.
  size_t smallChunkBytes() const { return scratch_.size(); }
  // How many waits for a peer so far went to sleep (a futex) rather than
  // ending while polling or yielding. Any thread.
  uint64_t waitSleeps() const { return waitSleeps_.load(std::memory_order_relaxed); }
  Status allgatherv(const void* in, void* out, const std::vector<size_t>& counts,
                    DataType dtype) override;
  Status broadcast(void* data, size_t count, DataType dtype, int root) override;
  Status alltoallv(const void* in, const std::vector<int64_t>& send, void* out,
                   const std::vector<int64_t>& recv, DataType dtype) override;
  Status reducescatter(void* inout, const std::vector<size_t>& counts, DataType dtype,
                       ReduceOp op) override;
  Status barrier() override;
  void abort() noexcept override;
  // The chunk (at most the slot) and the cut-over to the fallback.
  void tune(const TuningValues& values) override;
  // Called after every sleep slice of a wait for a peer (and passed on to
  // the fallback).
  void setWaitHook(std::function<void()> hook) override;
  // Not for what the fallback runs (one rank, below minBytes).
  bool callsWaitHook(size_t count, DataType dtype) const override {
    return !delegates(count * dataTypeSize(dtype));
  }

  // The cross stage of the hierarchical allreduce (HierBackend): start(part,
  // count) hands over this rank's part of a chunk (`count` elements in its
  // own slot, reduced over this host) to be allreduced with the other hosts
  // and returns at once; wait() blocks until the oldest exchange not yet
  // waited for has left its part reduced over every host, and returns its
  // status. Exchanges run in the order started; only non-empty parts, the
  // same parts on every host.
  struct CrossStage {
    std::function<void(void* part, size_t count)> start;
    std::function<Status()> wait;
  };
  // The hierarchical allreduce's local stages: per chunk, this host's ranks
  // reduce-scatter through shared memory (always split into one part per
  // rank, never the small-chunk path, so that every part has one owner),
  // each owner hands its part to `cross`, and every rank gathers all parts
  // once their owners published them. `overlap`: chunk k's exchange runs
  // while this rank packs and reduces chunk k+1 (in the other slot); else
  // each exchange is waited for at once. On failure an exchange may still
  // be running: the caller aborts it and waits it out. pack/unpack as for
  // allreduceGather; size_ > 1 and op supported. `combine` (may be empty): this
  // rank's own part of each chunk is not packed but combined straight from
  // the input, as in allreduceGatherCombine.
  Status allreduceCross(size_t count, DataType dtype, ReduceOp op, const PackFn& pack,
                        const UnpackFn& unpack, const CrossStage& cross, bool overlap,
                        const CombineFn& combine = CombineFn());

 private:
  // What prepackAllreduce packed: chunk `chunk`'s slot holds the first
  // chunk's elements [0, packedTo) (`len` in all, without [skipLo, skipHi))
  // of the allreduce `token` of `count` elements. token 0: nothing. Every
  // collective that writes the slots advances chunks_ (finishChunk), so
  // after one `chunk` no longer matches; one the fallback ran left the slot
  // as it was.
  struct Prepacked {
    uint64_t token = 0, chunk = 0;
    size_t count = 0, len = 0, skipLo = 0, skipHi = 0, packedTo = 0;
    DataType dtype = DataType::kFloat32;
    ReduceOp op = ReduceOp::kSum;
  };
  // Hands out what was packed ahead for the allreduce the caller said comes
  // next (expectPrepacked), and forgets both; `peerKey` gets (and forgets)
  // expectPeersPrepacked's key.
  Prepacked takePrepacked(uint64_t* peerKey);
  // Whether rank `peer` published a complete pack ahead of chunk `c` under
  // `key` (ShmHeader::prepackedChunk).
  bool peerPrepacked(int peer, uint32_t c, uint64_t key) const;
  // A chunk's layout: its length, this rank's part [lo, hi), whether every
  // rank reduces it whole (small) and whether this rank's own part is left
  // unpacked (combined from the input instead).
  struct ChunkPlan {
    size_t len = 0, partElems = 0, lo = 0, hi = 0;
    bool small = false, skipOwn = false;
  };
  ChunkPlan planChunk(size_t base, size_t count, size_t es, bool combine) const;
  // The shared-memory allreduce; size_ > 1, count > 0, op supported.
  // `combine` may be empty (every element packed). `ahead`: what was packed
  // ahead for it (used when it is this very chunk and layout).
  // `staging`: the caller's (Backend::allreduceGather), where small chunks
  // are reduced when given; null: private scratch.
  // `peerKey`: expectPeersPrepacked's (0: none).
  Status shmAllreduce(size_t count, DataType dtype, ReduceOp op, const PackFn& pack,
                      const UnpackFn& unpack, const CombineFn& combine, const Prepacked& ahead,
                      uint64_t peerKey, const std::string& what, uint8_t* staging = nullptr);
  // allreduceCross's pipeline; same preconditions.
  Status shmAllreduceCross(size_t count, DataType dtype, ReduceOp op, const PackFn& pack,
                           const UnpackFn& unpack, const std::string& what, const CrossStage& cross,
                           bool overlap, const CombineFn& combine);
  // Packs chunk elements [from, to) (call elements from `base`) into `slot`,
  // except [skipLo, skipHi) (the own part, combined later; skipLo == skipHi
  // == the chunk's length packs everything).
  void packChunk(size_t base, size_t from, size_t to, size_t skipLo, size_t skipHi, uint8_t* slot,
                 size_t es, const PackFn& pack);
  // Step 2 of a split chunk: this rank's part, call elements [begin, end),
  // reduced at `acc` (`at` elements into chunk c's slots): its own values
  // first, then every peer's in rank order, so the bits do not depend on
  // timing. combineOwn: its own values were not packed, and the first step
  // combines them straight from the input (or packs them if the caller
  // cannot).
  void reduceOwnPart(size_t begin, size_t end, uint8_t* acc, uint32_t c, size_t at, size_t es,
                     bool combineOwn, ReduceFn reduce, const PackFn& pack,
                     const CombineFn& combine);
  // Each rank copies chunk k of its part into its slot, then every part's
  // chunk k out of the slots; size_ > 1, byte sizes and offsets per rank.
  Status shmAllgatherv(const uint8_t* in, uint8_t* out, const std::vector<size_t>& bytes,
                       const std::vector<size_t>& offset, const std::string& what);
  // Root copies each chunk into its slot, the others out of it; size_ > 1.
  Status shmBroadcast(uint8_t* data, size_t bytes, int root, const std::string& what);
  // shm_exchange.cc; size_ > 1, arguments checked.
  Status shmReducescatter(uint8_t* data, const std::vector<size_t>& counts, DataType dtype,
                          ReduceOp op, const std::string& what);
  Status shmAlltoallv(const uint8_t* in, const std::vector<size_t>& sendBytes,
                      const std::vector<size_t>& sendOff, uint8_t* out,
                      const std::vector<size_t>& recvBytes, const std::vector<size_t>& recvOff,
                      const std::string& what);
  // After reading [p, p + bytes) of a peer's slot: claims its lines
  // (ShmBackendOptions::claimLines) where no other peer reads that range
  // before its owner writes it again: `soleReader`, or two ranks. (The
  // owner may still read its own slot meanwhile; the line then moves back,
  // which costs time only.) It stores back the bytes it loads. Until this
  // rank publishes `consumed` for the chunk, the owner writes the range at
  // most with the same bytes (a pack ahead it published, packed again in
  // its own run; ShmBackend::peerPrepacked) and no peer writes it at all, so
  // a claim never changes a byte; a range wrongly taken for one this rank
  // alone reads costs time, not a result. Executor thread (the collective's).
  void claimRead(uint8_t* p, size_t bytes, bool soleReader);
  // One rank (no peers) or a payload below minBytes: the fallback runs it.
  bool delegates(size_t bytes) const { return size_ == 1 || bytes < minBytes_; }
  std::function<void()> waitHook_;  // setWaitHook
  // Before writing this rank's slot for chunk `c` (that slot last held c-2).
  Status waitSlotFree(uint32_t c, const std::string& what);
  // Publishes the chunk consumed (and every counter current) and counts it.
  void finishChunk();
  // Waits until rank `peer`'s counter `which` reaches `want`.
  Status waitFor(int peer, ShmCounter ShmHeader::*which, uint32_t want, const char* phase,
                 const std::string& what);
  // "rank <set rank>" for communicator rank r (opts_.rankNames).
  std::string rankName(int r) const;
  // Publishes this rank's counter and wakes peers that sleep.
  void publish(ShmCounter ShmHeader::*which, uint32_t value);
  Status checkUsable(const std::string& what) const;
  Status fail(Status s);  // records the first failure, aborts the fallback
  template <typename F>
  Status delegate(const std::string& what, F&& call);

  std::vector<std::unique_ptr<ShmSegment>> segs_;
  const int rank_;
  const int size_;
  std::unique_ptr<Backend> fallback_;
  const ShmBackendOptions opts_;
  uint64_t chunks_ = 0;             // chunks run so far; executor thread only
  size_t chunkBytes_;               // the pipeline's chunk (autotune); executor thread only
  size_t minBytes_;                 // below: the fallback (autotune); executor thread only
  std::vector<uint8_t> scratch_;    // small-chunk reduction target; executor thread only
  int spinIterations_ = 0;          // before sleeping; 0 where waits sleep at once (pollsPeers)
  bool yieldToOwnThreads_ = false;  // polls give the CPU away between looks (ownCpusAlone)
  bool evenShare_ = false;          // ranksShareCpusEvenly
  bool claim_ = false;              // claimsLines
  std::chrono::nanoseconds yieldWindow_{0};  // before sleeping (ShmBackendOptions::peerYield)
  std::chrono::nanoseconds spinWindow_{0};   // before sleeping (ShmBackendOptions::peerSpin)
  std::vector<bool> watchPid_;               // whether a peer's death shows as its pid vanishing
  Prepacked prepacked_;                      // prepackAllreduce; executor thread only
  uint64_t expected_ = 0;                    // expectPrepacked; executor thread only
  uint64_t peerKey_ = 0;                     // expectPeersPrepacked; executor thread only
  std::atomic<uint64_t> prepacksUsed_{0};
  std::atomic<uint64_t> peerPrepacksRead_{0};
  std::atomic<uint64_t> waitSleeps_{0};

  std::atomic<bool> aborted_{false};
  mutable std::mutex brokenMu_;
  Status broken_;  // guarded by brokenMu_
};

template <typename F>
Status ShmBackend::delegate(const std::string& what, F&& call) {
  HORA_RETURN_IF_ERROR(checkUsable(what));
  Status s = call();
  // Bad arguments leave a backend usable; anything else broke the fallback.
  if (!s.isOk() && s.code() != Code::kInvalidArgument) {
    std::lock_guard<std::mutex> lock(brokenMu_);
    if (broken_.isOk()) broken_ = s;
  }
  return s;
}

// Sets up shared memory among the `size` ranks of a communicator and wraps
// `fallback` (already connected, same ranks). Every rank publishes its host
// identity under `store`; if all match, each creates and maps its segment
// and maps every peer's, and the ranks agree through the store that all of
// them succeeded. If any rank cannot (another host, /dev/shm missing or too
// small, a mapping error), every rank gets `fallback` back unchanged and
// *whyNot says why (an empty *whyNot means shm is in use). Fails (kTimeout
// or the store's error) only when the exchange itself fails; then the
// fallback is gone too and the set cannot start. size 1 returns fallback.
Result<std::unique_ptr<Backend>> createShmBackend(std::shared_ptr<Store> store, int rank, int size,
                                                  const ShmBackendOptions& opts,
                                                  std::unique_ptr<Backend> fallback,
                                                  std::string* whyNot);

}  // namespace hora
