// TcpRingBackend (ops/tcp/tcp_ring.h): connecting the ring, the ring
// allreduce's byte streams, waiting on the sockets.
#include "ops/tcp/tcp_ring.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>

#include "core/cpu_relax.h"
#include "core/reduce.h"
#include "ops/p2p/p2p_socket.h"

namespace hora {

namespace {

using Clock = std::chrono::steady_clock;

std::string randomToken() {
  std::random_device rd;
  std::ostringstream os;
  os << std::hex;
  while (os.str().size() < 31) os << rd();
  return os.str().substr(0, 31);
}

std::string seconds(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

// The IPv4 address of interface `name` (HORA_GLOO_IFACE), or "".
std::string interfaceAddress(const std::string& name) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string out;
  for (ifaddrs* i = list; i != nullptr && out.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || name != i->ifa_name)
      continue;
    char buf[INET_ADDRSTRLEN] = {0};
    const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf)) out = buf;
  }
  ::freeifaddrs(list);
  return out;
}

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

int toMs(std::chrono::milliseconds d) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(d.count(), 1 << 30)));
}

}  // namespace

// The ring's byte streams of one collective over n segments: step k sends
// segment (rank - k - shift) mod n and receives segment (rank - k - 1 -
// shift) mod n; the first reduceSteps steps reduce what they receive
// (reduce-scatter), the copySteps after them copy it into place (allgather).
// Step k+1 sends exactly the segment step k received, so it may send a byte
// once step k has made it final.
//   allreduce:     equal segments, shift 0, n-1 reduce + n-1 copy steps
//                  (rank r owns segment r+1 after the reduce steps);
//   reducescatter: segment r is rank r's counts, shift 1, n-1 reduce steps
//                  (rank r ends owning segment r);
//   allgather:     segment r is rank r's part, shift 0, n-1 copy steps
//                  (each rank starts owning its own segment).
struct TcpRingBackend::Plan {
  int n = 1, rank = 0, shift = 0, reduceSteps = 0, copySteps = 0;
  size_t es = 1;
  std::vector<size_t> begin;  // n + 1 element offsets
  int steps() const { return reduceSteps + copySteps; }
  size_t segBegin(int seg) const { return begin[seg]; }
  size_t segBytes(int seg) const { return (begin[seg + 1] - begin[seg]) * es; }
  int mod(int x) const { return (x % n + n) % n; }
  int sendSeg(int k) const { return mod(rank - k - shift); }
  int recvSeg(int k) const { return mod(rank - k - 1 - shift); }
  bool reduces(int k) const { return k < reduceSteps; }
};

namespace {
TcpRingBackend::Plan equalPlan(int n, int rank, size_t count, size_t es) {
  TcpRingBackend::Plan p;
  p.n = n;
  p.rank = rank;
  p.es = es;
  for (int s = 0; s <= n; ++s) p.begin.push_back(count * static_cast<size_t>(s) / n);
  return p;
}

TcpRingBackend::Plan countsPlan(int n, int rank, const std::vector<size_t>& counts, size_t es) {
  TcpRingBackend::Plan p;
  p.n = n;
  p.rank = rank;
  p.es = es;
  p.begin.push_back(0);
  for (size_t c : counts) p.begin.push_back(p.begin.back() + c);
  return p;
}
}  // namespace

TcpRingBackend::TcpRingBackend(int rank, int size, TcpRingOptions opts)
    : rank_(rank), size_(size), opts_(std::move(opts)) {
  abortFd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
}

TcpRingBackend::~TcpRingBackend() {
  p2pClose(sendFd_);
  p2pClose(recvFd_);
  if (abortFd_ >= 0) ::close(abortFd_);
}

namespace {
std::string rankName(const TcpRingOptions& o, int r) {
  return r >= 0 && r < static_cast<int>(o.rankNames.size()) ? o.rankNames[r]
                                                            : "ring rank " + std::to_string(r);
}
}  // namespace

