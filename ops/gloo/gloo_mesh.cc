// GlooMesh (see gloo_mesh.h): MeshContext's full-mesh connect with a loss
// watcher, and the transport context wrapper that keeps every unbound buffer
// reachable by AbortableBuffers::failAll.
#include "ops/gloo/gloo_mesh.h"

#include <gloo/common/error.h>
#include <gloo/transport/context.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <thread>
#include <utility>
#include <vector>

// signalPair needs tcp::Pair::signalExceptionExternal and failAll needs
// tcp::UnboundBuffer::signalException (see PairAccess and BufferAccess
// below), both protected.
// Debian's libgloo-dev 0.5 ships gloo/transport/tcp/pair.h but not the
// gloo/common/memory.h it includes, so the real class cannot be compiled
// here (nor unbound_buffer.h). In that case we declare stand-ins with just
// those members: the calls then bind to the exported symbols
// gloo::transport::tcp::Pair::signalExceptionExternal(const std::string&) and
// gloo::transport::tcp::UnboundBuffer::signalException(std::exception_ptr)
// in libgloo.so, with the ordinary member-call ABI. Strictly this is two
// definitions of each class (an ODR violation), which is harmless here because
// a stand-in is never instantiated, has no data or virtual members, and only
// names a non-virtual function whose mangled name does not depend on the
// class body. Where the header is complete, the real class is used.
#if __has_include(<gloo/common/memory.h>)
#include <gloo/transport/tcp/pair.h>
#include <gloo/transport/tcp/unbound_buffer.h>
#else
namespace gloo {
namespace transport {
namespace tcp {
class Pair {
 protected:
  std::exception_ptr signalExceptionExternal(const std::string& msg);
};
class UnboundBuffer {
 protected:
  void signalException(std::exception_ptr);
};
}  // namespace tcp
}  // namespace transport
}  // namespace gloo
#endif

namespace hora {
namespace {

// Reach the protected members: naming a member through a derived class
// yields a pointer-to-member of the base usable on any object of it.
// signalExceptionExternal is what Gloo itself calls on every pair when a wait
// times out, and the only Pair entry point that both closes the socket and
// wakes the waits it reaches (Pair::close() wakes nobody). The pairs and
// buffers come from a tcp device, and the transport classes are the tcp
// classes' primary (only) bases, so the reinterpret_casts are the ones
// Gloo's tcp code uses itself.
struct PairAccess : gloo::transport::tcp::Pair {
  static void signal(gloo::transport::Pair* pair, const std::string& msg) {
    (reinterpret_cast<gloo::transport::tcp::Pair*>(pair)->*&PairAccess::signalExceptionExternal)(
        msg);
  }
};
struct BufferAccess : gloo::transport::tcp::UnboundBuffer {
  static void fail(gloo::transport::UnboundBuffer* buffer, std::exception_ptr ex) {
    (reinterpret_cast<gloo::transport::tcp::UnboundBuffer*>(buffer)
         ->*&BufferAccess::signalException)(std::move(ex));
  }
};

// Forwards everything to the tcp buffer it wraps (which is what the pairs
// see: its send/recv pass itself), registered for the wrapper's lifetime.
class WatchedBuffer : public gloo::transport::UnboundBuffer {
 public:
  WatchedBuffer(std::unique_ptr<gloo::transport::UnboundBuffer> inner,
                std::shared_ptr<AbortableBuffers> registry)
      : gloo::transport::UnboundBuffer(inner->ptr, inner->size),
        inner_(std::move(inner)),
        registry_(std::move(registry)) {
    registry_->add(inner_.get());
  }
  ~WatchedBuffer() override { registry_->remove(inner_.get()); }

  bool waitRecv(int* rank, std::chrono::milliseconds timeout) override {
    return inner_->waitRecv(rank, timeout);
  }
  bool waitSend(int* rank, std::chrono::milliseconds timeout) override {
    return inner_->waitSend(rank, timeout);
  }
  void abortWaitRecv() override { inner_->abortWaitRecv(); }
  void abortWaitSend() override { inner_->abortWaitSend(); }
  void send(int dstRank, uint64_t slot, size_t offset, size_t nbytes) override {
    inner_->send(dstRank, slot, offset, nbytes);
  }
  void recv(int srcRank, uint64_t slot, size_t offset, size_t nbytes) override {
    inner_->recv(srcRank, slot, offset, nbytes);
  }
  void recv(std::vector<int> srcRanks, uint64_t slot, size_t offset, size_t nbytes) override {
    inner_->recv(std::move(srcRanks), slot, offset, nbytes);
  }

 private:
  const std::unique_ptr<gloo::transport::UnboundBuffer> inner_;
  const std::shared_ptr<AbortableBuffers> registry_;
};

// The connected tcp context with its buffers wrapped; pairs are the tcp
// context's own.
class WatchingContext : public gloo::transport::Context {
 public:
  WatchingContext(std::shared_ptr<gloo::transport::Context> inner,
                  std::shared_ptr<AbortableBuffers> registry)
      : gloo::transport::Context(inner->rank, inner->size),
        inner_(std::move(inner)),
        registry_(std::move(registry)) {
    setTimeout(inner_->getTimeout());
  }
  std::unique_ptr<gloo::transport::Pair>& getPair(int rank) override {
    return inner_->getPair(rank);
  }
  std::unique_ptr<gloo::transport::Pair>& createPair(int rank) override {
    return inner_->createPair(rank);
  }
  std::unique_ptr<gloo::transport::UnboundBuffer> createUnboundBuffer(void* ptr,
                                                                      size_t size) override {
    return std::unique_ptr<gloo::transport::UnboundBuffer>(
        new WatchedBuffer(inner_->createUnboundBuffer(ptr, size), registry_));
  }

