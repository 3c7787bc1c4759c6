// P2pEngine: point-to-point send and receive between two ranks of one
// process set (docs/p2p.md), beside the set's negotiated collectives.
//
// Sends and receives do not go through the coordinator: a message is
// matched by the receiver, by (sender, tag) in the order each side posted
// them (MPI's non-overtaking rule, no wildcards). Each ordered pair of ranks
// has a byte stream: a ring in the receiver's shared-memory inbox
// (ops/p2p/p2p_inbox.h) when both share a host, else a TCP connection
// (ops/p2p/p2p_socket.h). It carries frames:
//  - kMessage: seq, tag, dtype, shape; up to HORA_P2P_EAGER_BYTES its
//    payload follows at once (buffered by the receiver if no receive is
//    posted yet), above that the payload waits for the receiver's accept;
//  - kAccept / kReject: the receiver matched the message and its buffer
//    agrees (or not: dtype or element count differ, or allocation failed);
//  - kPayload: the payload of an accepted large message;
//  - kClose (TCP): the sender shut down cleanly (an end of stream without it
//    means its process died).
// A send completes when the receiver accepted it (and, for a large one,
// once its payload is written), so a mismatch fails both sides with both
// descriptions and never writes a byte into the wrong buffer.
//
// Threads: post() from any framework thread (it makes a round of progress
// itself, so a small send is written before it returns); progress is made
// by whoever holds the engine's lock: the engine's own progress thread
// (started on the first post, asleep on the inbox doorbell when there is
// nothing to do) or a framework thread waiting on a request (poll(), which
// the thread stands aside for). fail() from any thread (the set's health
// listener); shutdown() from the set's owner.
//
// GPU tensors (kDLCUDA): the frames are the same, with the message marked
// as a device payload; once accepted, the payload moves through the GPU
// plugin on a pair communicator of its own (ops/p2p/p2p_gpu.h, glue in
// p2p_engine_gpu.cc). A GPU message and a host receive buffer (or the
// reverse) are rejected on both sides, as a mismatch.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/clock.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/store.h"
#include "core/telemetry.h"
#include "core/tensor_entry.h"
#include "core/types.h"
#include "ops/gpu/gpu_plugin_loader.h"
#include "ops/p2p/p2p_gpu.h"
#include "ops/p2p/p2p_inbox.h"

namespace hora {

constexpr int kP2pMaxDims = 8;

// One send or receive. A receive with data == nullptr and allocate set
// gets its buffer from sink->allocateOutput once the message's shape is
// known ("size negotiated").
struct P2pOp {
  enum Kind : uint8_t { kSend, kRecv };
  Kind kind = kSend;
  int peer = 0;  // set rank
  int64_t tag = 0;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;  // send: the tensor's; recv: the buffer's
  void* data = nullptr;        // send: read; recv: written
  size_t bytes = 0;
  bool allocate = false;
  Device device;                      // kCuda: the payload moves through P2pGpu
  void* readyEvent = nullptr;         // GPU: the framework's event to wait for
  std::shared_ptr<RequestSink> sink;  // completeEntry() once
};

struct P2pEngineOptions {
  std::string setName;
  int rank = 0;                  // in the set
  std::vector<int> globalRanks;  // set rank -> global rank
  std::shared_ptr<Store> store;  // the set's, for inbox names
  std::string hostId;            // core/host_identity
  std::string dir = "/dev/shm";
  std::string hostname;            // where peers on other hosts reach this rank
  std::string transport = "auto";  // auto (shared memory on one host, else TCP), shm, tcp
  uint64_t ringBytes = 1 << 20;
  uint64_t eagerBytes = 64 << 10;
  uint64_t fastBytes = kP2pFastDataBytes;  // fast box up to this size (0: off)
  Seconds stallWarning{60};                // 0 = no warning
  Seconds stallShutdown{0};                // 0 = never
  int spinUs = 50;  // how long drive() callers and the thread poll before sleeping
  Logger logger;
  // GPU tensors: the runtime's plugin (null: refused), this process's local
  // rank (the device of a receive without a buffer) and the bound on a GPU
  // transfer (HORA_PEER_TIMEOUT_S).
  std::shared_ptr<GpuPlugin> gpuPlugin;
  int localRank = 0;
  std::chrono::milliseconds peerTimeout{30000};
  // The set's metrics, timeline and flight recorder (null: none): each
  // completed operation is counted there (Telemetry::p2pDone).
  std::shared_ptr<Telemetry> telemetry;
  // Breaks the set (SetHealth::fail, telling the peers): a peer's process
  // is gone, a frame is malformed, or an operation passed the stall
  // shutdown. Called without the engine's lock; the set's listener then
  // calls fail().
  std::function<void(const Status&)> onFatal;
};

class P2pEngine {
 public:
  explicit P2pEngine(P2pEngineOptions options);
  ~P2pEngine();
  P2pEngine(const P2pEngine&) = delete;
  P2pEngine& operator=(const P2pEngine&) = delete;

