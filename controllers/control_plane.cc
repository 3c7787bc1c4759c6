#include "controllers/control_plane.h"

#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/hmac.h"
#include "core/wire.h"

namespace hora {

namespace asio = boost::asio;
using asio::ip::tcp;
using SteadyClock = std::chrono::steady_clock;

namespace {
constexpr uint32_t kMaxFrameBytes = kMaxControlFrameBytes;
constexpr char kHelloMagic[] = "hora-ctrl-v1";

std::string frame(FrameType type, const std::string& payload) {
  std::string f(5, '\0');
  uint32_t len = static_cast<uint32_t>(payload.size() + 1);
  std::memcpy(&f[0], &len, 4);
  f[4] = static_cast<char>(type);
  f += payload;
  return f;
}

Result<tcp::endpoint> resolve(asio::io_context& io, const std::string& host, int port) {
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(host, ec);
  if (!ec) return tcp::endpoint(addr, static_cast<unsigned short>(port));
  tcp::resolver resolver(io);
  auto results = resolver.resolve(tcp::v4(), host, std::to_string(port), ec);
  if (ec || results.empty())
    return systemError("cannot resolve host '" + host + "': " + ec.message() +
                       " (set HORA_HOSTNAME to an address the other ranks can reach)");
  return results.begin()->endpoint();
}

// Runs handlers on this thread until done() or the deadline.
bool runUntil(asio::io_context& io, const std::function<bool()>& done,
              SteadyClock::time_point deadline) {
  while (!done()) {
    auto now = SteadyClock::now();
    if (now >= deadline) return false;
    io.restart();
    io.run_for(std::min<std::chrono::nanoseconds>(deadline - now, std::chrono::milliseconds(50)));
  }
  return true;
}
}  // namespace

Status parseFrameHeader(const char hdr[5], uint32_t* payloadLen, FrameType* type) {
  uint32_t len = 0;
  std::memcpy(&len, hdr, 4);
  uint8_t t = static_cast<uint8_t>(hdr[4]);
  if (len < 1 || len > kMaxFrameBytes || t < 1 || t > static_cast<uint8_t>(FrameType::kDoorbell))
    return protocolError("type " + std::to_string(t) + ", length " + std::to_string(len) +
                         ": is a different program or hora version talking to this port?");
  *payloadLen = len - 1;
  *type = static_cast<FrameType>(t);
  return Status::ok();
}

Status parseHello(const std::string& payload, Hello* out) {
  ByteReader rd(payload);
  HORA_RETURN_IF_ERROR(rd.str(&out->magic, "magic", 64));
  HORA_RETURN_IF_ERROR(rd.i32(&out->rank, "rank"));
  HORA_RETURN_IF_ERROR(rd.str(&out->token, "token", 256));
  return Status::ok();
}

const char* frameTypeName(FrameType t) {
  switch (t) {
    case FrameType::kHello:
      return "hello";
    case FrameType::kWelcome:
      return "welcome";
    case FrameType::kRequests:
      return "requests";
    case FrameType::kResponses:
      return "responses";
    case FrameType::kNack:
      return "nack";
    case FrameType::kHeartbeat:
      return "heartbeat";
    case FrameType::kAbort:
      return "abort";
    case FrameType::kGoodbye:
      return "goodbye";
    case FrameType::kDoorbell:
      return "doorbell";
  }
  return "unknown";
}

struct ControlPlane::Peer {
  explicit Peer(asio::io_context& io) : sock(io) {}
  int rank = -1;
  tcp::socket sock;
  std::string addr;
  std::deque<std::string> outq;
  size_t outOff = 0;  // bytes of outq.front() already written
  // TCP frames that wait until the lane has written what was sent before
  // them (the lane is a stream of its own: a frame must not overtake it).
  std::deque<std::pair<FrameType, std::string>> afterLane;
  bool writing = false;
  // Non-blocking since start(): flush() writes what the kernel takes at once
  // itself (the handshake before it uses blocking reads and writes).
  bool direct = false;
  bool lost = false;
  bool saidGoodbye = false;
  char hdr[5];
  std::string body;
  SteadyClock::time_point lastHeard = SteadyClock::now();
  // Bytes from this peer waiting unread (socket and lane) when markAlive()
  // last looked; a change there counts as hearing from it.
  uint64_t unreadSeen = 0;
};

ControlPlane::ControlPlane(ControlPlaneOptions options, Logger logger)
    : opts_(std::move(options)), logger_(std::move(logger)), timer_(io_) {}

ControlPlane::~ControlPlane() {
  boost::system::error_code ec;
  for (auto& p : peers_)
    if (p) p->sock.close(ec);
}

std::string ControlPlane::peerName(int peer) const {
  int global = peer < static_cast<int>(opts_.globalRanks.size()) ? opts_.globalRanks[peer] : peer;
  std::string s = "rank " + std::to_string(global);
  if (global >= 0 && global < static_cast<int>(opts_.workerIds.size()))
    s += " (worker " + opts_.workerIds[global] + ")";
  if (opts_.setName != "global")
    s += " (rank " + std::to_string(peer) + " of set " + opts_.setName + ")";
  if (peer >= 0 && peer < static_cast<int>(peers_.size()) && peers_[peer] &&
      !peers_[peer]->addr.empty())
    s += " at " + peers_[peer]->addr;
  return s;
}

Result<std::unique_ptr<ControlPlane>> ControlPlane::create(std::shared_ptr<Store> store,
                                                           ControlPlaneOptions options,
                                                           Logger logger) {
  std::unique_ptr<ControlPlane> cp(new ControlPlane(std::move(options), std::move(logger)));
  if (cp->opts_.size > 1) {
    Status s =
        cp->isCoordinator() ? cp->rendezvousCoordinator(*store) : cp->rendezvousWorker(*store);
    if (!s.isOk()) return s;
    // Run whether or not this rank wants the lane: the set decides together
    // (a rank with the lane off among ranks with it on would leave them
    // waiting for its answer), and every rank learns its kernel mates either
    // way. Its store waits end at once, naming the rank, when a peer's
    // control connection closes meanwhile (core/store.h); the event loop
    // does not run yet, so peeking at the connections races with nothing.
    ControlPlane* raw = cp.get();
    WatchedStore watched(
        store, [raw] { return raw->peersStillConnected(); },
        std::make_shared<std::atomic<bool>>(true));
    HORA_RETURN_IF_ERROR(cp->setUpLane(watched));
  }
  return cp;
}

Status ControlPlane::rendezvousCoordinator(Store& store) {
  auto ep = resolve(io_, opts_.hostname, 0);
  if (!ep.isOk()) return ep.status();
  tcp::acceptor acceptor(io_);
  boost::system::error_code ec;
  acceptor.open(ep.value().protocol(), ec);
  if (!ec) acceptor.bind(ep.value(), ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    return systemError("coordinator of set " + opts_.setName + " cannot listen on " +
                       opts_.hostname + ": " + ec.message() +
                       " (set HORA_HOSTNAME to a local address other ranks can reach)");
  // Handlers may still be pending when rendezvous ends (a stray client
  // mid-hello), so everything they touch lives in shared state, not on this stack.
  struct State {
    std::string token;
    int connected = 0;
    std::vector<std::shared_ptr<Peer>> accepted;
    std::function<void()> acceptNext;
    bool open = true;
  };
  auto st = std::make_shared<State>();
  st->token = randomHex(32);
  int port = acceptor.local_endpoint().port();
  HORA_RETURN_IF_ERROR(
      store.set("ctrl", opts_.hostname + " " + std::to_string(port) + " " + st->token));

  peers_.assign(opts_.size, nullptr);
  std::weak_ptr<State> weak = st;
  st->acceptNext = [this, &acceptor, weak]() {
    auto stl = weak.lock();
    if (!stl || !stl->open) return;
    auto p = std::make_shared<Peer>(io_);
    stl->accepted.push_back(p);
    acceptor.async_accept(p->sock, [this, weak, p](boost::system::error_code aec) {
      auto st2 = weak.lock();
      if (aec || !st2 || !st2->open) return;
      boost::system::error_code e2;
      auto remote = p->sock.remote_endpoint(e2);
      p->addr = e2 ? "?" : remote.address().to_string() + ":" + std::to_string(remote.port());
      p->sock.set_option(tcp::no_delay(true), e2);
      st2->acceptNext();
      // Hello: u32 len, u8 type, then magic, i32 rank, token.
      asio::async_read(
          p->sock, asio::buffer(p->hdr, 5), [this, weak, p](boost::system::error_code rec, size_t) {
            auto st3 = weak.lock();
            if (!st3 || !st3->open) return;
            uint32_t len = 0;
            std::memcpy(&len, p->hdr, 4);
            if (rec || static_cast<FrameType>(p->hdr[4]) != FrameType::kHello || len < 2 ||
                len > 4096) {
              HORA_LOG(logger_, kWarning)
                  << "control plane of set " << opts_.setName << ": rejected connection from "
                  << p->addr << ": not a hora hello (stray client or port scan?)";
              return;
            }
            p->body.resize(len - 1);
            asio::async_read(p->sock, asio::buffer(&p->body[0], len - 1),
                             [this, weak, p](boost::system::error_code rec2, size_t) {
                               auto st4 = weak.lock();
                               if (rec2 || !st4 || !st4->open) return;
                               Hello hello;
                               Status s = parseHello(p->body, &hello);
                               const std::string& tok = hello.token;
                               int32_t rank = hello.rank;
                               std::string why;
                               if (!s.isOk() || hello.magic != kHelloMagic)
                                 why = "malformed hello";
                               else if (tok != st4->token)
                                 why = "wrong session token";
                               else if (rank <= 0 || rank >= opts_.size)
                                 why = "rank " + std::to_string(rank) + " out of range";
                               else if (peers_[rank])
                                 why = "rank " + std::to_string(rank) + " connected twice";
                               if (!why.empty()) {
                                 HORA_LOG(logger_, kWarning)
                                     << "control plane of set " << opts_.setName
                                     << ": rejected connection from " << p->addr << ": " << why;
                                 boost::system::error_code ce;
                                 p->sock.close(ce);
                                 return;
                               }
                               p->rank = rank;
                               peers_[rank] = p;
                               ++st4->connected;
                             });
          });
    });
  };
  st->acceptNext();
  auto deadline = SteadyClock::now() + opts_.startTimeout;
  bool ok = runUntil(
      io_, [&] { return st->connected == opts_.size - 1; }, deadline);
  st->open = false;
  acceptor.close(ec);
  // Close every accepted socket that did not become a peer, so no handler
  // of the rendezvous stays pending on the control thread later.
  for (auto& p : st->accepted)
    if (p->rank < 0 || peers_[p->rank] != p) p->sock.close(ec);
  io_.restart();
  io_.poll();
  st->acceptNext = nullptr;
  if (!ok) {
    std::string missing;
    for (int r = 1; r < opts_.size; ++r)
      if (!peers_[r])
        missing += (missing.empty() ? "" : ",") +
                   std::to_string(opts_.globalRanks.empty() ? r : opts_.globalRanks[r]);
    return timeoutError(
        "process set " + opts_.setName + ": ranks " + missing +
        " did not connect to the coordinator within " +
        std::to_string(opts_.startTimeout.count() / 1000) +
        " s (HORA_START_TIMEOUT_S): were they started, with the same HORA_SIZE and store?");
  }
  for (int r = 1; r < opts_.size; ++r) {
    std::string f = frame(FrameType::kWelcome, "");
    asio::write(peers_[r]->sock, asio::buffer(f), ec);
    if (ec) return systemError("cannot welcome " + peerName(r) + ": " + ec.message());
  }
  return Status::ok();
}

Status ControlPlane::rendezvousWorker(Store& store) {
  auto value = store.get("ctrl", opts_.startTimeout);
  if (!value.isOk())
    return value.status().withContext("process set " + opts_.setName +
                                      ": waiting for the coordinator's address");
  std::istringstream is(value.value());
  std::string host, token;
  int port = 0;
  is >> host >> port >> token;
  if (host.empty() || port <= 0 || token.empty())
    return protocolError("malformed coordinator address in store: '" + value.value() + "'");
  auto ep = resolve(io_, host, port);
  if (!ep.isOk()) return ep.status();
  auto p = std::make_shared<Peer>(io_);
  p->rank = 0;
  p->addr = host + ":" + std::to_string(port);
  peers_.assign(1, p);
  auto deadline = SteadyClock::now() + opts_.startTimeout;
  boost::system::error_code ec;
  for (;;) {
    bool finished = false;
    p->sock.async_connect(ep.value(), [&](boost::system::error_code cec) {
      ec = cec;
      finished = true;
    });
    if (!runUntil(
            io_, [&] { return finished; }, deadline)) {
      p->sock.close(ec);
      io_.restart();
      io_.poll();
      return timeoutError("could not connect to the coordinator of set " + opts_.setName + " at " +
                          p->addr + " within the start timeout");
    }
    if (!ec) break;
    const std::string why = ec.message();  // close() below overwrites ec
    p->sock.close(ec);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (SteadyClock::now() >= deadline)
      return timeoutError("could not connect to the coordinator of set " + opts_.setName + " at " +
                          p->addr + ": " + why);
  }
  p->sock.set_option(tcp::no_delay(true), ec);
  ByteWriter w;
  w.str(kHelloMagic);
  w.i32(opts_.rank);
  w.str(token);
  std::string f = frame(FrameType::kHello, w.take());
  asio::write(p->sock, asio::buffer(f), ec);
  if (ec)
    return systemError("cannot say hello to the coordinator at " + p->addr + ": " + ec.message());
  bool got = false;
  boost::system::error_code rec;
  asio::async_read(p->sock, asio::buffer(p->hdr, 5), [&](boost::system::error_code e, size_t) {
    rec = e;
    got = true;
  });
  if (!runUntil(
          io_, [&] { return got; }, deadline)) {
    p->sock.close(ec);
    io_.restart();
    io_.poll();
    return timeoutError("the coordinator of set " + opts_.setName + " at " + p->addr +
                        " did not welcome rank " + std::to_string(opts_.rank) +
                        " before the start timeout (are other ranks missing?)");
  }
  if (rec || static_cast<FrameType>(p->hdr[4]) != FrameType::kWelcome)
    return protocolError("the coordinator at " + p->addr + " refused rank " +
                         std::to_string(opts_.rank) + (rec ? ": " + rec.message() : ""));
  return Status::ok();
}

void ControlPlane::start(ControlPlaneCallbacks callbacks) {
  cb_ = std::move(callbacks);
  io_.restart();
  work_ = std::make_unique<asio::executor_work_guard<asio::io_context::executor_type>>(
      io_.get_executor());
  for (auto& p : peers_)
    if (p) {
      p->lastHeard = SteadyClock::now();
      boost::system::error_code ec;
      p->sock.non_blocking(true, ec);
      p->direct = !ec;
      readHeader(p);
    }
  if (opts_.size > 1) tick();
}

void ControlPlane::run() {
  if (lane_)
    runWithLane();
  else
    runWithoutLane();
}

void ControlPlane::stop() {
  asio::post(io_, locked([this] {
               boost::system::error_code ec;
               timer_.cancel();
               for (auto& p : peers_)
                 if (p) p->sock.close(ec);
               work_.reset();
               io_.stop();
               // Run by a driver's poll while the control thread sleeps.
               wakeParked();
             }));
}

void ControlPlane::readExactly(const std::shared_ptr<Peer>& p, char* data, size_t n,
                               std::function<void(boost::system::error_code)> done) {
  if (n == 0) return done(boost::system::error_code());
  p->sock.async_read_some(asio::buffer(data, n),
                          locked([this, p, data, n, done = std::move(done)](
                                     boost::system::error_code ec, size_t got) mutable {
                            if (ec || got >= n) return done(ec);
                            readExactly(p, data + got, n - got, std::move(done));
                          }));
}

void ControlPlane::readHeader(std::shared_ptr<Peer> p) {
  readExactly(p, p->hdr, 5, [this, p](boost::system::error_code ec) {
    if (p->lost) return;
    if (ec) {
      lose(p, Status(Code::kRemoteError, peerName(p->rank) + " closed its control connection (" +
                                             ec.message() +
                                             "): the process exited, crashed or was killed"));
      return;
    }
    uint32_t len = 0;
    FrameType type;
    Status s = parseFrameHeader(p->hdr, &len, &type);
    if (!s.isOk()) {
      lose(p, s.withContext("malformed control frame from " + peerName(p->rank)));
      return;
    }
    readBody(p, len);
  });
}

void ControlPlane::readBody(std::shared_ptr<Peer> p, uint32_t len) {
  p->body.resize(len);
  readExactly(p, len ? &p->body[0] : nullptr, len, [this, p](boost::system::error_code ec) {
    if (p->lost) return;
    if (ec) {
      lose(p, Status(Code::kRemoteError, peerName(p->rank) +
                                             " closed its control connection mid-message (" +
                                             ec.message() + ")"));
      return;
    }
    p->lastHeard = SteadyClock::now();
    p->unreadSeen = 0;
    auto type = static_cast<FrameType>(p->hdr[4]);
    // What the peer put in the lane before this frame comes first.
    if (lane_) pollLane();
    if (p->lost) return;
    if (type == FrameType::kGoodbye) {
      // Keep reading: the connection's close is what ends the set (see
      // closeGracefully); the goodbye only says new work cannot include it.
      if (!p->saidGoodbye) {
        p->saidGoodbye = true;
        if (!closing_ && cb_.onPeerLost)
          cb_.onPeerLost(
              isCoordinator() ? p->rank : 0,
              Status(Code::kShutDown, peerName(p->rank) + " has shut down (called hora_shutdown)"));
        updateDone();
      }
    } else if (type != FrameType::kHeartbeat && type != FrameType::kDoorbell && cb_.onFrame) {
      std::string payload = std::move(p->body);
      p->body.clear();
      cb_.onFrame(isCoordinator() ? p->rank : 0, type, std::move(payload));
    }
    if (!p->lost) readHeader(p);
  });
}

void ControlPlane::updateDone() {
  bool done = true;
  for (auto& p : peers_)
    if (p && !p->lost && !(isCoordinator() && p->saidGoodbye)) done = false;
  if (done && closing_ && isCoordinator()) {
    // Every worker is finished: closing now tells them the set is over.
    boost::system::error_code ec;
    for (auto& p : peers_)
      if (p && !p->lost) {
        p->lost = true;
        p->sock.close(ec);
      }
  }
  peersDone_ = done;
}

namespace {
// About what ringing costs the writer (a write(2) on a loopback socket on
// this machine): polling that long for the reader first costs no more.
constexpr std::chrono::nanoseconds kRingGrace(2000);
}  // namespace

void ControlPlane::send(int peer, FrameType type, std::string payload) {
  if (peer < 0 || peer >= static_cast<int>(peers_.size())) return;
  auto& p = peers_[isCoordinator() ? peer : 0];
  if (!p || p->lost) return;
  const int lanePeer = isCoordinator() ? peer : 0;
  if (lane_ && isNegotiationFrame(type)) {
    // A ring is a system call here and a wake-up there; a peer about to
    // poll (its framework thread entering hora) is worth that long a look.
    if (lane_->send(lanePeer, type, payload) && !lane_->readerWithin(lanePeer, kRingGrace)) {
      sendFrame(p, FrameType::kDoorbell, "");
    }
    return;
  }
  if (lane_ && (!p->afterLane.empty() || lane_->hasPendingFor(lanePeer))) {
    p->afterLane.emplace_back(type, std::move(payload));
    return;
  }
  sendFrame(p, type, payload);
}

void ControlPlane::sendFrame(const std::shared_ptr<Peer>& p, FrameType type,
                             const std::string& payload) {
  p->outq.push_back(frame(type, payload));
  if (!p->writing) flush(p);
}

void ControlPlane::broadcast(FrameType type, const std::string& payload) {
  for (int r = 1; r < static_cast<int>(peers_.size()); ++r) send(r, type, payload);
}

bool ControlPlane::laneFlushed() const {
  if (!lane_ || lane_->hasPending()) return false;
  // Nor anything queued on a socket: a doorbell for a peer asleep in its
  // event loop would wait there until this thread is back. flush() writes
  // what the kernel takes at once, so a frame still queued is one the
  // kernel refused (a full socket).
  for (const auto& p : peers_)
    if (p && !p->lost && (!p->afterLane.empty() || !p->outq.empty())) return false;
  return true;
}

namespace {

// An abort frame's payload starts with its status code (encodeAbort). A
// coordinator also sends one after a peer's goodbye (kShutDown): the set is
// ending, not failing, and a rank still setting it up goes on as before.
// A code not yet fully received is not taken for a failure: a later look
// sees it whole.
bool abortIsAFailure(const char* payload, size_t have) {
  if (have < 4) return false;
  ByteReader rd(payload, 4);
  int32_t code = 0;
  if (!rd.i32(&code, "abort code").isOk()) return false;
  return code != static_cast<int32_t>(Code::kShutDown);
}

}  // namespace

Status ControlPlane::peersStillConnected() const {
  for (size_t i = 0; i < peers_.size(); ++i) {
    const auto& p = peers_[i];
    if (!p || !p->sock.is_open()) continue;
    // Peeked, never consumed: the event loop reads these bytes later.
    char buf[4096];
    const ssize_t n = ::recv(p->sock.native_handle(), buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT);
    const int err = errno;
    if (n > 0) {
      // Alive, but it may already have given up on the set: an abort frame
      // among the first waiting frames (after heartbeats) says so. A peer
      // whose own set-up finished runs its event loop and sends that
      // instead of closing its connection.
      size_t at = 0;
      while (at + 5 <= static_cast<size_t>(n)) {
        uint32_t len = 0;
        FrameType type;
        if (!parseFrameHeader(buf + at, &len, &type).isOk()) break;
        if (type == FrameType::kAbort && abortIsAFailure(buf + at + 5, n - (at + 5))) {
          const int peer = isCoordinator() ? static_cast<int>(i) : 0;
          return Status(Code::kRemoteError,
                        peerName(peer) + " gave up on process set " + opts_.setName +
                            " while this rank was still setting it up (a rank was lost or "
                            "failed; " +
                            (isCoordinator() ? "its" : "the coordinator's") +
                            " own output says which)");
        }
        at += 5 + len;
      }
      continue;
    }
    if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK || err == EINTR)) continue;
    const std::string how =
        n == 0 ? std::string("closed its control connection")
               : "lost its control connection (" + std::string(std::strerror(err)) + ")";
    const std::string when = " while process set " + opts_.setName + " was being set up";
    if (isCoordinator())
      return Status(Code::kRemoteError, peerName(static_cast<int>(i)) + " " + how + when +
                                            " (the process exited, crashed or was killed); "
                                            "its own output says why");
    // A worker sees only the coordinator: it may have died, or given up on
    // the set-up because another rank died (then its output names that one).
    return Status(Code::kRemoteError,
                  "the coordinator (" + peerName(0) + ") " + how + when +
                      ": it exited, or gave up on the set-up because another rank was lost; its "
                      "own output says which");
  }
  return Status::ok();
}

