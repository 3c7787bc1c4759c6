// TcpRingBackend (ops/tcp/tcp_ring.h): the collectives' byte streams
// (ring, chain, mesh exchange) and waiting on the sockets; connecting them
// is in tcp_ring_setup.cc.
#include "ops/tcp/tcp_ring.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/cpu_relax.h"
#include "core/reduce.h"
#include "ops/p2p/p2p_socket.h"
#include "ops/tcp/tcp_ring_internal.h"

namespace hora {

using namespace tcp_ring_detail;  // NOLINT: this file's own helpers

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
  // Segment s: count * s / n onwards (equal parts), or counts[s] elements.
  static Plan equal(int n, int rank, size_t count, size_t es);
  static Plan ofCounts(int n, int rank, const std::vector<size_t>& counts, size_t es);
};

TcpRingBackend::Plan TcpRingBackend::Plan::equal(int n, int rank, size_t count, size_t es) {
  Plan p;
  p.n = n;
  p.rank = rank;
  p.es = es;
  for (int s = 0; s <= n; ++s) p.begin.push_back(count * static_cast<size_t>(s) / n);
  return p;
}

TcpRingBackend::Plan TcpRingBackend::Plan::ofCounts(int n, int rank,
                                                    const std::vector<size_t>& counts, size_t es) {
  Plan p;
  p.n = n;
  p.rank = rank;
  p.es = es;
  p.begin.push_back(0);
  for (size_t c : counts) p.begin.push_back(p.begin.back() + c);
  return p;
}

TcpRingBackend::TcpRingBackend(int rank, int size, TcpRingOptions opts)
    : rank_(rank), size_(size), opts_(std::move(opts)) {
  abortFd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
}

TcpRingBackend::~TcpRingBackend() {
  p2pClose(sendFd_);
  p2pClose(recvFd_);
  for (int fd : meshFd_) p2pClose(fd);
  if (abortFd_ >= 0) ::close(abortFd_);
}

std::string TcpRingBackend::peerName(int r) const {
  const std::string who = rankName(opts_, r);
  const bool known = r >= 0 && r < static_cast<int>(addr_.size()) && !addr_[r].empty();
  return known ? who + " (" + addr_[r] + ")" : who;
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
  for (int fd : meshFd_)
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
}

void TcpRingBackend::abort() noexcept {
  aborted_.store(true, std::memory_order_release);
  if (abortFd_ >= 0) {
    uint64_t one = 1;
    (void)!::write(abortFd_, &one, sizeof one);
  }
  closeStreams();
}

Status TcpRingBackend::waitRing(bool wantSend, bool wantRecv, Clock::time_point lastProgress,
                                const std::string& what) {
  struct pollfd fds[2];
  int n = 0;
  const int next = nextRank(), prev = prevRank();
  if (wantSend) fds[n++] = {sendFd_, POLLOUT, 0};
  if (wantRecv) fds[n++] = {recvFd_, POLLIN, 0};
  return waitReady(fds, n, lastProgress, what, [&] {
    std::string peer = wantRecv ? peerName(prev) : peerName(next);
    if (wantRecv && wantSend && next != prev) peer += " and " + peerName(next);
    return peer;
  });
}

Status TcpRingBackend::waitReady(const struct pollfd* wanted, int count,
                                 Clock::time_point lastProgress, const std::string& what,
                                 const std::function<std::string()>& peers) {
  // Poll first: the bytes of a small exchange are usually back within a few
  // microseconds, and a sleeping thread pays a wake-up to see them.
  std::vector<struct pollfd> fds(wanted, wanted + count);
  const int ready = count;
  // A socket this rank only sends on hears nothing from its peer, unless
  // the peer shut its end down (it failed or aborted): with bytes still
  // unread there, nothing else would ever wake this wait (no reset comes
  // while the peer's descriptor stays open), so ask for that too.
  for (auto& f : fds)
    if ((f.events & POLLOUT) && !(f.events & POLLIN)) f.events |= POLLRDHUP;
  auto peerClosed = [&]() -> Status {
    for (int i = 0; i < ready; ++i) {
      if (!(fds[i].events & POLLRDHUP) || !(fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)))
        continue;
      if (aborted_.load(std::memory_order_acquire)) return abortedStatus(what);
      return Status(Code::kRemoteError, what + ": sending to " + peerName(peerOf(fds[i].fd)) +
                                            ": the peer shut its connection down (that rank was "
                                            "lost or aborted)");
    }
    return Status();
  };
  if (abortFd_ >= 0) fds.push_back({abortFd_, POLLIN, 0});
  auto timedOut = [&] {
    return Status(Code::kTimeout, what + ": no progress with " + peers() + " for " +
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
    int rc = ::poll(fds.data(), static_cast<nfds_t>(ready), 0);
    if (rc > 0) return peerClosed();
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
    int rc = ::poll(fds.data(), static_cast<nfds_t>(fds.size()), std::min(toMs(left), 1000));
    if (rc < 0 && errno != EINTR)
      return systemError(what + ": poll failed: " + std::strerror(errno));
    if (aborted_.load(std::memory_order_acquire)) return abortedStatus(what);
    for (int i = 0; rc > 0 && i < ready; ++i)
      if (fds[i].revents != 0) return peerClosed();
  }
}