std::string TcpRingBackend::peerName(int r) const {
  const std::string who = rankName(opts_, r);
  const std::string& addr = r == (rank_ + 1) % size_ ? nextAddr_ : prevAddr_;
  return who + " (" + addr + ")";
}

Status TcpRingBackend::abortedStatus(const std::string& what) const {
  return Status(Code::kRemoteError, what + ": aborted (a peer rank was lost)");
}

void TcpRingBackend::closeStreams() noexcept {
  // shutdown, not close: the descriptors stay valid for a poll in progress
  // on the calling thread, and the neighbours see the end of stream at once
  // instead of waiting HORA_PEER_TIMEOUT_S for bytes that will not come.
  if (sendFd_ >= 0) ::shutdown(sendFd_, SHUT_RDWR);
  if (recvFd_ >= 0) ::shutdown(recvFd_, SHUT_RDWR);
}

void TcpRingBackend::abort() noexcept {
  aborted_.store(true, std::memory_order_release);
  if (abortFd_ >= 0) {
    uint64_t one = 1;
    (void)!::write(abortFd_, &one, sizeof one);
  }
  closeStreams();
}

Status TcpRingBackend::waitReady(bool wantSend, bool wantRecv, Clock::time_point lastProgress,
                                 const std::string& what) {
  // Poll first: the bytes of a small exchange are usually back within a few
  // microseconds, and a sleeping thread pays a wake-up to see them.
  struct pollfd fds[3];
  int nfds = 0;
  const int next = (rank_ + 1) % size_, prev = (rank_ - 1 + size_) % size_;
  if (wantSend) fds[nfds++] = {sendFd_, POLLOUT, 0};
  if (wantRecv) fds[nfds++] = {recvFd_, POLLIN, 0};
  const int ready = nfds;
  if (abortFd_ >= 0) fds[nfds++] = {abortFd_, POLLIN, 0};
  auto timedOut = [&] {
    std::string peer = wantRecv ? peerName(prev) : peerName(next);
    if (wantRecv && wantSend && next != prev) peer += " and " + peerName(next);
    return Status(Code::kTimeout, what + ": no progress with " + peer + " for " +
                                      seconds(opts_.timeout) +
                                      " (the peer stalled or its host is unreachable; "
                                      "HORA_PEER_TIMEOUT_S bounds this wait)");
  };
  if (Clock::now() - lastProgress >= opts_.timeout) return timedOut();
  const auto spinUntil = Clock::now() + opts_.spin;
  for (unsigned looks = 0;; ++looks) {
    if (aborted_.load(std::memory_order_acquire)) return abortedStatus(what);
    // A yield may cost a time slice: then the clock is read every look.
    const bool look = !opts_.yieldWhilePolling && (looks & 63) != 0;
    if (!look && Clock::now() >= spinUntil) break;
    int rc = ::poll(fds, static_cast<nfds_t>(ready), 0);
    if (rc > 0) return Status();
    if (opts_.yieldWhilePolling)
      ::sched_yield();
    else
      cpuRelax();
  }
  for (;;) {
    const auto now = Clock::now();
    if (now - lastProgress >= opts_.timeout) return timedOut();
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(opts_.timeout - (now - lastProgress));
    int rc = ::poll(fds, static_cast<nfds_t>(nfds), std::min(toMs(left), 1000));
    if (rc < 0 && errno != EINTR)
      return systemError(what + ": poll failed: " + std::strerror(errno));
    if (aborted_.load(std::memory_order_acquire)) return abortedStatus(what);
    for (int i = 0; rc > 0 && i < ready; ++i)
      if (fds[i].revents != 0) return Status();
  }
}

Status TcpRingBackend::sendSome(const uint8_t* from, size_t bytes, size_t* moved,
                                const std::string& what) {
  *moved = 0;
  auto n = p2pSend(sendFd_, from, bytes);
  if (!n.isOk() && aborted_.load(std::memory_order_acquire)) return abortedStatus(what);
  if (!n.isOk())
    return Status(Code::kRemoteError, what + ": sending to " + peerName((rank_ + 1) % size_) +
                                          ": " + n.status().message() +
                                          " (that rank was lost or aborted)");
  *moved = n.value();
  return Status();
}

