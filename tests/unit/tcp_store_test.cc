// TcpStoreServer / TcpStoreClient over 127.0.0.1: the Store contract,
// authentication, and resilience against malformed or hostile peers.
// Every wait uses a short timeout so a regression fails instead of hanging.
#include "core/tcp_store.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/hmac.h"
#include "tests/common/free_port.h"

namespace hora {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr char kSecret[] = "test-secret";

Logger testLogger() { return Logger(LogLevel::kWarning, "[store-test]"); }

long long elapsedMs(Clock::time_point since) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count();
}

// A port with nothing listening on it, claimed against the tests running
// beside this one (an ephemeral port bound and released could be handed to
// another socket before the test uses it).
int unusedPort() { return htest::freePort(); }

// A hand-driven peer speaking raw bytes, for the hostile-client tests. All
// reads time out after 3 s so a server bug fails the test instead of hanging.
class RawPeer {
 public:
  // `from`: the loopback address to connect from (any 127.x.y.z), else the default.
  explicit RawPeer(int port, const char* from = nullptr) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{3, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (from) {
      sockaddr_in local{};
      local.sin_family = AF_INET;
      ::inet_pton(AF_INET, from, &local.sin_addr);
      if (::bind(fd_, reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0) return;
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawPeer() { ::close(fd_); }
  bool connected() const { return connected_; }
  bool send(const std::string& bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) == ssize_t(bytes.size());
  }
  // Reads exactly n bytes; false on EOF, error or timeout.
  bool recvExact(size_t n, std::string* out) {
    out->assign(n, '\0');
    size_t got = 0;
    while (got < n) {
      ssize_t r = ::recv(fd_, &(*out)[got], n - got, 0);
      if (r <= 0) return false;
      got += size_t(r);
    }
    return true;
  }
  // True when the server closes the connection (EOF or reset) within 3 s,
  // false when it is still open (the read timed out).
  bool closedByServer() {
    char buf[4096];
    for (;;) {
      ssize_t r = ::recv(fd_, buf, sizeof(buf), 0);
      if (r == 0) return true;
      if (r < 0) return errno != EAGAIN && errno != EWOULDBLOCK;
    }
  }
  // Runs the handshake by hand; returns the server's answer opcode.
  int authenticate(const std::string& secret) {
    std::string nonce;
    if (!readChallenge(&nonce)) return -1;
    return answerChallenge(secret, nonce);
  }
  // The handshake's two halves, for a client that is slow to answer.
  bool readChallenge(std::string* nonce) {
    std::string hdr;
    return recvExact(8, &hdr) && hdr[2] == 0x01 && recvExact(32, nonce);
  }
  int answerChallenge(const std::string& secret, const std::string& nonce) {
    std::string reply;
    std::string mac = hmacSha256(secret, "hora-store-v1" + nonce);
    if (!send(header(0x02, 32) + mac)) return -1;
    if (!recvExact(8, &reply)) return -1;
    return static_cast<unsigned char>(reply[2]);
  }
  static std::string header(uint8_t op, uint32_t len, uint8_t magic = 0x68) {
    std::string h = {char(magic), 2, char(op), 0};  // version 2: little-endian
    for (int i = 0; i < 4; ++i) h.push_back(char(len >> (8 * i)));
    return h;
  }
  static std::string str(const std::string& s) {
    std::string out;
    uint32_t len = uint32_t(s.size());
    for (int i = 0; i < 4; ++i) out.push_back(char(len >> (8 * i)));
    return out + s;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

class TcpStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { startServer(kSecret); }
  void startServer(const std::string& secret, int port = 0) {
    auto s = TcpStoreServer::start("127.0.0.1", port, secret, testLogger());
    ASSERT_TRUE(s.isOk()) << s.status().toString();
    server_ = s.take();
  }
  std::shared_ptr<TcpStoreClient> connect(const std::string& secret = kSecret) {
    auto c = TcpStoreClient::connect("127.0.0.1", server_->port(), secret, 2s, testLogger());
    EXPECT_TRUE(c.isOk()) << c.status().toString();
    return c.isOk() ? c.take() : nullptr;
  }
  // A fresh client proves the server still serves after some abuse.
  void expectServerHealthy() {
    auto c = connect();
    ASSERT_NE(c, nullptr);
    ASSERT_TRUE(c->set("health", "ok").isOk());
    auto v = c->get("health", 1s);
    ASSERT_TRUE(v.isOk()) << v.status().toString();
    EXPECT_EQ(v.value(), "ok");
  }

  std::unique_ptr<TcpStoreServer> server_;
};

TEST_F(TcpStoreTest, SetGetOverwriteAndBinaryValues) {
  EXPECT_GT(server_->port(), 0);
  auto c = connect();
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->set("a", "1").isOk());
  ASSERT_TRUE(c->set("a", "2").isOk());
  std::string binary("x\0y\xff", 4);
  ASSERT_TRUE(c->set("bin", binary).isOk());
  ASSERT_TRUE(c->set("empty", "").isOk());
  std::string big(3 << 20, 'z');
  ASSERT_TRUE(c->set("big", big).isOk());
  EXPECT_EQ(c->get("a", 1s).value(), "2");
  EXPECT_EQ(c->get("bin", 1s).value(), binary);
  auto e = c->get("empty", 1s);
  ASSERT_TRUE(e.isOk());
  EXPECT_EQ(e.value(), "");
  EXPECT_EQ(c->get("big", 1s).value(), big);
  // Another client sees the same data.
  auto c2 = connect();
  ASSERT_NE(c2, nullptr);
  EXPECT_EQ(c2->get("a", 1s).value(), "2");
}

TEST_F(TcpStoreTest, GetBlocksUntilAnotherThreadSets) {
  auto reader = connect();
  auto writer = connect();
  ASSERT_TRUE(reader && writer);
  auto start = Clock::now();
  std::thread t([&] {
    std::this_thread::sleep_for(150ms);
    EXPECT_TRUE(writer->set("late", "v").isOk());
  });
  auto v = reader->get("late", 3s);
  t.join();
  ASSERT_TRUE(v.isOk()) << v.status().toString();
  EXPECT_EQ(v.value(), "v");
  EXPECT_GE(elapsedMs(start), 120);
  EXPECT_LT(elapsedMs(start), 2000);
}

// The hosting process (a launcher) writes job facts itself; a client waiting
// for the key wakes, and adds share the clients' counter.
TEST_F(TcpStoreTest, HostingProcessSetsAndAddsWakingWaiters) {
  auto c = connect();
  ASSERT_NE(c, nullptr);
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    EXPECT_TRUE(server_->set("el/live", "3").isOk());
  });
  EXPECT_EQ(c->get("el/live", 5s).value(), "3");
  setter.join();
  ASSERT_TRUE(c->add("n", 2).isOk());
  EXPECT_EQ(server_->add("n", 5).value(), 7);
  EXPECT_EQ(c->add("n", 0).value(), 7);
  EXPECT_TRUE(server_->check("n").value());
  EXPECT_FALSE(server_->check("absent").value());
  ASSERT_TRUE(c->set("text", "x").isOk());
  auto bad = server_->add("text", 1);
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("non-integer"), std::string::npos);
}

