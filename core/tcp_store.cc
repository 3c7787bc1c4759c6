#include "core/tcp_store.h"

#include <fcntl.h>

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <deque>
#include <list>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "core/hmac.h"

namespace hora {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;
using std::chrono::milliseconds;

// ---- Wire protocol ----------------------------------------------------------
// Frame: [kMagic][kVersion][opcode][flags = 0][payload length u32 BE][payload].
// Payload fields: str = u32 BE length + bytes; u64 = 8 bytes BE (i64 as two's
// complement). Handshake: server kChallenge(nonce) -> client kAuth(mac) ->
// server kAuthOk or kReplyError(u32 code, message) and close. Requests:
//   kSet(str key, str value)      -> kReplyOk()
//   kGet(str key, u64 timeoutMs)  -> kReplyOk(value bytes) | kReplyTimeout(message)
//   kAdd(str key, u64 delta)      -> kReplyOk(u64 new value)
//   kWait(u32 n, n x str key, u64 timeoutMs) -> kReplyOk() | kReplyTimeout(message)
//   kCheck(str key)               -> kReplyOk(u8 exists)
//   kRemove(str key)              -> kReplyOk()
// Any request may also get kReplyError(u32 code, message). One request in
// flight per connection; a second one before the reply is a protocol error.
constexpr uint8_t kMagic = 0x68;  // 'h'
constexpr uint8_t kVersion = 1;
constexpr size_t kHeaderSize = 8;
constexpr size_t kNonceSize = 32;
constexpr size_t kMacSize = 32;
constexpr size_t kMaxKey = 4096;
constexpr size_t kMaxValue = size_t{64} << 20;
constexpr size_t kMaxFrame = kMaxValue + 2 * kMaxKey;  // a set: key + value + their lengths
constexpr size_t kMaxPreAuthFrame = 64;
constexpr uint32_t kMaxWaitKeys = 65536;
constexpr uint64_t kMaxWaitMs = uint64_t{7} * 24 * 3600 * 1000;  // a week: "forever"
constexpr auto kAuthDeadline = std::chrono::seconds(10);
constexpr auto kRejectFlushDeadline = std::chrono::seconds(2);
constexpr size_t kMaxPendingAuth = 1024;  // unauthenticated connections at once
constexpr size_t kMaxIdleConnections = 4;
constexpr auto kRequestDeadline = std::chrono::seconds(30);  // set/add/check/remove
constexpr auto kReplyGrace = std::chrono::seconds(5);        // added to get/wait timeouts
constexpr auto kMinHandshakeTime = std::chrono::seconds(2);
constexpr auto kMaxReconnectWindow = std::chrono::seconds(5);
const char kAuthContext[] = "hora-store-v1";

enum Op : uint8_t {
  kChallenge = 0x01,
  kAuth = 0x02,
  kAuthOk = 0x03,
  kSet = 0x10,
  kGet = 0x11,
  kAdd = 0x12,
  kWait = 0x13,
  kCheck = 0x14,
  kRemove = 0x15,
  kReplyOk = 0x20,
  kReplyTimeout = 0x21,
  kReplyError = 0x22,
};

bool isRequestOp(uint8_t op) { return op >= kSet && op <= kRemove; }

std::string hexByte(uint8_t b) { return "0x" + toHex(std::string(1, static_cast<char>(b))); }

// Builds one frame: header space first, patched by frame().
class Writer {
 public:
  Writer() : buf_(kHeaderSize, '\0') {}
  Writer& u8(uint8_t v) {
    buf_.push_back(static_cast<char>(v));
    return *this;
  }
  Writer& u32(uint32_t v) {
    for (int i = 3; i >= 0; --i) buf_.push_back(static_cast<char>(v >> (8 * i)));
    return *this;
  }
  Writer& u64(uint64_t v) {
    for (int i = 7; i >= 0; --i) buf_.push_back(static_cast<char>(v >> (8 * i)));
    return *this;
  }
  Writer& str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    return raw(s);
  }
  Writer& raw(const std::string& s) {
    buf_ += s;
    return *this;
  }
  std::string frame(uint8_t op) {
    uint32_t len = static_cast<uint32_t>(buf_.size() - kHeaderSize);
    buf_[0] = static_cast<char>(kMagic);
    buf_[1] = static_cast<char>(kVersion);
    buf_[2] = static_cast<char>(op);
    buf_[3] = 0;
    for (int i = 0; i < 4; ++i) buf_[4 + i] = static_cast<char>(len >> (8 * (3 - i)));
    return std::move(buf_);
  }