Status TcpRingBackend::recvSome(uint8_t* into, size_t bytes, size_t* moved,
                                const std::string& what) {
  *moved = 0;
  bool eof = false;
  auto n = p2pRecv(recvFd_, into, bytes, &eof);
  if ((!n.isOk() || eof) && aborted_.load(std::memory_order_acquire)) return abortedStatus(what);
  if (!n.isOk() || eof)
    return Status(Code::kRemoteError,
                  what + ": receiving from " + peerName((rank_ - 1 + size_) % size_) + ": " +
                      (eof ? std::string("the peer closed the connection") : n.status().message()) +
                      " (that rank was lost or aborted)");
  *moved = n.value();
  return Status();
}

Status TcpRingBackend::ring(uint8_t* data, const Plan& p, ReduceFn reduce,
                            const std::string& what) {
  size_t maxSeg = 0;
  for (int s = 0; s < p.n && p.reduceSteps > 0; ++s) maxSeg = std::max(maxSeg, p.segBytes(s));
  if (scratch_.size() < maxSeg) scratch_.resize(maxSeg);
  const int steps = p.steps();
  // Send side: step, bytes of it sent. Receive side: step, bytes of it
  // received, of them final (reduced, or copied into place).
  int sk = 0, rk = 0;
  size_t sent = 0, got = 0, done = 0;
  // Reduce the received bytes in pieces, so that the next step can forward
  // the first ones while later ones still arrive; whole elements only.
  const size_t piece = std::max<size_t>(p.es, (size_t{64} << 10) / p.es * p.es);
  auto finalBytes = [&](int k) -> size_t {
    if (k < rk) return p.segBytes(p.recvSeg(k));
    return k == rk ? done : 0;
  };
  auto lastProgress = Clock::now();
  auto aborted = [&] { return abortedStatus(what); };
  while (sk < steps || rk < steps) {
    if (aborted_.load(std::memory_order_acquire)) return aborted();
    bool moved = false;
    // Steps whose segment is empty complete at once on both sides.
    while (sk < steps && sent == p.segBytes(p.sendSeg(sk))) {
      ++sk;
      sent = 0;
    }
    while (rk < steps && done == p.segBytes(p.recvSeg(rk))) {
      ++rk;
      got = done = 0;
    }
    if (sk >= steps && rk >= steps) break;
    bool wantSend = false, wantRecv = false;
    if (sk < steps) {
      const int seg = p.sendSeg(sk);
      const size_t ready = sk == 0 ? p.segBytes(seg) : finalBytes(sk - 1);
      if (sent < ready) {
        size_t n = 0;
        HORA_RETURN_IF_ERROR(
            sendSome(data + p.segBegin(seg) * p.es + sent, ready - sent, &n, what));
        if (n > 0) {
          sent += n;
          moved = true;
        } else {
          wantSend = true;
        }
      }
    }
    if (rk < steps) {
      const int seg = p.recvSeg(rk);
      const size_t bytes = p.segBytes(seg);
      uint8_t* into = p.reduces(rk) ? scratch_.data() : data + p.segBegin(seg) * p.es;
      if (got < bytes) {
        size_t n = 0;
        HORA_RETURN_IF_ERROR(recvSome(into + got, bytes - got, &n, what));
        if (n > 0) {
          got += n;
          moved = true;
        } else {
          wantRecv = true;
        }
      }
      // Make final what arrived: whole elements, a piece at a time unless
      // the step is complete.
      const size_t whole = got / p.es * p.es;
      if (!p.reduces(rk)) {
        done = whole;
      } else if (whole > done && (whole - done >= piece || whole == bytes)) {
        uint8_t* acc = data + p.segBegin(seg) * p.es + done;
        reduce(acc, scratch_.data() + done, acc, (whole - done) / p.es);
        done = whole;
        moved = true;
      }
    }
    if (moved) {
      lastProgress = Clock::now();
      continue;
    }
    if (!wantSend && !wantRecv)
      return Status(Code::kInternal, what + ": nothing to send or receive, and not done (step " +
                                         std::to_string(sk) + "/" + std::to_string(rk) + ")");
    Status s = waitReady(wantSend, wantRecv, lastProgress, what);
    if (!s.isOk()) return s;
  }
  return Status();
}

