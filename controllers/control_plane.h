// ControlPlane: the sockets that carry one process set's negotiation, in a
// star around the set's coordinator (its lowest rank), over Boost.Asio.
//
// Why hora has its own control sockets instead of negotiating over the data
// library: the control plane must keep working while the data plane is busy
// or stuck. Heartbeats flow during a long allreduce, a crashed peer is seen as
// a closed connection within milliseconds, a stalled one after
// HORA_PEER_TIMEOUT_S of silence, and the coordinator can tell every rank
// which peer was lost so every error names it. Messages are event driven:
// nothing is sent while no rank has work.
//
// Threads: create() runs on the thread that creates the process set (it
// drives the io_context itself until every rank is connected). After start(),
// the io_context belongs to the set's control thread, which calls run(). A
// framework thread may do the control thread's work for a moment (tryDrive,
// driveOnce; drive_lock.h), over the shared-memory lane or the sockets:
// "the control thread" below means whichever thread holds the drive lock. Every handler runs under
// it, and every method not marked thread-safe must be called under it (use
// post() from elsewhere).
//
// Frames: u32 length, u8 type, payload. Lengths above 64 MiB, unknown types
// or a bad hello are protocol errors: before the hello the connection is
// dropped and logged (a stray client), after it the peer is treated as lost.
#pragma once

#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "controllers/drive_lock.h"
#include "controllers/shm_lane.h"
#include "core/logging.h"
#include "core/spin_wait.h"
#include "core/status.h"
#include "core/store.h"

namespace hora {

enum class FrameType : uint8_t {
  kHello = 1,
  kWelcome = 2,
  kRequests = 3,   // worker -> coordinator: encoded RequestList
  kResponses = 4,  // coordinator -> all: encoded ResponseList
  kNack = 5,       // coordinator -> one worker: RequestList of stale hits
  kHeartbeat = 6,
  kAbort = 7,     // coordinator -> all: the set failed (payload: i32 code, message)
  kGoodbye = 8,   // a rank is shutting down cleanly
  kDoorbell = 9,  // empty: the shared-memory lane has frames for a rank that slept
};

// Negotiation frames: the ones the shared-memory lane carries when it is up.
inline bool isNegotiationFrame(FrameType t) {
  return t == FrameType::kRequests || t == FrameType::kResponses || t == FrameType::kNack;
}

struct ControlPlaneOptions {
  int rank = 0;  // rank within the set
  int size = 1;
  std::vector<int> globalRanks;  // set rank -> global rank, for messages
  // Global rank -> the launcher's worker id (elastic mode; empty otherwise):
  // ranks change between epochs, the id is what the user's logs show.
  std::vector<std::string> workerIds;
  std::string hostname = "127.0.0.1";
  std::chrono::milliseconds startTimeout{120000};
  std::chrono::milliseconds heartbeatInterval{1000};
  std::chrono::milliseconds peerTimeout{30000};
  std::string setName = "global";
  // The shared-memory lane (shm_lane.h): tried at create() when every rank
  // of the set has it true and reports the same host identity; the set
  // negotiates over TCP otherwise (laneStatus() says why). The ranks
  // exchange `hostId` (hostIdentity()) at create() either way, which also
  // counts kernelMates().
  bool shmLane = false;
  std::string hostId;
  uint64_t laneRingBytes = 1 << 20;
  std::string laneDir = "/dev/shm";
  // How long run() polls after its last work before it sleeps (spin_wait.h).
  SpinPolicy spin;
};

struct ControlPlaneCallbacks {
  // Coordinator side: a frame from set rank `from`. Worker side: from == 0.
  std::function<void(int from, FrameType type, std::string payload)> onFrame;
  // A peer was lost, sent garbage, or said goodbye (code kShutDown). Called
  // once per peer; the status message names the peer.
  std::function<void(int peer, Status why)> onPeerLost;
};

class ControlPlane {
 public:
  // Rendezvous through `store` (keys under the store's own prefix): the
  // coordinator listens and publishes its address and a session token;
  // workers connect and say hello. Blocks until all are connected.
  static Result<std::unique_ptr<ControlPlane>> create(std::shared_ptr<Store> store,
                                                      ControlPlaneOptions options, Logger logger);
  ~ControlPlane();

