#include "ops/p2p/p2p_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace hora {
namespace {

std::string err(int e) { return std::strerror(e); }

void tune(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

// Waits for `events` on fd; false on timeout or error.
bool waitFor(int fd, short events, int timeoutMs) {
  struct pollfd p {
    fd, events, 0
  };
  int rc;
  do rc = ::poll(&p, 1, timeoutMs);
  while (rc < 0 && errno == EINTR);
  return rc > 0 && (p.revents & events);
}

}  // namespace

Result<int> p2pListen(const std::string& host, int* port) {
  struct addrinfo hints {
  }, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), "0", &hints, &res);
  if (rc != 0)
    return systemError("point-to-point: cannot resolve this rank's address \"" + host +
                       "\": " + ::gai_strerror(rc) + " (HORA_HOSTNAME sets it)");
  Status last = systemError("point-to-point: no address to listen on for \"" + host + "\"");
  for (auto* a = res; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 64) == 0) {
      struct sockaddr_storage ss;
      socklen_t len = sizeof ss;
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
      *port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
      ::freeaddrinfo(res);
      return fd;
    }
    last = systemError("point-to-point: cannot listen on \"" + host + "\": " + err(errno));
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return last;
}

Result<int> p2pConnect(const std::string& host, int port, const P2pHello& hello, int timeoutMs) {
  const std::string where = host + ":" + std::to_string(port);
  struct addrinfo hints {
  }, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0)
    return systemError("point-to-point: cannot resolve " + where + ": " + ::gai_strerror(rc));
  Status last = Status(Code::kRemoteError, "point-to-point: cannot connect to " + where);
  for (auto* a = res; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      int soerr = ETIMEDOUT;
      socklen_t len = sizeof soerr;
      if (waitFor(fd, POLLOUT, timeoutMs)) ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
      rc = soerr == 0 ? 0 : -1;
      errno = soerr;
    }
    if (rc != 0) {
      last = Status(Code::kRemoteError,
                    "point-to-point: cannot connect to " + where + ": " + err(errno));
      ::close(fd);
      continue;
    }
    tune(fd);
    size_t sent = 0;
    while (sent < sizeof hello) {
      ssize_t n = ::send(fd, reinterpret_cast<const char*>(&hello) + sent, sizeof hello - sent,
                         MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        if (!waitFor(fd, POLLOUT, timeoutMs)) break;
      } else {
        break;
      }
    }
    if (sent < sizeof hello) {
      last = Status(Code::kRemoteError,
                    "point-to-point: " + where + " closed the connection during the hello");
      ::close(fd);
      continue;
    }
    ::freeaddrinfo(res);
    return fd;
  }
  ::freeaddrinfo(res);
  return last;
}

Result<int> p2pAccept(int listenFd, P2pHello* hello, int timeoutMs) {
  int fd = ::accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED)
      return -1;
    return systemError("point-to-point: accept failed: " + err(errno));
  }
  tune(fd);
  size_t got = 0;
  while (got < sizeof *hello) {
    ssize_t n = ::recv(fd, reinterpret_cast<char*>(hello) + got, sizeof *hello - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!waitFor(fd, POLLIN, timeoutMs)) break;
    } else {
      break;
    }
  }
  if (got < sizeof *hello) {
    ::close(fd);
    return protocolError("point-to-point: a connection to this rank's listener sent no hello");
  }
  return fd;
}

Result<size_t> p2pSend(int fd, const void* data, size_t n) {
  for (;;) {
    ssize_t k = ::send(fd, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k >= 0) return static_cast<size_t>(k);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
    return Status(Code::kRemoteError, "the connection broke while sending (" + err(errno) + ")");
  }
}

Result<size_t> p2pRecv(int fd, void* data, size_t n, bool* eof) {
  *eof = false;
  if (n == 0) return size_t{0};
  for (;;) {
    ssize_t k = ::recv(fd, data, n, MSG_DONTWAIT);
    if (k > 0) return static_cast<size_t>(k);
    if (k == 0) {
      *eof = true;
      return size_t{0};
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
    return Status(Code::kRemoteError, "the connection broke while receiving (" + err(errno) + ")");
  }
}

void p2pClose(int fd) noexcept {
  if (fd >= 0) ::close(fd);
}

}  // namespace hora