Status TcpRingBackend::chain(uint8_t* data, size_t bytes, int root, const std::string& what) {
  // The root's bytes go around the ring: each rank forwards what it has
  // received at once, so for large buffers every link carries the payload
  // at the same time (a pipeline), and the last rank before the root only
  // receives.
  const bool receives = rank_ != root, sends = (rank_ + 1) % size_ != root;
  size_t got = receives ? 0 : bytes, sent = sends ? 0 : bytes;
  auto lastProgress = Clock::now();
  while (got < bytes || sent < bytes) {
    if (aborted_.load(std::memory_order_acquire)) return abortedStatus(what);
    bool moved = false, wantSend = false, wantRecv = false;
    if (sent < got) {
      size_t n = 0;
      HORA_RETURN_IF_ERROR(sendSome(data + sent, got - sent, &n, what));
      if (n > 0) {
        sent += n;
        moved = true;
      } else {
        wantSend = true;
      }
    }
    if (got < bytes) {
      size_t n = 0;
      HORA_RETURN_IF_ERROR(recvSome(data + got, bytes - got, &n, what));
      if (n > 0) {
        got += n;
        moved = true;
      } else {
        wantRecv = true;
      }
    }
    if (moved) {
      lastProgress = Clock::now();
      continue;
    }
    Status s = waitReady(wantSend, wantRecv, lastProgress, what);
    if (!s.isOk()) return s;
  }
  return Status();
}

Status TcpRingBackend::run(const std::string& what, const std::function<Status()>& call) {
  Status s;
  try {
    s = call();
  } catch (const std::exception& e) {
    s = Status(Code::kInternal, what + ": " + e.what());
  }
  if (!s.isOk()) {
    broken_ = s;
    closeStreams();  // the neighbours fail now, not after their timeout
  }
  return s;
}

Status TcpRingBackend::usable(const std::string& what) const {
  if (!broken_.isOk())
    return Status(broken_.code(), what + ": the ring failed before: " + broken_.message());
  if (aborted_.load(std::memory_order_acquire)) return abortedStatus(what);
  return Status();
}

std::string TcpRingBackend::describe(const char* op, size_t count, DataType dtype) const {
  return std::string(op) + " on the tcp ring (" + std::to_string(count) + " x " +
         dataTypeName(dtype) + ", ring rank " + std::to_string(rank_) + " of " +
         std::to_string(size_) + ")";
}

Status TcpRingBackend::allreduce(void* data, size_t count, DataType dtype, ReduceOp op) {
  const std::string what = std::string("allreduce on the tcp ring (") + std::to_string(count) +
                           " x " + dataTypeName(dtype) + ", " + reduceOpName(op) + ", ring rank " +
                           std::to_string(rank_) + " of " + std::to_string(size_) + ")";
  HORA_RETURN_IF_ERROR(usable(what));
  if (size_ == 1 || count == 0) return Status();
  // Bad arguments move no byte: the ring stays usable.
  if (data == nullptr) return invalidArgument(what + ": null buffer");
  const ReduceFn reduce = reduceFunction(dtype, op);
  if (reduce == nullptr)
    return invalidArgument(what + ": no " + reduceOpName(op) + " for " + dataTypeName(dtype));
  Plan p = equalPlan(size_, rank_, count, dataTypeSize(dtype));
  p.reduceSteps = p.copySteps = size_ - 1;
  return run(what, [&] { return ring(static_cast<uint8_t*>(data), p, reduce, what); });
}