bool ControlPlane::laneHasInput() const { return lane_ && lane_->hasInput(); }

void ControlPlane::markAlive() {
  if (lane_) lane_->markAlive();
  // The peers keep talking while this thread reads nothing: bytes arriving
  // on a peer's socket or lane ring count as hearing from it, so the first
  // tick after the busy spell judges silence as if it had read them (and a
  // peer that stalled meanwhile is still found silent).
  const auto now = SteadyClock::now();
  for (auto& p : peers_) {
    if (!p || p->lost) continue;
    int onSocket = 0;
    if (::ioctl(p->sock.native_handle(), FIONREAD, &onSocket) != 0) onSocket = 0;
    const uint64_t unread = static_cast<uint64_t>(std::max(onSocket, 0)) +
                            (lane_ ? lane_->readableFrom(isCoordinator() ? p->rank : 0) : 0);
    // Only growth is news: reading (the event loop, between busy spells)
    // shrinks it.
    if (unread > p->unreadSeen) p->lastHeard = now;
    p->unreadSeen = unread;
  }
}

bool ControlPlane::allSent() const {
  for (const auto& p : peers_)
    if (p && !p->lost && (p->writing || !p->outq.empty() || !p->afterLane.empty())) return false;
  return true;
}

void ControlPlane::whenSent(std::chrono::milliseconds bound, std::function<void()> done) {
  // Polled rather than hooked into every write's completion: this runs once,
  // when a set fails, and a millisecond's granularity is plenty there.
  pollSent(std::make_shared<asio::steady_timer>(io_), SteadyClock::now() + bound, std::move(done));
}