TEST_F(TcpStoreTest, GetTimeoutNamesKey) {
  auto c = connect();
  ASSERT_NE(c, nullptr);
  auto start = Clock::now();
  auto v = c->get("never-set", 200ms);
  long long ms = elapsedMs(start);
  ASSERT_FALSE(v.isOk());
  EXPECT_EQ(v.status().code(), Code::kTimeout);
  EXPECT_NE(v.status().message().find("never-set"), std::string::npos) << v.status().message();
  EXPECT_GE(ms, 150);
  EXPECT_LT(ms, 1500);
  // The connection is still usable afterwards.
  EXPECT_TRUE(c->set("after", "x").isOk());
  auto zero = c->get("never-set", 0ms);
  EXPECT_EQ(zero.status().code(), Code::kTimeout);
}

TEST_F(TcpStoreTest, BlockedGetDoesNotBlockOtherCallers) {
  auto c = connect();
  ASSERT_NE(c, nullptr);
  std::atomic<bool> got{false};
  std::thread waiter([&] {
    auto v = c->get("gate", 3s);  // same client object: must not hold the others up
    got = v.isOk();
  });
  std::this_thread::sleep_for(100ms);
  auto start = Clock::now();
  ASSERT_TRUE(c->set("other", "1").isOk());
  EXPECT_EQ(c->get("other", 1s).value(), "1");
  EXPECT_LT(elapsedMs(start), 1000);
  ASSERT_TRUE(c->set("gate", "open").isOk());
  waiter.join();
  EXPECT_TRUE(got);
}