 private:
  const std::shared_ptr<gloo::transport::Context> inner_;
  const std::shared_ptr<AbortableBuffers> registry_;
};

}  // namespace

void signalPair(gloo::transport::Pair* pair, const std::string& reason) {
  PairAccess::signal(pair, reason);
}

void AbortableBuffers::add(gloo::transport::UnboundBuffer* tcpBuffer) {
  std::lock_guard<std::mutex> lock(mu_);
  live_.insert(tcpBuffer);
  // Created after failAll (a collective that started late): fails at once.
  if (failed_) BufferAccess::fail(tcpBuffer, failed_);
}

void AbortableBuffers::remove(gloo::transport::UnboundBuffer* tcpBuffer) {
  std::lock_guard<std::mutex> lock(mu_);
  live_.erase(tcpBuffer);
}

void AbortableBuffers::failAll(const std::string& reason) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_) failed_ = std::make_exception_ptr(gloo::IoException(reason));
    // Under mu_: a buffer is unregistered (under mu_) before it is freed.
    for (auto* b : live_) BufferAccess::fail(b, failed_);
  } catch (...) {
    // Out of memory building the exception: the pairs' own signal and the
    // timeout remain.
  }
}

MeshContext::MeshContext(int rank, int size)
    : gloo::rendezvous::Context(rank, size), buffers_(std::make_shared<AbortableBuffers>()) {}

Status MeshContext::connectMesh(gloo::rendezvous::Store& store,
                                std::shared_ptr<gloo::transport::Device>& dev,
                                const std::function<Status()>& watch) {
  std::shared_ptr<gloo::transport::Context> tc = dev->createContext(rank, size);
  tc->setTimeout(getTimeout());
  std::vector<char> all;
  for (int i = 0; i < size; ++i) {
    if (i == rank) continue;
    const std::vector<char> bytes = tc->createPair(i)->address().bytes();
    all.insert(all.end(), bytes.begin(), bytes.end());
  }
  store.set(std::to_string(rank), all);
  // The watcher: every pair exists now (createPair above), and signalling
  // one is what GlooBackend::abort does to a connected set. It also bounds
  // each connect by the timeout: Gloo waits five times as long for a pair to
  // be connected to (a peer that published its address, then stalled).
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status lost;
  std::atomic<int> connecting{-1};  // the peer whose pair is connecting now
  std::atomic<int64_t> connectStartNs{0};
  auto failConnects = [&](const Status& why) {
    lost = why;
    for (int i = 0; i < size; ++i) {
      if (i == rank) continue;
      try {
        auto& pair = tc->getPair(i);
        if (pair) signalPair(pair.get(), "hora: " + why.message());
      } catch (...) {
        // A pair that cannot be signalled is broken already.
      }
    }
  };
  std::thread watcher([&] {
    const auto timeout = getTimeout();
    std::unique_lock<std::mutex> lk(mu);
    while (!cv.wait_for(lk, std::chrono::milliseconds(100), [&] { return done; })) {
      lk.unlock();
      // Nothing may escape this thread (std::terminate): a throwing
      // watch counts as a failed set-up.
      Status s;
      try {
        if (watch) s = watch();
        const int peer = connecting.load();
        const auto started =
            std::chrono::steady_clock::time_point(std::chrono::nanoseconds(connectStartNs.load()));
        if (s.isOk() && peer >= 0 && std::chrono::steady_clock::now() - started > timeout)
          s = Status(Code::kTimeout,
                     "rank " + std::to_string(peer) +
                         " of this Gloo communicator did not connect " + "its pair within " +
                         std::to_string(timeout.count() / 1000.0) +
                         " s (HORA_PEER_TIMEOUT_S) though it published its address: it is " +
                         "stopped, overloaded or unreachable");
      } catch (...) {
        s = Status(Code::kSystemError, "the set-up watch failed (out of memory?)");
      }
      lk.lock();
      if (s.isOk()) continue;
      failConnects(s);
      return;
    }
  });
  auto stopWatcher = [&] {
    {
      std::lock_guard<std::mutex> lk(mu);
      done = true;
    }
    cv.notify_all();
    watcher.join();
  };
  try {
    for (int i = 0; i < size; ++i) {
      if (i == rank) continue;
      const std::string key = std::to_string(i);
      store.wait({key}, getTimeout());
      std::vector<char> addrs = store.get(key);
      connectStartNs = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now().time_since_epoch())
                           .count();
      connecting = i;
      tc->getPair(i)->connect(extractAddress(addrs, i));
      connecting = -1;
    }
  } catch (...) {
    stopWatcher();
    if (!lost.isOk()) return lost;  // the connects failed because of it
    throw;
  }
  stopWatcher();
  if (!lost.isOk()) return lost;  // signalled after the last connect: unusable
  device_ = dev;
  // Every unbound buffer of the connected context is reachable by
  // buffers().failAll (see the header).
  transportContext_ = std::make_shared<WatchingContext>(std::move(tc), buffers_);
  return Status::ok();
}

}  // namespace hora
