// TcpRingBackend (ops/tcp/tcp_ring.h): connecting the ring (and, for a
// set's data plane, the mesh beside it), and the wrapper that puts a set's
// collectives on it when every rank agrees.
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>

#include "core/hmac.h"
#include "core/host_identity.h"
#include "ops/p2p/p2p_socket.h"
#include "ops/tcp/tcp_ring.h"
#include "ops/tcp/tcp_ring_internal.h"

namespace hora {

using namespace tcp_ring_detail;  // NOLINT: this ring's own helpers

namespace {

// A rank's entry in the store: "<host>\n<port>\n<token>".
struct Entry {
  std::string host, port, token;
  std::string address() const { return host + ":" + port; }
};
Entry parseEntry(const std::string& text) {
  std::istringstream is(text);
  Entry e;
  std::getline(is, e.host);
  std::getline(is, e.port);
  std::getline(is, e.token);
  return e;
}

}  // namespace

// ------------------------------------------------------------ set-up

Result<std::unique_ptr<Backend>> createTcpRingBackend(std::shared_ptr<Store> store, int rank,
                                                      int size, const TcpRingOptions& opts) {
  if (size < 1 || rank < 0 || rank >= size)
    return invalidArgument("tcp ring: rank " + std::to_string(rank) + " of " +
                           std::to_string(size));
  std::unique_ptr<TcpRingBackend> b(new TcpRingBackend(rank, size, opts));
  if (b->abortFd_ < 0)
    return systemError(std::string("tcp ring: eventfd: ") + std::strerror(errno));
  if (size == 1) return std::unique_ptr<Backend>(std::move(b));
  const auto deadline = Clock::now() + opts.startTimeout;
  auto left = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  };
  const int next = (rank + 1) % size, prev = (rank - 1 + size) % size;
  std::string host = opts.host;
  if (!opts.iface.empty()) {
    std::map<std::string, std::string> interfaces;
    ipv4Interfaces(&interfaces);
    const auto it = interfaces.find(opts.iface);
    host = it == interfaces.end() ? std::string() : it->second;
    if (host.empty())
      return invalidArgument("tcp ring: interface \"" + opts.iface +
                             "\" (HORA_GLOO_IFACE) has no IPv4 address on this host");
  }
  int port = 0;
  auto lfd = p2pListen(host, &port);
  if (!lfd.isOk()) return lfd.status().withContext("tcp ring");
  const int listenFd = lfd.value();
  struct Closer {
    int fd;
    ~Closer() { p2pClose(fd); }
  } closeListen{listenFd};
  const std::string token = randomHex(31);
  Status s =
      store->set("tcp/" + std::to_string(rank), host + "\n" + std::to_string(port) + "\n" + token);
  if (!s.isOk()) return s.withContext("tcp ring: publishing this rank's address");

  // Who connects to whom: this rank to rank + 1 (the ring), and with the
  // mesh the lower rank of every pair that are not ring neighbours to the
  // higher. Each connection is told apart by the hello's rank: rank - 1 is
  // always the ring's, any other rank the mesh's.
  auto adjacent = [&](int a, int c) { return (a + 1) % size == c || (c + 1) % size == a; };
  std::vector<int> connectTo = {next}, acceptFrom = {prev};
  for (int q = 0; q < size && opts.mesh; ++q) {
    if (q == rank || adjacent(rank, q)) continue;
    (q > rank ? connectTo : acceptFrom).push_back(q);
  }
  b->meshFd_.assign(size, -1);
  b->addr_.assign(size, std::string());
  for (int q : connectTo) {
    auto v = store->get("tcp/" + std::to_string(q), std::max(left(), std::chrono::milliseconds(1)));
    if (!v.isOk())
      return v.status().withContext("tcp ring: waiting for " + rankName(opts, q) + "'s address");
    const Entry them = parseEntry(v.value());
    b->addr_[q] = them.address();
    P2pHello hello{};
    hello.magic = kP2pHelloMagic;
    hello.rank = rank;
    std::snprintf(hello.token, sizeof hello.token, "%s", them.token.c_str());
    auto c = p2pConnect(them.host, std::atoi(them.port.c_str()), hello, toMs(left()));
    if (!c.isOk()) return c.status().withContext("tcp ring: connecting to " + b->peerName(q));
    (q == next ? b->sendFd_ : b->meshFd_[q]) = c.value();
  }