 private:
  std::string buf_;
};

std::string errorFrame(Code code, const std::string& message) {
  return Writer().u32(static_cast<uint32_t>(code)).raw(message).frame(kReplyError);
}

// Bounds-checked payload reader; every accessor fails instead of overrunning.
class Reader {
 public:
  explicit Reader(const std::string& buf) : buf_(buf) {}
  bool u8(uint8_t* v) {
    if (!need(1)) return false;
    *v = static_cast<uint8_t>(buf_[pos_++]);
    return true;
  }
  bool u32(uint32_t* v) {
    if (!need(4)) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) *v = (*v << 8) | static_cast<uint8_t>(buf_[pos_++]);
    return true;
  }
  bool u64(uint64_t* v) {
    if (!need(8)) return false;
    *v = 0;
    for (int i = 0; i < 8; ++i) *v = (*v << 8) | static_cast<uint8_t>(buf_[pos_++]);
    return true;
  }
  // Reads a length-prefixed string of at most maxLen bytes; `why` says what failed.
  bool str(std::string* out, size_t maxLen, const char* field, std::string* why) {
    uint32_t len = 0;
    if (!u32(&len)) return truncated(why);
    if (len > maxLen) {
      *why = std::string(field) + " of " + std::to_string(len) + " bytes exceeds the " +
             std::to_string(maxLen) + "-byte limit";
      return false;
    }
    if (!need(len)) return truncated(why);
    out->assign(buf_, pos_, len);
    pos_ += len;
    return true;
  }
  std::string rest() const { return buf_.substr(pos_); }
  bool done() const { return pos_ == buf_.size(); }

 private:
  bool need(size_t n) const { return buf_.size() - pos_ >= n; }
  static bool truncated(std::string* why) {
    *why = "truncated request payload";
    return false;
  }
  const std::string& buf_;
  size_t pos_ = 0;
};

struct Header {
  uint8_t op = 0;
  uint32_t length = 0;
};

// Returns "" when the header is well formed, else the reason.
std::string decodeHeader(const std::array<unsigned char, kHeaderSize>& h, Header* out) {
  if (h[0] != kMagic) return "bad magic byte " + hexByte(h[0]) + " (not a hora store client?)";
  if (h[1] != kVersion)
    return "protocol version " + std::to_string(h[1]) + ", expected " + std::to_string(kVersion) +
           " (mixed hora versions?)";
  if (h[3] != 0) return "nonzero reserved flags " + hexByte(h[3]);
  out->op = h[2];
  out->length = (uint32_t(h[4]) << 24) | (uint32_t(h[5]) << 16) | (uint32_t(h[6]) << 8) | h[7];
  return "";
}

std::string authMac(const std::string& secret, const std::string& nonce) {
  return hmacSha256(secret, std::string(kAuthContext) + nonce);
}

std::string hostPort(const std::string& host, int port) {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string formatEndpoint(const tcp::endpoint& ep) {
  asio::ip::address a = ep.address();
  if (a.is_v6() && a.to_v6().is_v4_mapped())
    a = asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
  return hostPort(a.to_string(), ep.port());
}

std::string formatSeconds(milliseconds ms) {
  if (ms.count() % 1000 == 0) return std::to_string(ms.count() / 1000) + " s";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g s", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}

uint64_t clampWaitMs(milliseconds timeout) {
  if (timeout.count() <= 0) return 0;
  return std::min<uint64_t>(static_cast<uint64_t>(timeout.count()), kMaxWaitMs);
}

// Sockets must not leak into processes the launcher or a rank forks.
void setCloseOnExec(int fd) {
  int flags = ::fcntl(fd, F_GETFD);
  if (flags >= 0) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
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
  std::unordered_map<std::string, std::string> data_;
  std::list<std::shared_ptr<Waiter>> waiters_;
  std::unordered_set<std::shared_ptr<Session>> sessions_;
};

class TcpStoreServer::Impl::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Impl& server, tcp::socket socket, std::string peer)
      : server_(server), socket_(std::move(socket)), timer_(server.io_), peer_(std::move(peer)) {}

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
  if (countedPending_) {
    countedPending_ = false;
    --server_.pendingAuth_;
  }
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
  if (!constantTimeEqual(body_, authMac(server_.secret_, nonce_)))
    return reject("bad HMAC (wrong HORA_SECRET?)", Code::kAuthError);
  authed_ = true;
  if (countedPending_) {
    countedPending_ = false;
    --server_.pendingAuth_;
  }
  timer_.cancel();
  HORA_LOG(server_.logger_, kDebug) << "store client " << peer_ << " authenticated";
  send(Writer().frame(kAuthOk));
}

