// The engine's private vocabulary, shared by its two translation units:
// p2p_engine.cc (posting, matching, the protocol, failures) and
// p2p_transport.cc (endpoints, connections, the progress thread). Not for
// anyone else.
#pragma once

#include <algorithm>
#include <boost/container/small_vector.hpp>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "core/hmac.h"
#include "ops/p2p/p2p_engine.h"

namespace hora {
namespace {

constexpr uint32_t kFrameMagic = 0x68327032;  // "h2p2"

enum FrameKind : uint8_t { kMessage = 1, kAccept = 2, kReject = 3, kPayload = 4, kClose = 5 };
enum RejectReason : int32_t { kReasonMismatch = 1, kReasonAlloc = 2, kReasonDevice = 3 };

}  // namespace

// What travels before every payload, in the sender's byte order: hosts are
// little-endian (a peer of another byte order fails on the magic, as a
// malformed frame).
struct P2pEngine::Frame {
  uint32_t magic = kFrameMagic;
  uint8_t kind = 0;
  uint8_t dtype = 0;
  uint8_t ndim = 0;
  uint8_t eager = 0;
  uint64_t seq = 0;
  int64_t tag = 0;
  uint64_t bytes = 0;
  int64_t shape[kP2pMaxDims] = {};
  int32_t reason = 0;
  // kMessage: the payload is in GPU memory and moves through P2pGpu after the
  // accept; kReject: the receive buffer is in GPU memory.
  uint8_t gpu = 0;
  uint8_t pad[27] = {};
};

namespace {

inline std::string shapeText(DataType dt, const int64_t* shape, int ndim) {
  return describeTensor(dt, std::vector<int64_t>(shape, shape + ndim));
}

}  // namespace

// Where `seq`'s entry in Peer::sends is (end() if none).
template <typename Sends>
auto findSend(Sends& sends, uint64_t seq) {
  auto it = std::lower_bound(sends.begin(), sends.end(), seq,
                             [](const auto& e, uint64_t s) { return e.first < s; });
  return it != sends.end() && it->first == seq ? it : sends.end();
}

struct P2pEngine::Op {
  P2pOp p;
  uint64_t seq = 0;
  Clock::time_point posted;
  int64_t postedNs = 0;  // precise, for the timeline's span; 0 when it does not record
  int64_t fastSeq = -1;  // a send that went through the fast box: its number there
  bool warned = false;
  bool done = false;
};

// A message that arrived before its receive was posted.
struct P2pEngine::Unexpected {
  Frame h;
  std::vector<char> payload;  // eager messages only
  bool complete = false;      // the whole eager payload is here
  int64_t fastSeq = -1;       // came through the fast box: accepted through its acks
};

struct P2pEngine::OutFrame {
  Frame h;
  const char* payload = nullptr;
  size_t payloadBytes = 0;
  size_t done = 0;  // bytes of header + payload written
  // Completes once this frame is written: a large send with its payload, a
  // receive with its accept or reject (so a receiver that returns and shuts
  // down at once has still told the sender).
  OpPtr completes;
  Status completeWith;
};

// The frames waiting to go to one peer, in order: a vector and the index of
// its first frame. The queue empties in almost every round and clear()
// keeps the memory, where a deque allocated a node for every second frame
// (a measurable part of a small message's time).
class P2pEngine::OutQueue {
 public:
  using Frame = OutFrame;
  bool empty() const { return head_ == q_.size(); }
  Frame& front() { return q_[head_]; }
  void push_back(const Frame& f) { q_.push_back(f); }
  void pop_front() {
    if (++head_ == q_.size()) {
      clear();
    } else if (head_ >= 64 && head_ * 2 >= q_.size()) {  // a queue that never drains
      q_.erase(q_.begin(), q_.begin() + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
    }
  }
  void clear() {
    q_.clear();
    head_ = 0;
  }
  std::vector<Frame>::iterator begin() { return q_.begin() + static_cast<std::ptrdiff_t>(head_); }
  std::vector<Frame>::iterator end() { return q_.end(); }

 private:
  std::vector<Frame> q_;
  size_t head_ = 0;
};

// Completions moved out of completions_ to run without the lock: a round
// completes one or two operations, which fit here without an allocation,
// and completions_ keeps its memory (swapping it out cost a reallocation
// per completed operation).
struct P2pEngine::Taken {
  boost::container::small_vector<std::pair<OpPtr, Status>, 4> items;
  void take(std::vector<std::pair<OpPtr, Status>>& from) {
    items.assign(std::make_move_iterator(from.begin()), std::make_move_iterator(from.end()));
    from.clear();
  }
};

// Doorbells collected under mu_ (ringLater), rung without it.
struct P2pEngine::Rings {
  boost::container::small_vector<P2pInbox*, 4> items;
  void take(std::vector<P2pInbox*>& from) {
    items.assign(from.begin(), from.end());
    from.clear();
  }
  void ring() {
    for (P2pInbox* in : items) in->ring();
  }
};

// A peer's words for quickLook(), written under mu_ where Peer's fast-box
// state changes, read without it.
struct P2pEngine::Watch {
  Watch() {
    for (auto& a : ackWant) a.store(0, std::memory_order_relaxed);
  }
  std::atomic<uint32_t> fastRead{0};    // Peer::fastRead
  std::atomic<int> fastOutstanding{0};  // Peer::fastOutstanding
  // Slot i busy: its fast-box number + 1, the acknowledgement that
  // completes it; 0: free.
  std::atomic<uint32_t> ackWant[kP2pFastSlots];
};

struct P2pEngine::Peer {
  int rank = 0;
  std::unique_ptr<P2pInbox> out;  // the peer's inbox; we write ring[our rank]
  bool wanted = false;            // some operation needs the connection
  Clock::time_point nextCheck{};
  uint64_t nextSeq = 0;
  OutQueue outq;
  // Inbound, from our inbox's ring[rank].
  Frame cur;
  size_t curGot = 0;
  bool inPayload = false;
  char* payloadDst = nullptr;  // null: discard
  size_t payloadLeft = 0;
  OpPtr payloadOp;                              // a receive completed by this payload
  std::list<Unexpected>::iterator payloadInto;  // or the unexpected message it fills
  bool payloadIntoValid = false;
  std::list<Unexpected> unexpected;
  std::deque<OpPtr> recvs;  // posted, not matched
  // Message written, awaiting accept or reject; by seq (pushed in seq
  // order), so the accept of the oldest, the usual case, is found first.
  std::deque<std::pair<uint64_t, OpPtr>> sends;
  std::map<uint64_t, OpPtr> large;  // receives accepted, awaiting kPayload
  // The next message's sequence number from this peer, through the ring or
  // the fast box: messages are taken strictly in this order, which keeps the
  // two paths non-overtaking.
  uint64_t nextRecvSeq = 0;
  // Fast box (ops/p2p/p2p_inbox.h), shared-memory peers only. Sending: the
  // next number to write into the peer's inbox, and the sends in its slots
  // awaiting accept or reject (slot = number % kP2pFastSlots).
  uint32_t fastNext = 0;
  OpPtr fastBusy[kP2pFastSlots];
  int fastOutstanding = 0;
  // Receiving: the next number to read from our inbox's area for this peer.
  uint32_t fastRead = 0;
  bool largePayload = false;  // the payload in flight is a kPayload's
  // TCP (a peer on another host): the connection, or that it will come.
  int fd = -1;
  bool awaitingAccept = false;
  bool closedByPeer = false;  // its kClose arrived
  Status peerFailure;         // later operations with this peer fail with it
};

}  // namespace hora
