#include "ops/shm/shm_backend.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <thread>
#include <utility>

#include "core/cpu_affinity.h"
#include "core/cpu_relax.h"
#include "core/hmac.h"
#include "core/host_identity.h"
#include "core/reduce.h"
#include "core/spin_wait.h"

namespace hora {
namespace {

using Clock = std::chrono::steady_clock;

// Checks before a waiter goes to sleep, and before the time-bounded poll
// (ShmBackendOptions::peerSpin). The peer usually is a few microseconds
// behind (it runs the same copies); a short spin catches that without a
// syscall. When the ranks outnumber the cores a spinner steals the core the
// awaited rank needs, so then waiters yield it (peerYield) or sleep at once.
constexpr int kSpinIterations = 2000;
// With ShmPlacement::ownCpusAlone alone, how long a long poll keeps the
// CPU before it starts giving it to this rank's own threads.
constexpr int kOwnThreadsFirstUs = 50;

// Longest sleep between checks of abort, deadline and peer liveness.
constexpr int kSleepSliceMs = 5;
// Chunks up to this size are reduced whole by every rank (one round of
// waiting less); above it each rank reduces 1/n and the parts are exchanged.
constexpr size_t kSmallChunkBytes = 64 << 10;
// Parts start on cache-line boundaries so two ranks never write one line.
constexpr size_t kLineBytes = 64;  // a cache line: claimRead's stride
constexpr size_t kPartAlignBytes = kLineBytes;
// Packing ahead asks its caller whether to stop after each piece of this
// size (about a microsecond of copying here).
constexpr size_t kPackAheadPieceBytes = 16 << 10;

std::string describe(size_t count, DataType dtype, ReduceOp op) {
  return std::string("shm allreduce(count=") + std::to_string(count) +
         ", dtype=" + dataTypeName(dtype) + ", op=" + reduceOpName(op) + ")";
}

std::string seconds(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g s", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}

}  // namespace

ShmBackend::ShmBackend(std::vector<std::unique_ptr<ShmSegment>> segments, int rank,
                       std::unique_ptr<Backend> fallback, const ShmBackendOptions& opts,
                       const ShmPlacement& placement)
    : segs_(std::move(segments)),
      rank_(rank),
      size_(static_cast<int>(segs_.size())),
      fallback_(std::move(fallback)),
      opts_(opts),
      chunkBytes_(std::min(opts.chunkBytes, segs_[rank_]->slotBytes())),
      minBytes_(opts.minBytes) {
  const size_t small = placement.crowdedUnevenly && opts_.smallChunkBytesWhenCrowded > 0
                           ? opts_.smallChunkBytesWhenCrowded
                           : kSmallChunkBytes;
  // Touched now, not on the first small allreduce.
  scratch_.assign(std::min(small, segs_[rank_]->slotBytes()), 0);
  // Polling where this rank's own mask holds the ranks, or where no other
  // rank of the set may run on its CPUs (a launcher's core per rank; every
  // wait here is for a peer, though the peer may wait for one of this
  // rank's own threads sharing the CPU, so those polls yield it between
  // looks: yieldToOwnThreads_). Not merely where the masks together hold a
  // CPU per rank: they may still share one (masks {0}, {0}, {1,2}), and
  // there a poller keeps the CPU from the peer it waits for. With a core per rank
  // (taskset), 1 MiB at 2 ranks took 136 us sleeping at once against 79
  // polling, 4 MiB 612 against 318 (bench/results/2026-11-28-claim-lines.md).
  const bool ownMaskHoldsRanks = !placement.matesCrowd && size_ <= usableCpuCount();
  spinIterations_ = ownMaskHoldsRanks || placement.ownCpusAlone ? kSpinIterations : 0;
  yieldToOwnThreads_ = !ownMaskHoldsRanks && placement.ownCpusAlone;
  if (spinIterations_ > 0) spinWindow_ = opts_.peerSpin;
  evenShare_ = placement.evenShare;
  claim_ = opts_.claimLines && (placement.ranksFit || opts_.claimLinesAnyPlacement) && size_ > 1;
  if (placement.evenShare || placement.matesCrowd) yieldWindow_ = opts_.peerYield;
  // A peer in another pid namespace (containers sharing /dev/shm) has a pid
  // that means nothing here: only watch pids that exist now.
  watchPid_.resize(segs_.size(), false);
  for (int j = 0; j < size_; ++j) {
    const pid_t pid = segs_[j]->header().pid;
    watchPid_[j] = pid != ::getpid() && (::kill(pid, 0) == 0 || errno == EPERM);
  }
}

ShmBackend::~ShmBackend() = default;

Status ShmBackend::checkUsable(const std::string& what) const {
  if (aborted_.load(std::memory_order_acquire))
    return Status(Code::kRemoteError, what + ": backend was aborted (a peer rank was lost)");
  std::lock_guard<std::mutex> lock(brokenMu_);
  if (!broken_.isOk())
    return Status(broken_.code(),
                  what + ": backend unusable after an earlier failure: " + broken_.message());
  return Status::ok();
}

Status ShmBackend::fail(Status s) {
  {
    std::lock_guard<std::mutex> lock(brokenMu_);
    if (broken_.isOk()) broken_ = s;
  }
  // The ranks no longer agree on what was exchanged: the fallback's next
  // call must not start a collective the others will never join.
  fallback_->abort();
  return s;
}

void ShmBackend::abort() noexcept {
  aborted_.store(true, std::memory_order_release);
  fallback_->abort();
  // A peer must not finish, on this rank's pack ahead, an allreduce this
  // rank will not run: without the word it waits for `packed` and sees gaveUp.
  withdrawPrepacked();
  // Tell the peers too (ShmHeader::gaveUp), and wake any that sleep.
  segs_[rank_]->header().gaveUp.value.store(1, std::memory_order_seq_cst);
  for (const auto& seg : segs_) shmFutexWakeAll(seg->header().doorbell.value);
}

std::string ShmBackend::rankName(int r) const {
  const bool named = static_cast<size_t>(r) < opts_.rankNames.size();
  return "rank " + std::to_string(named ? opts_.rankNames[r] : r);
}

void ShmBackend::publish(ShmCounter ShmHeader::*which, uint32_t value) {
  (segs_[rank_]->header().*which).value.store(value, std::memory_order_seq_cst);
  // Pairs with the waiter's sleeping=1 / re-check (both seq_cst): either it
  // sees the new value before sleeping or this sees it asleep and rings.
  for (int j = 0; j < size_; ++j) {
    if (j == rank_) continue;
    ShmHeader& h = segs_[j]->header();
    if (h.sleeping.value.load(std::memory_order_seq_cst) != 0) shmFutexWakeAll(h.doorbell.value);
  }
}

void ShmBackend::claimRead(uint8_t* p, size_t bytes, bool soleReader) {
  if (!claim_ || bytes == 0 || !(soleReader || size_ == 2)) return;
  // The first byte, then the first byte of every later line the range
  // touches (a range may start mid-line: reducescatter regions).
  auto forEachLine = [p, bytes](auto&& fn) {
    const uintptr_t first = reinterpret_cast<uintptr_t>(p);
    fn(p);
    for (uintptr_t a = (first / kLineBytes + 1) * kLineBytes; a < first + bytes; a += kLineBytes)
      fn(reinterpret_cast<uint8_t*>(a));
  };
  // Relaxed atomics: a store the compiler may not drop, of the byte loaded.
  auto load = [](uint8_t* b) { return __atomic_load_n(b, __ATOMIC_RELAXED); };
  if (opts_.claimHoldForTests.count() == 0) {
    forEachLine([&](uint8_t* b) { __atomic_store_n(b, load(b), __ATOMIC_RELAXED); });
    return;
  }
  // Tests: every byte read first, stored back after a pause, so that a claim
  // placed where the owner may write meanwhile would undo the write.
  std::vector<std::pair<uint8_t*, uint8_t>> seen;
  forEachLine([&](uint8_t* b) { seen.emplace_back(b, load(b)); });
  std::this_thread::sleep_for(opts_.claimHoldForTests);
  for (const auto& [b, v] : seen) __atomic_store_n(b, v, __ATOMIC_RELAXED);
}

Status ShmBackend::waitSlotFree(uint32_t c, const std::string& what) {
  // The slot of chunk c last held chunk c-2: every peer must be done reading it.
  if (c < 2 && chunks_ < 2) return Status::ok();
  const uint32_t want = c - 1;
  for (int j = 0; j < size_; ++j) {
    if (j == rank_) continue;
    HORA_RETURN_IF_ERROR(
        waitFor(j, &ShmHeader::consumed, want, "finish reading the chunk before last", what));
  }
  return Status::ok();
}

void ShmBackend::finishChunk() {
  const uint32_t next = static_cast<uint32_t>(chunks_) + 1;
  // A pack ahead this rank published for this chunk has served: a peer that
  // has not looked yet finds `packed`, published when the chunk began. So no
  // word outlives its chunk (not even by 2^32 chunks, when the counter wraps).
  if (segs_[rank_]->header().prepackedChunk.value.load(std::memory_order_relaxed) == next)
    withdrawPrepacked();
  // Every counter advances every chunk, whether or not this collective used
  // it (small allreduce chunks, broadcast and allgather never reduce), so
  // none lags 2^31 chunks behind and compares as "reached" after wrapping.
  if ((segs_[rank_]->header().reduced.value.load(std::memory_order_relaxed)) != next)
    publish(&ShmHeader::reduced, next);
  publish(&ShmHeader::consumed, next);
  ++chunks_;
}

Status ShmBackend::waitFor(int peer, ShmCounter ShmHeader::*which, uint32_t want, const char* phase,
                           const std::string& what) {
  std::atomic<uint32_t>& word = (segs_[peer]->header().*which).value;
  for (int i = 0; i < spinIterations_; ++i) {
    if (shmReached(word.load(std::memory_order_acquire), want)) return Status::ok();
    cpuRelax();
  }
  // Beside busy processes (ShmBackendOptions::peerSpin): 4 MiB at 2 ranks
  // next to two busy loops took 2.1-4.0 ms with the short spin above, about
  // 0.6 ms polling for 0.55 ms or more (bench/results/2026-11-28-peer-spin.md).
  if (spinWindow_.count() > 0) {
    const Clock::time_point start = Clock::now(), until = start + spinWindow_;
    // On a CPU of its own but shared with this rank's other threads (a
    // launcher's core per rank) the peer may be waiting for one of them
    // (the control thread's frames still going out): past the first
    // kOwnThreadsFirstUs, give the CPU away every 64 looks. Not sooner: a
    // yield from the start, handing the CPU to the rank's own polling
    // threads, made 4 MiB allreduces 7-9% slower with taskset'd ranks.
    const Clock::time_point yieldFrom =
        yieldToOwnThreads_ ? start + std::chrono::microseconds(kOwnThreadsFirstUs) : until;
    for (uint32_t i = 1;; ++i) {
      if (shmReached(word.load(std::memory_order_acquire), want)) return Status::ok();
      if ((i & 63) == 0) {
        if (aborted_.load(std::memory_order_relaxed)) break;
        const Clock::time_point now = Clock::now();
        if (now >= until) break;
        if (now >= yieldFrom) ::sched_yield();
      }
      cpuRelax();
    }
  }
  // At 4 ranks on 2 cores: 128 KiB allreduces 187 -> 102 us, 4 MiB 3.30 ->
  // 3.04 ms (bench/results/2026-11-28-caller-home.md).
  if (yieldWindow_.count() > 0) {
    const Clock::time_point until = Clock::now() + yieldWindow_;
    // Clock and abort read every round: next to a busy process one yield
    // can hand it a whole time slice.
    while (!shmReached(word.load(std::memory_order_acquire), want)) {
      if (aborted_.load(std::memory_order_relaxed) || Clock::now() >= until) break;
      ::sched_yield();
    }
    if (shmReached(word.load(std::memory_order_acquire), want)) return Status::ok();
  }
  ShmHeader& me = segs_[rank_]->header();
  waitSleeps_.fetch_add(1, std::memory_order_relaxed);
  const auto deadline = Clock::now() + opts_.timeout;
  const pid_t peerPid = segs_[peer]->header().pid;
  const std::string who = rankName(peer) + " (pid " + std::to_string(peerPid) + ")";
  for (;;) {
    me.sleeping.value.store(1, std::memory_order_seq_cst);
    const uint32_t bell = me.doorbell.value.load(std::memory_order_seq_cst);
    const bool done = shmReached(word.load(std::memory_order_seq_cst), want);
    if (!done && !aborted_.load(std::memory_order_acquire))
      shmFutexWait(me.doorbell.value, bell, kSleepSliceMs);
    me.sleeping.value.store(0, std::memory_order_relaxed);
    if (shmReached(word.load(std::memory_order_acquire), want)) return Status::ok();
    if (waitHook_) waitHook_();
    if (aborted_.load(std::memory_order_acquire))
      return Status(Code::kRemoteError, what + ": aborted while waiting for " + who + " to " +
                                            phase + " (a peer rank was lost)");
    for (int j = 0; j < size_; ++j)
      if (j != rank_ && segs_[j]->header().gaveUp.value.load(std::memory_order_acquire) != 0)
        return Status(Code::kRemoteError,
                      what + ": " + rankName(j) +
                          " gave up on its collectives (its process set failed or shut down "
                          "there; its own error names the cause) while this rank waited for " +
                          who + " to " + phase);
    if (watchPid_[peer] && ::kill(peerPid, 0) != 0 && errno == ESRCH)
      return Status(Code::kRemoteError,
                    what + ": " + who + " exited while this rank waited for it to " + phase);
    if (Clock::now() >= deadline)
      return timeoutError(what + ": " + who + " did not " + phase + " within " +
                          seconds(opts_.timeout) +
                          "; a peer rank may have died or stalled (the bound is "
                          "HORA_PEER_TIMEOUT_S)");
  }
}

void ShmBackend::setWaitHook(std::function<void()> hook) {
  fallback_->setWaitHook(hook);
  waitHook_ = std::move(hook);
}

void ShmBackend::tune(const TuningValues& v) {
  // Every rank gets the same values between the same two collectives and
  // has the same slot size (agreed at set-up), so every rank clamps alike.
  const size_t slot = segs_[rank_]->slotBytes();
  size_t chunk = v.shmChunkBytes > 0 ? std::min(static_cast<size_t>(v.shmChunkBytes), slot) : slot;
  chunkBytes_ = std::max<size_t>(64, chunk / 64 * 64);
  minBytes_ = static_cast<size_t>(std::max<int64_t>(v.shmMinBytes, 0));
  fallback_->tune(v);
}

void ShmBackend::packChunk(size_t base, size_t from, size_t to, size_t skipLo, size_t skipHi,
                           uint8_t* slot, size_t es, const PackFn& pack) {
  const size_t aHi = std::min(to, skipLo), bLo = std::max(from, skipHi);
  if (from < aHi) pack(base + from, base + aHi, slot + from * es);
  if (bLo < to) pack(base + bLo, base + to, slot + bLo * es);
}

void ShmBackend::reduceOwnPart(size_t begin, size_t end, uint8_t* acc, uint32_t c, size_t at,
                               size_t es, bool combineOwn, ReduceFn reduce, const PackFn& pack,
                               const CombineFn& combine) {
  bool ownPacked = !combineOwn;
  for (int j = 0; j < size_; ++j) {
    if (j == rank_) continue;
    const uint8_t* other = segs_[j]->slot(c) + at * es;
    if (!ownPacked) {
      ownPacked = true;
      if (combine(begin, end, acc, other, false)) continue;
      pack(begin, end, acc);  // the caller could not combine
    }
    reduce(acc, acc, other, end - begin);
  }
  if (!ownPacked) pack(begin, end, acc);  // no peer (not reached: size_ > 1)
}

ShmBackend::ChunkPlan ShmBackend::planChunk(size_t base, size_t count, size_t es,
                                            bool combine) const {
  const size_t chunkElems = std::max<size_t>(1, chunkBytes_ / es);
  const size_t align = std::max<size_t>(1, kPartAlignBytes / es);
  const size_t n = static_cast<size_t>(size_);
  ChunkPlan p;
  p.len = std::min(chunkElems, count - base);
  p.small = p.len * es <= scratch_.size();
  const size_t per = (p.len + n - 1) / n;
  p.partElems = (per + align - 1) / align * align;
  p.lo = std::min(p.len, static_cast<size_t>(rank_) * p.partElems);
  p.hi = std::min(p.len, static_cast<size_t>(rank_ + 1) * p.partElems);
  // Split chunks: this rank's part of its own slot is read by no peer
  // before this rank reduced it (step 2), so with a combine function it is
  // not packed: step 2 reads it straight from the input.
  p.skipOwn = !p.small && combine && p.hi > p.lo;
  return p;
}

ShmBackend::Prepacked ShmBackend::takePrepacked(uint64_t* peerKey) {
  Prepacked p;
  if (expected_ != 0 && prepacked_.token == expected_) p = prepacked_;
  prepacked_ = Prepacked();
  expected_ = 0;
  *peerKey = peerKey_;
  peerKey_ = 0;
  return p;
}

namespace {
// The published key: the caller's key and the first chunk's length, so that
// a peer whose chunk size changed since (autotune) finds no match.
uint64_t publishedKey(uint64_t peerKey, size_t len) {
  return (peerKey ^ (static_cast<uint64_t>(len) * 0x9e3779b97f4a7c15ull)) | 1;
}
}  // namespace

bool ShmBackend::peerPrepacked(int peer, uint32_t c, uint64_t key) const {
  ShmHeader& h = segs_[peer]->header();
  // The owner stores the key, then the chunk (both release, after the slot's
  // data): seeing the chunk, a reader sees the key and the data. Reading the
  // chunk again after the key catches a withdrawal in between. What keeps
  // the slot right while the reader reads it later is not this read but
  // when the owner writes the slot: only in its own run of chunk c (the same
  // allreduce, the same bytes) or once every peer consumed c. The owner
  // withdraws the word before it packs anything else, before each of its
  // request lists, when an allreduce runs without a chunk, when it finishes
  // the chunk and when it aborts (withdrawPrepacked).
  if (h.prepackedChunk.value.load(std::memory_order_acquire) != c + 1) return false;
  const uint64_t k = h.prepackedKey.value.load(std::memory_order_acquire);
  std::atomic_thread_fence(std::memory_order_acquire);
  return h.prepackedChunk.value.load(std::memory_order_acquire) == c + 1 && k == key;
}

void ShmBackend::withdrawPrepacked() noexcept {
  // Called before every request list: look first, so that the common case
  // (nothing published) does not take the line from the peers that read it.
  // Only this rank writes it non-zero, one thread at a time (a pack ahead),
  // so a zero seen here stays zero for what was published before.
  std::atomic<uint32_t>& word = segs_[rank_]->header().prepackedChunk.value;
  if (word.load(std::memory_order_relaxed) != 0) word.store(0, std::memory_order_seq_cst);
}

bool ShmBackend::prepackAllreduce(uint64_t token, uint64_t peerKey, size_t count, DataType dtype,
                                  ReduceOp op, const PackFn& pack,
                                  const std::function<bool()>& stop) {
  prepacked_ = Prepacked();
  // Whatever this rank published no longer holds once it packs again, or
  // once it has tried (the allreduce it was for may never run here).
  withdrawPrepacked();
  const size_t es = dataTypeSize(dtype);
  if (token == 0 || count == 0 || delegates(count * es) || reduceFunction(dtype, op) == nullptr ||
      !reduceOpSupported(op, dtype) || !checkUsable("pack ahead").isOk())
    return false;
  // The slot the next chunk uses must be free now (every peer done with the
  // chunk before last, as waitSlotFree would wait for): never wait here.
  const uint32_t c = static_cast<uint32_t>(chunks_);
  if (chunks_ >= 2) {
    for (int j = 0; j < size_; ++j)
      if (j != rank_ &&
          !shmReached(segs_[j]->header().consumed.value.load(std::memory_order_acquire), c - 1))
        return false;
  }
  // As shmAllreduce's first chunk with a combine function offered.
  const ChunkPlan p = planChunk(0, count, es, true);
  ShmHeader& own = segs_[rank_]->header();
  const size_t skipLo = p.skipOwn ? p.lo : p.len, skipHi = p.skipOwn ? p.hi : p.len;
  // In pieces, asking `stop` before each: the caller's other work waits at
  // most one piece. Pieces never straddle the own part, which is skipped,
  // not packed. `done`: every element before it that is packed at all is.
  const size_t piece = std::max<size_t>(1, kPackAheadPieceBytes / es);
  size_t done = 0;
  while (done < p.len) {
    if (stop && stop()) break;
    if (done >= skipLo && done < skipHi) done = skipHi;
    if (done >= p.len) break;
    const size_t to = std::min({p.len, done + piece, done < skipLo ? skipLo : p.len});
    packChunk(0, done, to, skipLo, skipHi, segs_[rank_]->slot(c), es, pack);
    done = to;
  }
  if (done == 0) return false;  // stopped before packing anything
  if (peerKey != 0 && done >= p.len) {
    own.prepackedKey.value.store(publishedKey(peerKey, p.len), std::memory_order_release);
    own.prepackedChunk.value.store(c + 1, std::memory_order_release);
  }
  prepacked_.packedTo = done;
  prepacked_.token = token;
  prepacked_.chunk = chunks_;
  prepacked_.count = count;
  prepacked_.len = p.len;
  prepacked_.skipLo = skipLo;
  prepacked_.skipHi = skipHi;
  prepacked_.dtype = dtype;
  prepacked_.op = op;
  return true;
}

Status ShmBackend::shmAllreduce(size_t count, DataType dtype, ReduceOp op, const PackFn& pack,
                                const UnpackFn& unpack, const CombineFn& combine,
                                const Prepacked& ahead, uint64_t peerKey, const std::string& what,
                                uint8_t* staging) {
  const size_t es = dataTypeSize(dtype);
  const ReduceFn reduce = reduceFunction(dtype, op);
  ShmSegment& own = *segs_[rank_];
  for (size_t base = 0; base < count;) {
    const ChunkPlan p = planChunk(base, count, es, static_cast<bool>(combine));
    const size_t len = p.len, partElems = p.partElems, lo = p.lo, hi = p.hi;
    const bool small = p.small, skipOwn = p.skipOwn;
    auto partLo = [&](size_t j) { return std::min(len, j * partElems); };
    auto partHi = [&](size_t j) { return std::min(len, (j + 1) * partElems); };
    const uint32_t c = static_cast<uint32_t>(chunks_);
    const uint32_t next = c + 1;
    HORA_RETURN_IF_ERROR(waitSlotFree(c, what));
    uint8_t* mine = own.slot(c);
    const size_t skipLo = skipOwn ? lo : len, skipHi = skipOwn ? hi : len;
    // Packed ahead (all or a prefix): the same allreduce, chunk and layout.
    const bool packedAhead = base == 0 && ahead.token != 0 && ahead.chunk == chunks_ &&
                             ahead.count == count && ahead.dtype == dtype && ahead.op == op &&
                             ahead.len == len && ahead.skipLo == skipLo && ahead.skipHi == skipHi;
    if (packedAhead) prepacksUsed_.fetch_add(1, std::memory_order_relaxed);
    packChunk(base, packedAhead ? ahead.packedTo : 0, len, skipLo, skipHi, mine, es, pack);
    publish(&ShmHeader::packed, next);
    // A peer that packed this chunk ahead and published it needs no wait:
    // its slot holds this allreduce's first chunk in this layout.
    const uint64_t key = base == 0 && peerKey != 0 ? publishedKey(peerKey, len) : 0;
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      if (key != 0 && peerPrepacked(j, c, key)) {
        peerPrepacksRead_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      HORA_RETURN_IF_ERROR(waitFor(j, &ShmHeader::packed, next, "pack its input", what));
    }
    if (small) {
      // 2'. Small chunk: every rank reduces all of it, in rank order (so every
      // rank computes the same bits), into the caller's staging (for one
      // tensor its output: unpack then has nothing to copy) or else private
      // scratch; the first step reads two slots (no copy of slot 0 first:
      // one pass less). The chunk's input is in this rank's slot already, so
      // writing over it (an in-place allreduce) loses nothing.
      // Ranks 0 and 1 take their own operand of that first step from their
      // input (combine, in the same operand order) instead of their slot,
      // which the peers are reading meanwhile: 64 KiB at 2 ranks went from
      // 15.7 to 11.6 us (bench/results/2026-11-28-small-combine.md). Not
      // ranks from 2 on: acc may be their input, already overwritten by the
      // first step when their own operand comes.
      uint8_t* acc = staging ? staging + base * es : scratch_.data();
      const uint8_t* s0 = segs_[0]->slot(c);
      const uint8_t* s1 = segs_[1]->slot(c);
      const bool combined =
          combine && rank_ < 2 && combine(base, base + len, acc, rank_ == 0 ? s1 : s0, rank_ == 1);
      if (!combined) reduce(acc, s0, s1, len);
      for (int j = 2; j < size_; ++j) reduce(acc, acc, segs_[j]->slot(c), len);
      unpack(base, base + len, acc);
      // Every rank reads every slot whole: sole reader at two ranks only.
      for (int j = 0; j < size_; ++j)
        if (j != rank_) claimRead(segs_[j]->slot(c), len * es, false);
    } else {
      // 2. This rank's part, reduced in place in its own slot: peers read
      // only their own parts of it until this rank publishes `reduced`. Own
      // value first, then the others in rank order.
      if (hi > lo)
        reduceOwnPart(base + lo, base + hi, mine + lo * es, c, lo, es, skipOwn, reduce, pack,
                      combine);
      publish(&ShmHeader::reduced, next);
      // Only this rank reads its part of the peers' slots (after `reduced`:
      // the peers wait for that, not for this).
      if (hi > lo)
        for (int j = 0; j < size_; ++j)
          if (j != rank_) claimRead(segs_[j]->slot(c) + lo * es, (hi - lo) * es, true);
      // 3. Every part from the slot that holds it, this rank's first.
      for (int k = 0; k < size_; ++k) {
        const int j = (rank_ + k) % size_;
        const size_t plo = partLo(j), phi = partHi(j);
        if (phi <= plo) continue;
        if (j != rank_)
          HORA_RETURN_IF_ERROR(waitFor(j, &ShmHeader::reduced, next, "reduce its part", what));
        unpack(base + plo, base + phi, segs_[j]->slot(c) + plo * es);
        if (j != rank_) claimRead(segs_[j]->slot(c) + plo * es, (phi - plo) * es, false);
      }
    }
    finishChunk();
    base += len;
  }
  return Status::ok();
}

Status ShmBackend::allreduceGather(void* staging, size_t count, DataType dtype, ReduceOp op,
                                   const PackFn& pack, const UnpackFn& unpack) {
  return allreduceGatherCombine(staging, count, dtype, op, pack, unpack, CombineFn());
}

Status ShmBackend::allreduceGatherCombine(void* staging, size_t count, DataType dtype, ReduceOp op,
                                          const PackFn& pack, const UnpackFn& unpack,
                                          const CombineFn& combine) {
  const std::string what = describe(count, dtype, op);
  uint64_t peerKey = 0;
  const Prepacked ahead = takePrepacked(&peerKey);
  HORA_RETURN_IF_ERROR(checkUsable(what));
  if (reduceFunction(dtype, op) == nullptr || !reduceOpSupported(op, dtype))
    return invalidArgument(what + ": unsupported dtype/op");
  if (count == 0 || delegates(count * dataTypeSize(dtype))) {
    // No chunk runs: a pack ahead this rank published would stay valid for
    // the chunk it named, and a later run of the same tensor there would
    // match it with other data (autotune moves min bytes; ShmNegotiation.
    // ATensorAllreducedWhileAutotuneMovesItsCutOverStaysExact).
    withdrawPrepacked();
    if (count == 0) return Status::ok();
    return delegate(
        what, [&] { return fallback_->allreduceGather(staging, count, dtype, op, pack, unpack); });
  }
  Status s = shmAllreduce(count, dtype, op, pack, unpack, combine, ahead, peerKey, what,
                          static_cast<uint8_t*>(staging));
  return s.isOk() ? s : fail(s);
}

Status ShmBackend::allreduceCross(size_t count, DataType dtype, ReduceOp op, const PackFn& pack,
                                  const UnpackFn& unpack, const CrossStage& cross, bool overlap,
                                  const CombineFn& combine) {
  const std::string what = describe(count, dtype, op) + " inside a host";
  HORA_RETURN_IF_ERROR(checkUsable(what));
  if (reduceFunction(dtype, op) == nullptr || !reduceOpSupported(op, dtype))
    return invalidArgument(what + ": unsupported dtype/op");
  if (count == 0) return Status::ok();
  if (size_ == 1) return internalError(what + ": a host with one rank has no local stage");
  Status s = shmAllreduceCross(count, dtype, op, pack, unpack, what, cross, overlap, combine);
  return s.isOk() ? s : fail(s);
}

Status ShmBackend::shmAllreduceCross(size_t count, DataType dtype, ReduceOp op, const PackFn& pack,
                                     const UnpackFn& unpack, const std::string& what,
                                     const CrossStage& cross, bool overlap,
                                     const CombineFn& combine) {
  const size_t es = dataTypeSize(dtype);
  const ReduceFn reduce = reduceFunction(dtype, op);
  ShmSegment& own = *segs_[rank_];
  // Whole slots, which the hierarchy makes of one chunk (HORA_SHM_CHUNK_BYTES):
  // each chunk is also one call of the cross stage. 1 MiB beat 4 MiB (the
  // first measurements, bench/results/2026-11-24-hier-allreduce.md, were with
  // Gloo across, whose per-call cost was far higher): at 10 Gbit/s 0.71-0.87
  // of the time (bench/results/2026-11-29-hier-kernel-mates.md).
  const size_t chunkElems = std::max<size_t>(1, own.slotBytes() / es);
  const size_t align = std::max<size_t>(1, kPartAlignBytes / es);
  const size_t n = static_cast<size_t>(size_);
  struct Chunk {
    size_t base = 0, len = 0, partElems = 0;
    bool crossing = false;  // this rank's part was handed to `cross`
  };
  auto partLo = [&](const Chunk& k, size_t j) { return std::min(k.len, j * k.partElems); };
  auto partHi = [&](const Chunk& k, size_t j) { return std::min(k.len, (j + 1) * k.partElems); };
  // Stage 1 of chunk c: pack it, reduce this rank's part over the host, hand
  // the part to the cross stage.
  auto local = [&](Chunk& k, uint32_t c) -> Status {
    HORA_RETURN_IF_ERROR(waitSlotFree(c, what));
    uint8_t* mine = own.slot(c);
    const size_t per = (k.len + n - 1) / n;
    k.partElems = (per + align - 1) / align * align;
    const size_t lo = partLo(k, rank_), hi = partHi(k, rank_);
    // As in shmAllreduce: this rank's own part is read by no peer before it is
    // reduced, so with a combine function it is not packed.
    const bool skipOwn = combine && hi > lo;
    packChunk(k.base, 0, k.len, skipOwn ? lo : k.len, skipOwn ? hi : k.len, mine, es, pack);
    publish(&ShmHeader::packed, c + 1);
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      HORA_RETURN_IF_ERROR(waitFor(j, &ShmHeader::packed, c + 1, "pack its input", what));
    }
    if (hi > lo) {
      uint8_t* acc = mine + lo * es;
      reduceOwnPart(k.base + lo, k.base + hi, acc, c, lo, es, skipOwn, reduce, pack, combine);
      cross.start(acc, hi - lo);
      k.crossing = true;
      for (int j = 0; j < size_; ++j)
        if (j != rank_) claimRead(segs_[j]->slot(c) + lo * es, (hi - lo) * es, true);
    }
    return Status::ok();
  };
  // Stage 3 of the oldest chunk in flight (chunks_): once its exchange is
  // done, publish the part and gather every part from its owner's slot.
  auto gather = [&](Chunk& k) -> Status {
    const uint32_t c = static_cast<uint32_t>(chunks_);
    if (k.crossing) {
      k.crossing = false;
      HORA_RETURN_IF_ERROR(cross.wait());
    }
    publish(&ShmHeader::reduced, c + 1);
    for (int i = 0; i < size_; ++i) {
      const int j = (rank_ + i) % size_;
      const size_t plo = partLo(k, j), phi = partHi(k, j);
      if (phi <= plo) continue;
      if (j != rank_)
        HORA_RETURN_IF_ERROR(
            waitFor(j, &ShmHeader::reduced, c + 1, "reduce its part across hosts", what));
      unpack(k.base + plo, k.base + phi, segs_[j]->slot(c) + plo * es);
      if (j != rank_) claimRead(segs_[j]->slot(c) + plo * es, (phi - plo) * es, false);
    }
    finishChunk();
    return Status::ok();
  };
  // With overlap the order is local(0), local(1), gather(0), local(2),
  // gather(1), ...: chunk k crosses while chunk k+1 is packed and reduced.
  // Every wait is for a chunk no later than the waiter's own, so no rank
  // waits for one that waits for it.
  Chunk pending;
  bool inFlight = false;
  for (size_t base = 0; base < count; base += chunkElems) {
    Chunk k;
    k.base = base;
    k.len = std::min(chunkElems, count - base);
    HORA_RETURN_IF_ERROR(local(k, static_cast<uint32_t>(chunks_) + (inFlight ? 1 : 0)));
    if (inFlight) HORA_RETURN_IF_ERROR(gather(pending));
    if (overlap) {
      pending = k;
      inFlight = true;
    } else {
      HORA_RETURN_IF_ERROR(gather(k));
    }
  }
  if (inFlight) HORA_RETURN_IF_ERROR(gather(pending));
  return Status::ok();
}

bool ShmBackend::needsStaging(size_t count, DataType dtype) const {
  return delegates(count * dataTypeSize(dtype));
}

Status ShmBackend::allreduce(void* data, size_t count, DataType dtype, ReduceOp op) {
  const std::string what = describe(count, dtype, op);
  HORA_RETURN_IF_ERROR(checkUsable(what));
  if (data == nullptr && count > 0) return invalidArgument(what + ": null buffer");
  const size_t es = dataTypeSize(dtype);
  auto* bytes = static_cast<uint8_t*>(data);
  return allreduceGather(
      data, count, dtype, op,
      [&](size_t lo, size_t hi, void* dst) {
        if (dst != bytes + lo * es) copyBytes(dst, bytes + lo * es, (hi - lo) * es);
      },
      [&](size_t lo, size_t hi, const void* src) {
        if (src != bytes + lo * es) copyBytes(bytes + lo * es, src, (hi - lo) * es);
      });
}

Status ShmBackend::allgatherv(const void* in, void* out, const std::vector<size_t>& counts,
                              DataType dtype) {
  size_t total = 0;
  for (size_t c : counts) total += c;
  const std::string what = std::string("shm allgatherv(total=") + std::to_string(total) +
                           ", dtype=" + dataTypeName(dtype) + ")";
  HORA_RETURN_IF_ERROR(checkUsable(what));
  if (counts.size() != static_cast<size_t>(size_))
    return invalidArgument(what + ": " + std::to_string(counts.size()) + " counts for " +
                           std::to_string(size_) + " ranks");
  const size_t es = dataTypeSize(dtype);
  if (total == 0) return Status::ok();
  if (out == nullptr || (counts[rank_] > 0 && in == nullptr))
    return invalidArgument(what + ": null buffer");
  if (delegates(total * es))
    return delegate(what, [&] { return fallback_->allgatherv(in, out, counts, dtype); });
  std::vector<size_t> bytes(counts.size()), offset(counts.size() + 1, 0);
  for (size_t q = 0; q < counts.size(); ++q) {
    bytes[q] = counts[q] * es;
    offset[q + 1] = offset[q] + bytes[q];
  }
  Status s = shmAllgatherv(static_cast<const uint8_t*>(in), static_cast<uint8_t*>(out), bytes,
                           offset, what);
  return s.isOk() ? s : fail(s);
}

Status ShmBackend::shmAllgatherv(const uint8_t* in, uint8_t* out, const std::vector<size_t>& bytes,
                                 const std::vector<size_t>& offset, const std::string& what) {
  ShmSegment& own = *segs_[rank_];
  const size_t slot = chunkBytes_;
  const size_t most = *std::max_element(bytes.begin(), bytes.end());
  // Chunk k carries bytes [k*slot, (k+1)*slot) of every rank's part (empty
  // for ranks whose part is shorter); the same count of chunks on every rank.
  for (size_t lo = 0; lo < most; lo += slot) {
    const uint32_t c = static_cast<uint32_t>(chunks_);
    const uint32_t next = c + 1;
    HORA_RETURN_IF_ERROR(waitSlotFree(c, what));
    auto len = [&](int q) { return lo < bytes[q] ? std::min(slot, bytes[q] - lo) : size_t{0}; };
    if (len(rank_) > 0) copyBytes(own.slot(c), in + lo, len(rank_));
    publish(&ShmHeader::packed, next);
    for (int k = 0; k < size_; ++k) {
      const int q = (rank_ + k) % size_;
      if (len(q) == 0) continue;
      if (q != rank_)
        HORA_RETURN_IF_ERROR(waitFor(q, &ShmHeader::packed, next, "publish its part", what));
      // In place (in == out + offset[rank]) the own copy rewrites equal bytes.
      copyBytes(out + offset[q] + lo, segs_[q]->slot(c), len(q));
      if (q != rank_) claimRead(segs_[q]->slot(c), len(q), false);
    }
    finishChunk();
  }
  return Status::ok();
}

Status ShmBackend::broadcast(void* data, size_t count, DataType dtype, int root) {
  const std::string what = std::string("shm broadcast(count=") + std::to_string(count) +
                           ", dtype=" + dataTypeName(dtype) + ", root=" + std::to_string(root) +
                           ")";
  HORA_RETURN_IF_ERROR(checkUsable(what));
  if (root < 0 || root >= size_) return invalidArgument(what + ": root outside the communicator");
  const size_t bytes = count * dataTypeSize(dtype);
  if (bytes == 0) return Status::ok();
  if (data == nullptr) return invalidArgument(what + ": null buffer");
  if (delegates(bytes))
    return delegate(what, [&] { return fallback_->broadcast(data, count, dtype, root); });
  Status s = shmBroadcast(static_cast<uint8_t*>(data), bytes, root, what);
  return s.isOk() ? s : fail(s);
}

Status ShmBackend::shmBroadcast(uint8_t* data, size_t bytes, int root, const std::string& what) {
  ShmSegment& own = *segs_[rank_];
  for (size_t base = 0; base < bytes; base += chunkBytes_) {
    const size_t len = std::min(chunkBytes_, bytes - base);
    const uint32_t c = static_cast<uint32_t>(chunks_);
    const uint32_t next = c + 1;
    if (rank_ == root) {
      HORA_RETURN_IF_ERROR(waitSlotFree(c, what));
      copyBytes(own.slot(c), data + base, len);
    }
    publish(&ShmHeader::packed, next);  // by every rank: see finishChunk
    if (rank_ != root) {
      HORA_RETURN_IF_ERROR(
          waitFor(root, &ShmHeader::packed, next, "publish its broadcast data", what));
      copyBytes(data + base, segs_[root]->slot(c), len);
      claimRead(segs_[root]->slot(c), len, false);
    }
    finishChunk();
  }
  return Status::ok();
}

// ------------------------------------------------------------ set-up

namespace {

// The first "no ..." entry, naming its rank; empty if every entry says "ok".
std::string firstRefusal(const std::vector<std::string>& all) {
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r].compare(0, 2, "ok") != 0)
      return "rank " + std::to_string(r) + ": " + all[r].substr(std::min<size_t>(3, all[r].size()));
  return "";
}

}  // namespace