Status TcpRingBackend::reducescatter(void* inout, const std::vector<size_t>& counts, DataType dtype,
                                     ReduceOp op) {
  const bool shaped = counts.size() == static_cast<size_t>(size_);
  size_t total = 0;
  for (size_t c : counts) total += c;
  const std::string what = describe("reducescatter", total, dtype);
  HORA_RETURN_IF_ERROR(usable(what));
  if (!shaped)
    return invalidArgument(what + ": expected " + std::to_string(size_) + " counts, got " +
                           std::to_string(counts.size()));
  if (size_ == 1 || total == 0) return Status();
  if (inout == nullptr) return invalidArgument(what + ": null buffer");
  const ReduceFn reduce = reduceFunction(dtype, op);
  if (reduce == nullptr)
    return invalidArgument(what + ": no " + reduceOpName(op) + " for " + dataTypeName(dtype));
  Plan p = countsPlan(size_, rank_, counts, dataTypeSize(dtype));
  p.shift = 1;
  p.reduceSteps = size_ - 1;
  return run(what, [&] { return ring(static_cast<uint8_t*>(inout), p, reduce, what); });
}

Status TcpRingBackend::allgatherv(const void* in, void* out, const std::vector<size_t>& counts,
                                  DataType dtype) {
  const bool shaped = counts.size() == static_cast<size_t>(size_);
  size_t total = 0;
  for (size_t c : counts) total += c;
  const std::string what = describe("allgatherv", total, dtype);
  HORA_RETURN_IF_ERROR(usable(what));
  if (!shaped)
    return invalidArgument(what + ": expected " + std::to_string(size_) + " counts, got " +
                           std::to_string(counts.size()));
  if (total == 0) return Status();
  const size_t es = dataTypeSize(dtype);
  if (out == nullptr || (counts[rank_] > 0 && in == nullptr))
    return invalidArgument(what + ": null buffer");
  Plan p = countsPlan(size_, rank_, counts, es);
  uint8_t* mine = static_cast<uint8_t*>(out) + p.segBegin(rank_) * es;
  if (counts[rank_] > 0 && in != mine) std::memmove(mine, in, counts[rank_] * es);
  if (size_ == 1) return Status();
  p.copySteps = size_ - 1;
  return run(what, [&] { return ring(static_cast<uint8_t*>(out), p, nullptr, what); });
}

Status TcpRingBackend::broadcast(void* data, size_t count, DataType dtype, int root) {
  const std::string what =
      describe("broadcast", count, dtype) + " from ring rank " + std::to_string(root);
  HORA_RETURN_IF_ERROR(usable(what));
  if (root < 0 || root >= size_) return invalidArgument(what + ": no such root");
  if (size_ == 1 || count == 0) return Status();
  if (data == nullptr) return invalidArgument(what + ": null buffer");
  return run(what, [&] {
    return chain(static_cast<uint8_t*>(data), count * dataTypeSize(dtype), root, what);
  });
}

Status TcpRingBackend::barrier() {
  const std::string what = "barrier on the tcp ring (ring rank " + std::to_string(rank_) + " of " +
                           std::to_string(size_) + ")";
  HORA_RETURN_IF_ERROR(usable(what));
  if (size_ == 1) return Status();
  // An allreduce of one byte: its result depends on every rank's input, so
  // no rank returns before all have arrived (the byte goes round twice).
  uint8_t byte = 1;
  Plan p = equalPlan(size_, rank_, 1, 1);
  p.reduceSteps = p.copySteps = size_ - 1;
  const ReduceFn reduce = reduceFunction(DataType::kUint8, ReduceOp::kMax);
  return run(what, [&] { return ring(&byte, p, reduce, what); });
}

