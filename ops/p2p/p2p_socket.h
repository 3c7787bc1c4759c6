// Sockets for point-to-point between ranks on different hosts: a TCP byte
// stream per pair of ranks, carrying the same frames as the shared-memory
// rings (ops/p2p/p2p_engine.h).
//
// The rank with the lower set rank connects; the other accepts. The
// connector proves it read the acceptor's entry in the job's authenticated
// store by sending the random token published there, so a stranger that
// finds the port cannot inject frames.
//
// Used by the engine's progress (under the engine's lock): connecting and
// accepting block for at most a few seconds, once per pair; data calls
// never block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace hora {

struct P2pHello {
  uint32_t magic;
  int32_t rank;    // the connector's set rank
  char token[32];  // the acceptor's token, from the store
  uint8_t pad[24];
};
constexpr uint32_t kP2pHelloMagic = 0x68327068;  // "h2ph"

// A non-blocking listening socket on `host` (any port); *port gets it.
Result<int> p2pListen(const std::string& host, int* port);
// Connects to host:port within `timeoutMs`, sends the hello, returns a
// non-blocking socket with TCP_NODELAY.
Result<int> p2pConnect(const std::string& host, int port, const P2pHello& hello, int timeoutMs);
// Accepts one pending connection and reads its hello (waiting at most
// `timeoutMs` for it); -1 when none is pending. The socket is non-blocking.
Result<int> p2pAccept(int listenFd, P2pHello* hello, int timeoutMs);
// Non-blocking transfer: bytes moved (0: would block). Errors: kRemoteError
// for a reset or, on receive, the peer's end of stream (*eof set).
Result<size_t> p2pSend(int fd, const void* data, size_t n);
Result<size_t> p2pRecv(int fd, void* data, size_t n, bool* eof);
void p2pClose(int fd) noexcept;

}  // namespace hora
