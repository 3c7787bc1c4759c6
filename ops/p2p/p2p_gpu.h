// P2pGpu: the GPU half of point-to-point (docs/p2p.md). The engine
// (p2p_engine.h) still carries every message's header frames, so matching,
// mismatches and failures are decided exactly as for CPU tensors; once a
// receiver accepted a GPU message, both sides hand the payload here and it
// moves through the GPU plugin's p2p_group (NCCL ncclSend/ncclRecv).
//
// Communicators: one per ordered pair of ranks (a "channel": sender ->
// receiver), of two ranks, with its own stream on each side, created when
// the pair's first GPU message in that direction is accepted. Not the set's
// collective communicator: NCCL operations on one communicator must be issued
// in the same order on every rank, and sends and receives are not ordered
// against the set's collectives (a rank doing allreduce-then-send beside a
// peer doing recv-then-allreduce would deadlock). One direction per
// communicator and stream because the two directions of a pair are not
// ordered against each other either: with one stream, rank A's send to B
// queued before its receive from B, and B's send to A before its receive
// from A, would each wait for the other's receive. Within a channel, order is
// the order of the accepts: the receiver enqueues its receives as it writes
// them, the sender its sends as it reads them, so both sides enqueue the
// same sequence. The sender makes the communicator's id and publishes it in
// the set's store ("gpu/<from>-<to>"); the receiver reads (and removes) it.
//
// Threads: check(), submit(), failPeer() and fail() from any thread (the
// engine calls them with its lock held: they only queue and wake);
// completion callbacks and onFatal run on this object's GPU thread (started
// at the first submit), without its lock. That thread issues every plugin
// call on the channels' streams and polls their events; communicators are
// created on short-lived helper threads, one per channel, because
// comm_init blocks until the peer joins and two ranks may start their
// channels in different orders. shutdown() from the engine's owner.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/clock.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/store.h"
#include "core/tensor_entry.h"
#include "core/types.h"
#include "ops/gpu/gpu_plugin_loader.h"

namespace hora {

struct P2pGpuOptions {
  std::string setName;
  int rank = 0;                  // in the set
  std::vector<int> globalRanks;  // set rank -> global rank
  std::shared_ptr<Store> store;  // the set's (prefixed), for communicator ids
  std::shared_ptr<GpuPlugin> plugin;
  int localRank = 0;  // the device of a receive without a buffer: localRank % GPUs
  // Bounds communicator creation and each transfer once both sides issued it.
  std::chrono::milliseconds peerTimeout{30000};
  Logger logger;
  // A transfer that failed in the plugin (or timed out) breaks the set: its
  // peer's half would otherwise wait until its own timeout.
  std::function<void(const Status&)> onFatal;
};

class P2pGpu : public DeviceMemory {
 public:
  // One accepted message's payload, on one side.
  struct Transfer {
    bool send = true;
    int peer = 0;  // set rank
    void* data = nullptr;
    size_t bytes = 0;
    void* readyEvent = nullptr;  // the framework's event the transfer waits for
    // Runs once, on the GPU thread, without this object's lock.
    std::function<void(const Status&)> done;
  };

  explicit P2pGpu(P2pGpuOptions options);
  ~P2pGpu() override;
  P2pGpu(const P2pGpu&) = delete;
  P2pGpu& operator=(const P2pGpu&) = delete;

  // At post: the plugin loads and has p2p_group, and `dev` is this rank's
  // point-to-point device (the first GPU tensor's; all must share it).
  Status check(const Device& dev, const std::string& what);
  // Queues a transfer behind the earlier ones of its channel; fails (without
  // calling t.done) when the channel or everything failed or is stopping.
  Status submit(Transfer t);
  // Fails the transfers with `peer` (it shut down): aborts those channels.
  void failPeer(int peer, const Status& why);
  // Fails everything now and later (the set broke).
  void fail(const Status& why);
  // Whether transfers with `peer` are queued or in flight.
  bool busyWith(int peer) const;
  // Lets what was submitted finish until `deadline`, fails the rest with
  // `why`, stops the thread and releases streams and communicators.
  void shutdown(const Status& why, Clock::time_point deadline);

  // DeviceMemory: a receive without a buffer, on this rank's p2p device.
  Result<std::shared_ptr<void>> allocate(size_t bytes, const std::string& what) override;
  Device device();

 private:
  struct Channel;
  void run();
  void create(Channel& ch);
  Status createComm(Channel& ch);
  // With mu_ held; the done callbacks collected go to `out`.
  void failChannelLocked(Channel& ch, const Status& why,
                         std::vector<std::pair<Transfer, Status>>& out);
  Channel& channelLocked(int peer, bool send);
  std::string rankText(int setRank) const;

  const P2pGpuOptions opts_;
  const hora_gpu_plugin_v1_t* api_ = nullptr;  // set by check() under mu_
  mutable std::mutex mu_;                      // everything below
  std::condition_variable cv_;
  int device_ = -1;
  std::vector<std::unique_ptr<Channel>> channels_;  // [peer * 2 + (send ? 0 : 1)]
  Status failed_;
  bool stop_ = false;
  bool threadStarted_ = false;
  std::thread thread_;
};

}  // namespace hora