Status TcpRingBackend::alltoallv(const void*, const std::vector<int64_t>&, void*,
                                 const std::vector<int64_t>&, DataType) {
  return Status(Code::kNotSupported,
                "tcp ring: alltoallv is not carried here (every rank sends to every other; the "
                "set runs it on its Gloo backend)");
}

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
    host = interfaceAddress(opts.iface);
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
  const std::string token = randomToken();
  Status s =
      store->set("tcp/" + std::to_string(rank), host + "\n" + std::to_string(port) + "\n" + token);
  if (!s.isOk()) return s.withContext("tcp ring: publishing this rank's address");

  // Connect to rank + 1 with the token it published.
  auto v =
      store->get("tcp/" + std::to_string(next), std::max(left(), std::chrono::milliseconds(1)));
  if (!v.isOk())
    return v.status().withContext("tcp ring: waiting for " + rankName(opts, next) + "'s address");
  const Entry them = parseEntry(v.value());
  b->nextAddr_ = them.address();
  P2pHello hello{};
  hello.magic = kP2pHelloMagic;
  hello.rank = rank;
  std::snprintf(hello.token, sizeof hello.token, "%s", them.token.c_str());
  auto c = p2pConnect(them.host, std::atoi(them.port.c_str()), hello, toMs(left()));
  if (!c.isOk()) return c.status().withContext("tcp ring: connecting to " + b->peerName(next));
  b->sendFd_ = c.value();

  // Accept rank - 1: only a connection that presents this rank's token.
  while (b->recvFd_ < 0) {
    if (left().count() <= 0)
      return Status(Code::kTimeout, "tcp ring: " + rankName(opts, prev) +
                                        " did not connect within " + seconds(opts.startTimeout) +
                                        " (HORA_START_TIMEOUT_S)");
    if (opts.setUpWatch) {
      Status w = opts.setUpWatch();
      if (!w.isOk())
        return w.withContext("tcp ring: waiting for " + rankName(opts, prev) + " to connect");
    }
    struct pollfd pf {
      listenFd, POLLIN, 0
    };
    (void)::poll(&pf, 1, std::min(toMs(left()), 100));
    P2pHello in{};
    auto a = p2pAccept(listenFd, &in, std::min(toMs(left()), 5000));
    if (!a.isOk() && a.status().code() == Code::kSystemError)
      return a.status().withContext("tcp ring: accepting " + rankName(opts, prev));
    if (!a.isOk() || a.value() < 0) continue;  // nothing pending, or no hello: keep waiting
    in.token[sizeof in.token - 1] = 0;
    if (in.magic != kP2pHelloMagic || in.rank != prev || token != in.token) {
      p2pClose(a.value());  // a stranger, or not the ring's left neighbour
      continue;
    }
    b->recvFd_ = a.value();
  }
  auto pv = store->get("tcp/" + std::to_string(prev), std::chrono::milliseconds(1));
  if (pv.isOk()) b->prevAddr_ = parseEntry(pv.value()).address();
  return std::unique_ptr<Backend>(std::move(b));
}

Result<std::unique_ptr<Backend>> withTcpRing(std::shared_ptr<Store> store, int rank, int size,
                                             const std::string& refusal, const TcpRingOptions& opts,
                                             std::unique_ptr<Backend> rest, std::string* whyNot) {
  whyNot->clear();
  const std::string mine = refusal.empty() ? "tcp" : "no " + refusal;
  Status s = store->set("want/" + std::to_string(rank), mine);
  if (!s.isOk()) return s.withContext("tcp ring: publishing this rank's choice");
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    auto v = store->get("want/" + std::to_string(r), opts.startTimeout);
    if (!v.isOk()) return v.status().withContext("tcp ring: waiting for " + rankName(opts, r));
    if (v.value() != "tcp" && whyNot->empty())
      *whyNot = rankName(opts, r) + " keeps Gloo (" +
                v.value().substr(std::min<size_t>(3, v.value().size())) + ")";
  }
  if (!refusal.empty()) *whyNot = refusal;
  if (!whyNot->empty()) return rest;
  auto ring = createTcpRingBackend(store, rank, size, opts);
  if (!ring.isOk()) return ring.status().withContext("tcp ring");
  return std::unique_ptr<Backend>(new RingPlaneBackend(ring.take(), std::move(rest)));
}

}  // namespace hora
