// ShmBackend's reducescatter, alltoallv and barrier (see shm_backend.h for the
// slots, counters and failure model they share with allreduce). Kept apart
// from the allreduce pipeline so that each file has one algorithm family.
//
// reducescatter, per chunk of the whole buffer: every rank packs the chunk of
// its input into its slot, then reduces, straight into its own output region,
// the part of the chunk that falls inside that region from every peer's slot
// (own value first, then the others in rank order: the bits do not depend on
// timing). One copy in of all but the own region, (n-1)/n of a chunk read per
// rank, no staging.
//
// alltoallv: a first round publishes each rank's largest block (send or
// receive), so that every rank runs the same number of rounds without knowing
// the others' counts. Each later round splits the slot into one 64-byte
// aligned box per destination; rank r copies the next piece of its block for
// rank j into box j, and every rank copies its pieces out of box `rank` of
// every peer's slot. The own block is copied directly.
//
// barrier: one chunk that carries no data: every rank publishes `packed` and
// waits for every peer's.
//
// Threads and failures: as shm_backend.h (the executor thread; a lost, stalled
// or aborted peer fails the call naming it, and every later call fails).
#include <algorithm>
#include <cstring>

#include "core/reduce.h"
#include "ops/shm/shm_backend.h"

namespace hora {
namespace {

constexpr size_t kBoxAlign = 64;  // a cache line: boxes of two ranks never share one

}  // namespace

Status ShmBackend::reducescatter(void* inout, const std::vector<size_t>& counts, DataType dtype,
                                 ReduceOp op) {
  size_t total = 0;
  for (size_t c : counts) total += c;
  const std::string what = std::string("shm reducescatter(total=") + std::to_string(total) +
                           ", dtype=" + dataTypeName(dtype) + ", op=" + reduceOpName(op) + ")";
  HORA_RETURN_IF_ERROR(checkUsable(what));
  if (counts.size() != static_cast<size_t>(size_))
    return invalidArgument(what + ": " + std::to_string(counts.size()) + " counts for " +
                           std::to_string(size_) + " ranks");
  if (reduceFunction(dtype, op) == nullptr || !reduceOpSupported(op, dtype))
    return invalidArgument(what + ": unsupported dtype/op");
  if (total == 0) return Status::ok();
  if (inout == nullptr) return invalidArgument(what + ": null buffer");
  if (size_ == 1)
    return delegate(what, [&] { return fallback_->reducescatter(inout, counts, dtype, op); });
  Status s = shmReducescatter(static_cast<uint8_t*>(inout), counts, dtype, op, what);
  return s.isOk() ? s : fail(s);
}

Status ShmBackend::shmReducescatter(uint8_t* data, const std::vector<size_t>& counts,
                                    DataType dtype, ReduceOp op, const std::string& what) {
  const size_t es = dataTypeSize(dtype);
  const ReduceFn reduce = reduceFunction(dtype, op);
  ShmSegment& own = *segs_[rank_];
  const size_t chunkElems = std::max<size_t>(1, own.slotBytes() / es);
  size_t total = 0, myLo = 0;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) myLo = total;
    total += counts[q];
  }
  const size_t myHi = myLo + counts[rank_];
  for (size_t base = 0; base < total; base += chunkElems) {
    const size_t len = std::min(chunkElems, total - base);
    const uint32_t c = static_cast<uint32_t>(chunks_);
    const uint32_t next = c + 1;
    HORA_RETURN_IF_ERROR(waitSlotFree(static_cast<uint32_t>(chunks_), what));
    // Every rank's chunk is visible to the others except this rank's own
    // region, which no peer reads (each reads only its own region of every
    // slot): it is reduced in place in `data` and never packed. This rank
    // writes only its own region, which later chunks never pack.
    const size_t lo = std::max(base, myLo), hi = std::min(base + len, myHi);
    uint8_t* slot = own.slot(c);
    if (hi > lo) {
      if (lo > base) copyBytes(slot, data + base * es, (lo - base) * es);
      if (base + len > hi)
        copyBytes(slot + (hi - base) * es, data + hi * es, (base + len - hi) * es);
    } else {
      copyBytes(slot, data + base * es, len * es);
    }
    publish(&ShmHeader::packed, next);
    if (hi > lo) {
      for (int j = 0; j < size_; ++j) {
        if (j == rank_) continue;
        HORA_RETURN_IF_ERROR(waitFor(j, &ShmHeader::packed, next, "pack its input", what));
      }
      uint8_t* acc = data + lo * es;
      for (int j = 0; j < size_; ++j)
        if (j != rank_) reduce(acc, acc, segs_[j]->slot(c) + (lo - base) * es, hi - lo);
      // Only this rank reads its part of the peers' slots.
      for (int j = 0; j < size_; ++j)
        if (j != rank_) claimRead(segs_[j]->slot(c) + (lo - base) * es, (hi - lo) * es, true);
    }
    finishChunk();
  }
  return Status::ok();
}

