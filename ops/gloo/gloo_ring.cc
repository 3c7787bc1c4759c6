// GlooBackend, part 2 (part 1: gloo_backend.cc): ringAllreduce, the ring allreduce behind
// allreduceGather.
//
// It follows the schedule of Gloo's own ring allreduce (gloo/allreduce.cc in
// Gloo 0.5: reduce-scatter then allgather, segments of at most 1 MiB) with
// kDepth instead of 2 transfers in flight, and adds the two hooks
// allreduceGather needs: pack a segment into the staging buffer before it is
// first sent or reduced into, and unpack it as soon as it is final on this
// rank. The hooks run right after the next transfers are posted, so the
// copies that the runtime used to do before and after the allreduce fall
// into the network waits, on the same thread. (Where the CPU is already
// saturated, as with 2 ranks on 2 cores, they still cost their CPU time.)
//
// Schedule (n ranks, kDepth transfers in flight per direction): the buffer
// is cut into numSegments segments (a multiple of n, at least kDepth*n, at
// most kRingSegmentBytes each except to satisfy those two rules); rank c ends
// up owning chunk c, segments [c*spr, (c+1)*spr) with spr = numSegments / n.
// Rank r sends to r-1 and receives from r+1.
//  - Reduce-scatter, iteration i: wait for receive i-kDepth and reduce it into
//    its place (freeing its scratch slot), post the receive of segment
//    (r+2)*spr + i into that slot, send segment (r+1)*spr + i (for i < spr a
//    segment of chunk r+1, packed just before; later ones were reduced here
//    spr >= kDepth iterations earlier), then pack segment (r+2)*spr + i,
//    which is reduced into kDepth iterations later.
//  - Allgather, iteration i: wait for receive i-kDepth, post the receive of
//    segment (r+1)*spr + i in place and send segment r*spr + i (this rank's
//    own reduced chunk for i < spr, unpacked right after its send is posted;
//    later ones arrived spr iterations earlier), then unpack the segment
//    that receive i-kDepth brought.
// So every copy runs after the next transfers are posted. spr >= kDepth keeps
// the segments reduced, packed or received apart from those being sent.
// Segments past the end of the buffer are empty and skipped by both sides.
//
// Every segment is packed exactly once (the segments of chunk r+1 at their
// first send, every other segment when its first receive is posted) and
// unpacked exactly once (chunk r at its first allgather send, the others at
// their allgather receive).
#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <string>

#include "core/reduce.h"
#include "ops/gloo/gloo_backend.h"

