// The P2pEngine test fixture (tests/unit/p2p_engine_test.cc,
// tests/unit/p2p_fastbox_test.cc): engines of one process as ranks, sharing
// a MemoryStore and a temporary directory for their inboxes; tensors whose
// bytes say who sent them; waits with deadlines.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/memory_store.h"
#include "gtest/gtest.h"
#include "ops/p2p/p2p_engine.h"
#include "ops/p2p/p2p_socket.h"
#include "runtime_fakes.h"

namespace hora {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kRingBytes = 64 << 10;
constexpr uint64_t kEagerBytes = 4 << 10;
constexpr auto kDeadline = 10s;

// Records what the engine hands back; allocates receive buffers on request.
using Sink = RecordingSink;

// Waits for a sink and returns its status (a timeout is a failure of its own).
Status waitFor(const std::shared_ptr<Sink>& s) {
  if (!s->waitDone()) return Status(Code::kTimeout, "test: the operation did not complete in 10 s");
  EXPECT_EQ(s->completions(), 1) << "completed more than once";
  return s->status();
}

// A tensor's bytes with content that says who sent it and which message.
struct Buf {
  DataType dtype;
  std::vector<int64_t> shape;
  std::vector<char> bytes;
  Buf(DataType dt, std::vector<int64_t> s, char fill = 0) : dtype(dt), shape(std::move(s)) {
    bytes.assign(static_cast<size_t>(numElements(shape)) * dataTypeSize(dt), fill);
  }
  void stamp(int from, int64_t id) {
    for (size_t i = 0; i < bytes.size(); ++i)
      bytes[i] = static_cast<char>((i * 131 + from * 17 + id * 29 + 1) & 0xff);
  }
  bool stamped(int from, int64_t id) const {
    for (size_t i = 0; i < bytes.size(); ++i)
      if (bytes[i] != static_cast<char>((i * 131 + from * 17 + id * 29 + 1) & 0xff)) return false;
    return true;
  }
  bool all(char c) const {
    for (char b : bytes)
      if (b != c) return false;
    return true;
  }
};

P2pOp sendOp(int peer, int64_t tag, Buf& b, std::shared_ptr<Sink> sink) {
  P2pOp o;
  o.kind = P2pOp::kSend;
  o.peer = peer;
  o.tag = tag;
  o.dtype = b.dtype;
  o.shape = b.shape;
  o.data = b.bytes.data();
  o.bytes = b.bytes.size();
  o.sink = std::move(sink);
  return o;
}

P2pOp recvOp(int peer, int64_t tag, Buf& b, std::shared_ptr<Sink> sink) {
  P2pOp o = sendOp(peer, tag, b, std::move(sink));
  o.kind = P2pOp::kRecv;
  return o;
}

P2pOp recvAnyShape(int peer, int64_t tag, std::shared_ptr<Sink> sink) {
  P2pOp o;
  o.kind = P2pOp::kRecv;
  o.peer = peer;
  o.tag = tag;
  o.data = nullptr;
  o.allocate = true;
  o.sink = std::move(sink);
  return o;
}

bool contains(const Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

class P2pEngineTest : public ::testing::Test {
 protected:
  // onFatal calls of one rank, waitable.
  struct Fatal {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<Status> calls;
    bool wait(std::chrono::milliseconds timeout = kDeadline) {
      std::unique_lock<std::mutex> lk(mu);
      return cv.wait_for(lk, timeout, [&] { return !calls.empty(); });
    }
    size_t count() {
      std::lock_guard<std::mutex> lk(mu);
      return calls.size();
    }
    Status first() {
      std::lock_guard<std::mutex> lk(mu);
      return calls.empty() ? Status() : calls.front();
    }
  };

  void SetUp() override {
    char tmpl[] = "/tmp/hora-p2p-engine-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    store_ = std::make_shared<MemoryStore>();
  }
  void TearDown() override {
    engines_.clear();  // shuts them down, removes their inboxes
    std::string cmd = "rm -rf '" + dir_ + "'";
    EXPECT_EQ(std::system(cmd.c_str()), 0);
  }

  P2pEngineOptions options(int rank, int size) {
    P2pEngineOptions o;
    o.setName = "test";
    o.rank = rank;
    for (int r = 0; r < size; ++r) o.globalRanks.push_back(r);
    o.store = store_;
    o.hostId = "host-a";
    o.dir = dir_;
    o.ringBytes = kRingBytes;
    o.eagerBytes = kEagerBytes;
    o.stallWarning = Seconds(0);
    o.stallShutdown = Seconds(0);
    o.logger = Logger(LogLevel::kError, "[p2p-test rank " + std::to_string(rank) + "]");
    Fatal* f = fatal_[rank].get();
    o.onFatal = [f](const Status& why) {
      {
        std::lock_guard<std::mutex> lk(f->mu);
        f->calls.push_back(why);
      }
      f->cv.notify_all();
    };
    return o;
  }
  // `size` engines, options tweaked per rank by `tweak`.
  void start(int size, const std::function<void(P2pEngineOptions&)>& tweak = nullptr) {
    for (int r = 0; r < size; ++r) fatal_.push_back(std::make_unique<Fatal>());
    for (int r = 0; r < size; ++r) {
      P2pEngineOptions o = options(r, size);
      if (tweak) tweak(o);
      engines_.push_back(std::make_unique<P2pEngine>(std::move(o)));
    }
  }
  P2pEngine& rank(int r) { return *engines_[r]; }
  Status post(int r, P2pOp op) {
    std::vector<P2pOp> ops;
    ops.push_back(std::move(op));
    return rank(r).post(std::move(ops));
  }
  // Waits until rank r has nothing pending (the engines complete before they
  // forget an operation, so this follows the sinks).
  bool drained(int r) {
    const auto until = Clock::now() + kDeadline;
    while (rank(r).pending() != 0) {
      if (Clock::now() > until) return false;
      std::this_thread::sleep_for(1ms);
    }
    return true;
  }

  std::string dir_;
  std::shared_ptr<MemoryStore> store_;
  std::vector<std::unique_ptr<Fatal>> fatal_;
  std::vector<std::unique_ptr<P2pEngine>> engines_;
};

}  // namespace
}  // namespace hora