int TcpRingBackend::peerOf(int fd) const {
  if (fd == sendFd_) return nextRank();
  if (fd == recvFd_) return prevRank();
  for (size_t q = 0; q < meshFd_.size(); ++q)
    if (meshFd_[q] == fd) return static_cast<int>(q);
  return -1;
}

Status TcpRingBackend::sendSome(int fd, int peer, const uint8_t* from, size_t bytes, size_t* moved,
                                const std::string& what) {
  *moved = 0;
  auto n = p2pSend(fd, from, bytes);
  if (!n.isOk() && aborted_.load(std::memory_order_acquire)) return abortedStatus(what);
  if (!n.isOk())
    return Status(Code::kRemoteError, what + ": sending to " + peerName(peer) + ": " +
                                          n.status().message() +
                                          " (that rank was lost or aborted)");
  *moved = n.value();
  return Status();
}

Status TcpRingBackend::recvSome(int fd, int peer, uint8_t* into, size_t bytes, size_t* moved,
                                const std::string& what) {
  *moved = 0;
  bool eof = false;
  auto n = p2pRecv(fd, into, bytes, &eof);
  if ((!n.isOk() || eof) && aborted_.load(std::memory_order_acquire)) return abortedStatus(what);
  if (!n.isOk() || eof)
    return Status(Code::kRemoteError,
                  what + ": receiving from " + peerName(peer) + ": " +
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
  const int next = nextRank(), prev = prevRank();
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
  while (sk < steps || rk < steps) {
    if (aborted_.load(std::memory_order_acquire)) return abortedStatus(what);
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
            sendSome(sendFd_, next, data + p.segBegin(seg) * p.es + sent, ready - sent, &n, what));
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
        HORA_RETURN_IF_ERROR(recvSome(recvFd_, prev, into + got, bytes - got, &n, what));
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
    Status s = waitRing(wantSend, wantRecv, lastProgress, what);
    if (!s.isOk()) return s;
  }
  return Status();
}