  // Accept the others: only connections that present this rank's token,
  // from a rank that is expected and not yet connected.
  auto socketOf = [&](int q) -> int& { return q == prev ? b->recvFd_ : b->meshFd_[q]; };
  auto waitingFor = [&]() {
    for (int q : acceptFrom)
      if (socketOf(q) < 0) return q;
    return -1;
  };
  for (int missing = waitingFor(); missing >= 0; missing = waitingFor()) {
    if (left().count() <= 0)
      return Status(Code::kTimeout, "tcp ring: " + rankName(opts, missing) +
                                        " did not connect within " + seconds(opts.startTimeout) +
                                        " (HORA_START_TIMEOUT_S)");
    if (opts.setUpWatch) {
      Status w = opts.setUpWatch();
      if (!w.isOk())
        return w.withContext("tcp ring: waiting for " + rankName(opts, missing) + " to connect");
    }
    struct pollfd pf {
      listenFd, POLLIN, 0
    };
    (void)::poll(&pf, 1, std::min(toMs(left()), 100));
    P2pHello in{};
    auto a = p2pAccept(listenFd, &in, std::min(toMs(left()), 5000));
    if (!a.isOk() && a.status().code() == Code::kSystemError)
      return a.status().withContext("tcp ring: accepting " + rankName(opts, missing));
    if (!a.isOk() || a.value() < 0) continue;  // nothing pending, or no hello: keep waiting
    in.token[sizeof in.token - 1] = 0;
    const bool expected =
        std::find(acceptFrom.begin(), acceptFrom.end(), in.rank) != acceptFrom.end() &&
        socketOf(in.rank) < 0;
    if (in.magic != kP2pHelloMagic || !expected || token != in.token) {
      p2pClose(a.value());  // a stranger, or a rank that does not connect here
      continue;
    }
    socketOf(in.rank) = a.value();
  }
  for (int q : acceptFrom) {
    auto pv = store->get("tcp/" + std::to_string(q), std::chrono::milliseconds(1));
    if (pv.isOk()) b->addr_[q] = parseEntry(pv.value()).address();
  }
  return std::unique_ptr<Backend>(std::move(b));
}

Result<std::unique_ptr<Backend>> withTcpRing(std::shared_ptr<Store> store, int rank, int size,
                                             const std::string& refusal, const TcpRingOptions& opts,
                                             std::unique_ptr<Backend> rest, std::string* whyNot) {
  whyNot->clear();
  const std::string mine = refusal.empty() ? "tcp" : "no " + refusal;
  auto all = exchangeValues(*store, "want", rank, allRanks(size), mine, opts.startTimeout,
                            "tcp ring: every rank's choice");
  if (!all.isOk()) return all.status();
  for (int r = 0; r < size && whyNot->empty(); ++r)
    if (r != rank && all.value()[r] != "tcp")
      *whyNot = rankName(opts, r) + " keeps Gloo (" +
                all.value()[r].substr(std::min<size_t>(3, all.value()[r].size())) + ")";
  if (!refusal.empty()) *whyNot = refusal;
  if (!whyNot->empty()) return rest;
  TcpRingOptions meshed = opts;
  meshed.mesh = true;  // alltoall too
  auto ring = createTcpRingBackend(store, rank, size, meshed);
  if (!ring.isOk()) return ring.status().withContext("tcp ring");
  return std::unique_ptr<Backend>(new RingPlaneBackend(ring.take(), std::move(rest)));
}

}  // namespace hora