TEST_F(TcpStoreTest, ConcurrentAddsSum) {
  auto shared = connect();
  ASSERT_NE(shared, nullptr);
  constexpr int kThreads = 8;
  constexpr int kAddsEach = 50;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Half the threads share one client, half have their own.
      auto own = (t % 2) ? connect() : shared;
      for (int i = 0; i < kAddsEach; ++i)
        if (!own || !own->add("counter", 2).isOk()) ++failures;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  auto v = shared->add("counter", -1);
  ASSERT_TRUE(v.isOk());
  EXPECT_EQ(v.value(), kThreads * kAddsEach * 2 - 1);
  EXPECT_EQ(shared->get("counter", 1s).value(), std::to_string(kThreads * kAddsEach * 2 - 1));
  // A missing key starts at 0; a non-integer value is refused and the client keeps working.
  EXPECT_EQ(shared->add("fresh", 5).value(), 5);
  ASSERT_TRUE(shared->set("text", "abc").isOk());
  auto bad = shared->add("text", 1);
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(shared->check("counter").value());
}

TEST_F(TcpStoreTest, WaitForSeveralKeys) {
  auto c = connect();
  auto w = connect();
  ASSERT_TRUE(c && w);
  std::thread setter([&] {
    for (const char* k : {"k1", "k2", "k3"}) {
      std::this_thread::sleep_for(50ms);
      EXPECT_TRUE(w->set(k, "v").isOk());
    }
  });
  Status st = c->wait({"k1", "k2", "k3"}, 3s);
  setter.join();
  EXPECT_TRUE(st.isOk()) << st.toString();
  EXPECT_TRUE(c->wait({}, 0ms).isOk());
  auto start = Clock::now();
  Status missing = c->wait({"k1", "absent-a", "absent-b"}, 200ms);
  EXPECT_EQ(missing.code(), Code::kTimeout);
  EXPECT_NE(missing.message().find("absent-a"), std::string::npos) << missing.message();
  EXPECT_NE(missing.message().find("absent-b"), std::string::npos);
  EXPECT_EQ(missing.message().find("k1"), std::string::npos);
  EXPECT_LT(elapsedMs(start), 1500);
}

TEST_F(TcpStoreTest, CheckAndRemove) {
  auto c = connect();
  ASSERT_NE(c, nullptr);
  EXPECT_FALSE(c->check("x").value());
  ASSERT_TRUE(c->set("x", "1").isOk());
  EXPECT_TRUE(c->check("x").value());
  ASSERT_TRUE(c->remove("x").isOk());
  EXPECT_FALSE(c->check("x").value());
  EXPECT_TRUE(c->remove("x").isOk());  // removing a missing key is fine
  EXPECT_EQ(c->get("x", 50ms).status().code(), Code::kTimeout);
}

TEST_F(TcpStoreTest, OversizedKeyIsRejectedLocally) {
  auto c = connect();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->set(std::string(5000, 'k'), "v").code(), Code::kInvalidArgument);
  EXPECT_TRUE(c->set("fine", "v").isOk());
}

TEST_F(TcpStoreTest, PrefixStoreOverTcp) {
  auto c = connect();
  ASSERT_NE(c, nullptr);
  PrefixStore p(c, "ps0");
  ASSERT_TRUE(p.set("addr", "h:1").isOk());
  EXPECT_EQ(c->get("ps0/addr", 1s).value(), "h:1");
}

TEST_F(TcpStoreTest, WrongSecretIsAuthErrorAndServerKeepsServing) {
  auto good = connect();
  ASSERT_NE(good, nullptr);
  ASSERT_TRUE(good->set("k", "v").isOk());
  auto start = Clock::now();
  auto bad = TcpStoreClient::connect("127.0.0.1", server_->port(), "wrong", 2s, testLogger());
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().code(), Code::kAuthError);
  EXPECT_NE(bad.status().message().find("HORA_SECRET"), std::string::npos)
      << bad.status().message();
  EXPECT_LT(elapsedMs(start), 1000);  // not retried until the timeout
  auto empty = TcpStoreClient::connect("127.0.0.1", server_->port(), "", 2s, testLogger());
  EXPECT_EQ(empty.status().code(), Code::kAuthError);
  EXPECT_EQ(good->get("k", 1s).value(), "v");
  expectServerHealthy();
}