Status ShmBackend::alltoallv(const void* in, const std::vector<int64_t>& send, void* out,
                             const std::vector<int64_t>& recv, DataType dtype) {
  const std::string what = std::string("shm alltoallv(dtype=") + dataTypeName(dtype) + ")";
  HORA_RETURN_IF_ERROR(checkUsable(what));
  if (send.size() != static_cast<size_t>(size_) || recv.size() != static_cast<size_t>(size_))
    return invalidArgument(what + ": " + std::to_string(send.size()) + " send and " +
                           std::to_string(recv.size()) + " receive counts for " +
                           std::to_string(size_) + " ranks");
  const size_t es = dataTypeSize(dtype);
  std::vector<size_t> sendBytes(size_), recvBytes(size_), sendOff(size_), recvOff(size_);
  size_t sendTotal = 0, recvTotal = 0;
  for (int q = 0; q < size_; ++q) {
    if (send[q] < 0 || recv[q] < 0) return invalidArgument(what + ": a negative count");
    sendBytes[q] = static_cast<size_t>(send[q]) * es;
    recvBytes[q] = static_cast<size_t>(recv[q]) * es;
    sendOff[q] = sendTotal;
    recvOff[q] = recvTotal;
    sendTotal += sendBytes[q];
    recvTotal += recvBytes[q];
  }
  if ((sendTotal > 0 && in == nullptr) || (recvTotal > 0 && out == nullptr))
    return invalidArgument(what + ": null buffer");
  if (sendBytes[rank_] != recvBytes[rank_])
    return invalidArgument(what + ": this rank sends itself " + std::to_string(send[rank_]) +
                           " elements but expects " + std::to_string(recv[rank_]));
  if (size_ == 1)
    return delegate(what, [&] { return fallback_->alltoallv(in, send, out, recv, dtype); });
  Status s = shmAlltoallv(static_cast<const uint8_t*>(in), sendBytes, sendOff,
                          static_cast<uint8_t*>(out), recvBytes, recvOff, what);
  return s.isOk() ? s : fail(s);
}

Status ShmBackend::shmAlltoallv(const uint8_t* in, const std::vector<size_t>& sendBytes,
                                const std::vector<size_t>& sendOff, uint8_t* out,
                                const std::vector<size_t>& recvBytes,
                                const std::vector<size_t>& recvOff, const std::string& what) {
  ShmSegment& own = *segs_[rank_];
  const size_t box = own.slotBytes() / static_cast<size_t>(size_) / kBoxAlign * kBoxAlign;
  if (box == 0)
    return invalidArgument(what + ": a slot of " + std::to_string(own.slotBytes()) +
                           " bytes is too small for " + std::to_string(size_) +
                           " boxes; raise HORA_SHM_CHUNK_BYTES");
  // Round 0: the largest block anyone sends or receives sets the rounds.
  uint64_t most = 0;
  for (int q = 0; q < size_; ++q)
    if (q != rank_) most = std::max<uint64_t>(most, std::max(sendBytes[q], recvBytes[q]));
  {
    const uint32_t c = static_cast<uint32_t>(chunks_);
    const uint32_t next = c + 1;
    HORA_RETURN_IF_ERROR(waitSlotFree(static_cast<uint32_t>(chunks_), what));
    std::memcpy(own.slot(c), &most, sizeof most);
    publish(&ShmHeader::packed, next);
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      HORA_RETURN_IF_ERROR(waitFor(j, &ShmHeader::packed, next, "publish its block sizes", what));
      uint64_t theirs = 0;
      std::memcpy(&theirs, segs_[j]->slot(c), sizeof theirs);
      most = std::max(most, theirs);
    }
    finishChunk();
  }
  if (sendBytes[rank_] > 0)
    std::memmove(out + recvOff[rank_], in + sendOff[rank_], sendBytes[rank_]);
  const size_t rounds = static_cast<size_t>((most + box - 1) / box);
  for (size_t k = 0; k < rounds; ++k) {
    const size_t lo = k * box;
    const uint32_t c = static_cast<uint32_t>(chunks_);
    const uint32_t next = c + 1;
    HORA_RETURN_IF_ERROR(waitSlotFree(static_cast<uint32_t>(chunks_), what));
    uint8_t* mine = own.slot(c);
    for (int j = 0; j < size_; ++j) {
      if (j == rank_ || lo >= sendBytes[j]) continue;
      copyBytes(mine + static_cast<size_t>(j) * box, in + sendOff[j] + lo,
                std::min(box, sendBytes[j] - lo));
    }
    publish(&ShmHeader::packed, next);
    for (int k2 = 1; k2 < size_; ++k2) {
      const int j = (rank_ + k2) % size_;
      if (lo >= recvBytes[j]) continue;
      HORA_RETURN_IF_ERROR(waitFor(j, &ShmHeader::packed, next, "pack its blocks", what));
      copyBytes(out + recvOff[j] + lo, segs_[j]->slot(c) + static_cast<size_t>(rank_) * box,
                std::min(box, recvBytes[j] - lo));
      // The box addressed to this rank: no other rank reads it.
      claimRead(segs_[j]->slot(c) + static_cast<size_t>(rank_) * box,
                std::min(box, recvBytes[j] - lo), true);
    }
    finishChunk();
  }
  return Status::ok();
}

Status ShmBackend::barrier() {
  const std::string what = "shm barrier";
  HORA_RETURN_IF_ERROR(checkUsable(what));
  if (size_ == 1) return delegate(what, [&] { return fallback_->barrier(); });
  Status s = [&]() -> Status {
    const uint32_t next = static_cast<uint32_t>(chunks_) + 1;
    // No data, but the counters must stay in step with the slots' reuse.
    HORA_RETURN_IF_ERROR(waitSlotFree(static_cast<uint32_t>(chunks_), what));
    publish(&ShmHeader::packed, next);
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      HORA_RETURN_IF_ERROR(waitFor(j, &ShmHeader::packed, next, "reach the barrier", what));
    }
    finishChunk();
    return Status::ok();
  }();
  return s.isOk() ? s : fail(s);
}

}  // namespace hora
