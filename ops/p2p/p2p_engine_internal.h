// The engine's private vocabulary, shared by its two translation units:
// p2p_engine.cc (posting, matching, the protocol, failures) and
// p2p_transport.cc (endpoints, connections, the progress thread). Not for
// anyone else.
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>

#include "ops/p2p/p2p_engine.h"

namespace hora {
namespace {

constexpr uint32_t kFrameMagic = 0x68327032;  // "h2p2"

enum FrameKind : uint8_t { kMessage = 1, kAccept = 2, kReject = 3, kPayload = 4, kClose = 5 };
enum RejectReason : int32_t { kReasonMismatch = 1, kReasonAlloc = 2 };

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
  uint8_t pad[28] = {};
};

namespace {

inline std::string shapeText(DataType dt, const int64_t* shape, int ndim) {
  return describeTensor(dt, std::vector<int64_t>(shape, shape + ndim));
}

inline std::string randomHex() {
  std::random_device rd;
  std::ostringstream os;
  os << std::hex << rd() << rd();
  return os.str();
}

}  // namespace

struct P2pEngine::Op {
  P2pOp p;
  uint64_t seq = 0;
  Clock::time_point posted;
  bool warned = false;
  bool done = false;
};

// A message that arrived before its receive was posted.
struct P2pEngine::Unexpected {
  Frame h;
  std::vector<char> payload;  // eager messages only
  bool complete = false;      // the whole eager payload is here
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

struct P2pEngine::Peer {
  int rank = 0;
  std::unique_ptr<P2pInbox> out;  // the peer's inbox; we write ring[our rank]
  bool wanted = false;            // some operation needs the connection
  Clock::time_point nextCheck{};
  uint64_t nextSeq = 0;
  std::deque<OutFrame> outq;
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
  std::deque<OpPtr> recvs;          // posted, not matched
  std::map<uint64_t, OpPtr> sends;  // message written, awaiting accept or reject
  std::map<uint64_t, OpPtr> large;  // receives accepted, awaiting kPayload
  bool largePayload = false;        // the payload in flight is a kPayload's
  // TCP (a peer on another host): the connection, or that it will come.
  int fd = -1;
  bool awaitingAccept = false;
  bool closedByPeer = false;  // its kClose arrived
  Status peerFailure;         // later operations with this peer fail with it
};

}  // namespace hora
