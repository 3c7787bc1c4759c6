// P2pEngine: posting, matching, the frame protocol and failures
// (ops/p2p/p2p_engine.h); endpoints and threads are in p2p_transport.cc.
#include "ops/p2p/p2p_engine.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "ops/p2p/p2p_engine_internal.h"
#include "ops/p2p/p2p_socket.h"

namespace hora {

std::string P2pEngine::rankText(int setRank) const {
  std::string s = "rank " + std::to_string(setRank);
  if (opts_.globalRanks[setRank] != setRank)
    s += " (global " + std::to_string(opts_.globalRanks[setRank]) + ")";
  return s;
}

std::string P2pEngine::describe(const Op& op) const {
  std::ostringstream os;
  os << (op.p.kind == P2pOp::kSend ? "send of " : "recv of ")
     << (op.p.allocate ? "a tensor of any shape" : describeTensor(op.p.dtype, op.p.shape))
     << (op.p.kind == P2pOp::kSend ? " to " : " from ") << rankText(op.p.peer) << " (tag "
     << op.p.tag << ") in process set " << opts_.setName << " on " << rankText(opts_.rank);
  return os.str();
}

Status P2pEngine::post(P2pOp* ops, size_t count) {
  const int n = static_cast<int>(peers_.size());
  for (size_t i = 0; i < count; ++i) {
    const P2pOp& o = ops[i];
    if (o.peer < 0 || o.peer >= n)
      return invalidArgument("point-to-point " +
                             std::string(o.kind == P2pOp::kSend ? "send" : "recv") + ": peer " +
                             std::to_string(o.peer) + " is not a rank of process set " +
                             opts_.setName + " (size " + std::to_string(n) + ")");
    if (o.peer == opts_.rank)
      return invalidArgument("point-to-point " +
                             std::string(o.kind == P2pOp::kSend ? "send" : "recv") + " on " +
                             rankText(opts_.rank) + " names itself as the peer; send to " +
                             "and receive from other ranks of the set");
    if (!o.sink) return internalError("point-to-point operation without a request");
    HORA_RETURN_IF_ERROR(checkGpu(o));
  }
  Taken done;
  std::vector<Status> fatal;
  Rings rings;
  bool needed;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!failed_.isOk()) return failed_;
    if (stopping_)
      return Status(Code::kShutDown, "process set " + opts_.setName + " is shutting down");
    // Coarse: posted times feed only the stall checks (seconds), and
    // progress paces connection attempts in milliseconds.
    const auto now = coarseNow();
    // The precise clock only while a timeline records (it cost a seventh
    // of a polling round; see drive()).
    const int64_t postedNs =
        opts_.telemetry && opts_.telemetry->p2pTimed()
            ? std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
                  .count()
            : 0;
    for (size_t i = 0; i < count; ++i) {
      auto op = std::make_shared<Op>();
      op->p = std::move(ops[i]);
      op->posted = now;
      op->postedNs = postedNs;
      incoming_.push_back(std::move(op));
      // Changed only under mu_: a load and a store, no locked instruction
      // (which would wait for this core's pending stores to reach memory).
      live_.store(live_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    }
    if (!threadStarted_) {
      threadStarted_ = true;
      thread_ = std::thread([this] { run(); });
    }
    // Make progress right here, under the lock taken anyway: a small send
    // leaves (and a receive whose message is here completes) without a
    // thread hand-off and without taking the lock again. Only for what was
    // posted: a full round (every peer, the listener, the stall checks) was
    // half of a small send's own time.
    progressPostedLocked(now);
    // The thread is needed only for what inline progress left behind (a
    // connection to make, a full ring); replies wake it through the doorbell.
    needed = !incoming_.empty();
    for (auto& p : peers_) needed = needed || !p->outq.empty();
    done.take(completions_);
    fatal.swap(fatal_);
    rings.take(toRing_);
  }
  rings.ring();
  deliver(done, fatal);
  if (needed) wake();
  return Status();
}

bool P2pEngine::drive(Clock::time_point now) {
  std::unique_lock<std::mutex> lk(mu_, std::try_to_lock);
  if (!lk.owns_lock()) return false;
  const bool moved = progressLocked(now);
  if (completions_.empty() && fatal_.empty() && toRing_.empty()) return moved;
  Taken done;
  std::vector<Status> fatal;
  Rings rings;
  done.take(completions_);
  fatal.swap(fatal_);
  rings.take(toRing_);
  lk.unlock();
  rings.ring();
  deliver(done, fatal);
  return moved;
}