TEST_F(TcpStoreTest, EmptySecretStillHandshakes) {
  server_.reset();
  startServer("");
  auto c = TcpStoreClient::connect("127.0.0.1", server_->port(), "", 2s, testLogger());
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_TRUE(c.value()->set("a", "b").isOk());
  auto withSecret = TcpStoreClient::connect("127.0.0.1", server_->port(), "x", 2s, testLogger());
  EXPECT_EQ(withSecret.status().code(), Code::kAuthError);
}

TEST_F(TcpStoreTest, GarbageBytesAreRejected) {
  RawPeer peer(server_->port());
  ASSERT_TRUE(peer.connected());
  ASSERT_TRUE(peer.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_TRUE(peer.closedByServer());
  expectServerHealthy();
}

TEST_F(TcpStoreTest, OversizedFrameBeforeAuthIsRejected) {
  RawPeer peer(server_->port());
  ASSERT_TRUE(peer.connected());
  ASSERT_TRUE(peer.send(RawPeer::header(0x02, 0xffffffffu)));
  EXPECT_TRUE(peer.closedByServer());
  expectServerHealthy();
}

TEST_F(TcpStoreTest, RequestBeforeAuthIsRejected) {
  RawPeer peer(server_->port());
  ASSERT_TRUE(peer.connected());
  std::string body = RawPeer::str("k") + RawPeer::str("v");
  ASSERT_TRUE(peer.send(RawPeer::header(0x10, uint32_t(body.size())) + body));
  EXPECT_TRUE(peer.closedByServer());
  expectServerHealthy();
}

TEST_F(TcpStoreTest, AuthenticatedButHostileFramesAreRejected) {
  {
    RawPeer peer(server_->port());
    ASSERT_EQ(peer.authenticate(kSecret), 0x03);
    ASSERT_TRUE(peer.send(RawPeer::header(0x10, 200u << 20)));  // 200 MiB > 64 MiB cap
    EXPECT_TRUE(peer.closedByServer());
  }
  {
    RawPeer peer(server_->port());
    ASSERT_EQ(peer.authenticate(kSecret), 0x03);
    ASSERT_TRUE(peer.send(RawPeer::header(0x7e, 0)));  // unknown opcode
    EXPECT_TRUE(peer.closedByServer());
  }
  {
    RawPeer peer(server_->port());
    ASSERT_EQ(peer.authenticate(kSecret), 0x03);
    std::string body = RawPeer::str(std::string(10000, 'k')) + RawPeer::str("v");  // key > 4 KiB
    ASSERT_TRUE(peer.send(RawPeer::header(0x10, uint32_t(body.size())) + body));
    EXPECT_TRUE(peer.closedByServer());
  }
  {
    RawPeer peer(server_->port());
    ASSERT_EQ(peer.authenticate(kSecret), 0x03);
    std::string body = "\x00\x00\x01";  // truncated string length
    ASSERT_TRUE(peer.send(RawPeer::header(0x14, uint32_t(body.size())) + body));
    EXPECT_TRUE(peer.closedByServer());
  }
  {
    RawPeer peer(server_->port());
    ASSERT_EQ(peer.authenticate("not-the-secret"), 0x22);  // error frame, then close
    EXPECT_TRUE(peer.closedByServer());
  }
  {
    // A client of the big-endian version 1 (an older hora): refused, not misread.
    RawPeer peer(server_->port());
    std::string old = {char(0x68), 1, char(0x02), 0, 0, 0, 0, 32};
    ASSERT_TRUE(peer.send(old + std::string(32, 'm')));
    EXPECT_TRUE(peer.closedByServer());
  }
  expectServerHealthy();
}

TEST_F(TcpStoreTest, WaiterThatDisconnectsIsForgotten) {
  {
    RawPeer peer(server_->port());
    ASSERT_EQ(peer.authenticate(kSecret), 0x03);
    std::string body = RawPeer::str("parked") + std::string("\0\0\0\0\0\0\x27\x10", 8);  // 10 s
    ASSERT_TRUE(peer.send(RawPeer::header(0x11, uint32_t(body.size())) + body));
    std::this_thread::sleep_for(50ms);
  }  // closes while its get is parked
  std::this_thread::sleep_for(50ms);
  auto c = connect();
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->set("parked", "now").isOk());
  expectServerHealthy();
}