Result<std::unique_ptr<Backend>> createShmBackend(std::shared_ptr<Store> store, int rank, int size,
                                                  const ShmBackendOptions& opts,
                                                  std::unique_ptr<Backend> fallback,
                                                  std::string* whyNot) {
  whyNot->clear();
  if (size <= 1) {
    *whyNot = "a single rank needs no shared memory";
    return fallback;
  }
  // Round 1: enabled everywhere, valid and equal settings, one host? Every
  // rank publishes its answer before deciding and sees the same answers, so
  // all decide alike (a rank that refuses cannot leave the others waiting
  // for its segment, and unequal settings would route one allreduce through
  // shm on some ranks and Gloo on others).
  const size_t slot = std::max(opts.slotBytes, opts.chunkBytes);
  std::string self;
  if (!opts.enabled) {
    self = "no HORA_SHM=0 on this rank";
  } else if (opts.chunkBytes < 64 || opts.chunkBytes % 64 != 0) {
    self = "no HORA_SHM_CHUNK_BYTES=" + std::to_string(opts.chunkBytes) +
           " on this rank is not a positive multiple of 64";
  } else if (slot % 64 != 0) {
    self = "no the shared-memory slot size " + std::to_string(slot) +
           " on this rank is not a multiple of 64";
  } else {
    // chunk/slot in one field: the settings every rank must share (with
    // the chunk for ranks that fit the CPUs, when there is one, and the
    // whole-chunk size where they crowd them unevenly: ranks disagreeing on
    // it would reduce one chunk two ways). After a tab, this rank's CPU mask
    // as a list, which may differ between ranks.
    self =
        "ok " + std::to_string(opts.chunkBytes) +
        (opts.chunkBytesWhenRanksFit > 0 ? "|" + std::to_string(opts.chunkBytesWhenRanksFit)
                                         : std::string()) +
        "/" + std::to_string(slot) +
        (opts.smallChunkBytesWhenCrowded > 0 ? ":" + std::to_string(opts.smallChunkBytesWhenCrowded)
                                             : std::string()) +
        " " + std::to_string(opts.minBytes) + " " +
        (opts.hostId.empty() ? hostIdentity() : opts.hostId) + "\t" + formatCpuList(allowedCpus()) +
        "\t" + std::to_string(std::max(opts.kernelRanks, size));
  }
  auto hosts = exchangeValues(*store, "host", rank, allRanks(size), self, opts.startTimeout,
                              "shared-memory set-up");
  if (!hosts.isOk()) return hosts.status();
  *whyNot = firstRefusal(hosts.value());
  if (!whyNot->empty()) return fallback;
  // Split off each rank's count of ranks on its kernel; the most counts.
  int kernelRanks = size;
  for (int r = 0; r < size; ++r) {
    std::string& v = hosts.value()[r];
    // After the CPU mask's tab: a string with one tab only carries no count.
    const size_t tab = v.rfind('\t');
    if (tab == std::string::npos || tab == 0 || v.rfind('\t', tab - 1) == std::string::npos)
      continue;
    int n = 0;
    if (parseKernelCount(v.substr(tab + 1), &n)) kernelRanks = std::max(kernelRanks, n);
    v.resize(tab);
  }
  // Split off each rank's CPUs; the rest must match. The ranks have a CPU
  // each when their masks together hold as many CPUs as there are ranks
  // (every mask the whole machine, or a launcher's core per rank); not when
  // a launcher put them all on fewer.
  std::set<int> cpusOfAll;
  bool cpusKnown = true, oneMask = true;
  std::vector<std::string> masks;
  std::vector<std::vector<int>> cpusOf(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    std::string& v = hosts.value()[r];
    const size_t tab = v.rfind('\t');
    if (tab == std::string::npos) {
      cpusKnown = false;
      continue;
    }
    masks.push_back(v.substr(tab + 1));
    std::vector<int>& cpus = cpusOf[r];
    if (parseCpuList(masks.back(), &cpus)) {
      cpusOfAll.insert(cpus.begin(), cpus.end());
    } else {
      cpusKnown = false;  // a rank that could not read its mask
    }
    oneMask = oneMask && masks.back() == masks.front();
    v.resize(tab);
  }
  // This rank's CPUs are in no other rank's mask (a launcher's core or
  // cores per rank): a peer never needs them.
  bool ownCpusAlone = cpusKnown && !cpusOf[rank].empty();
  for (int r = 0; r < size && ownCpusAlone; ++r) {
    if (r == rank) continue;
    for (int cpu : cpusOf[r])
      if (std::find(cpusOf[rank].begin(), cpusOf[rank].end(), cpu) != cpusOf[rank].end())
        ownCpusAlone = false;
  }
  const int cpusHeld = static_cast<int>(cpusOfAll.size());
  // Ranks beyond this communicator on its kernel (emulated or container
  // hosts) that, with it, outnumber the machine's CPUs (ShmPlacement::
  // matesCrowd).
  const long online =
      opts.onlineCpusForTests > 0 ? opts.onlineCpusForTests : ::sysconf(_SC_NPROCESSORS_ONLN);
  const bool matesCrowd = kernelRanks > size && online > 0 && kernelRanks > online;
  if (matesCrowd) ownCpusAlone = false;
  const bool ranksFit = cpusKnown && cpusHeld >= size && !matesCrowd;
  // Every rank on the same CPUs, two or more ranks to each (peerYield).
  const bool evenShare =
      cpusKnown && oneMask && cpusHeld > 0 && size > cpusHeld && size % cpusHeld == 0;
  auto settings = [](const std::string& v) { return v.substr(0, v.find(' ', v.find(' ', 3) + 1)); };
  for (int r = 1; r < size; ++r) {
    if (settings(hosts.value()[r]) != settings(hosts.value()[0])) {
      *whyNot = "HORA_SHM_CHUNK_BYTES / HORA_SHM_MIN_BYTES differ between ranks 0 and " +
                std::to_string(r) + " (\"" + settings(hosts.value()[0]).substr(3) + "\" vs \"" +
                settings(hosts.value()[r]).substr(3) +
                "\" as chunk/slot min; the slot is 4 MiB where HORA_SHM_CHUNK_BYTES is unset, "
                "the chunk where it is set; chunk|n: n is the chunk when every rank has a CPU of "
                "its own, present where HORA_SHM_CHUNK_BYTES is unset; slot:m: chunks up to m are "
                "reduced whole where the ranks crowd the CPUs unevenly); every rank must use the "
                "same values";
      return fallback;
    }
    if (hosts.value()[r] != hosts.value()[0]) {
      *whyNot = "ranks 0 and " + std::to_string(r) + " run on different hosts";
      return fallback;
    }
  }
  // Round 2: every rank creates its segment.
  const std::string name =
      "hora-" + std::to_string(::getpid()) + "-" + randomHex(16) + "-r" + std::to_string(rank);
  std::vector<std::unique_ptr<ShmSegment>> segs(size);
  auto own = ShmSegment::create(opts.dir, name, slot);
  std::string mine = own.isOk() ? "ok " + name : "no " + own.status().message();
  if (own.isOk()) segs[rank] = own.take();
  auto created = exchangeValues(*store, "created", rank, allRanks(size), mine, opts.startTimeout,
                                "shared-memory set-up");
  if (!created.isOk()) return created.status();
  *whyNot = firstRefusal(created.value());
  if (!whyNot->empty()) return fallback;
  // Round 3: every rank maps every peer's segment.
  std::string opened = "ok";
  for (int r = 0; r < size && opened == "ok"; ++r) {
    if (r == rank) continue;
    auto seg = ShmSegment::open(opts.dir, created.value()[r].substr(3), slot);
    if (seg.isOk()) {
      segs[r] = seg.take();
    } else {
      opened = "no " + seg.status().message();
    }
  }
  auto all = exchangeValues(*store, "opened", rank, allRanks(size), opened, opts.startTimeout,
                            "shared-memory set-up");
  // Every peer has mapped this segment or given up on it: the name can go.
  segs[rank]->unlink();
  if (!all.isOk()) return all.status();
  *whyNot = firstRefusal(all.value());
  if (!whyNot->empty()) return fallback;
  ShmBackendOptions picked = opts;
  if (opts.chunkBytesWhenRanksFit > 0 && ranksFit)
    picked.chunkBytes = std::min(opts.chunkBytesWhenRanksFit, slot);
  picked.chunkBytesWhenRanksFit = 0;
  ShmPlacement placement;
  placement.evenShare = evenShare;
  placement.crowdedUnevenly = cpusKnown && cpusHeld < size && !evenShare;
  placement.ranksFit = ranksFit;
  placement.ownCpusAlone = ownCpusAlone;
  placement.matesCrowd = matesCrowd;
  return std::unique_ptr<Backend>(
      new ShmBackend(std::move(segs), rank, std::move(fallback), picked, placement));
}

}  // namespace hora