  // Queues the operations (all or none); they progress in the background.
  // Fails at once when the engine has failed or shut down, or an op names a
  // peer outside the set or this rank itself.
  Status post(P2pOp* ops, size_t n);  // moves from ops[0..n)
  Status post(std::vector<P2pOp> ops) { return post(ops.data(), ops.size()); }
  // One round of progress if no other thread is making it; returns whether
  // anything moved. For framework threads waiting on a request. `now` may
  // be a few rounds old (a polling waiter reads the clock now and then:
  // clock_gettime was a seventh of a polling round); it paces connection
  // attempts and the stall checks.
  bool drive(Clock::time_point now);
  bool drive() { return drive(Clock::now()); }
  // A framework thread waiting on a request: drives progress until `done`
  // is set or HORA_P2P_SPIN_US passed, then returns (the caller sleeps).
  // Meanwhile the progress thread stands aside, so a rank has one poller,
  // not two competing for the cores; on return progress goes back to it.
  void poll(const std::atomic<bool>& done);

  // Fails every pending and later operation with `why` (the set broke).
  void fail(const Status& why);
  // Fails what is pending with kShutDown, stops the thread, removes the inbox.
  void shutdown(const std::string& reason);

  // Operations posted and not completed (for tests and the stall report).
  size_t pending() const;
  // Those operations, one line each with how long they have waited, for the
  // flight recorder's dump (any thread; "" when there are none).
  std::string pendingReport() const;
  // Sends that went through the fast box so far (tests, metrics).
  uint64_t fastSends() const { return fastSends_.load(std::memory_order_relaxed); }

 private:
  struct Frame;
  struct Op;
  struct Unexpected;
  struct OutFrame;
  class OutQueue;
  struct Peer;
  using OpPtr = std::shared_ptr<Op>;

  void run();
  void wake();
  void beginDrive();
  void endDrive();
  // Whether a peer on this host polls on the CPU this thread runs on: then
  // spinning only keeps it from running.
  bool peerSharesCpu();
  // All below: with mu_ held.
  bool progressLocked(Clock::time_point now);
  Status ensureInbox();
  bool connect(Peer& p, Clock::time_point now);
  void acceptLocked();
  size_t writeOut(Peer& p, const char* data, size_t n);
  size_t readIn(Peer& p, void* data, size_t n);
  bool sleepOnSockets(int timeoutMs);
  void takeIncoming();
  // fastSeq >= 0: the message came through the fast box (accepted there).
  char* matchLocked(Peer& p, const OpPtr& recv, const Frame& h, const char* eagerData,
                    int64_t fastSeq = -1);
  void acceptEagerLocked(Peer& p, const OpPtr& recv, const Frame& h, int64_t fastSeq = -1);
  // The fast box (p2p_fastbox.cc): a small send written straight into the
  // peer's inbox, the messages waiting in ours, the peer's acknowledgements.
  bool tryFastSendLocked(Peer& p, const OpPtr& op);
  bool drainFastLocked(Peer& p);
  bool reapFastAcksLocked(Peer& p);
  bool fastWorkLocked(const Peer& p) const;
  // A fast-box store for `p` wants its doorbell rung, which takes a full
  // fence (P2pInbox::ring): done after mu_ is released, when unlocking has
  // drained the store anyway. Fencing right after the store made this core
  // wait for the line to leave the peer's cache, on the message's path.
  void ringLater(Peer& p);
  struct Rings;
  // What poll() reads between rounds of progress, without the lock (see
  // quickLook); one per peer.
  struct Watch;
  // Whether a round of progress could move anything, from the words a
  // shared-memory peer writes into our inbox (the next fast-box slot's stamp,
  // the acknowledgements of our fast sends, its ring's head) and their
  // expected values mirrored under mu_. False means nothing arrived; true
  // may be a stale mirror's false alarm, or that only a full round can tell
  // (TCP peers, frames queued, a connection to make). Any thread.
  bool quickLook() const;
  // With mu_ held: whether quickLook() sees everything a round would (else
  // it answers true); stored for it at the end of every round.
  bool quickLookCoversLocked() const;
  // The part of a round of progress for one peer (mu_ held).
  bool progressPeerLocked(Peer& p, Clock::time_point now);
  // A round for what post() just queued: the peers of the receives and of
  // the sends that did not go through the fast box, and the listener when a
  // connection is awaited; no stall checks (the progress thread and polling
  // waiters make full rounds).
  void progressPostedLocked(Clock::time_point now);
  // The send awaiting accept or reject with sequence number `seq`, taken out
  // of Peer::sends or Peer::fastBusy (null: it failed meanwhile).
  OpPtr takeSendLocked(Peer& p, uint64_t seq);
  // A message whose whole payload is at `data` meets its receive, or waits.
  void deliverLocked(Peer& p, const Frame& h, const char* data, int64_t fastSeq);
  // Payloads move through a ring in pieces of a quarter ring, each published
  // (and the peer's doorbell rung) on its own, so that the receiver copies
  // one piece out while the sender copies the next in. Whole-ring writes
  // made the two copies take turns: half the bandwidth for large messages
  // (1-16 MiB ping-pong: 1.6-2x with pieces, bench/README.md "Point-to-point").
  size_t payloadPiece() const { return static_cast<size_t>(opts_.ringBytes / 4); }
  bool pumpOut(Peer& p, Clock::time_point now);
  bool pumpIn(Peer& p);
  bool onFrameLocked(Peer& p);
  void finishPayloadLocked(Peer& p);
  void complete(OpPtr op, const Status& s);
  // Runs completions and onFatal calls collected under mu_, without it.
  struct Taken;
  void deliver(Taken& done, std::vector<Status>& fatal);
  void failPeerLocked(Peer& p, const Status& why);
  void fatalLocked(const Status& why);
  void failAllLocked(const Status& why);
  void checkLocked(Clock::time_point now);
  bool hasWorkLocked();
  std::string describe(const Op& op) const;
  std::string rankText(int setRank) const;
  // GPU payloads (p2p_engine_gpu.cc).
  P2pGpu* gpu();  // created on first use; null without a plugin
  P2pGpu* gpuIfAny() const { return gpuPtr_.load(std::memory_order_acquire); }
  Status checkGpu(const P2pOp& op);  // at post, before the lock
  // With mu_ held: hand an accepted GPU message's payload to P2pGpu, in the
  // order of the accepts (sender: as it reads them; receiver: as it queues them).
  void transferGpuLocked(const OpPtr& op);
  void gpuDone(const OpPtr& op, const Status& s);  // P2pGpu's thread, without mu_

