// TcpStoreServer (tcp_store.h): the server half of the rendezvous store; the client is
// tcp_store_client.cc, the wire format tcp_store_wire.h.
#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <charconv>
#include <deque>
#include <functional>
#include <future>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "core/hmac.h"
#include "core/tcp_store.h"
#include "core/tcp_store_wire.h"

namespace hora {

using namespace tcp_store_wire;  // NOLINT(build/namespaces): internal protocol helpers

namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;
using std::chrono::milliseconds;

constexpr auto kAuthDeadline = std::chrono::seconds(10);
constexpr auto kRejectFlushDeadline = std::chrono::seconds(2);
// Unauthenticated connections at once. At the limit a new connection evicts
// the oldest unauthenticated one: a real client answers the challenge within
// a round trip, so only an idle (or hostile) connection is ever that old, and
// a flood of them cannot keep a late rank out until their deadlines pass.
constexpr size_t kMaxPendingAuth = 1024;
// Unauthenticated connections from one address at once. At this limit a new
// connection from that address evicts that address's oldest one, so a single
// flooding address churns only its own connections: it can never fill the
// 1,024 above and push out another host's client mid-handshake. 128 is far
// above what real clients need (each rank authenticates within a round trip;
// one evicted mid-handshake reconnects), even when hundreds of local ranks
// start at once from 127.0.0.1. (An IPv6 host owning a whole prefix has many
// addresses; the global limit still bounds it.)
constexpr size_t kMaxPendingAuthPerAddress = 128;

std::string errorFrame(Code code, const std::string& message) {
  return Writer().u32(static_cast<uint32_t>(code)).raw(message).frame(kReplyError);
}

// The peer's address without the port (IPv4-mapped IPv6 as IPv4).
std::string formatAddress(const tcp::endpoint& ep) {
  asio::ip::address a = ep.address();
  if (a.is_v6() && a.to_v6().is_v4_mapped())
    a = asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
  return a.to_string();
}

std::string formatEndpoint(const tcp::endpoint& ep) {
  return hostPort(formatAddress(ep), ep.port());
}

}  // namespace

// ============================================================================
// Server
// ============================================================================

class TcpStoreServer::Impl {
 public:
  class Session;
  // A get/wait that could not be answered yet; lives until set/add satisfies
  // it, its timer fires, or its session closes.
  struct Waiter {
    explicit Waiter(asio::io_context& io) : timer(io) {}
    std::shared_ptr<Session> session;
    std::vector<std::string> keys;
    bool isGet = false;
    uint64_t timeoutMs = 0;
    bool done = false;
    asio::steady_timer timer;
  };

  Impl(std::string secret, Logger logger)
      : secret_(std::move(secret)), logger_(std::move(logger)) {}
  ~Impl() {
    if (thread_.joinable()) shutdown();
  }

  Status listen(const std::string& bindHost, int port);
  void startThread();
  void shutdown();

  // Everything below runs on the io thread only.
  void accept();
  void addWaiter(const std::shared_ptr<Waiter>& w);
  void dropWaiter(std::shared_ptr<Waiter> w);  // by value: w may alias session->waiter_
  void finishWaiter(std::shared_ptr<Waiter> w, bool timedOut);
  void serveWaiters(const std::string& key);
  // The store's add; the caller serves the waiters for key afterwards.
  Result<int64_t> applyAdd(const std::string& key, int64_t delta) {
    int64_t current = 0;
    auto it = data_.find(key);
    if (it != data_.end()) {
      const std::string& text = it->second;
      auto res = std::from_chars(text.data(), text.data() + text.size(), current);
      if (res.ec != std::errc() || res.ptr != text.data() + text.size())
        return invalidArgument("store add: key '" + key + "' holds a non-integer value");
    }
    int64_t next = 0;
    if (__builtin_add_overflow(current, delta, &next))
      return invalidArgument("store add: key '" + key + "' would overflow int64");
    data_[key] = std::to_string(next);
    return next;
  }
  // Runs fn on the server thread and waits for it (the hosting process's
  // own writes; data_ belongs to that thread).
  template <typename T>
  T onServerThread(std::function<T()> fn) {
    std::packaged_task<T()> task(std::move(fn));
    auto result = task.get_future();
    asio::post(io_, [&task] { task(); });
    return result.get();
  }
  bool allPresent(const Waiter& w) const {
    for (const auto& k : w.keys)
      if (!data_.count(k)) return false;
    return true;
  }