TEST_F(TcpStoreTest, SilentUnauthenticatedPeerDoesNotBlockOthers) {
  RawPeer idle(server_->port());  // connects and never answers the challenge
  ASSERT_TRUE(idle.connected());
  auto start = Clock::now();
  expectServerHealthy();
  EXPECT_LT(elapsedMs(start), 1000);
}

// Issue 14: 1,024 idle connections (a port scanner, stray clients) delayed a
// late rank's start-up by ~15 s: the store refused every new connection until
// the idle ones hit their 10 s authentication deadline. Now the oldest
// unauthenticated connection makes room for the new one.
TEST_F(TcpStoreTest, FloodOfIdleConnectionsDoesNotDelayAClient) {
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  const size_t kIdle = 1100;  // past the server's 1,024 pending-authentication limit
  if (lim.rlim_cur < 2 * kIdle + 200) {
    lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, 2 * kIdle + 200);
    ::setrlimit(RLIMIT_NOFILE, &lim);
    if (lim.rlim_cur < 2 * kIdle + 200) GTEST_SKIP() << "needs " << 2 * kIdle + 200 << " fds";
  }
  // From 10 addresses, 110 each: under the per-address limit (128), so the global one acts
  // (OneAddressCannotEvictAnotherAddresssHandshake floods from one address).
  std::vector<std::unique_ptr<RawPeer>> idle;
  for (size_t i = 0; i < kIdle; ++i) {
    const std::string from = "127.0.1." + std::to_string(1 + i % 10);
    idle.push_back(std::make_unique<RawPeer>(server_->port(), from.c_str()));
    ASSERT_TRUE(idle.back()->connected()) << "idle connection " << i << " from " << from;
  }
  std::this_thread::sleep_for(200ms);  // let the server accept them all
  auto start = Clock::now();
  expectServerHealthy();
  auto ms = elapsedMs(start);
  std::printf("connect + set + get with %zu idle connections open: %lld ms\n", kIdle,
              static_cast<long long>(ms));
  EXPECT_LT(ms, 1000);
  // The newest idle connections are still served (not refused at accept):
  // each got its challenge frame.
  std::string challenge;
  EXPECT_TRUE(idle.back()->recvExact(8 + 32, &challenge));
}

// Issue 14: a flood from one address evicted other hosts' clients mid-handshake. At the global
// limit the oldest unauthenticated connection of all is dropped, and the flood's own ones are
// always newer, so a client that had its challenge but not yet answered (a slow host) lost its
// connection to 1,024 idle ones from elsewhere. Now one address is held to 128 unauthenticated
// connections, making room among its own: the slow client, from another address, answers
// after the flood and is let in.
TEST_F(TcpStoreTest, OneAddressCannotEvictAnotherAddresssHandshake) {
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  const size_t kFlood = 1100;  // past the server's 1,024 pending-authentication limit
  if (lim.rlim_cur < kFlood + 400) {
    lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, kFlood + 400);
    ::setrlimit(RLIMIT_NOFILE, &lim);
    if (lim.rlim_cur < kFlood + 400) GTEST_SKIP() << "needs " << kFlood + 400 << " fds";
  }
  RawPeer slow(server_->port(), "127.0.0.2");
  if (!slow.connected()) GTEST_SKIP() << "cannot connect from 127.0.0.2";
  std::string nonce;
  ASSERT_TRUE(slow.readChallenge(&nonce));
  std::vector<std::unique_ptr<RawPeer>> flood;
  for (size_t i = 0; i < kFlood; ++i) {
    flood.push_back(std::make_unique<RawPeer>(server_->port(), "127.0.0.1"));
    ASSERT_TRUE(flood.back()->connected()) << "flood connection " << i;
  }
  std::this_thread::sleep_for(200ms);  // let the server accept them all
  EXPECT_EQ(slow.answerChallenge(kSecret, nonce), 0x03) << "the slow client was evicted";
  // The flood made room among its own connections: its oldest are closed, its newest served.
  EXPECT_TRUE(flood.front()->closedByServer());
  std::string challenge;
  EXPECT_TRUE(flood.back()->recvExact(8 + 32, &challenge));
  // A real client from the flooding address still gets in.
  auto start = Clock::now();
  expectServerHealthy();
  EXPECT_LT(elapsedMs(start), 1000);
}

