// GlooMesh (ops/gloo/gloo_mesh.h) with two ranks as threads: a normal
// connect, and the transfers Gloo's own pair signal cannot wake (a receive
// partly read, a send partly written), which AbortableBuffers::failAll must.
#include "ops/gloo/gloo_mesh.h"

#include <gloo/common/error.h>
#include <gloo/transport/tcp/device.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/memory_store.h"
#include "core/store.h"
#include "ops/gloo/gloo_store_adapter.h"

namespace hora {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Two connected MeshContexts over loopback, `timeout` on every wait.
std::vector<std::shared_ptr<MeshContext>> connectTwo(milliseconds timeout) {
  // As createGlooBackend does: Gloo writes to sockets a failed peer closed.
  ::signal(SIGPIPE, SIG_IGN);
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::shared_ptr<MeshContext>> ctx(2);
  std::vector<Status> st(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      GlooStoreAdapter adapter(std::make_shared<PrefixStore>(store, "mesh"), timeout);
      gloo::transport::tcp::attr attr;
      attr.hostname = "127.0.0.1";
      auto device = gloo::transport::tcp::CreateDevice(attr);
      auto c = std::make_shared<MeshContext>(r, 2);
      c->setTimeout(timeout);
      st[r] = c->connectMesh(adapter, device, {});
      ctx[r] = c;
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(st[r].isOk()) << st[r].toString();
  return ctx;
}

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

TEST(GlooMesh, ConnectedContextsMoveData) {
  auto ctx = connectTwo(milliseconds(5000));
  std::vector<int32_t> a(1000, 7), b(1000, 0);
  auto out = ctx[0]->createUnboundBuffer(a.data(), a.size() * sizeof(int32_t));
  auto in = ctx[1]->createUnboundBuffer(b.data(), b.size() * sizeof(int32_t));
  in->recv(0, 1);
  out->send(1, 1);
  EXPECT_TRUE(out->waitSend());
  EXPECT_TRUE(in->waitRecv());
  EXPECT_EQ(b, a);
}

// Rank 1 streams a large message to rank 0; rank 0's pair is failed mid-way
// (as when the peer's connection breaks). Gloo wakes neither the receive
// being read nor the send being written: both would wait for the 20 s
// timeout. failAll on each side must end both waits at once.
TEST(GlooMesh, FailAllWakesTransfersThePairSignalMisses) {
  auto ctx = connectTwo(milliseconds(20000));
  const size_t bytes = size_t(256) << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  auto out = ctx[1]->createUnboundBuffer(src.data(), bytes);
  auto in = ctx[0]->createUnboundBuffer(dst.data(), bytes);
  in->recv(1, 3);
  out->send(0, 3);

  std::atomic<bool> sendEnded{false};
  double sendAfterFail = -1;
  Clock::time_point failedAt[2], cutAt;
  std::thread sender([&] {
    try {
      out->waitSend();
    } catch (const gloo::IoException&) {
    }
    sendEnded = true;
  });
  std::thread cutter([&] {
    // Mid-transfer: 256 MiB take well over 20 ms on loopback.
    std::this_thread::sleep_for(milliseconds(20));
    cutAt = Clock::now();  // when it really happened (a loaded machine wakes late)
    signalPair(ctx[0]->getPair(1).get(), "test: the connection broke");
    std::this_thread::sleep_for(milliseconds(300));
    failedAt[0] = Clock::now();
    ctx[0]->sharedBuffers()->failAll("test: rank 0 aborted");
    std::this_thread::sleep_for(milliseconds(300));
    failedAt[1] = Clock::now();
    ctx[1]->sharedBuffers()->failAll("test: rank 1 aborted");
  });
  const auto t0 = Clock::now();
  std::string why;
  bool threw = false;
  try {
    in->waitRecv();
  } catch (const gloo::IoException& e) {
    threw = true;
    why = e.what();
  }
  const auto recvEnded = Clock::now();
  cutter.join();
  sender.join();
  sendAfterFail = secondsSince(failedAt[1]);
  if (!threw) {
    // Only a machine that streams 256 MiB before the cut gets here.
    EXPECT_LT(recvEnded, cutAt + milliseconds(50)) << "a receive that was cut completed";
    std::printf("note: the transfer finished before the cut; nothing to wake\n");
  }
  EXPECT_LT(std::chrono::duration<double>(recvEnded - t0).count(), 3.0)
      << "the receive waited for the timeout: " << why;
  EXPECT_TRUE(sendEnded.load());
  // Measured from the end of the test: the sender ended no later than that.
  EXPECT_LT(sendAfterFail, 3.0);
  if (recvEnded < failedAt[0])
    std::printf("note: the receive ended on the pair's own signal (not cut mid-payload)\n");
}

// A buffer created after failAll fails at once: a collective that starts
// after the abort cannot wait either.
TEST(GlooMesh, ABufferCreatedAfterFailAllFailsAtOnce) {
  auto ctx = connectTwo(milliseconds(20000));
  ctx[0]->sharedBuffers()->failAll("test: aborted");
  std::vector<char> buf(16);
  auto in = ctx[0]->createUnboundBuffer(buf.data(), buf.size());
  const auto t0 = Clock::now();
  bool threw = false;
  try {
    in->recv(1, 5);
    in->waitRecv();
  } catch (const gloo::IoException& e) {
    threw = true;
    EXPECT_NE(std::string(e.what()).find("test: aborted"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(threw);
  EXPECT_LT(secondsSince(t0), 1.0);
}

}  // namespace
}  // namespace hora