  static constexpr std::chrono::milliseconds kAcceptEvery{10};
  // poll(): idle ticks (a quick look 1, a full round 4) between checks of
  // where the peers poll, and quick looks (quickLook) between full rounds of
  // progress (which also make the stall checks and take connections).
  static constexpr unsigned kIdlePollsPerYieldCheck = 64;
  static constexpr unsigned kQuickLooksPerRound = 64;

  const P2pEngineOptions opts_;
  mutable std::mutex mu_;  // everything below; held for a whole round of progress
  std::unique_ptr<P2pInbox> inbox_;
  std::atomic<P2pInbox*> inboxPtr_{nullptr};  // inbox_, for wake() without mu_
  int listenFd_ = -1;                         // TCP, for peers on other hosts
  int awaitingAccepts_ = 0;                   // peers whose connection we wait for
  Clock::time_point nextAccept_{};            // when to look at the listener unasked
  std::atomic<bool> listenerReady_{false};    // poll() saw a connection waiting
  std::string token_;                         // what a connecting peer must present
  std::atomic<int> wakeFd_{-1};               // eventfd: wakes the thread in poll()
  std::vector<char> scratch_;                 // where discarded TCP bytes go
  std::vector<std::unique_ptr<Peer>> peers_;
  std::unique_ptr<Watch[]> watch_;            // per peer, see quickLook()
  std::atomic<bool> quickLookCovers_{false};  // quickLookCoversLocked() after the last round
  std::vector<OpPtr> incoming_;               // posted, not yet taken by progress
  std::atomic<size_t> live_{0};
  std::atomic<uint64_t> fastSends_{0};  // posted and not completed; changed under mu_, read without
  std::vector<std::pair<OpPtr, Status>> completions_;  // run after mu_ is released
  std::vector<Status> fatal_;                          // onFatal calls, likewise
  std::vector<P2pInbox*> toRing_;                      // doorbells to ring, likewise
  Status failed_;                                      // set once; later posts fail with it
  bool stopping_ = false;
  bool threadStarted_ = false;
  Clock::time_point nextCheck_{};
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int> drivers_{0};
  // Before the inbox exists the thread sleeps on this; after, on its doorbell.
  std::mutex wakeMu_;
  std::condition_variable wakeCv_;
  uint64_t wakeups_ = 0;
  std::once_flag gpuOnce_;
  std::unique_ptr<P2pGpu> gpu_;
  std::atomic<P2pGpu*> gpuPtr_{nullptr};
};

}  // namespace hora