void TcpStoreServer::Impl::Session::handleRequest(uint8_t op) {
  Reader r(body_);
  std::string why;
  std::string key;
  auto malformed = [&](const char* name) {
    if (why.empty()) why = "trailing bytes";
    reject(std::string("malformed ") + name + " request: " + why, Code::kProtocolError);
  };
  auto& data = server_.data_;
  switch (op) {
    case kSet: {
      std::string value;
      if (!r.str(&key, kMaxKey, "key", &why) || !r.str(&value, kMaxValue, "value", &why) ||
          !r.done())
        return malformed("set");
      data[key] = std::move(value);
      send(Writer().frame(kReplyOk));
      server_.serveWaiters(key);
      return;
    }
    case kAdd: {
      uint64_t raw = 0;
      if (!r.str(&key, kMaxKey, "key", &why) || !r.u64(&raw) || !r.done()) return malformed("add");
      int64_t delta = static_cast<int64_t>(raw);
      int64_t current = 0;
      auto it = data.find(key);
      if (it != data.end()) {
        const std::string& text = it->second;
        auto res = std::from_chars(text.data(), text.data() + text.size(), current);
        if (res.ec != std::errc() || res.ptr != text.data() + text.size())
          return send(errorFrame(Code::kInvalidArgument,
                                 "store add: key '" + key + "' holds a non-integer value"));
      }
      int64_t next = 0;
      if (__builtin_add_overflow(current, delta, &next))
        return send(errorFrame(Code::kInvalidArgument,
                               "store add: key '" + key + "' would overflow int64"));
      data[key] = std::to_string(next);
      send(Writer().u64(static_cast<uint64_t>(next)).frame(kReplyOk));
      server_.serveWaiters(key);
      return;
    }
    case kCheck:
      if (!r.str(&key, kMaxKey, "key", &why) || !r.done()) return malformed("check");
      return send(Writer().u8(data.count(key) ? 1 : 0).frame(kReplyOk));
    case kRemove:
      if (!r.str(&key, kMaxKey, "key", &why) || !r.done()) return malformed("remove");
      data.erase(key);
      return send(Writer().frame(kReplyOk));
    case kGet:
    case kWait: {
      auto w = std::make_shared<Waiter>(server_.io_);
      w->isGet = op == kGet;
      if (w->isGet) {
        if (!r.str(&key, kMaxKey, "key", &why)) return malformed("get");
        w->keys.push_back(key);
      } else {
        uint32_t n = 0;
        if (!r.u32(&n)) return malformed("wait");
        if (n > kMaxWaitKeys) {
          why = std::to_string(n) + " keys exceed the limit of " + std::to_string(kMaxWaitKeys);
          return malformed("wait");
        }
        for (uint32_t i = 0; i < n; ++i) {
          if (!r.str(&key, kMaxKey, "key", &why)) return malformed("wait");
          w->keys.push_back(key);
        }
      }
      if (!r.u64(&w->timeoutMs) || !r.done()) return malformed(w->isGet ? "get" : "wait");
      w->timeoutMs = std::min(w->timeoutMs, kMaxWaitMs);
      if (server_.allPresent(*w))
        return send(Writer().raw(w->isGet ? data[w->keys[0]] : std::string()).frame(kReplyOk));
      w->session = shared_from_this();
      waiter_ = w;
      busy_ = true;
      server_.addWaiter(w);
      return;
    }
    default:
      return reject("unknown opcode " + hexByte(op), Code::kProtocolError);
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
    setCloseOnExec(socket.native_handle());
    if (pendingAuth_ >= kMaxPendingAuth) {
      HORA_LOG(logger_, kWarning) << "rejected store client " << peer << ": too many ("
                                  << pendingAuth_ << ") connections still authenticating";
      socket.close(e2);
    } else {
      socket.set_option(tcp::no_delay(true), e2);
      auto session = std::make_shared<Session>(*this, std::move(socket), peer);
      sessions_.insert(session);
      session->start();
    }
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

// ============================================================================
// Client
// ============================================================================

// One authenticated socket with its private io_context, so that each
// operation can run with a deadline (async op + run_until, close on expiry).
class TcpStoreClient::Connection {
 public:
  asio::io_context io;
  tcp::socket socket{io};

  // Starts an async op via start(handler) and runs it until it completes or
  // `deadline` passes (then the socket is closed: the connection is dead).
  template <typename Start>
  error_code run(Clock::time_point deadline, Start start) {
    error_code result = asio::error::would_block;
    bool done = false;
    start([&](const error_code& ec, auto&&...) {
      result = ec;
      done = true;
    });
    io.restart();
    io.run_until(deadline);
    if (!done) {
      error_code ignored;
      socket.close(ignored);
      io.restart();
      io.run();  // lets the aborted handler finish
      return asio::error::timed_out;
    }
    return result;
  }
  error_code write(const std::string& data, Clock::time_point deadline) {
    return run(deadline, [&](auto handler) {
      asio::async_write(socket, asio::buffer(data), std::move(handler));
    });
  }
  error_code read(void* p, size_t n, Clock::time_point deadline) {
    return run(deadline, [&](auto handler) {
      asio::async_read(socket, asio::buffer(p, n), std::move(handler));
    });
  }
};

TcpStoreClient::TcpStoreClient(std::string host, int port, std::string secret,
                               milliseconds connectTimeout, Logger logger)
    : host_(std::move(host)),
      port_(port),
      address_(hostPort(host_, port)),
      secret_(std::move(secret)),
      connectTimeout_(connectTimeout),
      logger_(std::move(logger)) {}

TcpStoreClient::~TcpStoreClient() = default;

Result<std::shared_ptr<TcpStoreClient>> TcpStoreClient::connect(const std::string& host, int port,
                                                                std::string secret,
                                                                milliseconds connectTimeout,
                                                                Logger logger) {
  if (port <= 0 || port > 65535)
    return invalidArgument("store port " + std::to_string(port) + " is out of range");
  if (host.empty()) return invalidArgument("store host is empty (check HORA_STORE_ADDR)");
  std::shared_ptr<TcpStoreClient> client(
      new TcpStoreClient(host, port, std::move(secret), connectTimeout, std::move(logger)));
  connectTimeout = std::clamp(connectTimeout, milliseconds(0), milliseconds(kMaxWaitMs));
  client->connectTimeout_ = connectTimeout;
  auto conn = client->openConnection(Clock::now() + connectTimeout, /*initial=*/true);
  if (!conn.isOk()) return conn.status();
  client->release(conn.take());
  HORA_LOG(client->logger_, kDebug) << "connected to the rendezvous store at " << client->address_;
  return client;
}

Result<std::unique_ptr<TcpStoreClient::Connection>> TcpStoreClient::openConnection(
    Clock::time_point deadline, bool initial) {
  std::string lastError = "no attempt made";
  milliseconds backoff(50);
  for (;;) {
    std::unique_ptr<Connection> conn;
    error_code ec;
    try {
      conn = std::make_unique<Connection>();
      tcp::resolver resolver(conn->io);
      auto endpoints = resolver.resolve(host_, std::to_string(port_), ec);
      if (!ec) {
        ec = conn->run(deadline, [&](auto handler) {
          asio::async_connect(conn->socket, endpoints, std::move(handler));
        });
      }
    } catch (const std::exception& e) {
      return systemError("cannot create a socket for the rendezvous store at " + address_ + ": " +
                         e.what());
    }
    if (!ec) {
      setCloseOnExec(conn->socket.native_handle());
      conn->socket.set_option(tcp::no_delay(true), ec);
      Status st = handshake(*conn, std::max(deadline, Clock::now() + kMinHandshakeTime));
      if (st.isOk()) return conn;
      if (st.code() != Code::kRemoteError) return st;  // auth/protocol failures are final
      lastError = st.message();
    } else {
      lastError = ec.message();
    }
    auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, milliseconds(1000));
  }
  if (!initial)
    return Status(Code::kRemoteError, "lost the rendezvous store at " + address_ +
                                          " and could not reconnect (" + lastError +
                                          "): did rank 0 / the launcher exit?");
  return timeoutError("could not reach the rendezvous store at " + address_ + " within " +
                      formatSeconds(connectTimeout_) +
                      ": is rank 0 / the launcher running, and is HORA_STORE_ADDR right? (last "
                      "error: " +
                      lastError + ")");
}

Status TcpStoreClient::readReply(Connection& conn, Clock::time_point deadline, Reply* out) {
  std::array<unsigned char, kHeaderSize> raw{};
  error_code ec = conn.read(raw.data(), raw.size(), deadline);
  Header h;
  std::string why;
  if (!ec) {
    why = decodeHeader(raw, &h);
    if (why.empty() && h.length > kMaxFrame) why = "oversized reply frame";
    if (!why.empty())
      return protocolError("the server at " + address_ +
                           " does not speak this hora store protocol (" + why + ")");
    out->op = h.op;
    out->payload.resize(h.length);
    if (h.length > 0) ec = conn.read(&out->payload[0], h.length, deadline);
  }
  if (ec == asio::error::timed_out)
    return timeoutError("the rendezvous store at " + address_ + " did not answer in time");
  if (ec)
    return Status(Code::kRemoteError, "lost connection to the rendezvous store at " + address_ +
                                          " (" + ec.message() + ")");
  return Status::ok();
}

Status TcpStoreClient::handshake(Connection& conn, Clock::time_point deadline) {
  Reply r;
  HORA_RETURN_IF_ERROR(readReply(conn, deadline, &r));
  auto serverError = [&](const Reply& reply) {
    Reader rd(reply.payload);
    uint32_t code = 0;
    rd.u32(&code);
    return std::make_pair(static_cast<Code>(code), rd.rest());
  };
  if (r.op == kReplyError)  // e.g. too many connections authenticating: retry
    return Status(Code::kRemoteError, serverError(r).second);
  if (r.op != kChallenge || r.payload.size() != kNonceSize)
    return protocolError("the server at " + address_ +
                         " does not speak the hora store protocol (unexpected handshake frame)");
  error_code ec = conn.write(Writer().raw(authMac(secret_, r.payload)).frame(kAuth), deadline);
  if (ec)
    return Status(Code::kRemoteError, "lost connection to the rendezvous store at " + address_ +
                                          " during the handshake (" + ec.message() + ")");
  HORA_RETURN_IF_ERROR(readReply(conn, deadline, &r));
  if (r.op == kAuthOk && r.payload.empty()) return Status::ok();
  if (r.op == kReplyError) {
    auto [code, message] = serverError(r);
    if (code == Code::kAuthError)
      return Status(Code::kAuthError, "the rendezvous store at " + address_ +
                                          " rejected this process's secret (" + message +
                                          "): check that HORA_SECRET / HORA_SECRET_FILE match the "
                                          "launcher's");
    return Status(Code::kProtocolError,
                  "the rendezvous store at " + address_ + " refused the handshake: " + message);
  }
  return protocolError("the server at " + address_ + " sent an unexpected handshake reply");
}

Result<std::unique_ptr<TcpStoreClient::Connection>> TcpStoreClient::acquire() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!idle_.empty()) {
      auto conn = std::move(idle_.back());
      idle_.pop_back();
      return conn;
    }
  }
  auto window =
      std::min<milliseconds>(std::max(connectTimeout_, milliseconds(0)), kMaxReconnectWindow);
  return openConnection(Clock::now() + window, /*initial=*/false);
}