  asio::io_context io_;  // declared first: destroyed last
  tcp::acceptor acceptor_{io_};
  asio::steady_timer acceptRetry_{io_};
  std::thread thread_;
  std::string secret_;
  Logger logger_;
  int port_ = 0;
  bool stopping_ = false;
  size_t pendingAuth_ = 0;
  std::list<Session*> pendingOrder_;  // unauthenticated sessions, oldest first
  // The same per peer address (no entry for an address with none).
  std::unordered_map<std::string, std::list<Session*>> pendingByAddress_;
  uint64_t evicted_ = 0;  // unauthenticated connections dropped at kMaxPendingAuth
  // Clients refused for a wrong secret: read by the hosting process's
  // threads (authRefusals) while the server thread counts them.
  mutable std::mutex refusedMu_;
  uint64_t badSecrets_ = 0;    // guarded by refusedMu_
  std::string lastBadSecret_;  // guarded by refusedMu_: the last such client's address
  void noteBadSecret(const std::string& peer) {
    std::lock_guard<std::mutex> lk(refusedMu_);
    ++badSecrets_;
    lastBadSecret_ = peer;
  }
  uint64_t evictedSameAddress_ = 0;  // ... at kMaxPendingAuthPerAddress
  std::unordered_map<std::string, std::string> data_;
  std::list<std::shared_ptr<Waiter>> waiters_;
  std::unordered_set<std::shared_ptr<Session>> sessions_;
};

class TcpStoreServer::Impl::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Impl& server, tcp::socket socket, std::string peer, std::string address)
      : server_(server),
        socket_(std::move(socket)),
        timer_(server.io_),
        peer_(std::move(peer)),
        address_(std::move(address)) {}

  void start();
  void close();
  void send(std::string frame);
  // Logs why, sends an error frame, closes once it is flushed (or after 2 s).
  void reject(const std::string& reason, Code code);
  void onWaitFinished() {
    waiter_.reset();
    busy_ = false;
  }

 private:
  void readHeader();
  void onHeader(const error_code& ec);
  void onBody(const error_code& ec);
  void handleAuth();
  void handleRequest(uint8_t op);
  void writeNext();
  void releaseBody() {
    if (body_.capacity() > (size_t{1} << 20)) std::string().swap(body_);
  }

  Impl& server_;
  tcp::socket socket_;
  asio::steady_timer timer_;  // authentication deadline, then the reject flush deadline
  std::string peer_;
  std::string address_;  // peer_ without the port: the key of pendingByAddress_
  std::string nonce_;
  std::array<unsigned char, kHeaderSize> header_{};
  uint8_t op_ = 0;
  std::string body_;
  std::deque<std::string> outbox_;
  bool writing_ = false;
  bool authed_ = false;
  bool countedPending_ = false;
  bool busy_ = false;  // a get/wait is parked in the waiter list
  bool rejecting_ = false;
  bool closed_ = false;
  std::shared_ptr<Waiter> waiter_;
  // Valid while countedPending_: this session in pendingOrder_ and in its address's list.
  std::list<Session*>::iterator pendingIt_, pendingByAddressIt_;
  Clock::time_point startedAt_ = Clock::now();

 public:
  void stopCountingPending() {
    if (!countedPending_) return;
    countedPending_ = false;
    --server_.pendingAuth_;
    server_.pendingOrder_.erase(pendingIt_);
    auto mine = server_.pendingByAddress_.find(address_);
    mine->second.erase(pendingByAddressIt_);
    if (mine->second.empty()) server_.pendingByAddress_.erase(mine);
  }
  const std::string& peer() const { return peer_; }
  Clock::duration age() const { return Clock::now() - startedAt_; }
};