namespace hora {
namespace {

// Slot space of the ring allreduce: like ring reduce-scatter's 0x48 (see
// gloo_backend.cc), a top byte Gloo never uses, the tag in bits 24..55 and
// the phase in the low bits.
constexpr uint64_t kRingAllreduceSlotPrefix = 0x49;

uint64_t ringAllreduceSlot(uint32_t tag, uint64_t phase) {
  return (kRingAllreduceSlotPrefix << 56) | (static_cast<uint64_t>(tag) << 24) | phase;
}

// Upper bound on a segment, Gloo's kMaxSegmentSize: large enough to amortize
// per-message costs, small enough that the scratch and the copy of one
// segment stay in cache.
constexpr size_t kRingSegmentBytes = 1 << 20;

// Receives (and sends) in flight per direction. Gloo's ring keeps 2; with 4
// the plain ring ran 10-20% faster than gloo::allreduce's on the 2-core dev
// machine (loopback, 102 MB float32), and the copies get more slack.
constexpr size_t kDepth = 4;

size_t roundUp(size_t v, size_t m) { return (v + m - 1) / m * m; }

}  // namespace

void GlooBackend::checkWait(bool completed, const char* what) {
  if (!completed) throw gloo::IoException(std::string("ring: ") + what + " aborted");
}

void GlooBackend::ringAllreduce(uint8_t* data, size_t count, DataType dtype, ReduceOp op,
                                uint32_t tag, const PackFn& pack, const UnpackFn& unpack) {
  const size_t n = static_cast<size_t>(size_);
  const size_t r = static_cast<size_t>(rank_);
  const size_t es = dataTypeSize(dtype);
  const ReduceFn reduce = reduceFunction(dtype, op);
  const size_t totalBytes = count * es;
  const int sendRank = static_cast<int>((r + n - 1) % n);
  const int recvRank = static_cast<int>((r + 1) % n);

  const size_t maxSegBytes = es * std::max<size_t>(1, kRingSegmentBytes / es);
  const size_t numSegments =
      roundUp(std::max((totalBytes + maxSegBytes - 1) / maxSegBytes, kDepth * n), n);
  const size_t spr = numSegments / n;  // segments per rank (chunk), >= kDepth
  const size_t segBytes = roundUp((totalBytes + numSegments - 1) / numSegments, es);
  const size_t iterations = numSegments - spr;  // sends (and receives) per phase

  if (ringScratch_.size() < kDepth * segBytes) ringScratch_.resize(kDepth * segBytes);
  uint8_t* scratch = ringScratch_.data();
  auto dataBuf = context_->createUnboundBuffer(data, totalBytes);
  auto tmpBuf = context_->createUnboundBuffer(scratch, kDepth * segBytes);

  // Byte offset of segment k (mod numSegments) and its length, 0 when it
  // lies past the end of the buffer.
  struct Segment {
    size_t offset;
    size_t bytes;
  };
  auto segment = [&](size_t k) {
    const size_t offset = (k % numSegments) * segBytes;
    return Segment{offset, offset >= totalBytes ? 0 : std::min(segBytes, totalBytes - offset)};
  };
  // Both hooks work in place in `data` (the caller's staging buffer).
  auto call = [&](const auto& fn, const Segment& s) {
    if (s.bytes > 0) fn(s.offset / es, (s.offset + s.bytes) / es, data + s.offset);
  };
  // Sends complete in posting order; at most kDepth stay outstanding.
  size_t sendsPosted = 0, sendsDone = 0;
  auto send = [&](const Segment& s, uint64_t slot) {
    if (s.bytes == 0) return;
    dataBuf->send(sendRank, slot, s.offset, s.bytes);
    ++sendsPosted;
  };
  // Unpacks wait until no send still reads the segment: unpack may rewrite
  // the staging buffer in place (the executor post-scales there), so a
  // segment is handed over only once every send posted before it finished.
  struct PendingUnpack {
    Segment seg;
    size_t afterSends;
  };
  std::deque<PendingUnpack> pendingUnpacks;
  auto flushUnpacks = [&] {
    while (!pendingUnpacks.empty() && pendingUnpacks.front().afterSends <= sendsDone) {
      call(unpack, pendingUnpacks.front().seg);
      pendingUnpacks.pop_front();
    }
  };
  auto deferUnpack = [&](const Segment& s) {
    if (s.bytes > 0) pendingUnpacks.push_back({s, sendsPosted});
  };
  auto drainSends = [&](size_t keep) {
    for (; sendsPosted - sendsDone > keep; ++sendsDone) {
      checkWait(dataBuf->waitSend(timeout_), "allreduce send");
    }
    flushUnpacks();
  };

  // Reduce-scatter. Iteration i first completes receive i-kDepth (reducing
  // it into place frees its scratch slot), then posts receive i and send i.
  const uint64_t rsSlot = ringAllreduceSlot(tag, 0);
  auto rsRecv = [&](size_t i) { return segment((r + 2) * spr + i); };
  for (size_t i = 0; i < iterations + kDepth; ++i) {
    if (i >= kDepth) {
      const Segment done = rsRecv(i - kDepth);
      if (done.bytes > 0) {
        checkWait(tmpBuf->waitRecv(timeout_), "allreduce receive");
        reduce(data + done.offset, data + done.offset, scratch + ((i - kDepth) % kDepth) * segBytes,
               done.bytes / es);
      }
    }
    if (i < iterations) {
      const Segment recv = rsRecv(i);
      if (recv.bytes > 0) tmpBuf->recv(recvRank, rsSlot, (i % kDepth) * segBytes, recv.bytes);
      // Segment i of chunk r+1: packed now for i < spr, else reduced here
      // spr >= kDepth iterations ago (above, at the latest).
      const Segment out = segment((r + 1) * spr + i);
      if (i < spr) call(pack, out);
      send(out, rsSlot);
      // First touch of the segment receive i will be reduced into: pack it
      // now, while kDepth receives and sends are in flight.
      call(pack, recv);
      drainSends(kDepth);
    }
  }
  drainSends(0);

  // Allgather: receive i lands in place; send i is this rank's own chunk for
  // i < spr and afterwards the segment received spr iterations earlier
  // (forwarded). A segment is unpacked after its last send has completed, or
  // right after its receive when it is never forwarded.
  const uint64_t agSlot = ringAllreduceSlot(tag, 1);
  const size_t forwarded = iterations - spr;  // receives j < forwarded are sent on at j + spr
  for (size_t i = 0; i < iterations + kDepth; ++i) {
    if (i >= kDepth) {
      const size_t j = i - kDepth;
      const Segment done = segment((r + 1) * spr + j);
      if (done.bytes > 0) checkWait(dataBuf->waitRecv(timeout_), "allreduce receive");
      if (j >= forwarded) deferUnpack(done);  // no send reads it: ready now
    }
    if (i < iterations) {
      const Segment recv = segment((r + 1) * spr + i);
      if (recv.bytes > 0) dataBuf->recv(recvRank, agSlot, recv.offset, recv.bytes);
      const Segment out = segment(r * spr + i);
      send(out, agSlot);
      deferUnpack(out);  // own chunk (i < spr) or a forward: its last send
    }
    drainSends(kDepth);
  }
  drainSends(0);
  if (!pendingUnpacks.empty()) flushUnpacks();
}

}  // namespace hora