void TcpStoreClient::release(std::unique_ptr<Connection> conn) {
  std::lock_guard<std::mutex> lk(mu_);
  if (idle_.size() < kMaxIdleConnections) idle_.push_back(std::move(conn));
}

Result<TcpStoreClient::Reply> TcpStoreClient::call(const std::string& frame,
                                                   milliseconds serverWait,
                                                   const std::string& what) {
  auto acquired = acquire();
  if (!acquired.isOk()) return acquired.status().withContext("store " + what);
  std::unique_ptr<Connection> conn = acquired.take();
  auto deadline = Clock::now() + (serverWait.count() > 0 ? serverWait + kReplyGrace
                                                         : milliseconds(kRequestDeadline));
  error_code ec = conn->write(frame, deadline);
  if (ec == asio::error::timed_out)
    return timeoutError("store " + what + ": the rendezvous store at " + address_ +
                        " did not accept the request in time");
  if (ec)
    return Status(Code::kRemoteError, "store " + what +
                                          ": lost connection to the rendezvous "
                                          "store at " +
                                          address_ + " (" + ec.message() + ")");
  Reply reply;
  Status st = readReply(*conn, deadline, &reply);
  if (!st.isOk()) return st.withContext("store " + what);
  switch (reply.op) {
    case kReplyOk:
      release(std::move(conn));
      return reply;
    case kReplyTimeout:
      release(std::move(conn));
      return timeoutError(reply.payload);
    case kReplyError: {
      // The connection is dropped: after a rejection the server closes it.
      Reader rd(reply.payload);
      uint32_t code = 0;
      if (!rd.u32(&code) || code == 0 || code > static_cast<uint32_t>(Code::kInternal))
        return protocolError("store " + what + ": malformed error reply from " + address_);
      return Status(static_cast<Code>(code), rd.rest());
    }
    default:
      return protocolError("store " + what + ": unexpected reply opcode " + hexByte(reply.op) +
                           " from " + address_);
  }
}