void TcpStoreServer::Impl::Session::start() {
  auto nonce = randomBytes(kNonceSize);
  if (!nonce.isOk()) {
    HORA_LOG(server_.logger_, kError)
        << "store cannot serve " << peer_ << ": " << nonce.status().toString();
    close();
    return;
  }
  nonce_ = nonce.take();
  countedPending_ = true;
  ++server_.pendingAuth_;
  pendingIt_ = server_.pendingOrder_.insert(server_.pendingOrder_.end(), this);
  auto& sameAddress = server_.pendingByAddress_[address_];
  pendingByAddressIt_ = sameAddress.insert(sameAddress.end(), this);
  auto self = shared_from_this();
  timer_.expires_after(kAuthDeadline);
  timer_.async_wait([self](const error_code& ec) {
    if (ec || self->closed_ || self->authed_ || self->rejecting_) return;
    self->reject("did not authenticate within " + std::to_string(kAuthDeadline.count()) + " s",
                 Code::kAuthError);
  });
  send(Writer().raw(nonce_).frame(kChallenge));
  readHeader();
}

void TcpStoreServer::Impl::Session::close() {
  if (closed_) return;
  auto self = shared_from_this();  // keeps *this alive until we return
  closed_ = true;
  stopCountingPending();
  error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  timer_.cancel();
  if (waiter_) server_.dropWaiter(waiter_);
  waiter_.reset();
  outbox_.clear();
  server_.sessions_.erase(self);
}

void TcpStoreServer::Impl::Session::send(std::string frame) {
  if (closed_) return;
  outbox_.push_back(std::move(frame));
  if (!writing_) writeNext();
}

void TcpStoreServer::Impl::Session::writeNext() {
  if (outbox_.empty()) {
    writing_ = false;
    if (rejecting_) close();
    return;
  }
  writing_ = true;
  auto self = shared_from_this();
  asio::async_write(socket_, asio::buffer(outbox_.front()), [self](const error_code& ec, size_t) {
    if (self->closed_) return;
    if (ec) {
      self->close();
      return;
    }
    self->outbox_.pop_front();
    self->writeNext();
  });
}

void TcpStoreServer::Impl::Session::reject(const std::string& reason, Code code) {
  if (closed_ || rejecting_) return;
  HORA_LOG(server_.logger_, kWarning) << "rejected store client " << peer_ << ": " << reason;
  rejecting_ = true;
  if (waiter_) server_.dropWaiter(waiter_);
  waiter_.reset();
  auto self = shared_from_this();
  timer_.expires_after(kRejectFlushDeadline);
  timer_.async_wait([self](const error_code& ec) {
    if (!ec) self->close();
  });
  send(errorFrame(code, "store rejected the connection: " + reason));
}

void TcpStoreServer::Impl::Session::readHeader() {
  auto self = shared_from_this();
  asio::async_read(socket_, asio::buffer(header_),
                   [self](const error_code& ec, size_t) { self->onHeader(ec); });
}

void TcpStoreServer::Impl::Session::onHeader(const error_code& ec) {
  if (closed_ || rejecting_) return;
  if (ec) {
    if (!authed_) {
      HORA_LOG(server_.logger_, kInfo)
          << "store client " << peer_ << " disconnected before authenticating (" << ec.message()
          << ")";
    } else {
      HORA_LOG(server_.logger_, kDebug) << "store client " << peer_ << " disconnected";
    }
    close();
    return;
  }
  Header h;
  std::string why = decodeHeader(header_, &h);
  if (!why.empty()) return reject("sent a malformed frame: " + why, Code::kProtocolError);
  size_t limit = authed_ ? kMaxFrame : kMaxPreAuthFrame;
  if (h.length > limit)
    return reject("frame of " + std::to_string(h.length) + " bytes exceeds the " +
                      std::to_string(limit) + "-byte limit" +
                      (authed_ ? "" : " before authentication"),
                  Code::kProtocolError);
  if (!authed_ && h.op != kAuth)
    return reject(isRequestOp(h.op) ? "sent a request before authenticating"
                                    : "unknown opcode " + hexByte(h.op) + " during handshake",
                  Code::kAuthError);
  if (authed_ && !isRequestOp(h.op))
    return reject("unknown opcode " + hexByte(h.op), Code::kProtocolError);
  if (busy_)
    return reject("sent a request while its previous one was still pending", Code::kProtocolError);
  op_ = h.op;
  try {
    body_.resize(h.length);
  } catch (const std::bad_alloc&) {
    return reject("out of memory for a " + std::to_string(h.length) + "-byte frame",
                  Code::kSystemError);
  }
  if (h.length == 0) return onBody(error_code());
  auto self = shared_from_this();
  asio::async_read(socket_, asio::buffer(&body_[0], h.length),
                   [self](const error_code& e, size_t) { self->onBody(e); });
}