void ControlPlane::pollSent(std::shared_ptr<asio::steady_timer> timer,
                            SteadyClock::time_point deadline, std::function<void()> done) {
  if (lane_) pollLane();  // frames waiting behind the lane move on as it drains
  if (allSent() || SteadyClock::now() >= deadline) return done();
  timer->expires_after(std::chrono::milliseconds(1));
  timer->async_wait(
      locked([this, timer, deadline, done = std::move(done)](boost::system::error_code ec) {
        if (!ec) pollSent(timer, deadline, done);
      }));
}

void ControlPlane::flush(std::shared_ptr<Peer> p) {
  // What the kernel takes now is written here, not through an asynchronous
  // write: Asio would write it at once too, but post its completion, which
  // from a framework thread driving the set wakes the control thread out of
  // its epoll wait (the hand-off caller-driving exists to avoid). A failure,
  // or a full socket, is left to the asynchronous write below, which reports
  // it from a handler as before.
  while (p->direct && !p->outq.empty() && !p->lost) {
    const std::string& f = p->outq.front();
    boost::system::error_code ec;
    const size_t n =
        p->sock.write_some(asio::buffer(f.data() + p->outOff, f.size() - p->outOff), ec);
    if (ec) break;
    p->outOff += n;
    if (p->outOff >= f.size()) {
      p->outq.pop_front();
      p->outOff = 0;
    }
  }
  if (p->outq.empty() || p->lost) {
    p->writing = false;
    return;
  }
  p->writing = true;
  const std::string& f = p->outq.front();
  // One write_some at a time, each completion under the drive lock (a
  // composed async_write would continue a partial write outside it).
  p->sock.async_write_some(
      asio::buffer(f.data() + p->outOff, f.size() - p->outOff),
      locked([this, p](boost::system::error_code ec, size_t n) {
        if (ec) {
          p->outq.clear();
          p->outOff = 0;
          p->writing = false;
          if (!p->lost && !closing_)
            lose(p, Status(Code::kRemoteError,
                           "cannot send to " + peerName(p->rank) + ": " + ec.message()));
          return;
        }
        p->outOff += n;
        if (p->outOff >= p->outq.front().size()) {
          p->outq.pop_front();
          p->outOff = 0;
        }
        flush(p);
      }));
}