  boost::asio::io_context& io() { return io_; }
  // Thread-safe: runs `fn` on the control thread. Unlike a plain post to
  // io(), the loop that polls the shared-memory lane looks at the event loop
  // in its next round instead of within eight (its own poll is an epoll
  // system call, made every eighth round otherwise): on a machine where the
  // runtime's threads share cores each round gives the core away, and the
  // eight rounds were a sizable part of a small allreduce.
  // The handler runs under the drive lock (drive_lock.h), as every handler
  // of this loop does.
  template <typename F>
  void post(F&& fn) {
    boost::asio::post(io_, locked(std::forward<F>(fn)));
    posted_.fetch_add(1, std::memory_order_release);
  }
  // `fn` wrapped to run under the drive lock: for every handler given to
  // io() (timers, posts), since a framework thread driving the set may run
  // the loop's work while the control thread runs a handler.
  template <typename F>
  auto locked(F&& fn) {
    return [this, fn = std::forward<F>(fn)](auto&&... args) mutable {
      std::lock_guard<DriveLock> hold(drive_);
      fn(std::forward<decltype(args)>(args)...);
      runSoonQueued();
    };
  }
  // Runs `fn` once the work in progress on this thread (which holds the
  // drive lock) is done, still under the lock: a step that must not run
  // inside the one that asked for it (re-entrancy), without waking the
  // control thread as post() would when it sleeps.
  // From a thread without the lock it is post().
  void runSoon(std::function<void()> fn) {
    if (drive_.heldHere())
      soon_.push_back(std::move(fn));
    else
      post(std::move(fn));
  }
  DriveLock& driveLock() { return drive_; }
  // Whether the calling thread is the one running the set's control logic
  // now (holds the drive lock).
  bool drivenHere() const { return drive_.heldHere(); }

  // A framework thread submitting work (see drive_lock.h): runs `fn` on the
  // calling thread under the drive lock (with the lane, between two of its
  // rounds, counted among its pollers; over TCP, what it sends goes straight
  // into the kernel), when no thread drives the set now (nor this one, in a
  // handler); false, running nothing, otherwise.
  // `*whileDriving`, if given, is true from the lock's taking to its
  // release. Thread-safe.
  bool tryDrive(const std::function<void()>& fn, bool* whileDriving = nullptr);
  // A framework thread doing the control thread's work while it waits for
  // one of the set's collectives (a set with peers: drivable()):
  // beginDriving() counts it among the lane's pollers (peers then need not
  // ring it) or, over TCP, takes the sockets from the control thread (which
  // leaves its epoll wait and sleeps until the last driver ends: once it
  // has, a frame that arrives wakes no thread but the one polling for it),
  // driveOnce() does one round if no other thread is driving (kWorked if
  // anything moved; kHeldElsewhere, doing nothing, while another thread of
  // this process drives, or over TCP while the control thread has not left
  // its wait yet), endDriving() undoes beginDriving and hands what arrived
  // meanwhile (and, the last one, the sockets) back to the control thread.
  // driveOnce() only between a thread's own beginDriving() and endDriving()
  // (over TCP an uncounted poller could run the no-op that ends the control
  // thread's wait, which then waits again). Thread-safe.
  enum class DriveRound { kWorked, kIdle, kHeldElsewhere };
  bool drivable() const { return lane_ != nullptr || opts_.size > 1; }
  void beginDriving();
  DriveRound driveOnce();
  void endDriving();
  // Starts reads and heartbeats; call on the control thread before run().
  void start(ControlPlaneCallbacks callbacks);
  // Runs the event loop until stop(). Control thread only.
  void run();
  // Thread-safe: stops run() soon.
  void stop();