void TcpStoreServer::Impl::Session::onBody(const error_code& ec) {
  if (closed_ || rejecting_) return;
  if (ec) {
    HORA_LOG(server_.logger_, kInfo)
        << "store client " << peer_ << " disconnected mid-frame (" << ec.message() << ")";
    close();
    return;
  }
  if (authed_) {
    handleRequest(op_);
  } else {
    handleAuth();
  }
  releaseBody();
  if (!closed_ && !rejecting_) readHeader();
}

void TcpStoreServer::Impl::Session::handleAuth() {
  if (body_.size() != kMacSize)
    return reject("authentication answer of " + std::to_string(body_.size()) + " bytes, expected " +
                      std::to_string(kMacSize),
                  Code::kAuthError);
  if (!constantTimeEqual(body_, authMac(server_.secret_, nonce_))) {
    server_.noteBadSecret(peer_);
    return reject("bad HMAC (wrong HORA_SECRET?)", Code::kAuthError);
  }
  authed_ = true;
  stopCountingPending();
  timer_.cancel();
  HORA_LOG(server_.logger_, kDebug) << "store client " << peer_ << " authenticated";
  send(Writer().frame(kAuthOk));
}

void TcpStoreServer::Impl::Session::handleRequest(uint8_t op) {
  Request req;
  std::string why = parseRequest(op, body_, &req);
  if (!why.empty()) return reject(why, Code::kProtocolError);
  auto& data = server_.data_;
  switch (op) {
    case kSet:
      data[req.keys[0]] = std::move(req.value);
      send(Writer().frame(kReplyOk));
      server_.serveWaiters(req.keys[0]);
      return;
    case kAdd: {
      auto next = server_.applyAdd(req.keys[0], static_cast<int64_t>(req.number));
      if (!next.isOk()) return send(errorFrame(next.status().code(), next.status().message()));
      send(Writer().u64(static_cast<uint64_t>(next.value())).frame(kReplyOk));
      server_.serveWaiters(req.keys[0]);
      return;
    }
    case kCheck:
      return send(Writer().u8(data.count(req.keys[0]) ? 1 : 0).frame(kReplyOk));
    case kRemove:
      data.erase(req.keys[0]);
      return send(Writer().frame(kReplyOk));
    default: {  // kGet, kWait (parseRequest accepts nothing else)
      auto w = std::make_shared<Waiter>(server_.io_);
      w->isGet = op == kGet;
      w->keys = std::move(req.keys);
      w->timeoutMs = req.number;
      if (server_.allPresent(*w))
        return send(Writer().raw(w->isGet ? data[w->keys[0]] : std::string()).frame(kReplyOk));
      w->session = shared_from_this();
      waiter_ = w;
      busy_ = true;
      server_.addWaiter(w);
      return;
    }
  }
}

Status TcpStoreServer::Impl::listen(const std::string& bindHost, int port) {
  std::string host = bindHost.empty() ? "0.0.0.0" : bindHost;
  std::string where = hostPort(host, port);
  error_code ec;
  tcp::resolver resolver(io_);
  auto results = resolver.resolve(host, std::to_string(port),
                                  tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty())
    return systemError("cannot resolve the store bind address " + where + ": " + ec.message());
  tcp::endpoint ep = results.begin()->endpoint();
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    return systemError("cannot listen for the rendezvous store on " + where + ": " + ec.message());
  setCloseOnExec(acceptor_.native_handle());
  port_ = acceptor_.local_endpoint(ec).port();
  if (ec) return systemError("cannot read the store's bound port: " + ec.message());
  return Status::ok();
}

