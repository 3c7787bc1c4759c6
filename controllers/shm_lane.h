// ShmLane: the shared-memory lane of a process set's control plane, which
// carries the negotiation frames (requests, cache hits, nacks, response
// lists) when every rank of the set runs on one host (issue 20).
//
// The frames are the control plane's own ([u32 length][u8 type][payload],
// parseFrameHeader checks each), streamed through the set's ShmMailbox
// (core/shm_mailbox.h): the coordinator has an up and a down ring per
// worker. Everything else (hello, heartbeats, aborts, goodbyes, peer loss)
// stays on the TCP connections, so failures are seen and reported exactly
// as without the lane. Order between the two: a writer puts a frame in the
// lane before it sends anything later over TCP, and the reader drains the
// lane before it handles any TCP frame or a lost connection
// (ControlPlane), so the negotiation's order is the order it was sent in.
//
// Waking: the control thread polls the lane while it has had work within
// the spin window (ControlPlane::run) and says so in the mailbox; a writer
// whose reader does not poll rings it with a doorbell frame over TCP, which
// wakes its event loop.
//
// Control thread only (the one that runs the set's ControlPlane).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/shm_mailbox.h"
#include "core/status.h"

namespace hora {

enum class FrameType : uint8_t;

class ShmLane {
 public:
  // `rank`: this rank's set rank; the coordinator (0) talks to every other
  // rank, a worker to rank 0 only.
  ShmLane(std::unique_ptr<ShmMailbox> mailbox, int rank);

  // Queues one frame for `peer` and writes what fits. True when the peer
  // must be rung (it is not polling the lane now).
  bool send(int peer, FrameType type, const std::string& payload);
  // After send() said `peer` must be rung: polls for up to `grace` whether
  // it starts polling or reads what waits for it (true: no ring needed).
  bool readerWithin(int peer, std::chrono::nanoseconds grace);
  // Writes what is still queued and reads every ring; each complete frame
  // goes to `deliver` in order, a malformed stream to `bad` (that peer's
  // lane is dropped), and `ring` is called for each peer that must be rung
  // for bytes written now. True if any byte moved.
  struct Handlers {
    std::function<void(int from, FrameType type, std::string payload)> deliver;
    std::function<void(int from, Status why)> bad;
    std::function<void(int peer)> ring;
  };
  bool poll(const Handlers& h);
  // Whether some ring from a live peer holds bytes to read (any thread),
  // or frames wait to be written (the driving thread).
  bool hasInput() const;
  bool hasPending() const;
  bool hasPendingFor(int peer) const;
  // This rank's "polling" word counts the threads polling its lane now
  // (its control thread, and a framework thread driving it): each `true`
  // is undone by one `false`.
  void setPolling(bool on);
  // Refreshes this rank's liveness time (the control thread, while it runs
  // a collective itself instead of its event loop), and reads a peer's
  // (steady clock; the epoch when it never did).
  void markAlive();
  // Bytes `peer` wrote that this rank has not read yet.
  size_t readableFrom(int peer) const;
  std::chrono::steady_clock::time_point aliveAt(int peer) const;
  // A lost peer: its streams are forgotten.
  void drop(int peer);
  int rank() const { return rank_; }
  ShmMailbox& mailbox() { return *mb_; }

 private:
  struct Stream {
    int peer = -1;
    uint32_t outRing = 0, inRing = 0;
    std::string out;    // frames not yet written
    size_t outOff = 0;  // bytes of `out` already written
    std::string in;     // bytes read, not yet a complete frame
    bool dropped = false;
  };
  Stream* stream(int peer);
  bool flush(Stream& s);  // true if bytes were written
  bool peerPolling(int peer);

  std::unique_ptr<ShmMailbox> mb_;
  const int rank_;
  std::vector<Stream> streams_;
  std::vector<char> buf_;
  // Per set rank: its streams were dropped (read by hasInput, off the
  // driving thread).
  std::unique_ptr<std::atomic<bool>[]> droppedPeers_;
};

}  // namespace hora
