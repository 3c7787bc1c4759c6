// TcpStoreServer / TcpStoreClient: the real rendezvous Store, over TCP.
//
// The launcher (hora_run) or rank 0 starts one TcpStoreServer per job; every
// rank connects a TcpStoreClient to it (HORA_STORE_ADDR) and uses it through
// the Store interface during initialization and process-set creation.
//
// Security: each connection starts with a challenge-response handshake. The
// server sends a random 32-byte nonce; the client answers
// HMAC-SHA256(secret, "hora-store-v1" + nonce); the server compares in
// constant time and drops the peer (logging why and from where) on mismatch.
// An empty secret still runs the handshake with an empty key, and the server
// logs that it is unauthenticated. Malformed, oversized or slow clients are
// rejected and closed without disturbing other connections.
//
// Wire format: length-prefixed frames, 8-byte header
// [magic 'h'][version 2][opcode][flags 0][payload length, u32 little-endian],
// every length bounds-checked (keys <= 4 KiB, values <= 64 MiB).
//
// Threads: the server runs its own io_context on one internal thread; its
// public methods may be called from any thread. The client is thread-safe: each
// call borrows a connection from a small pool (opening another one when all are
// busy), so a blocking get() on one thread does not delay set() on another.
// Every client call is bounded by a deadline and never hangs.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/logging.h"
#include "core/store.h"

namespace hora {

class TcpStoreServer {
 public:
  // Binds bindHost:port (port 0 = an ephemeral port; see port()) and starts
  // serving. bindHost "" means all IPv4 interfaces.
  static Result<std::unique_ptr<TcpStoreServer>> start(const std::string& bindHost, int port,
                                                       std::string secret, Logger logger);
  // Stops accepting, closes every connection and joins the io thread.
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // The bound port (the actual one when started with port 0).
  int port() const;
  // "" or one sentence on the clients refused for a wrong secret (how many,
  // the last one's address): appended to start-up timeouts on the hosting
  // rank, whose peers' only other trace is in their own error. Any thread.
  std::string authRefusals() const;

  // Writes / atomically adds to a key from the hosting process itself (a
  // launcher publishing job facts such as the live worker count), waking
  // clients that wait for it. Safe from any thread except the server's own;
  // blocks until the server thread has applied the change.
  Status set(const std::string& key, const std::string& value);
  Result<int64_t> add(const std::string& key, int64_t delta);
  Result<bool> check(const std::string& key);

 private:
  class Impl;
  explicit TcpStoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class TcpStoreClient : public Store {
 public:
  // Connects and authenticates, retrying refused/failed connections until
  // connectTimeout passes (the server may still be starting). kTimeout names
  // host:port; kAuthError when the server rejects the secret.
  static Result<std::shared_ptr<TcpStoreClient>> connect(const std::string& host, int port,
                                                         std::string secret,
                                                         std::chrono::milliseconds connectTimeout,
                                                         Logger logger);
  ~TcpStoreClient() override;
  TcpStoreClient(const TcpStoreClient&) = delete;
  TcpStoreClient& operator=(const TcpStoreClient&) = delete;

  Status set(const std::string& key, const std::string& value) override;
  Result<std::string> get(const std::string& key, std::chrono::milliseconds timeout) override;
  Result<int64_t> add(const std::string& key, int64_t delta) override;
  Status wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  Result<bool> check(const std::string& key) override;
  Status remove(const std::string& key) override;

  // "host:port" of the server, for messages.
  const std::string& address() const { return address_; }

 private:
  class Connection;
  struct Reply {
    uint8_t op = 0;
    std::string payload;
  };

  TcpStoreClient(std::string host, int port, std::string secret,
                 std::chrono::milliseconds connectTimeout, Logger logger);

  // Opens and authenticates a connection, retrying failed attempts until
  // `deadline`. `initial` selects the wording of the failure (first contact
  // vs. a reconnect after the store was reachable).
  Result<std::unique_ptr<Connection>> openConnection(std::chrono::steady_clock::time_point deadline,
                                                     bool initial);
  Status handshake(Connection& conn, std::chrono::steady_clock::time_point deadline);
  Status readReply(Connection& conn, std::chrono::steady_clock::time_point deadline, Reply* out);
  // Takes an idle pooled connection or opens a new one.
  Result<std::unique_ptr<Connection>> acquire();
  void release(std::unique_ptr<Connection> conn);
  // Sends one encoded request frame and reads its reply; `serverWait` is how
  // long the server may legitimately hold the request (get/wait), `what`
  // names the operation in error messages.
  Result<Reply> call(const std::string& frame, std::chrono::milliseconds serverWait,
                     const std::string& what);

  std::string host_;
  int port_;
  std::string address_;
  std::string secret_;
  std::chrono::milliseconds connectTimeout_;
  Logger logger_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Connection>> idle_;  // guarded by mu_
};

}  // namespace hora