void TcpStoreServer::Impl::startThread() {
  accept();
  thread_ = std::thread([this] {
    for (;;) {
      try {
        io_.run();
        return;
      } catch (const std::exception& e) {
        // A handler threw (e.g. allocation failure); keep serving the others.
        HORA_LOG(logger_, kError) << "store server handler failed: " << e.what();
      }
    }
  });
}

void TcpStoreServer::Impl::shutdown() {
  asio::post(io_, [this] {
    stopping_ = true;
    error_code ignored;
    acceptor_.close(ignored);
    acceptRetry_.cancel();
    auto waiters = waiters_;
    for (auto& w : waiters) dropWaiter(w);
    auto sessions = sessions_;
    for (auto& s : sessions) s->close();
  });
  // Every pending operation is cancelled above, so run() runs out of work.
  if (thread_.joinable()) thread_.join();
}

void TcpStoreServer::Impl::accept() {
  acceptor_.async_accept([this](const error_code& ec, tcp::socket socket) {
    if (stopping_) return;
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      // EMFILE and friends: back off instead of spinning; the listener stays up.
      HORA_LOG(logger_, kWarning) << "store accept failed: " << ec.message();
      acceptRetry_.expires_after(milliseconds(100));
      acceptRetry_.async_wait([this](const error_code& e) {
        if (!e && !stopping_) accept();
      });
      return;
    }
    error_code e2;
    tcp::endpoint ep = socket.remote_endpoint(e2);
    std::string peer = e2 ? std::string("<unknown peer>") : formatEndpoint(ep);
    std::string address = e2 ? peer : formatAddress(ep);
    setCloseOnExec(socket.native_handle());
    auto sameAddress = pendingByAddress_.find(address);
    if (sameAddress != pendingByAddress_.end() &&
        sameAddress->second.size() >= kMaxPendingAuthPerAddress) {
      // This address is at its own limit: make room among its connections, not
      // among everyone's (the global eviction below would pick the oldest of all).
      Session* oldest = sameAddress->second.front();
      if (evictedSameAddress_++ % 1000 == 0)
        HORA_LOG(logger_, kWarning)
            << "store has " << sameAddress->second.size() << " connections from " << address
            << " that have not authenticated (port scan or stray clients?): dropping its oldest, "
            << oldest->peer() << " (idle "
            << std::chrono::duration_cast<milliseconds>(oldest->age()).count() << " ms), for "
            << peer << "; " << evictedSameAddress_ << " dropped so far for a newer one from "
            << "the same address";
      oldest->close();
    } else if (pendingAuth_ >= kMaxPendingAuth && !pendingOrder_.empty()) {
      Session* oldest = pendingOrder_.front();
      // The first eviction and every 1,000th after it, so a flood cannot flood the log.
      if (evicted_++ % 1000 == 0)
        HORA_LOG(logger_, kWarning)
            << "store has " << pendingAuth_ << " connections that have not authenticated (port "
            << "scan or stray clients?): dropping the oldest, " << oldest->peer() << " (idle "
            << std::chrono::duration_cast<milliseconds>(oldest->age()).count() << " ms), for "
            << peer << "; " << evicted_ << " dropped so far";
      oldest->close();
    }
    socket.set_option(tcp::no_delay(true), e2);
    auto session = std::make_shared<Session>(*this, std::move(socket), peer, address);
    sessions_.insert(session);
    session->start();
    accept();
  });
}

void TcpStoreServer::Impl::addWaiter(const std::shared_ptr<Waiter>& w) {
  waiters_.push_back(w);
  std::weak_ptr<Waiter> weak = w;
  w->timer.expires_after(milliseconds(w->timeoutMs));
  w->timer.async_wait([this, weak](const error_code& ec) {
    if (ec) return;
    auto locked = weak.lock();
    if (locked && !locked->done) finishWaiter(locked, /*timedOut=*/true);
  });
}

void TcpStoreServer::Impl::dropWaiter(std::shared_ptr<Waiter> w) {
  w->done = true;
  w->timer.cancel();
  waiters_.remove(w);
  if (w->session) w->session->onWaitFinished();
  w->session.reset();
}

