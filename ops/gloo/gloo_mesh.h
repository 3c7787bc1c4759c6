// GlooMesh: how GlooBackend connects its Gloo context, and what keeps every
// transfer on it abortable.
//
// Gloo leaves two holes that a lost rank falls into, each costing the
// survivors the whole peer timeout:
//  - connectFullMesh keeps the pairs out of reach until every one is
//    connected, so nothing can wake a pair waiting to be connected to by a
//    peer that died after publishing its address. MeshContext::connectMesh
//    does the same steps with a watcher that signals the pairs on a loss.
//  - A pair's failure (tcp::Pair::signalException) wakes the buffers of the
//    operations still queued on it, but not an unbound-buffer send already
//    partly written to the socket (tx_ is walked for bound buffers only) nor
//    a receive partly read (rx_): a transfer to or from a rank that died
//    mid-way waits out its timeout even after every pair was signalled
//    (seen: a hierarchical allreduce's cross stage, 30 s in waitSend). The
//    connected context therefore creates its unbound buffers through a thin
//    wrapper that registers them in AbortableBuffers, and failAll() sets the
//    exception on every live one, as Gloo does for the buffers it reaches.
//
// Created by createGlooBackend on the init thread; AbortableBuffers::failAll
// and signalPair from any thread (GlooBackend::abort); the buffers are created
// and destroyed by whichever thread runs a collective.
#pragma once

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/unbound_buffer.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>

#include "core/status.h"

namespace hora {

// Fails a Gloo tcp pair: closes its socket and wakes the waits Gloo reaches
// (no-op if it already failed). May throw; callers treat a pair that cannot
// be signalled as broken already.
void signalPair(gloo::transport::Pair* pair, const std::string& reason);

// The unbound buffers alive on one context. Thread-safe.
class AbortableBuffers {
 public:
  void add(gloo::transport::UnboundBuffer* tcpBuffer);
  void remove(gloo::transport::UnboundBuffer* tcpBuffer);
  // Every live buffer's waits throw `reason` from now on (waking those
  // blocked), and so do those of every buffer created later. Call it once the
  // pairs are signalled (GlooBackend::abort does): a pair still open would be
  // left with half a message read.
  void failAll(const std::string& reason) noexcept;

 private:
  std::mutex mu_;
  std::unordered_set<gloo::transport::UnboundBuffer*> live_;  // guarded by mu_
  std::exception_ptr failed_;                                 // guarded by mu_
};

class MeshContext : public gloo::rendezvous::Context {
 public:
  MeshContext(int rank, int size);

  // Gloo's full-mesh connect (every rank publishes its pairs' addresses under
  // its rank in `store`, then connects each pair to the address the peer
  // published for it), with `watch` (may be empty) asked every 100 ms on a
  // thread of its own until done: an error there signals every pair, which
  // fails the pending connects, and is what this returns. The same thread
  // fails a connect that takes longer than the context's timeout (kTimeout
  // naming the peer; Gloo's own bound is five times that). Gloo's exceptions
  // (a store timeout, a refused connect) propagate.
  Status connectMesh(gloo::rendezvous::Store& store,
                     std::shared_ptr<gloo::transport::Device>& device,
                     const std::function<Status()>& watch);

  // The buffers of the connected context, for GlooBackend::abort.
  const std::shared_ptr<AbortableBuffers>& sharedBuffers() const { return buffers_; }

 private:
  const std::shared_ptr<AbortableBuffers> buffers_;
};

}  // namespace hora