  // Control thread only.
  void send(int peer, FrameType type, std::string payload);
  void broadcast(FrameType type, const std::string& payload);
  // Calls `done` (on the control thread) once every frame queued so far is
  // in the kernel for every live peer, or after `bound`, whichever is first:
  // a rank that found a failure tells its peers before its user can exit on
  // it (SetHealth::holdForPeers). Not called if the loop stops first.
  void whenSent(std::chrono::milliseconds bound, std::function<void()> done);
  bool isCoordinator() const { return opts_.rank == 0; }
  // Whether negotiation frames travel through shared memory, and if not, why
  // ("" when the lane is up).
  bool laneUp() const { return lane_ != nullptr; }
  // The lane is up and every frame for every peer is in it (nothing waits
  // for room in a ring, or behind the lane for a socket): peers can read all
  // this rank sent without this thread's help. The condition under which the
  // control thread may block on work for a moment (SetController's small
  // groups). Control thread only.
  bool laneFlushed() const;
  // Whether a peer wrote into the lane what this rank has not read yet.
  // Control thread only.
  bool laneHasInput() const;
  // While the control thread runs a collective itself (and neither reads
  // nor sends frames), now and then: tells the peers through the lane that
  // this rank is alive, so that they do not take its silence for a stall,
  // and counts bytes arriving unread from a peer as hearing from it.
  // Control thread only.
  void markAlive();
  const std::string& laneStatus() const { return laneWhyNot_; }
  // How many of the set's ranks share this rank's kernel (its boot id),
  // whatever their host names: emulated or containerised hosts on one
  // machine share its cores. Learnt at the lane's set-up, which every rank
  // of a set runs whether or not it wants the lane; 0 when unknown (a set of
  // one rank, or an identity without a boot id such as HORA_HOST_ID's).
  int kernelMates() const { return kernelMates_; }
  // An error naming the first peer whose control connection is closed (it
  // died); ok if none is. Only before start(): the event loop, once it runs,
  // owns the connections. The data plane's set-up asks it between slices of
  // its store waits (core/store.h, WatchedStore).
  Status peersStillConnected() const;
  // Says goodbye to every peer. Sockets stay open so the peers can finish
  // work already agreed; the coordinator closes them once every worker has
  // said goodbye (or was lost), which is the workers' signal that the set is
  // over. Control thread only.
  void closeGracefully();
  // Thread-safe: whether the set is over from this rank's view (coordinator:
  // every worker said goodbye or was lost; worker: the coordinator closed).
  bool peersDone() const { return peersDone_.load(); }

 private:
  struct Peer;
  ControlPlane(ControlPlaneOptions options, Logger logger);
  Status rendezvousCoordinator(Store& store);
  Status rendezvousWorker(Store& store);
  // Reads exactly n bytes through async_read_some steps, each completion
  // under the drive lock (a composed async_read would run its intermediate
  // steps, which touch the socket, outside it); `done` runs under it too.
  void readExactly(const std::shared_ptr<Peer>& p, char* data, size_t n,
                   std::function<void(boost::system::error_code)> done);
  void readHeader(std::shared_ptr<Peer> p);
  void readBody(std::shared_ptr<Peer> p, uint32_t len);
  void flush(std::shared_ptr<Peer> p);
  void lose(const std::shared_ptr<Peer>& p, Status why);
  void tick();
  std::string peerName(int peer) const;
  // The lane's set-up through the store after the TCP rendezvous
  // (control_plane_lane.cc); a failure leaves the set on TCP, a store
  // failure fails create().
  Status setUpLane(Store& store);
  // A lane set-up value from the store (waiting up to the start timeout);
  // the coordinator's reason when it gave up on the set-up.
  Result<std::string> laneValue(Store& store, const std::string& key);