void TcpStoreServer::Impl::finishWaiter(std::shared_ptr<Waiter> w, bool timedOut) {
  auto session = w->session;
  dropWaiter(w);
  if (!session) return;
  if (!timedOut) {
    session->send(Writer().raw(w->isGet ? data_[w->keys[0]] : std::string()).frame(kReplyOk));
    return;
  }
  std::string message;
  if (w->isGet) {
    message = "store key '" + w->keys[0] + "' did not appear within " +
              std::to_string(w->timeoutMs) + " ms";
  } else {
    std::string missing;
    for (const auto& k : w->keys)
      if (!data_.count(k)) missing += (missing.empty() ? "" : ", ") + k;
    message = "store keys still missing after " + std::to_string(w->timeoutMs) + " ms: " + missing;
  }
  session->send(Writer().raw(message).frame(kReplyTimeout));
}

void TcpStoreServer::Impl::serveWaiters(const std::string& key) {
  std::vector<std::shared_ptr<Waiter>> ready;
  for (const auto& w : waiters_) {
    if (std::find(w->keys.begin(), w->keys.end(), key) == w->keys.end()) continue;
    if (allPresent(*w)) ready.push_back(w);
  }
  for (const auto& w : ready) finishWaiter(w, /*timedOut=*/false);
}

TcpStoreServer::TcpStoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TcpStoreServer::~TcpStoreServer() {
  impl_->shutdown();  // joins the io thread; ~Impl then releases the sockets
  HORA_LOG(impl_->logger_, kDebug) << "rendezvous store on port " << impl_->port_ << " stopped";
}

int TcpStoreServer::port() const { return impl_->port_; }

std::string TcpStoreServer::authRefusals() const {
  std::lock_guard<std::mutex> lk(impl_->refusedMu_);
  if (impl_->badSecrets_ == 0) return "";
  return "the store refused " + std::to_string(impl_->badSecrets_) +
         " connection(s) for a wrong secret, the last from " + impl_->lastBadSecret_ +
         ": is HORA_SECRET / HORA_SECRET_FILE the same on every rank?";
}

Status TcpStoreServer::set(const std::string& key, const std::string& value) {
  Impl* impl = impl_.get();
  return impl->onServerThread<Status>([&]() -> Status {
    impl->data_[key] = value;
    impl->serveWaiters(key);
    return Status::ok();
  });
}

Result<bool> TcpStoreServer::check(const std::string& key) {
  Impl* impl = impl_.get();
  return impl->onServerThread<Result<bool>>(
      [&]() -> Result<bool> { return impl->data_.count(key) > 0; });
}

Result<int64_t> TcpStoreServer::add(const std::string& key, int64_t delta) {
  Impl* impl = impl_.get();
  return impl->onServerThread<Result<int64_t>>([&]() -> Result<int64_t> {
    auto next = impl->applyAdd(key, delta);
    if (next.isOk()) impl->serveWaiters(key);
    return next;
  });
}

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::start(const std::string& bindHost, int port,
                                                              std::string secret, Logger logger) {
  if (port < 0 || port > 65535)
    return invalidArgument("store port " + std::to_string(port) + " is out of range");
  try {
    auto impl = std::make_unique<Impl>(std::move(secret), logger);
    HORA_RETURN_IF_ERROR(impl->listen(bindHost, port));
    impl->startThread();
    int bound = impl->port_;
    bool open = impl->secret_.empty();
    std::unique_ptr<TcpStoreServer> server(new TcpStoreServer(std::move(impl)));
    HORA_LOG(logger, kInfo) << "rendezvous store listening on "
                            << hostPort(bindHost.empty() ? "0.0.0.0" : bindHost, bound);
    if (open)
      HORA_LOG(logger, kWarning)
          << "rendezvous store on port " << bound
          << " is UNAUTHENTICATED (no HORA_SECRET): any process that can reach it can join";
    return server;
  } catch (const std::exception& e) {
    return systemError(std::string("cannot start the rendezvous store: ") + e.what());
  }
}

}  // namespace hora