namespace {
Status checkKey(const std::string& key) {
  if (key.size() > kMaxKey)
    return invalidArgument("store key of " + std::to_string(key.size()) + " bytes exceeds the " +
                           std::to_string(kMaxKey) + "-byte limit");
  return Status::ok();
}
}  // namespace

Status TcpStoreClient::set(const std::string& key, const std::string& value) {
  HORA_RETURN_IF_ERROR(checkKey(key));
  if (value.size() > kMaxValue)
    return invalidArgument("store value for key '" + key + "' of " + std::to_string(value.size()) +
                           " bytes exceeds the " + std::to_string(kMaxValue) + "-byte limit");
  return call(Writer().str(key).str(value).frame(kSet), milliseconds(0), "set of '" + key + "'")
      .status();
}

Result<std::string> TcpStoreClient::get(const std::string& key, milliseconds timeout) {
  HORA_RETURN_IF_ERROR(checkKey(key));
  uint64_t ms = clampWaitMs(timeout);
  auto r = call(Writer().str(key).u64(ms).frame(kGet), milliseconds(ms), "get of '" + key + "'");
  if (!r.isOk()) return r.status();
  return std::move(r.value().payload);
}

Result<int64_t> TcpStoreClient::add(const std::string& key, int64_t delta) {
  HORA_RETURN_IF_ERROR(checkKey(key));
  auto r = call(Writer().str(key).u64(static_cast<uint64_t>(delta)).frame(kAdd), milliseconds(0),
                "add to '" + key + "'");
  if (!r.isOk()) return r.status();
  Reader rd(r.value().payload);
  uint64_t v = 0;
  if (!rd.u64(&v) || !rd.done())
    return protocolError("store add to '" + key + "': malformed reply from " + address_);
  return static_cast<int64_t>(v);
}