Status TcpRingBackend::chain(uint8_t* data, size_t bytes, int root, const std::string& what) {
  // The root's bytes go around the ring: each rank forwards what it has
  // received at once, so for large buffers every link carries the payload
  // at the same time (a pipeline), and the last rank before the root only
  // receives.
  const int next = nextRank(), prev = prevRank();
  const bool receives = rank_ != root, sends = next != root;
  size_t got = receives ? 0 : bytes, sent = sends ? 0 : bytes;
  auto lastProgress = Clock::now();
  while (got < bytes || sent < bytes) {
    if (aborted_.load(std::memory_order_acquire)) return abortedStatus(what);
    bool moved = false, wantSend = false, wantRecv = false;
    if (sent < got) {
      size_t n = 0;
      HORA_RETURN_IF_ERROR(sendSome(sendFd_, next, data + sent, got - sent, &n, what));
      if (n > 0) {
        sent += n;
        moved = true;
      } else {
        wantSend = true;
      }
    }
    if (got < bytes) {
      size_t n = 0;
      HORA_RETURN_IF_ERROR(recvSome(recvFd_, prev, data + got, bytes - got, &n, what));
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
    Status s = waitRing(wantSend, wantRecv, lastProgress, what);
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

Status TcpRingBackend::localError(const std::string& message) {
  Status s = invalidArgument(message);
  broken_ = s;
  closeStreams();
  return s;
}

Status TcpRingBackend::usable(const std::string& what) const {
  if (!broken_.isOk())
    return Status(broken_.code(), what + ": the ring failed before: " + broken_.message());
  if (aborted_.load(std::memory_order_acquire)) return abortedStatus(what);
  return Status();
}

std::string TcpRingBackend::describe(const char* op, size_t count, DataType dtype,
                                     const std::string& reduce) const {
  return std::string(op) + " on the tcp ring (" + std::to_string(count) + " x " +
         dataTypeName(dtype) + (reduce.empty() ? "" : ", " + reduce) + ", ring rank " +
         std::to_string(rank_) + " of " + std::to_string(size_) + ")";
}

Status TcpRingBackend::allreduce(void* data, size_t count, DataType dtype, ReduceOp op) {
  const std::string what = describe("allreduce", count, dtype, reduceOpName(op));
  HORA_RETURN_IF_ERROR(usable(what));
  if (size_ == 1 || count == 0) return Status();
  if (data == nullptr) return localError(what + ": null buffer");
  ReduceFn reduce = nullptr;
  HORA_RETURN_IF_ERROR(reduceFor(dtype, op, what, &reduce));
  Plan p = Plan::equal(size_, rank_, count, dataTypeSize(dtype));
  p.reduceSteps = p.copySteps = size_ - 1;
  return run(what, [&] { return ring(static_cast<uint8_t*>(data), p, reduce, what); });
}

Status TcpRingBackend::countsCall(const char* op, const std::vector<size_t>& counts, DataType dtype,
                                  std::string* what, size_t* total) const {
  *total = 0;
  for (size_t c : counts) *total += c;
  *what = describe(op, *total, dtype);
  HORA_RETURN_IF_ERROR(usable(*what));
  if (counts.size() != static_cast<size_t>(size_))
    return invalidArgument(*what + ": expected " + std::to_string(size_) + " counts, got " +
                           std::to_string(counts.size()));
  return Status();
}

Status TcpRingBackend::reduceFor(DataType dtype, ReduceOp op, const std::string& what,
                                 ReduceFn* fn) const {
  *fn = reduceFunction(dtype, op);
  if (*fn == nullptr)
    return invalidArgument(what + ": no " + reduceOpName(op) + " for " + dataTypeName(dtype));
  return Status();
}

Status TcpRingBackend::reducescatter(void* inout, const std::vector<size_t>& counts, DataType dtype,
                                     ReduceOp op) {
  std::string what;
  size_t total = 0;
  HORA_RETURN_IF_ERROR(countsCall("reducescatter", counts, dtype, &what, &total));
  if (size_ == 1 || total == 0) return Status();
  if (inout == nullptr) return localError(what + ": null buffer");
  ReduceFn reduce = nullptr;
  HORA_RETURN_IF_ERROR(reduceFor(dtype, op, what, &reduce));
  Plan p = Plan::ofCounts(size_, rank_, counts, dataTypeSize(dtype));
  p.shift = 1;
  p.reduceSteps = size_ - 1;
  return run(what, [&] { return ring(static_cast<uint8_t*>(inout), p, reduce, what); });
}

Status TcpRingBackend::allgatherv(const void* in, void* out, const std::vector<size_t>& counts,
                                  DataType dtype) {
  std::string what;
  size_t total = 0;
  HORA_RETURN_IF_ERROR(countsCall("allgatherv", counts, dtype, &what, &total));
  if (total == 0) return Status();
  const size_t es = dataTypeSize(dtype);
  if (out == nullptr || (counts[rank_] > 0 && in == nullptr))
    return localError(what + ": null buffer");
  Plan p = Plan::ofCounts(size_, rank_, counts, es);
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
  if (data == nullptr) return localError(what + ": null buffer");
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
  Plan p = Plan::equal(size_, rank_, 1, 1);
  p.reduceSteps = p.copySteps = size_ - 1;
  const ReduceFn reduce = reduceFunction(DataType::kUint8, ReduceOp::kMax);
  return run(what, [&] { return ring(&byte, p, reduce, what); });
}

int TcpRingBackend::sendSocket(int peer) const {
  if (peer == nextRank()) return sendFd_;
  if (peer == prevRank()) return recvFd_;  // the connection from prev carries both ways
  return meshFd_.empty() ? -1 : meshFd_[peer];
}

int TcpRingBackend::recvSocket(int peer) const {
  if (peer == prevRank()) return recvFd_;
  if (peer == nextRank()) return sendFd_;
  return meshFd_.empty() ? -1 : meshFd_[peer];
}

Status TcpRingBackend::alltoallv(const void* in, const std::vector<int64_t>& send, void* out,
                                 const std::vector<int64_t>& recv, DataType dtype) {
  const bool shaped = send.size() == static_cast<size_t>(size_) && recv.size() == send.size();
  int64_t sendTotal = 0, recvTotal = 0;
  bool negative = false;
  for (size_t r = 0; shaped && r < send.size(); ++r) {
    negative = negative || send[r] < 0 || recv[r] < 0;
    sendTotal += send[r];
    recvTotal += recv[r];
  }
  const std::string what =
      describe("alltoallv", static_cast<size_t>(std::max<int64_t>(sendTotal, 0)), dtype);
  HORA_RETURN_IF_ERROR(usable(what));
  // Every count is this rank's own: any error here is local.
  if (!shaped)
    return localError(what + ": expected " + std::to_string(size_) +
                      " send and receive counts, got " + std::to_string(send.size()) + " and " +
                      std::to_string(recv.size()));
  if (negative) return localError(what + ": a negative count");
  if (send[rank_] != recv[rank_])
    return localError(what + ": this rank sends itself " + std::to_string(send[rank_]) +
                      " elements but receives " + std::to_string(recv[rank_]));
  if ((sendTotal > 0 && in == nullptr) || (recvTotal > 0 && out == nullptr))
    return localError(what + ": null buffer");
  for (int p = 0; p < size_; ++p)
    if (p != rank_ && (sendSocket(p) < 0 || recvSocket(p) < 0))
      return Status(Code::kNotSupported,
                    what + ": no connection to " + peerName(p) +
                        " (this ring was set up without its mesh: the hierarchy's cross stage)");
  const size_t es = dataTypeSize(dtype);
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  std::vector<Flow> flows;  // this rank's sends, then its receives
  size_t sendAt = 0, recvAt = 0;
  for (int p = 0; p < size_; ++p) {
    const size_t sb = static_cast<size_t>(send[p]) * es, rb = static_cast<size_t>(recv[p]) * es;
    if (p == rank_) {
      if (sb > 0) std::memmove(dst + recvAt, src + sendAt, sb);
    } else {
      if (sb > 0) flows.push_back({p, true, sendSocket(p), src + sendAt, nullptr, sb});
      if (rb > 0) flows.push_back({p, false, recvSocket(p), nullptr, dst + recvAt, rb});
    }
    sendAt += sb;
    recvAt += rb;
  }
  if (flows.empty()) return Status();
  return run(what, [&] { return exchange(flows, what); });
}

Status TcpRingBackend::exchange(std::vector<Flow>& flows, const std::string& what) {
  // Every flow at once: a send never waits for a receive, so no pair of
  // ranks can block each other on full socket buffers, and a small
  // exchange takes one round trip, not n-1.
  auto lastProgress = Clock::now();
  std::vector<struct pollfd> fds;
  for (;;) {
    if (aborted_.load(std::memory_order_acquire)) return abortedStatus(what);
    bool moved = false, pending = false;
    for (Flow& f : flows) {
      if (f.left == 0) continue;
      size_t n = 0;
      if (f.sends) {
        HORA_RETURN_IF_ERROR(sendSome(f.fd, f.peer, f.from, f.left, &n, what));
        f.from += n;
      } else {
        HORA_RETURN_IF_ERROR(recvSome(f.fd, f.peer, f.into, f.left, &n, what));
        f.into += n;
      }
      f.left -= n;
      moved = moved || n > 0;
      pending = pending || f.left > 0;
    }
    if (!pending) return Status();
    if (moved) {
      lastProgress = Clock::now();
      continue;
    }
    // One entry per socket: a neighbour's connection may carry a send and a
    // receive.
    fds.clear();
    for (const Flow& f : flows) {
      if (f.left == 0) continue;
      auto at = std::find_if(fds.begin(), fds.end(), [&](const pollfd& x) { return x.fd == f.fd; });
      if (at == fds.end()) at = fds.insert(fds.end(), {f.fd, 0, 0});
      at->events |= f.sends ? POLLOUT : POLLIN;
    }
    Status s = waitReady(fds.data(), static_cast<int>(fds.size()), lastProgress, what, [&] {
      std::string peers;
      for (const Flow& f : flows) {
        if (f.left == 0) continue;
        const std::string name = peerName(f.peer);
        if (peers.find(name) == std::string::npos) peers += (peers.empty() ? "" : ", ") + name;
      }
      return peers;
    });
    if (!s.isOk()) return s;
  }
}

}  // namespace hora
