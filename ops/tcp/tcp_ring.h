// TcpRingBackend: ring collectives over hora's own TCP sockets, driven by the
// calling thread: the hierarchical allreduce's cross-host stage (one rank per
// host, ops/shm/hier_backend.h), and allreduce, reducescatter, allgather,
// broadcast, barrier and alltoall of a set across hosts (RingPlaneBackend
// below).
//
// Why not Gloo there: a Gloo wait is two wake-ups (its device thread reads
// the socket, then wakes the waiting thread), and a wake-up of an idle vCPU
// can take a millisecond on a shared VM. Between 2 emulated hosts Gloo's own
// ring took 0.75-2.0 ms per allreduce of 16 B to 16 KiB where Open MPI, which
// polls, took 11-127 us in the same run; the hierarchy with a Gloo cross
// stage took 1.9 ms for 64 KiB, with this ring 0.77 ms
// (bench/results/2026-11-28-tcp-cross.md). Here the calling thread moves
// the bytes itself: it polls the sockets for a short while (the reply of a
// small exchange is usually back by then), then sleeps in poll(2), one
// wake-up away from the data.
//
// Algorithms, around the ring rank -> rank+1 over n segments: allreduce is a
// reduce-scatter then an allgather (2(n-1) steps); reducescatter and
// allgather are those halves alone (n-1 steps each, segment r being rank r's
// counts); broadcast is a chain from the root that forwards bytes as they
// come; barrier is an allreduce of one byte (the Backend contract's; hora's
// own barrier completes in the negotiation and never reaches a data plane).
// Bytes a step has received (and reduced) are forwarded at once by the next
// step, so steps overlap on the wire and each ring socket carries one
// direction only (alltoall aside): the send and receive streams run together
// (full duplex). Every rank gets the same bits: each segment is reduced once
// along the ring, in a fixed order, then copied. Alltoall is not a ring's job (every rank sends to
// every other): it runs over a mesh (TcpRingOptions::mesh: every pair of ranks that are not ring
// neighbours connected too), all of a rank's sends and receives at once.
//
// Connections: each rank listens on its address, publishes address, port and
// a random token in the store, connects to rank+1 (proving it read the
// token) and accepts rank-1; with the mesh, the lower rank of every other
// pair connects to the higher. A stranger that finds the port is refused.
//
// Threads: created on the process set's init thread; collectives from one
// thread at a time (HierBackend's cross thread, or the executor through
// RingPlaneBackend); abort() from any thread, never blocking: it wakes a
// sleeping call and shuts the sockets down, so a call in progress returns at
// its next look, and every later call fails.
//
// Failure model: a peer that closes or resets its socket (a lost rank, or
// one that aborted) fails the call with kRemoteError; no byte from or to a
// peer for `timeout` fails it with kTimeout; both name the peer's rank in
// this ring and its address. After a failure (or abort) the ring is broken:
// this rank shuts its sockets down, so that its neighbours fail at once too,
// and every later call fails.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/reduce.h"
#include "core/status.h"
#include "core/store.h"

struct pollfd;  // <poll.h>

namespace hora {

struct TcpRingOptions {
  std::string host;   // this rank's address, where the others reach it
  std::string iface;  // HORA_GLOO_IFACE: listen on and publish this interface's address instead
  std::chrono::milliseconds timeout{30000};       // no progress for this long: kTimeout
  std::chrono::milliseconds startTimeout{30000};  // connecting the ring
  // How long a wait polls the sockets before it sleeps in poll(2); 0: sleep
  // at once. yieldWhilePolling: give the CPU away between looks (more ranks
  // than cores on this host).
  std::chrono::microseconds spin{100};
  bool yieldWhilePolling = false;
  // How the errors name the ranks of this ring (e.g. "set rank 5"); empty:
  // "ring rank k".
  std::vector<std::string> rankNames;
  // Asked about every 100 ms while this rank waits for its left neighbour
  // to connect (may be empty): an error (a peer known to be gone) fails the
  // set-up at once instead of after startTimeout.
  std::function<Status()> setUpWatch;
  // Connect the mesh for alltoall (n(n-1)/2 - n connections beyond the
  // ring's n); without it alltoall is kNotSupported from 4 ranks up.
  bool mesh = false;
};

class TcpRingBackend : public Backend {
 public:
  ~TcpRingBackend() override;