  // Reads the lane and hands its frames on (also before any TCP frame and
  // before a lost peer, which keeps the order); true if anything moved.
  bool pollLane();
  // The event loop with the lane: polls both while there is work.
  void runWithLane();
  // The event loop over TCP: waits in the io_context, or, while framework
  // threads drive, sleeps (they poll the io_context).
  void runWithoutLane();
  // Over TCP, in runWithoutLane: until no framework thread drives or the
  // loop stopped (or a while has passed).
  void parkWhileDriven();
  // Wakes the control thread from parkWhileDriven, if it sleeps there.
  void wakeParked();
  void sendFrame(const std::shared_ptr<Peer>& p, FrameType type, const std::string& payload);
  bool allSent() const;
  void pollSent(std::shared_ptr<boost::asio::steady_timer> timer,
                std::chrono::steady_clock::time_point deadline, std::function<void()> done);

  ControlPlaneOptions opts_;
  Logger logger_;
  boost::asio::io_context io_;
  std::unique_ptr<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  boost::asio::steady_timer timer_;
  std::vector<std::shared_ptr<Peer>> peers_;  // indexed by set rank (coordinator) or [0]
  ControlPlaneCallbacks cb_;
  void updateDone();
  bool closing_ = false;
  std::atomic<bool> peersDone_{false};
  std::atomic<uint64_t> posted_{0};  // post() calls so far
  // Framework threads between beginDriving() and endDriving(): while one
  // polls, the control thread sleeps instead of racing it for the lock
  // (runWithLane) or for the sockets (runWithoutLane).
  std::atomic<int> drivers_{0};
  // Over TCP: the control thread is inside io_.run_one() (maybe in epoll,
  // where a driver's poll cannot reach the sockets: beginDriving wakes it),
  // or asleep in parkWhileDriven.
  std::atomic<bool> inLoop_{false};
  std::atomic<bool> parked_{false};
  std::mutex parkMu_;
  std::condition_variable parkCv_;
  uint64_t drivenPostsSeen_ = 0;  // under drive_: posts a driver has polled for
  std::unique_ptr<ShmLane> lane_;
  std::string laneWhyNot_ = "not tried";
  int kernelMates_ = 0;
  bool inLanePoll_ = false;
  mutable DriveLock drive_;
  std::vector<std::function<void()>> soon_;  // under drive_: runSoon()
  // Runs what runSoon() queued, at the outermost level of the lock only.
  void runSoonQueued();
  // A driver leaving (under the lock, no longer counted as a poller): reads
  // what came after its last round, and wakes the control thread for frames
  // still waiting for room in a ring (it flushes them).
  void leaveLane();
};

const char* frameTypeName(FrameType t);

// Per rank, how many of `hostIds` (hostIdentity() values as the lane's
// set-up collects them) share its kernel's boot id; 0 where a value names
// no boot ("-", a test override). Pure, for tests.
std::vector<int> kernelMatesByRank(const std::vector<std::string>& hostIds);
// Rank `rank`'s count from the comma-separated list the coordinator
// publishes; 0 when it is missing or malformed. Pure, for tests.
int kernelMatesOf(const std::string& list, int rank);

// The frame codec's two parsers of bytes from the network, standalone so they
// can be tested and fuzzed. A frame is [u32 length = 1 + payload][u8 type][payload].
constexpr uint32_t kMaxControlFrameBytes = 64u << 20;
// Checks a frame header: known type, 1 <= length <= kMaxControlFrameBytes;
// sets *payloadLen (length - 1) and *type. kProtocolError otherwise.
Status parseFrameHeader(const char hdr[5], uint32_t* payloadLen, FrameType* type);
// A hello's payload: str magic (<= 64 bytes), i32 rank, str token (<= 256 bytes).
struct Hello {
  std::string magic;
  int32_t rank = -1;
  std::string token;
};
Status parseHello(const std::string& payload, Hello* out);

}  // namespace hora