Status TcpStoreClient::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  if (keys.empty()) return Status::ok();
  if (keys.size() > kMaxWaitKeys)
    return invalidArgument("store wait for " + std::to_string(keys.size()) +
                           " keys exceeds the limit of " + std::to_string(kMaxWaitKeys));
  Writer w;
  w.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) {
    HORA_RETURN_IF_ERROR(checkKey(k));
    w.str(k);
  }
  uint64_t ms = clampWaitMs(timeout);
  w.u64(ms);
  return call(w.frame(kWait), milliseconds(ms), "wait for " + std::to_string(keys.size()) + " keys")
      .status();
}

Result<bool> TcpStoreClient::check(const std::string& key) {
  HORA_RETURN_IF_ERROR(checkKey(key));
  auto r = call(Writer().str(key).frame(kCheck), milliseconds(0), "check of '" + key + "'");
  if (!r.isOk()) return r.status();
  Reader rd(r.value().payload);
  uint8_t v = 0;
  if (!rd.u8(&v) || !rd.done() || v > 1)
    return protocolError("store check of '" + key + "': malformed reply from " + address_);
  return v == 1;
}

Status TcpStoreClient::remove(const std::string& key) {
  HORA_RETURN_IF_ERROR(checkKey(key));
  return call(Writer().str(key).frame(kRemove), milliseconds(0), "remove of '" + key + "'")
      .status();
}

}  // namespace hora
