#include "controllers/shm_lane.h"

#include <cstring>

#include "controllers/control_plane.h"
#include "core/cpu_relax.h"

namespace hora {

ShmLane::ShmLane(std::unique_ptr<ShmMailbox> mailbox, int rank)
    : mb_(std::move(mailbox)),
      rank_(rank),
      buf_(64 << 10),
      droppedPeers_(new std::atomic<bool>[static_cast<size_t>(mb_->ranks())]) {
  for (int r = 0; r < mb_->ranks(); ++r) droppedPeers_[r].store(false);
  if (rank_ == 0) {
    for (int r = 1; r < mb_->ranks(); ++r) {
      Stream s;
      s.peer = r;
      s.outRing = ShmMailbox::downRing(r);
      s.inRing = ShmMailbox::upRing(r);
      streams_.push_back(std::move(s));
    }
  } else {
    Stream s;
    s.peer = 0;
    s.outRing = ShmMailbox::upRing(rank_);
    s.inRing = ShmMailbox::downRing(rank_);
    streams_.push_back(std::move(s));
  }
}

ShmLane::Stream* ShmLane::stream(int peer) {
  for (auto& s : streams_)
    if (s.peer == peer) return s.dropped ? nullptr : &s;
  return nullptr;
}

bool ShmLane::peerPolling(int peer) {
  // Pairs with the reader's store of its word before its last look at the
  // rings (setPolling): either it sees these bytes, or this sees it asleep.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return mb_->polling(peer).load(std::memory_order_seq_cst) != 0;
}

bool ShmLane::flush(Stream& s) {
  if (s.outOff == s.out.size()) return false;
  const size_t n = mb_->write(s.outRing, s.out.data() + s.outOff, s.out.size() - s.outOff);
  s.outOff += n;
  if (s.outOff == s.out.size()) {
    s.out.clear();
    s.outOff = 0;
  }
  return n > 0;
}

bool ShmLane::send(int peer, FrameType type, const std::string& payload) {
  Stream* s = stream(peer);
  if (!s) return false;
  const uint32_t len = static_cast<uint32_t>(payload.size() + 1);
  char hdr[5];
  std::memcpy(hdr, &len, 4);
  hdr[4] = static_cast<char>(type);
  s->out.append(hdr, 5);
  s->out.append(payload);
  return flush(*s) && !peerPolling(peer);
}

bool ShmLane::readerWithin(int peer, std::chrono::nanoseconds grace) {
  Stream* s = stream(peer);
  if (!s) return true;
  const auto until = std::chrono::steady_clock::now() + grace;
  for (uint32_t i = 0;; ++i) {
    if (peerPolling(peer) || mb_->readable(s->outRing) == 0) return true;
    if ((i & 15) == 15 && std::chrono::steady_clock::now() >= until) return false;
    cpuRelax();
  }
}

bool ShmLane::poll(const Handlers& h) {
  bool moved = false;
  for (auto& s : streams_) {
    if (s.dropped) continue;
    if (flush(s)) {
      moved = true;
      if (!peerPolling(s.peer) && h.ring) h.ring(s.peer);
    }
    for (;;) {
      const size_t n = mb_->read(s.inRing, buf_.data(), buf_.size());
      if (n == 0) break;
      moved = true;
      s.in.append(buf_.data(), n);
    }
    // Complete frames, in order.
    size_t at = 0;
    while (!s.dropped && s.in.size() - at >= 5) {
      uint32_t payloadLen = 0;
      FrameType type;
      Status ok = parseFrameHeader(s.in.data() + at, &payloadLen, &type);
      if (!ok.isOk()) {
        s.dropped = true;
        s.in.clear();
        at = 0;
        if (h.bad) h.bad(s.peer, ok);
        break;
      }
      if (s.in.size() - at - 5 < payloadLen) break;
      std::string payload = s.in.substr(at + 5, payloadLen);
      at += 5 + payloadLen;
      if (h.deliver) h.deliver(s.peer, type, std::move(payload));
    }
    if (at > 0 && !s.dropped) s.in.erase(0, at);
  }
  return moved;
}

bool ShmLane::hasInput() const {
  // The mailbox's words and the dropped flags only, not the streams: safe
  // off the thread that drives the lane. A dropped peer's ring is never
  // read again: its bytes do not count.
  if (rank_ != 0)
    return !droppedPeers_[0].load(std::memory_order_acquire) &&
           mb_->readable(ShmMailbox::downRing(rank_)) > 0;
  for (int r = 1; r < mb_->ranks(); ++r)
    if (!droppedPeers_[r].load(std::memory_order_acquire) &&
        mb_->readable(ShmMailbox::upRing(r)) > 0)
      return true;
  return false;
}

bool ShmLane::hasPending() const {
  for (const auto& s : streams_)
    if (!s.dropped && s.outOff < s.out.size()) return true;
  return false;
}

bool ShmLane::hasPendingFor(int peer) const {
  for (const auto& s : streams_)
    if (s.peer == peer && !s.dropped && s.outOff < s.out.size()) return true;
  return false;
}

void ShmLane::markAlive() {
  // steady_clock is CLOCK_MONOTONIC: one clock for every process of the host.
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  mb_->aliveNs(rank_).store(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count(),
                            std::memory_order_release);
}

size_t ShmLane::readableFrom(int peer) const {
  for (const auto& s : streams_)
    if (s.peer == peer && !s.dropped) return mb_->readable(s.inRing);
  return 0;
}

std::chrono::steady_clock::time_point ShmLane::aliveAt(int peer) const {
  const int64_t ns = mb_->aliveNs(peer).load(std::memory_order_acquire);
  return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(ns));
}

void ShmLane::setPolling(bool on) {
  if (on)
    mb_->polling(rank_).fetch_add(1, std::memory_order_seq_cst);
  else
    mb_->polling(rank_).fetch_sub(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void ShmLane::drop(int peer) {
  if (peer >= 0 && peer < mb_->ranks()) droppedPeers_[peer].store(true, std::memory_order_release);
  for (auto& s : streams_)
    if (s.peer == peer) {
      s.dropped = true;
      s.out.clear();
      s.in.clear();
      s.outOff = 0;
    }
}

}  // namespace hora
