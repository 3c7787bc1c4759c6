// TcpStoreClient (tcp_store.h): the client half of the rendezvous store; the server is
// tcp_store_server.cc, the wire format tcp_store_wire.h.
#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <cstdio>
#include <thread>

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

constexpr size_t kMaxIdleConnections = 4;
constexpr auto kRequestDeadline = std::chrono::seconds(30);  // set/add/check/remove
constexpr auto kReplyGrace = std::chrono::seconds(5);        // added to get/wait timeouts
constexpr auto kMinHandshakeTime = std::chrono::seconds(2);
constexpr auto kMaxReconnectWindow = std::chrono::seconds(5);

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

}  // namespace

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
    Code code = Code::kProtocolError;
    std::string message;
    if (!parseErrorReply(reply.payload, &code, &message))
      message = "malformed error reply (" + std::to_string(reply.payload.size()) + " bytes)";
    return std::make_pair(code, message);
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
      Code code = Code::kProtocolError;
      std::string message;
      if (!parseErrorReply(reply.payload, &code, &message))
        return protocolError("store " + what + ": malformed error reply from " + address_);
      return Status(code, message);
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
