// CoordinatorLink: how a rank's SetController reaches the coordinator of its
// process set, chosen once at construction so that the controller walks the
// same code on every rank:
//  - set rank 0 hosts the coordinator: CoordinatorService
//    (coordinator_service.h), reached by direct calls;
//  - every other rank reaches it over the control plane: RemoteCoordinator
//    (below), which turns calls into frames and frames into calls.
// The coordinator answers through the Client interface, which the
// SetController implements: response lists, nacks of stale cache hits, and
// failures of the set.
//
// Control thread only (the thread that runs the set's ControlPlane).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "controllers/control_plane.h"
#include "core/message.h"
#include "core/status.h"

namespace hora {

class CoordinatorLink {
 public:
  // What the coordinator tells a rank.
  class Client {
   public:
    virtual ~Client() = default;
    virtual void onResponses(const ResponseList& list) = 0;
    // Cache hits the coordinator could not resolve: resend them in full.
    virtual void onNacks(const std::vector<CacheHit>& hits) = 0;
    // The set failed. `tellPeers`: this rank must spread it (it found the
    // failure, or it is the coordinator relaying a worker's); false when the
    // coordinator reported it to this rank.
    virtual void failSet(Status why, bool tellPeers) = 0;
    // Shutdown has begun on this rank (timers stop re-arming).
    virtual bool stopping() const = 0;
  };

  virtual ~CoordinatorLink() = default;
  // Before start(); the client outlives the link's use.
  virtual void attach(Client* client) = 0;
  // On the control thread, before any frame arrives (the coordinator starts
  // its stall inspection here).
  virtual void start() {}
  // This rank's new requests and cache hits.
  virtual void submit(RequestList list) = 0;
  // Spreads a failure this rank found: a worker tells the coordinator, the
  // coordinator tells every worker.
  virtual void reportFailure(const Status& why) = 0;
  // A frame from the control plane (a worker's frames reach the coordinator
  // here, the coordinator's frames a worker).
  virtual void onFrame(int from, FrameType type, std::string payload) = 0;
  // The status a lost peer breaks the set with, seen from this side.
  virtual Status describeLoss(int peer, const Status& why) const = 0;
  // Whether executorIdle() does anything (the controller only wakes the
  // control thread after each group when it does).
  virtual bool wantsExecutorIdle() const { return false; }
  // Executor thread, after a group: whether executorIdle() has anything to
  // do now (the coordinator held tensors back while the executor was busy);
  // if not, the control thread is not woken for it.
  virtual bool executorIdleWanted() const { return wantsExecutorIdle(); }
  // This rank's executor finished a group (the coordinator may emit now).
  virtual void executorIdle() {}
  // Emits everything ready at once (shutdown: other ranks may wait for it).
  virtual void flush() {}
  // Cancels timers (shutdown).
  virtual void stop() {}
};

// A worker's link: requests and failures go to set rank 0 as frames;
// responses, nacks and aborts come back from it.
class RemoteCoordinator : public CoordinatorLink {
 public:
  RemoteCoordinator(ControlPlane& cp, std::string setName);
  void attach(Client* client) override { client_ = client; }
  void submit(RequestList list) override;
  void reportFailure(const Status& why) override;
  void onFrame(int from, FrameType type, std::string payload) override;
  Status describeLoss(int peer, const Status& why) const override;

 private:
  ControlPlane& cp_;
  const std::string setName_;
  Client* client_ = nullptr;
};

// The abort frame's payload (i32 code, message) and its checked decoding: a
// malformed one becomes a protocol error, an unknown code a remote error.
std::string encodeAbort(const Status& why);
Status decodeAbort(const std::string& payload);
// A peer's goodbye, as the status of what can no longer complete.
Status peerShutDown(const Status& goodbye);

}  // namespace hora