void P2pEngine::deliver(Taken& done, std::vector<Status>& fatal) {
  for (auto& d : done.items) d.first->p.sink->completeEntry(d.second);
  for (auto& s : fatal)
    if (opts_.onFatal) opts_.onFatal(s);
}

size_t P2pEngine::pending() const { return live_.load(std::memory_order_acquire); }

std::string P2pEngine::pendingReport() const {
  // A dump runs on a thread that found a failure; a round of progress holds
  // the lock for microseconds, so a short wait is enough, and a dump never
  // waits on a stuck engine.
  std::unique_lock<std::mutex> lk(mu_, std::defer_lock);
  for (int i = 0; i < 200 && !lk.try_lock(); ++i)
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  if (!lk.owns_lock()) return "point-to-point: the engine is busy; its operations are not listed\n";
  std::vector<OpPtr> all(incoming_.begin(), incoming_.end());
  for (const auto& pp : peers_) {
    for (const auto& op : pp->recvs) all.push_back(op);
    for (const auto& kv : pp->sends) all.push_back(kv.second);
    for (const auto& op : pp->fastBusy)
      if (op) all.push_back(op);
    for (const auto& kv : pp->large) all.push_back(kv.second);
    for (const auto& f : pp->outq)
      if (f.completes) all.push_back(f.completes);
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  all.erase(std::remove_if(all.begin(), all.end(), [](const OpPtr& op) { return op->done; }),
            all.end());
  if (all.empty()) return "";
  std::sort(all.begin(), all.end(),
            [](const OpPtr& a, const OpPtr& b) { return a->posted < b->posted; });
  const auto now = Clock::now();
  std::ostringstream os;
  os << "point-to-point operations not finished: " << all.size() << "\n";
  char secs[32];
  for (const auto& op : all) {
    std::snprintf(secs, sizeof secs, "%.1f", Seconds(now - op->posted).count());
    os << "  " << describe(*op) << ": posted " << secs << " s ago\n";
  }
  return os.str();
}

void P2pEngine::complete(OpPtr op, const Status& s) {
  if (op->done) return;
  op->done = true;
  live_.store(live_.load(std::memory_order_relaxed) - 1, std::memory_order_release);
  if (opts_.telemetry)
    opts_.telemetry->p2pDone(op->p.kind == P2pOp::kSend, opts_.globalRanks[op->p.peer], op->p.tag,
                             static_cast<int64_t>(op->p.bytes), op->postedNs, s);
  if (s.isOk()) {
    completions_.emplace_back(std::move(op), s);
  } else {
    Status why = s.withContext(describe(*op));
    completions_.emplace_back(std::move(op), std::move(why));
  }
}

void P2pEngine::takeIncoming() {
  for (auto& op : incoming_) {
    Peer& p = *peers_[op->p.peer];
    if (!p.peerFailure.isOk()) {
      complete(op, p.peerFailure);
      continue;
    }
    p.wanted = true;
    if (op->p.kind == P2pOp::kSend) {
      op->seq = p.nextSeq++;
      if (tryFastSendLocked(p, op)) continue;  // it waits in Peer::fastBusy, not in sends
      OutFrame f;
      f.h.kind = kMessage;
      f.h.dtype = static_cast<uint8_t>(op->p.dtype);
      f.h.ndim = static_cast<uint8_t>(op->p.shape.size());
      for (size_t i = 0; i < op->p.shape.size(); ++i) f.h.shape[i] = op->p.shape[i];
      f.h.seq = op->seq;
      f.h.tag = op->p.tag;
      f.h.bytes = op->p.bytes;
      // A GPU payload never travels in frames (zero bytes: nothing to move).
      f.h.gpu = op->p.device.kind == DeviceKind::kCuda ? 1 : 0;
      f.h.eager = op->p.bytes <= (f.h.gpu ? 0 : opts_.eagerBytes) ? 1 : 0;
      if (f.h.eager) {
        f.payload = static_cast<const char*>(op->p.data);
        f.payloadBytes = op->p.bytes;
      }
      p.outq.push_back(f);
      p.sends.emplace_back(op->seq, std::move(op));
    } else {
      // The first message with this tag that arrived unmatched, if any.
      auto it = p.unexpected.begin();
      for (; it != p.unexpected.end(); ++it)
        if (it->h.tag == op->p.tag) break;
      if (it != p.unexpected.end() && (it->complete || !it->h.eager)) {
        Unexpected msg = std::move(*it);
        p.unexpected.erase(it);
        matchLocked(p, op, msg.h, msg.h.eager ? msg.payload.data() : nullptr, msg.fastSeq);
      } else {
        p.recvs.push_back(op);  // matched on arrival (or when that message is complete)
      }
    }
  }
  incoming_.clear();
}

// A receive meets its message. `eagerData` holds the payload of an eager
// message already here; null when the payload is still on its way (eager:
// the caller streams it into the receive) or follows an accept (large).
// Returns where an eager payload still on its way must go (null: discard).
char* P2pEngine::matchLocked(Peer& p, const OpPtr& recv, const Frame& h, const char* eagerData,
                             int64_t fastSeq) {
  const DataType dt = static_cast<DataType>(h.dtype);
  std::string why;
  int32_t reason = 0;
  const bool gpuRecv = recv->p.device.kind == DeviceKind::kCuda;
  if (recv->p.allocate) {
    std::vector<int64_t> shape(h.shape, h.shape + h.ndim);
    // A GPU message lands in GPU memory: this rank's point-to-point device.
    P2pGpu* g = h.gpu ? gpu() : nullptr;
    Device dev = g ? g->device() : Device{};
    auto mem = h.gpu && !g ? Result<void*>(Status(Code::kNotSupported, "no GPU plugin configured"))
                           : recv->p.sink->allocateOutput(shape, dt, dev, g);
    if (!mem.isOk()) {
      why = "allocating the receive buffer failed: " + mem.status().message();
      reason = kReasonAlloc;
    } else {
      recv->p.data = mem.value();
      recv->p.device = dev;
      recv->p.dtype = dt;
      recv->p.shape = shape;
      recv->p.bytes = h.bytes;
    }
  } else if ((h.gpu != 0) != gpuRecv) {
    why = "the message is " + shapeText(dt, h.shape, h.ndim) + " in " + (h.gpu ? "GPU" : "host") +
          " memory but the receive buffer is " + describeTensor(recv->p.dtype, recv->p.shape) +
          " in " + (gpuRecv ? "GPU" : "host") +
          " memory; point-to-point needs both sides in GPU memory or both in host memory (copy "
          "one of them: tensor.cuda() or tensor.cpu())";
    reason = kReasonDevice;
  } else if (dt != recv->p.dtype || h.bytes != recv->p.bytes) {
    why = "the message is " + shapeText(dt, h.shape, h.ndim) + " (" + std::to_string(h.bytes) +
          " bytes) but the receive buffer is " + describeTensor(recv->p.dtype, recv->p.shape) +
          " (" + std::to_string(recv->p.bytes) +
          " bytes); post a buffer of the sender's dtype and element count, or receive without "
          "a buffer to have one allocated";
    reason = kReasonMismatch;
  }
  if (reason != 0) {
    OutFrame f;
    f.h.kind = kReject;
    f.h.seq = h.seq;
    f.h.tag = h.tag;
    f.h.reason = reason;
    f.h.dtype = static_cast<uint8_t>(recv->p.dtype);
    f.h.ndim = static_cast<uint8_t>(std::min<size_t>(recv->p.shape.size(), kP2pMaxDims));
    for (int i = 0; i < f.h.ndim; ++i) f.h.shape[i] = recv->p.shape[i];
    f.h.bytes = recv->p.bytes;
    f.h.gpu = gpuRecv ? 1 : 0;
    f.completes = recv;
    f.completeWith = Status(Code::kMismatch, why);
    p.outq.push_back(f);
    return nullptr;
  }
  if (h.gpu && h.bytes > 0) {
    OutFrame f;
    f.h.kind = kAccept;
    f.h.seq = h.seq;
    f.h.tag = h.tag;
    p.outq.push_back(f);
    // Enqueued in the order of the accepts, which the sender reads in order.
    transferGpuLocked(recv);
    return nullptr;
  }
  if (!h.eager) {
    p.large[h.seq] = recv;
    OutFrame f;
    f.h.kind = kAccept;
    f.h.seq = h.seq;
    f.h.tag = h.tag;
    p.outq.push_back(f);
    return nullptr;
  }
  if (eagerData || h.bytes == 0) {
    if (h.bytes) std::memcpy(recv->p.data, eagerData, h.bytes);
    acceptEagerLocked(p, recv, h, fastSeq);
    return nullptr;
  }
  return static_cast<char*>(recv->p.data);
}

void P2pEngine::acceptEagerLocked(Peer& p, const OpPtr& recv, const Frame& h, int64_t fastSeq) {
  if (fastSeq >= 0 && p.out && p.fd < 0) {
    // One store into the sender's inbox instead of a frame; the receive is
    // done with it (the sender sees it even after we shut down).
    p.out->fast(static_cast<uint32_t>(opts_.rank))
        .acks.acked[static_cast<uint32_t>(fastSeq) % kP2pFastSlots]
        .store(static_cast<uint32_t>(fastSeq) + 1, std::memory_order_release);
    ringLater(p);
    complete(recv, Status());
    return;
  }
  OutFrame f;
  f.h.kind = kAccept;
  f.h.seq = h.seq;
  f.h.tag = h.tag;
  // The receive completes once its sender has been told, i.e. when this
  // frame is written (at once, unless the ring is full or the peer's inbox
  // not mapped yet): a rank that shuts down right after its receive
  // returned would otherwise leave the accept unsent, and the sender's send
  // would fail with kShutDown although its data arrived.
  f.completes = recv;
  p.outq.push_back(f);
}

bool P2pEngine::pumpOut(Peer& p, Clock::time_point now) {
  if (p.outq.empty()) return false;
  if (!connect(p, now)) return false;
  bool moved = false;
  const size_t piece = payloadPiece();
  while (!p.outq.empty()) {
    OutFrame& f = p.outq.front();
    const size_t total = sizeof(Frame) + f.payloadBytes;
    while (f.done < total) {
      size_t n;
      if (f.done < sizeof(Frame)) {
        n = writeOut(p, reinterpret_cast<const char*>(&f.h) + f.done, sizeof(Frame) - f.done);
      } else {
        const size_t left = total - f.done;
        n = writeOut(p, f.payload + (f.done - sizeof(Frame)), std::min(left, piece));
        // More follows: the peer can start on this piece.
        if (n > 0 && n < left && p.out) p.out->ring();
      }
      if (!failed_.isOk()) return true;
      if (n == 0) break;
      f.done += n;
      moved = true;
    }
    if (f.done < total) break;  // the ring is full: the peer reads, then we go on
    if (f.completes) complete(f.completes, f.completeWith);
    p.outq.pop_front();
  }
  if (moved && p.out) p.out->ring();
  return moved;
}

bool P2pEngine::pumpIn(Peer& p) {
  const size_t piece = payloadPiece();
  bool moved = false;
  for (;;) {
    if (p.inPayload) {
      const size_t n = readIn(p, p.payloadDst, std::min(p.payloadLeft, piece));
      if (!failed_.isOk()) return true;
      if (n == 0) break;
      moved = true;
      p.payloadLeft -= n;
      if (p.payloadDst) p.payloadDst += n;
      if (p.payloadLeft > 0) {
        if (p.out) p.out->ring();  // room for the next piece
        continue;
      }
      p.inPayload = false;
      finishPayloadLocked(p);
      continue;
    }
    const size_t n =
        readIn(p, reinterpret_cast<char*>(&p.cur) + p.curGot, sizeof(Frame) - p.curGot);
    if (!failed_.isOk()) return true;
    if (n == 0) break;
    moved = true;
    p.curGot += n;
    if (p.curGot < sizeof(Frame)) continue;
    p.curGot = 0;
    if (!onFrameLocked(p)) return true;  // the stream is broken; the set fails
  }
  if (moved && p.out) p.out->ring();  // room for a sender blocked on a full ring
  return moved;
}

bool P2pEngine::onFrameLocked(Peer& p) {
  const Frame& h = p.cur;
  const bool known = h.kind >= kMessage && h.kind <= kClose;
  size_t elem = 0;
  bool ok = h.magic == kFrameMagic && known && h.ndim <= kP2pMaxDims;
  if (ok && h.kind == kMessage) {
    ok = h.dtype <= static_cast<uint8_t>(DataType::kBool);
    if (ok) elem = dataTypeSize(static_cast<DataType>(h.dtype));
    uint64_t count = 1;
    for (int i = 0; ok && i < h.ndim; ++i) {
      ok = h.shape[i] >= 0 &&
           (h.shape[i] == 0 || count <= UINT64_MAX / static_cast<uint64_t>(h.shape[i]));
      if (ok) count *= static_cast<uint64_t>(h.shape[i]);
    }
    ok = ok && elem != 0 && count <= UINT64_MAX / elem && count * elem == h.bytes;
  }
  if (!ok) {
    fatalLocked(protocolError("malformed point-to-point frame from " + rankText(p.rank) + " to " +
                              rankText(opts_.rank) + " in process set " + opts_.setName +
                              " (kind " + std::to_string(h.kind) + ", " + std::to_string(h.bytes) +
                              " bytes): a different hora version or memory corruption"));
    return false;
  }
  switch (h.kind) {
    case kClose:
      p.closedByPeer = true;
      break;
    case kMessage: {
      // Fast-box messages sent before this one come first.
      drainFastLocked(p);
      if (!failed_.isOk()) return false;
      if (h.seq != p.nextRecvSeq) {
        fatalLocked(protocolError("point-to-point message " + std::to_string(h.seq) + " from " +
                                  rankText(p.rank) + " to " + rankText(opts_.rank) +
                                  " in process set " + opts_.setName + " arrived where message " +
                                  std::to_string(p.nextRecvSeq) +
                                  " was due: a different hora version or memory corruption"));
        return false;
      }
      ++p.nextRecvSeq;
      OpPtr recv;
      for (auto it = p.recvs.begin(); it != p.recvs.end(); ++it)
        if ((*it)->p.tag == h.tag) {
          recv = *it;
          p.recvs.erase(it);
          break;
        }
      if (recv) {
        char* dst = matchLocked(p, recv, h, nullptr);
        if (h.eager && h.bytes > 0) {
          p.inPayload = true;
          p.payloadDst = dst;
          p.payloadLeft = h.bytes;
          p.payloadOp = dst ? recv : nullptr;
          p.payloadIntoValid = false;
        }
      } else {
        p.unexpected.emplace_back();
        Unexpected& u = p.unexpected.back();
        u.h = h;
        u.complete = !h.eager || h.bytes == 0;
        if (h.eager && h.bytes > 0) {
          u.payload.resize(h.bytes);
          p.inPayload = true;
          p.payloadDst = u.payload.data();
          p.payloadLeft = h.bytes;
          p.payloadOp = nullptr;
          p.payloadInto = std::prev(p.unexpected.end());
          p.payloadIntoValid = true;
        }
      }
      break;
    }
    case kAccept: {
      OpPtr send = takeSendLocked(p, h.seq);
      if (!send) break;  // failed meanwhile
      if (send->p.device.kind == DeviceKind::kCuda && send->p.bytes > 0) {
        transferGpuLocked(send);
      } else if (send->p.bytes <= opts_.eagerBytes) {
        complete(send, Status());
      } else {
        OutFrame f;
        f.h.kind = kPayload;
        f.h.seq = h.seq;
        f.h.tag = send->p.tag;
        f.h.bytes = send->p.bytes;
        f.payload = static_cast<const char*>(send->p.data);
        f.payloadBytes = send->p.bytes;
        f.completes = send;
        p.outq.push_back(f);
      }
      break;
    }
    case kReject: {
      OpPtr send = takeSendLocked(p, h.seq);
      if (!send) break;
      const DataType rdt = h.dtype <= static_cast<uint8_t>(DataType::kBool)
                               ? static_cast<DataType>(h.dtype)
                               : DataType::kUint8;
      const bool gpuSend = send->p.device.kind == DeviceKind::kCuda;
      std::string why =
          h.reason == kReasonDevice
              ? rankText(p.rank) + "'s matching receive is " + shapeText(rdt, h.shape, h.ndim) +
                    " in " + (h.gpu ? "GPU" : "host") + " memory but this rank sent " +
                    describeTensor(send->p.dtype, send->p.shape) + " in " +
                    (gpuSend ? "GPU" : "host") +
                    " memory; point-to-point needs both sides in GPU memory or both in host "
                    "memory (copy one of them: tensor.cuda() or tensor.cpu())"
          : h.reason == kReasonMismatch
              ? rankText(p.rank) + "'s matching receive expected " +
                    shapeText(rdt, h.shape, h.ndim) + " (" + std::to_string(h.bytes) +
                    " bytes) but this rank sent " + describeTensor(send->p.dtype, send->p.shape) +
                    " (" + std::to_string(send->p.bytes) +
                    " bytes); send and receive the same dtype and element count"
              : rankText(p.rank) + " could not allocate a buffer for this message";
      complete(send, Status(Code::kMismatch, why));
      break;
    }
    case kPayload: {
      auto it = p.large.find(h.seq);
      OpPtr recv;
      if (it != p.large.end()) {
        recv = it->second;
        p.large.erase(it);
      }
      if (recv && recv->p.bytes != h.bytes) {
        fatalLocked(protocolError("point-to-point payload from " + rankText(p.rank) + " has " +
                                  std::to_string(h.bytes) + " bytes, its message announced " +
                                  std::to_string(recv->p.bytes)));
        return false;
      }
      if (h.bytes == 0) {
        if (recv) complete(recv, Status());
        break;
      }
      p.inPayload = true;
      p.payloadDst = recv ? static_cast<char*>(recv->p.data) : nullptr;
      p.payloadLeft = h.bytes;
      p.payloadOp = recv;
      p.payloadIntoValid = false;
      p.largePayload = true;
      break;
    }
  }
  return true;
}

void P2pEngine::finishPayloadLocked(Peer& p) {
  if (p.payloadIntoValid) {
    p.payloadIntoValid = false;
    Unexpected& u = *p.payloadInto;
    u.complete = true;
    // A receive posted while this message was arriving waits for it.
    for (auto it = p.recvs.begin(); it != p.recvs.end(); ++it)
      if ((*it)->p.tag == u.h.tag) {
        OpPtr recv = *it;
        p.recvs.erase(it);
        Unexpected msg = std::move(u);
        p.unexpected.erase(p.payloadInto);
        matchLocked(p, recv, msg.h, msg.payload.data());
        break;
      }
  } else if (p.payloadOp) {
    OpPtr recv = std::move(p.payloadOp);
    if (p.largePayload)
      complete(recv, Status());
    else
      acceptEagerLocked(p, recv, p.cur);
  }
  p.payloadOp = nullptr;
  p.largePayload = false;
}

void P2pEngine::failPeerLocked(Peer& p, const Status& why) {
  if (p.payloadOp) complete(p.payloadOp, why);
  p.payloadOp = nullptr;
  for (auto& op : p.recvs) complete(op, why);
  for (auto& kv : p.sends) complete(kv.second, why);
  for (auto& kv : p.large) complete(kv.second, why);
  for (auto& f : p.outq)
    if (f.completes) complete(f.completes, why);
  for (auto& op : p.fastBusy)
    if (op) complete(std::move(op), why);
  p.fastOutstanding = 0;
  Watch& w = watch_[p.rank];
  for (auto& a : w.ackWant) a.store(0, std::memory_order_relaxed);
  w.fastOutstanding.store(0, std::memory_order_relaxed);
  p.recvs.clear();
  p.sends.clear();
  p.large.clear();
  // Frames not yet started can go; a started one would desynchronize the
  // stream, so a peer that fails mid-frame fails the whole engine instead.
  p.outq.clear();
  p.unexpected.clear();
  p.peerFailure = why;
  if (P2pGpu* g = gpuIfAny()) g->failPeer(p.rank, why);
}

void P2pEngine::fatalLocked(const Status& why) {
  fatal_.push_back(why);
  failAllLocked(why);
}

void P2pEngine::failAllLocked(const Status& why) {
  if (failed_.isOk()) failed_ = why;
  if (P2pGpu* g = gpuIfAny()) g->fail(why);
  for (auto& op : incoming_) complete(op, why);
  incoming_.clear();
  for (auto& p : peers_) {
    failPeerLocked(*p, why);
    p->inPayload = false;
    p->payloadOp = nullptr;
  }
}

void P2pEngine::checkLocked(Clock::time_point now) {
  if (now < nextCheck_) return;
  nextCheck_ = now + std::chrono::milliseconds(500);
  for (auto& pp : peers_) {
    Peer& p = *pp;
    const bool waiting = !p.recvs.empty() || !p.sends.empty() || !p.large.empty() ||
                         !p.outq.empty() || p.inPayload || p.fastOutstanding > 0 ||
                         (gpuIfAny() && gpuIfAny()->busyWith(p.rank));
    if (!waiting) continue;
    // A peer that shut down: what it has not sent by now never comes (its
    // inbound bytes were drained before this check).
    const bool closed =
        p.closedByPeer ||
        (p.out && p.out->header().closed.value.load(std::memory_order_acquire) != 0 &&
         inbox_->readable(static_cast<uint32_t>(p.rank)) == 0);
    if (closed && !p.inPayload && p.curGot == 0) {
      failPeerLocked(p,
                     Status(Code::kShutDown, rankText(p.rank) + " of process set " + opts_.setName +
                                                 " shut down (hora_shutdown) while this "
                                                 "operation waited for it"));
      p.peerFailure = Status();  // a later runtime of that rank is another story
      continue;
    }
    // A peer whose process is gone: its frames will never come.
    if (p.fd < 0 && p.out && p.out->ownerPid() != ::getpid() && ::kill(p.out->ownerPid(), 0) != 0 &&
        errno == ESRCH) {
      fatalLocked(Status(Code::kRemoteError,
                         rankText(p.rank) + " of process set " + opts_.setName + " (pid " +
                             std::to_string(p.out->ownerPid()) +
                             ") exited during point-to-point communication with " +
                             rankText(opts_.rank) + "; check that rank's output for the cause"));
      return;
    }
  }
  std::vector<OpPtr> all;
  for (auto& pp : peers_) {
    for (auto& op : pp->recvs) all.push_back(op);
    for (auto& kv : pp->sends) all.push_back(kv.second);
    for (auto& op : pp->fastBusy)
      if (op) all.push_back(op);
    for (auto& kv : pp->large) all.push_back(kv.second);
    for (auto& f : pp->outq)
      if (f.completes) all.push_back(f.completes);
  }
  for (auto& op : all) {
    if (op->done) continue;
    const auto waited = std::chrono::duration_cast<Seconds>(now - op->posted);
    const bool isRecv = op->p.kind == P2pOp::kRecv;
    const std::string hint =
        rankText(op->p.peer) + (isRecv ? " has not sent a message" : " has not posted a receive") +
        " with tag " + std::to_string(op->p.tag) +
        " to match it; check that every send has a "
        "receive on the peer with the same tag (and that the peer is not blocked in an earlier "
        "send to this rank)";
    if (opts_.stallShutdown.count() > 0 && waited >= opts_.stallShutdown) {
      char secs[32];
      std::snprintf(secs, sizeof secs, "%.1f", waited.count());
      fatalLocked(timeoutError(describe(*op) + " waited " + secs +
                               " s (HORA_STALL_SHUTDOWN_TIME_S): " + hint));
      return;
    }
    if (opts_.stallWarning.count() > 0 && waited >= opts_.stallWarning && !op->warned) {
      op->warned = true;
      HORA_LOG(opts_.logger, kWarning)
          << "stall: " << describe(*op) << " has waited " << int(waited.count()) << " s: " << hint;
    }
  }
}

bool P2pEngine::progressLocked(Clock::time_point now) {
  if (!failed_.isOk() || stopping_) return false;
  bool moved = false;
  if (!incoming_.empty()) {
    Status s = ensureInbox();
    if (!s.isOk()) {
      fatalLocked(s.withContext("process set " + opts_.setName + ": point-to-point set-up"));
      return true;
    }
    takeIncoming();
    moved = true;
  }
  if (!inbox_ && listenFd_ < 0) return moved;
  // accept4() costs a system call (and a socket allocated and freed in the
  // kernel) even with nothing pending, which was most of a small message's
  // time on one host. A connection matters once we wait for one; otherwise
  // a peer's early connection is taken when poll() saw it or within
  // kAcceptEvery.
  if (listenFd_ >= 0 &&
      (awaitingAccepts_ > 0 || now >= nextAccept_ ||
       (listenerReady_.load(std::memory_order_relaxed) && listenerReady_.exchange(false)))) {
    nextAccept_ = now + kAcceptEvery;
    acceptLocked();
  }
  for (auto& p : peers_) {
    if (!failed_.isOk()) return true;
    if (!p->wanted && p->fd < 0 &&
        (!inbox_ || (inbox_->readable(static_cast<uint32_t>(p->rank)) == 0 && !fastWorkLocked(*p))))
      continue;
    moved |= progressPeerLocked(*p, now);
  }
  if (!failed_.isOk()) return true;
  checkLocked(now);
  quickLookCovers_.store(quickLookCoversLocked(), std::memory_order_release);
  return moved;
}

bool P2pEngine::progressPeerLocked(Peer& p, Clock::time_point now) {
  p.wanted = true;
  // A receive needs the connection too: over TCP only the lower rank of
  // a pair connects, whichever of them sends first.
  if (!p.out && p.fd < 0) connect(p, now);
  if (!failed_.isOk()) return true;
  bool moved = drainFastLocked(p);
  if (!failed_.isOk()) return true;
  moved |= pumpIn(p);
  if (!failed_.isOk()) return true;
  moved |= drainFastLocked(p);  // a ring message may have let a later fast one through
  if (!failed_.isOk()) return true;
  moved |= reapFastAcksLocked(p);
  moved |= pumpOut(p, now);
  return moved;
}

void P2pEngine::progressPostedLocked(Clock::time_point now) {
  if (!failed_.isOk() || stopping_) return;
  Status s = ensureInbox();
  if (!s.isOk()) {
    fatalLocked(s.withContext("process set " + opts_.setName + ": point-to-point set-up"));
    return;
  }
  // The operations stay alive in the peers' queues (or completions_) after
  // takeIncoming(); only their peers and whether a send went through the
  // fast box are read afterwards.
  boost::container::small_vector<Op*, 4> posted;
  for (auto& op : incoming_) posted.push_back(op.get());
  takeIncoming();
  if (listenFd_ >= 0 && awaitingAccepts_ > 0) acceptLocked();
  // A send in the fast box needs nothing more here (its acknowledgement is
  // reaped by whoever waits on it); anything else gets its peer's round: a
  // receive whose message is here completes, a frame is written.
  uint64_t done = 0;  // peers already served, for sets up to 64 ranks
  for (Op* op : posted) {
    if (!failed_.isOk()) return;
    if (op->p.kind == P2pOp::kSend && op->fastSeq >= 0) continue;
    const int r = op->p.peer;
    if (r < 64) {
      if (done & (uint64_t(1) << r)) continue;
      done |= uint64_t(1) << r;
    }
    progressPeerLocked(*peers_[r], now);
  }
  if (failed_.isOk()) quickLookCovers_.store(quickLookCoversLocked(), std::memory_order_release);
}

bool P2pEngine::quickLookCoversLocked() const {
  if (!inbox_ || !incoming_.empty() || awaitingAccepts_ > 0 || !failed_.isOk() || stopping_)
    return false;
  for (const auto& pp : peers_) {
    const Peer& p = *pp;
    if (p.rank == opts_.rank) continue;
    if (p.fd >= 0 || !p.outq.empty() || p.inPayload || p.curGot != 0 || (p.wanted && !p.out))
      return false;
  }
  return true;
}

bool P2pEngine::quickLook() const {
  if (!quickLookCovers_.load(std::memory_order_acquire)) return true;
  const P2pInbox* in = inboxPtr_.load(std::memory_order_acquire);
  if (!in) return true;
  const uint32_t n = static_cast<uint32_t>(peers_.size());
  for (uint32_t r = 0; r < n; ++r) {
    if (r == static_cast<uint32_t>(opts_.rank)) continue;
    const P2pFastArea& a = in->fast(r);
    const Watch& w = watch_[r];
    const uint32_t next = w.fastRead.load(std::memory_order_relaxed);
    if (a.slots[next % kP2pFastSlots].stamp.load(std::memory_order_acquire) == next + 1)
      return true;
    if (in->readable(r) > 0) return true;
    if (w.fastOutstanding.load(std::memory_order_relaxed) > 0)
      for (uint32_t i = 0; i < kP2pFastSlots; ++i) {
        const uint32_t want = w.ackWant[i].load(std::memory_order_relaxed);
        if (want != 0 && a.acks.acked[i].load(std::memory_order_acquire) == want) return true;
      }
  }
  return false;
}

void P2pEngine::fail(const Status& why) {
  std::vector<std::pair<OpPtr, Status>> done;
  {
    std::lock_guard<std::mutex> lk(mu_);
    failAllLocked(why);
    done.swap(completions_);
  }
  for (auto& d : done) d.first->p.sink->completeEntry(d.second);
}

}  // namespace hora