// The per-address count follows connections that authenticate or leave: after a flood is gone,
// the same address can hold as many unauthenticated connections as before.
TEST_F(TcpStoreTest, PerAddressLimitFollowsConnectionsThatAuthenticateOrLeave) {
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<std::unique_ptr<RawPeer>> peers;
    std::vector<std::string> nonces(120);
    for (size_t i = 0; i < nonces.size(); ++i) {
      peers.push_back(std::make_unique<RawPeer>(server_->port(), "127.0.0.3"));
      ASSERT_TRUE(peers.back()->readChallenge(&nonces[i])) << "connection " << i;
    }
    // Under the limit of 128 nobody is evicted; half of them authenticate, the rest leave.
    for (size_t i = 0; i < peers.size(); i += 2)
      EXPECT_EQ(peers[i]->answerChallenge(kSecret, nonces[i]), 0x03) << "connection " << i;
  }
  expectServerHealthy();
}

TEST_F(TcpStoreTest, ConnectToNothingTimesOutNamingAddress) {
  int port = unusedPort();
  auto start = Clock::now();
  auto c = TcpStoreClient::connect("127.0.0.1", port, kSecret, 400ms, testLogger());
  long long ms = elapsedMs(start);
  ASSERT_FALSE(c.isOk());
  EXPECT_EQ(c.status().code(), Code::kTimeout);
  EXPECT_NE(c.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find("HORA_STORE_ADDR"), std::string::npos);
  EXPECT_GE(ms, 350);
  EXPECT_LT(ms, 1500);
}

TEST_F(TcpStoreTest, ClientWaitsForLateServer) {
  int port = unusedPort();
  Result<std::shared_ptr<TcpStoreClient>> result{nullptr};
  std::thread t(
      [&] { result = TcpStoreClient::connect("127.0.0.1", port, kSecret, 3s, testLogger()); });
  std::this_thread::sleep_for(300ms);
  auto late = TcpStoreServer::start("127.0.0.1", port, kSecret, testLogger());
  ASSERT_TRUE(late.isOk()) << late.status().toString();
  t.join();
  ASSERT_TRUE(result.isOk()) << result.status().toString();
  EXPECT_TRUE(result.value()->set("k", "v").isOk());
}

TEST_F(TcpStoreTest, ServerShutdownFailsCallsInsteadOfHanging) {
  auto c = TcpStoreClient::connect("127.0.0.1", server_->port(), kSecret, 500ms, testLogger());
  ASSERT_TRUE(c.isOk());
  auto client = c.take();
  ASSERT_TRUE(client->set("k", "v").isOk());
  Status blocked;
  auto start = Clock::now();
  std::atomic<bool> asking{false};
  std::thread getter([&] {
    asking = true;
    blocked = client->get("never", 10s).status();
  });
  while (!asking) std::this_thread::yield();
  std::this_thread::sleep_for(300ms);
  server_.reset();  // stops while a get is parked on it
  getter.join();
  EXPECT_FALSE(blocked.isOk());
  // Parked: the server's going is a remote error. A getter the machine
  // scheduled too late for that finds no server (a system error): either
  // way it fails at once instead of waiting out its 10 s.
  EXPECT_TRUE(blocked.code() == Code::kRemoteError || blocked.code() == Code::kSystemError)
      << blocked.toString();
  EXPECT_NE(blocked.message().find("127.0.0.1:"), std::string::npos) << blocked.message();
  EXPECT_LT(elapsedMs(start), 2000);
  // Later calls fail too (reconnect refused), within about the connect timeout.
  auto again = Clock::now();
  Status st = client->set("k", "v2");
  EXPECT_FALSE(st.isOk());
  EXPECT_TRUE(st.code() == Code::kRemoteError || st.code() == Code::kSystemError) << st.toString();
  EXPECT_LT(elapsedMs(again), 2000);
}

TEST(TcpStoreStartTest, BadArguments) {
  EXPECT_EQ(TcpStoreServer::start("127.0.0.1", 70000, "", testLogger()).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(TcpStoreClient::connect("127.0.0.1", 0, "", 100ms, testLogger()).status().code(),
            Code::kInvalidArgument);
  auto first = TcpStoreServer::start("127.0.0.1", 0, "s", testLogger());
  ASSERT_TRUE(first.isOk());
  auto second = TcpStoreServer::start("127.0.0.1", first.value()->port(), "s", testLogger());
  EXPECT_FALSE(second.isOk());  // address in use: an error, not a crash
}

}  // namespace
}  // namespace hora
