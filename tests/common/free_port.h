// freePort: a TCP port on 127.0.0.1 for a test's store or server, claimed
// against every other test running at the same time (unit and multirank
// tests alike; tests/launcher/lib.sh claim_port and the Python harness use
// the same directory of locks). Header-only so that both test trees share it.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

namespace htest {

namespace free_port_detail {

// Whether something could bind 127.0.0.1:port right now.
inline bool bindable(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

// The first port of the kernel's ephemeral range (what binding port 0 and
// outgoing connections draw from).
inline int ephemeralLow() {
  int lo = 32768, hi = 60999;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768;
    std::fclose(f);
  }
  return lo;
}

}  // namespace free_port_detail

// Not a port from the ephemeral range: between this check and the caller's
// bind, any socket of any process (a concurrently running test's Gloo or
// control-plane listener, an outgoing connection) may be given it, which
// once failed a test with "Address already in use". Below that range only
// sockets that ask for a port by number get one, and among the tests an
// flock on a file named after the port makes the claim exclusive; the lock
// lasts as long as this process (its children inherit it). Nothing listens
// on the port until the caller binds it.
inline int freePort() {
  const int hi = free_port_detail::ephemeralLow(), lo = 10000;
  if (hi - lo < 1000) std::abort();  // an unusual ephemeral range: no room below it
  const std::string dir = "/tmp/hora-test-ports";
  ::mkdir(dir.c_str(), 0777);
  std::random_device seed;
  std::mt19937 gen(seed());
  std::uniform_int_distribution<int> pick(lo, hi - 1);
  for (int attempt = 0; attempt < 10000; ++attempt) {
    const int port = pick(gen);
    const std::string path = dir + "/" + std::to_string(port);
    const int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0666);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && free_port_detail::bindable(port))
      return port;  // fd stays open: the claim
    ::close(fd);
  }
  std::fprintf(stderr, "freePort: no free port in %d..%d after 10000 tries\n", lo, hi - 1);
  std::abort();
}

}  // namespace htest