  std::string name() const override { return "tcp-ring"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status allreduce(void* data, size_t count, DataType dtype, ReduceOp op) override;
  Status allgatherv(const void* in, void* out, const std::vector<size_t>& counts,
                    DataType dtype) override;
  Status broadcast(void* data, size_t count, DataType dtype, int root) override;
  Status alltoallv(const void* in, const std::vector<int64_t>& send, void* out,
                   const std::vector<int64_t>& recv, DataType dtype) override;
  Status reducescatter(void* inout, const std::vector<size_t>& counts, DataType dtype,
                       ReduceOp op) override;
  Status barrier() override;
  void abort() noexcept override;

 private:
  struct Plan;  // the segments and steps of one ring collective (tcp_ring.cc)
  friend Result<std::unique_ptr<Backend>> createTcpRingBackend(std::shared_ptr<Store> store,
                                                               int rank, int size,
                                                               const TcpRingOptions& opts);
  TcpRingBackend(int rank, int size, TcpRingOptions opts);
  std::string peerName(int ringRank) const;
  // Shuts both streams down (any thread): the neighbours see the end of
  // stream at once.
  void closeStreams() noexcept;
  Status abortedStatus(const std::string& what) const;
  // One direction of an alltoall's exchange with one peer.
  struct Flow {
    int peer;
    bool sends;
    int fd;
    const uint8_t* from;  // sends
    uint8_t* into;        // receives
    size_t left;          // bytes
  };
  // The ring rank at the other end of socket `fd` (-1: none).
  int peerOf(int fd) const;
  // The socket that carries this rank's bytes to / from `peer` (-1: none).
  int sendSocket(int peer) const;
  int recvSocket(int peer) const;
  Status exchange(std::vector<Flow>& flows, const std::string& what);
  // A bad argument that only this rank may see (a null buffer, its own
  // alltoall counts): its peers go ahead with the call, so the ring breaks
  // (they fail at once instead of reading this rank's next call's bytes as
  // this one's). Arguments every rank shares (counts, root, dtype, op) fail
  // the call alone and leave the ring usable.
  Status localError(const std::string& message);
  // The failure that broke the ring before, or abort, as `what`'s error.
  Status usable(const std::string& what) const;
  // "<op> on the tcp ring (<count> x <dtype>[, <reduce>], ring rank r of n)".
  std::string describe(const char* op, size_t count, DataType dtype,
                       const std::string& reduce = "") const;
  int nextRank() const { return (rank_ + 1) % size_; }
  int prevRank() const { return (rank_ - 1 + size_) % size_; }
  // *what for `op` over `counts`; an error when the ring cannot take a call
  // or the counts are not one per rank.
  Status countsCall(const char* op, const std::vector<size_t>& counts, DataType dtype,
                    std::string* what, size_t* total) const;
  Status reduceFor(DataType dtype, ReduceOp op, const std::string& what, ReduceFn* fn) const;
  // Runs one collective's byte streams; a failure breaks the ring (every
  // later call fails) and shuts the sockets down for the neighbours.
  Status run(const std::string& what, const std::function<Status()>& call);
  Status ring(uint8_t* data, const Plan& p, ReduceFn reduce, const std::string& what);
  Status chain(uint8_t* data, size_t bytes, int root, const std::string& what);
  // One non-blocking send to / receive from `peer` on `fd`: *moved 0 when
  // the socket is not ready; an error naming the peer when it is gone.
  Status sendSome(int fd, int peer, const uint8_t* from, size_t bytes, size_t* moved,
                  const std::string& what);
  Status recvSome(int fd, int peer, uint8_t* into, size_t bytes, size_t* moved,
                  const std::string& what);
  // Returns once one of `fds` is ready (or poll's slice ends: the caller
  // looks again); an error on abort or when nothing moved for opts_.timeout
  // (naming `peers()`). waitRing: for the ring's two sockets.
  Status waitReady(const struct pollfd* fds, int count,
                   std::chrono::steady_clock::time_point lastProgress, const std::string& what,
                   const std::function<std::string()>& peers);
  Status waitRing(bool wantSend, bool wantRecv, std::chrono::steady_clock::time_point lastProgress,
                  const std::string& what);

  const int rank_, size_;
  const TcpRingOptions opts_;
  int sendFd_ = -1;                // to rank + 1
  int recvFd_ = -1;                // from rank - 1
  int abortFd_ = -1;               // eventfd: abort() wakes a sleeping poll
  std::vector<int> meshFd_;        // by ring rank; -1: none (neighbours, or no mesh)
  std::vector<std::string> addr_;  // peers' "host:port" by ring rank, for errors
  std::atomic<bool> aborted_{false};
  Status broken_;  // the first failure; only the calling thread touches it
  std::vector<uint8_t> scratch_;
};

// A set's data plane across hosts on a tcp ring: every collective on `ring`
// (connected with its mesh) over all of the set's ranks. `rest` (the set's
// Gloo backend, connected before the ranks agreed on the ring) carries no
// collective; it stays for its name and is aborted with the ring. Same
// threads as its parts.
class RingPlaneBackend : public Backend {
 public:
  RingPlaneBackend(std::unique_ptr<Backend> ring, std::unique_ptr<Backend> rest)
      : ring_(std::move(ring)), rest_(std::move(rest)) {}
  std::string name() const override { return "tcp-ring+" + rest_->name(); }
  int rank() const override { return rest_->rank(); }
  int size() const override { return rest_->size(); }
  Status allreduce(void* data, size_t count, DataType dtype, ReduceOp op) override {
    return ring_->allreduce(data, count, dtype, op);
  }
  Status allgatherv(const void* in, void* out, const std::vector<size_t>& counts,
                    DataType dtype) override {
    return ring_->allgatherv(in, out, counts, dtype);
  }
  Status broadcast(void* data, size_t count, DataType dtype, int root) override {
    return ring_->broadcast(data, count, dtype, root);
  }
  Status alltoallv(const void* in, const std::vector<int64_t>& send, void* out,
                   const std::vector<int64_t>& recv, DataType dtype) override {
    return ring_->alltoallv(in, send, out, recv, dtype);
  }
  Status reducescatter(void* inout, const std::vector<size_t>& counts, DataType dtype,
                       ReduceOp op) override {
    return ring_->reducescatter(inout, counts, dtype, op);
  }
  Status barrier() override { return ring_->barrier(); }
  void abort() noexcept override {
    ring_->abort();
    rest_->abort();
  }

 private:
  std::unique_ptr<Backend> ring_, rest_;
};

// Collective over the set's ranks (keys under `store`): if no rank gives a
// `refusal` (empty: this rank wants the ring; else why not), connects a tcp ring over all of them
// and returns `rest` wrapped in a RingPlaneBackend; otherwise returns `rest` unchanged and
// *whyNot says why. Fails only when an exchange or the ring's set-up fails.
Result<std::unique_ptr<Backend>> withTcpRing(std::shared_ptr<Store> store, int rank, int size,
                                             const std::string& refusal, const TcpRingOptions& opts,
                                             std::unique_ptr<Backend> rest, std::string* whyNot);

// Connects the ring of `size` ranks whose keys live under `store`; `rank` is
// this rank's index in it. size 1: no sockets. Fails (naming the peer) when
// a peer does not appear or cannot be reached within opts.startTimeout.
Result<std::unique_ptr<Backend>> createTcpRingBackend(std::shared_ptr<Store> store, int rank,
                                                      int size, const TcpRingOptions& opts);

}  // namespace hora