void ControlPlane::lose(const std::shared_ptr<Peer>& p, Status why) {
  if (p->lost) return;
  // Frames the peer put in the lane before it went are handled first.
  if (lane_) pollLane();
  if (p->lost) return;
  p->lost = true;
  if (lane_) lane_->drop(isCoordinator() ? p->rank : 0);
  boost::system::error_code ec;
  p->sock.close(ec);
  // After a goodbye (or while this rank is closing) the close is expected.
  if (!closing_ && !p->saidGoodbye) {
    if (why.code() != Code::kShutDown) HORA_LOG(logger_, kWarning) << why.message();
    if (cb_.onPeerLost) cb_.onPeerLost(isCoordinator() ? p->rank : 0, why);
  }
  updateDone();
}

bool ControlPlane::pollLane() {
  if (!lane_ || inLanePoll_) return false;
  inLanePoll_ = true;
  ShmLane::Handlers h;
  h.deliver = [this](int from, FrameType type, std::string payload) {
    auto& p = peers_[isCoordinator() ? from : 0];
    if (!p || p->lost) return;
    if (!isNegotiationFrame(type)) {
      lose(p, protocolError(std::string("unexpected ") + frameTypeName(type) + " frame from " +
                            peerName(p->rank) + " in the shared-memory lane"));
      return;
    }
    p->unreadSeen = 0;  // markAlive's baseline: this was read
    if (cb_.onFrame) cb_.onFrame(from, type, std::move(payload));
  };
  h.bad = [this](int from, Status why) {
    auto& p = peers_[isCoordinator() ? from : 0];
    if (p && !p->lost)
      lose(p, why.withContext("malformed frame from " + peerName(p->rank) +
                              " in the shared-memory lane"));
  };
  h.ring = [this](int peer) {
    auto& p = peers_[isCoordinator() ? peer : 0];
    if (p && !p->lost) sendFrame(p, FrameType::kDoorbell, "");
  };
  const bool moved = lane_->poll(h);
  for (auto& p : peers_)
    if (p && !p->lost && !p->afterLane.empty() &&
        !lane_->hasPendingFor(isCoordinator() ? p->rank : 0))
      while (!p->afterLane.empty()) {
        sendFrame(p, p->afterLane.front().first, p->afterLane.front().second);
        p->afterLane.pop_front();
      }
  inLanePoll_ = false;
  return moved;
}

