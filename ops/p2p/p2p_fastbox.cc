// P2pEngine's fast box: small messages between ranks on one host in one
// cache line each way (the layout is in ops/p2p/p2p_inbox.h, the protocol
// in ops/p2p/p2p_engine.h). Everything here runs under the engine's lock,
// on whichever thread makes progress.
//
// A send of at most kP2pFastDataBytes, with at most kP2pFastMaxDims
// dimensions of at most 65535 each, to a peer whose inbox is mapped and
// with nothing queued for it, is written into a free slot of the peer's
// fast box instead of the ring. The receiver takes fast-box and ring
// messages strictly in sequence-number order, so a small message never
// overtakes an earlier large one or the reverse. An accept comes back as
// one store into our own fast box's acknowledgement line; a reject (or an
// accept from a receiver that has not mapped our inbox yet) comes as the
// usual frame. Either way the send completes only when the receiver matched
// the message, as for ring messages (docs/p2p.md "When things complete").
#include <cstring>

#include "ops/p2p/p2p_engine.h"
#include "ops/p2p/p2p_engine_internal.h"

namespace hora {

bool P2pEngine::tryFastSendLocked(Peer& p, const OpPtr& op) {
  const P2pOp& o = op->p;
  if (p.fd >= 0 || !p.out || !p.outq.empty() || o.bytes > opts_.fastBytes || opts_.fastBytes == 0 ||
      o.device.kind != DeviceKind::kCpu || o.shape.size() > static_cast<size_t>(kP2pFastMaxDims))
    return false;
  const uint32_t n = p.fastNext;
  const uint32_t i = n % kP2pFastSlots;
  if (p.fastBusy[i]) return false;  // its last message is not accepted yet
  for (int64_t d : o.shape)
    if (d < 0 || d > UINT16_MAX) return false;
  P2pFastSlot& s = p.out->fast(static_cast<uint32_t>(opts_.rank)).slots[i];
  s.seqLow = static_cast<uint32_t>(op->seq);
  s.tag = o.tag;
  s.dtype = static_cast<uint8_t>(o.dtype);
  s.ndim = static_cast<uint8_t>(o.shape.size());
  s.bytes = static_cast<uint16_t>(o.bytes);
  for (size_t d = 0; d < o.shape.size(); ++d) s.dims[d] = static_cast<uint16_t>(o.shape[d]);
  if (o.bytes) std::memcpy(s.data, o.data, o.bytes);
  s.stamp.store(n + 1, std::memory_order_release);
  p.fastNext = n + 1;
  p.fastBusy[i] = op;
  ++p.fastOutstanding;
  Watch& w = watch_[p.rank];
  // n + 1 wraps to 0 ("free") once every 2^32 sends: quickLook then misses
  // that one acknowledgement until poll()'s next full round.
  w.ackWant[i].store(n + 1, std::memory_order_relaxed);
  w.fastOutstanding.store(p.fastOutstanding, std::memory_order_relaxed);
  op->fastSeq = n;
  // Written under the engine's lock only: no locked instruction needed.
  fastSends_.store(fastSends_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  ringLater(p);
  return true;
}

void P2pEngine::ringLater(Peer& p) {
  if (toRing_.empty() || toRing_.back() != p.out.get()) toRing_.push_back(p.out.get());
}

bool P2pEngine::drainFastLocked(Peer& p) {
  if (!inbox_ || p.fd >= 0) return false;
  P2pFastArea& area = inbox_->fast(static_cast<uint32_t>(p.rank));
  bool moved = false;
  while (failed_.isOk()) {
    P2pFastSlot& s = area.slots[p.fastRead % kP2pFastSlots];
    if (s.stamp.load(std::memory_order_acquire) != p.fastRead + 1) break;
    // A ring message sent before this one is still to come.
    if (s.seqLow != static_cast<uint32_t>(p.nextRecvSeq)) break;
    Frame h;
    h.kind = kMessage;
    h.eager = 1;
    h.seq = p.nextRecvSeq;
    h.tag = s.tag;
    h.dtype = s.dtype;
    h.ndim = s.ndim;
    h.bytes = s.bytes;
    bool ok = h.ndim <= kP2pFastMaxDims && h.dtype <= static_cast<uint8_t>(DataType::kBool) &&
              h.bytes <= kP2pFastDataBytes;
    uint64_t count = 1;
    for (int d = 0; ok && d < h.ndim; ++d) {
      h.shape[d] = s.dims[d];
      count *= s.dims[d];  // at most 4 factors below 2^16: no overflow
    }
    ok = ok && count * dataTypeSize(static_cast<DataType>(h.dtype)) == h.bytes;
    if (!ok) {
      fatalLocked(protocolError(
          "malformed point-to-point fast-box message from " + rankText(p.rank) + " to " +
          rankText(opts_.rank) + " in process set " + opts_.setName + " (" +
          std::to_string(h.bytes) + " bytes, dtype " + std::to_string(h.dtype) + ", " +
          std::to_string(h.ndim) + " dimensions): a different hora version or memory corruption"));
      return true;
    }
    char data[kP2pFastDataBytes];
    if (h.bytes) std::memcpy(data, s.data, h.bytes);
    const int64_t fastSeq = p.fastRead;
    ++p.fastRead;
    watch_[p.rank].fastRead.store(p.fastRead, std::memory_order_relaxed);
    ++p.nextRecvSeq;
    p.wanted = true;
    deliverLocked(p, h, data, fastSeq);
    moved = true;
  }
  return moved;
}

void P2pEngine::deliverLocked(Peer& p, const Frame& h, const char* data, int64_t fastSeq) {
  for (auto it = p.recvs.begin(); it != p.recvs.end(); ++it)
    if ((*it)->p.tag == h.tag) {
      OpPtr recv = std::move(*it);
      p.recvs.erase(it);
      matchLocked(p, recv, h, data, fastSeq);
      return;
    }
  p.unexpected.emplace_back();
  Unexpected& u = p.unexpected.back();
  u.h = h;
  u.payload.assign(data, data + h.bytes);
  u.complete = true;
  u.fastSeq = fastSeq;
}

bool P2pEngine::reapFastAcksLocked(Peer& p) {
  if (p.fastOutstanding == 0 || !inbox_) return false;
  P2pFastAcks& acks = inbox_->fast(static_cast<uint32_t>(p.rank)).acks;
  bool moved = false;
  for (uint32_t i = 0; i < kP2pFastSlots; ++i) {
    OpPtr& busy = p.fastBusy[i];
    if (!busy ||
        acks.acked[i].load(std::memory_order_acquire) != static_cast<uint32_t>(busy->fastSeq) + 1)
      continue;
    OpPtr send = std::move(busy);
    busy = nullptr;
    --p.fastOutstanding;
    watch_[p.rank].ackWant[i].store(0, std::memory_order_relaxed);
    complete(std::move(send), Status());
    moved = true;
  }
  if (moved) watch_[p.rank].fastOutstanding.store(p.fastOutstanding, std::memory_order_relaxed);
  return moved;
}

bool P2pEngine::fastWorkLocked(const Peer& p) const {
  if (!inbox_ || p.fd >= 0) return false;
  const P2pFastArea& area = inbox_->fast(static_cast<uint32_t>(p.rank));
  if (area.slots[p.fastRead % kP2pFastSlots].stamp.load(std::memory_order_acquire) ==
      p.fastRead + 1)
    return true;
  if (p.fastOutstanding == 0) return false;
  for (uint32_t i = 0; i < kP2pFastSlots; ++i)
    if (p.fastBusy[i] && area.acks.acked[i].load(std::memory_order_acquire) ==
                             static_cast<uint32_t>(p.fastBusy[i]->fastSeq) + 1)
      return true;
  return false;
}

P2pEngine::OpPtr P2pEngine::takeSendLocked(Peer& p, uint64_t seq) {
  auto it = findSend(p.sends, seq);
  if (it != p.sends.end()) {
    OpPtr send = std::move(it->second);
    p.sends.erase(it);
    return send;
  }
  // A fast-box message rejected, or accepted by a frame (its receiver had
  // not mapped our inbox yet).
  if (p.fastOutstanding > 0)
    for (uint32_t i = 0; i < kP2pFastSlots; ++i) {
      OpPtr& busy = p.fastBusy[i];
      if (busy && busy->seq == seq) {
        --p.fastOutstanding;
        Watch& w = watch_[p.rank];
        w.ackWant[i].store(0, std::memory_order_relaxed);
        w.fastOutstanding.store(p.fastOutstanding, std::memory_order_relaxed);
        return std::move(busy);
      }
    }
  return nullptr;
}

}  // namespace hora