void ControlPlane::tick() {
  auto now = SteadyClock::now();
  for (auto& p : peers_) {
    if (!p || p->lost || p->saidGoodbye) continue;
    // A peer busy running a collective on its control thread reads and
    // sends nothing, but says it is alive through the lane.
    if (now - p->lastHeard > opts_.peerTimeout && lane_)
      p->lastHeard = std::max(p->lastHeard, lane_->aliveAt(isCoordinator() ? p->rank : 0));
    if (now - p->lastHeard > opts_.peerTimeout) {
      lose(p, Status(Code::kRemoteError,
                     peerName(p->rank) + " sent nothing on the control plane for " +
                         std::to_string(opts_.peerTimeout.count() / 1000) +
                         " s (HORA_PEER_TIMEOUT_S): it is stopped, overloaded or unreachable"));
      continue;
    }
    if (!p->writing && p->outq.empty()) {
      p->outq.push_back(frame(FrameType::kHeartbeat, ""));
      flush(p);
    }
  }
  timer_.expires_after(opts_.heartbeatInterval);
  timer_.async_wait(locked([this](boost::system::error_code ec) {
    if (!ec && !closing_) tick();
  }));
}

void ControlPlane::closeGracefully() {
  if (closing_) return;
  closing_ = true;
  timer_.cancel();
  for (auto& p : peers_)
    if (p && !p->lost)
      send(p->rank < 0 ? 0 : (isCoordinator() ? p->rank : 0), FrameType::kGoodbye, "");
  updateDone();
}

}  // namespace hora
