// GlooBackend, part 1: creation (the full mesh through the Store), the collectives that map
// onto Gloo's own, abort, and the conversion of Gloo's exceptions; the ring allreduce behind
// allreduceGather is part 2, gloo_ring.cc.
#include "ops/gloo/gloo_backend.h"

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <signal.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <numeric>
#include <string>
#include <utility>

#include "core/reduce.h"
#include "ops/gloo/gloo_mesh.h"
#include "ops/gloo/gloo_store_adapter.h"

// Allreduce algorithm choice under "auto" (kGlooBcubeMaxBytes). Measured on
// the 2-core dev machine, ranks as threads over loopback TCP, float32 sum,
// 25th percentile of 8..200 runs, microseconds, while other builds were
// running (so noisy; the ordering was stable across two runs):
//
//   bytes        2 ranks ring / bcube     4 ranks ring / bcube
//   1 KiB            521 /   279             7613 /  1241
//   64 KiB           447 /   432             5954 /  1090
//   256 KiB          518 /   496             2523 /  1138
//   1 MiB           3983 /  3628             6782 /  1713
//   4 MiB           7006 /  4954            17353 /  7724  (other run: 13946 / 18980)
//   16 MiB         21462 / 19951            33078 / 49699
//
// bcube (recursive halving/doubling) needs log2(n) rounds instead of ring's
// 2(n-1), so it wins while latency dominates; ring moves the least data per
// link and wins once bandwidth dominates, more so with more ranks.

namespace hora {
namespace {

// Gloo's option setters are templated on the element type only to learn its
// size; any trivially copyable type of the right width will do.
template <typename F>
void withElementType(size_t elementSize, F&& f) {
  switch (elementSize) {
    case 1:
      return f(uint8_t{});
    case 2:
      return f(uint16_t{});
    case 4:
      return f(uint32_t{});
    case 8:
      return f(uint64_t{});
    default:
      GLOO_ENFORCE(false, "unsupported element size ", elementSize);
  }
}

std::string describe(const char* coll, size_t count, DataType dtype) {
  return std::string("gloo ") + coll + "(count=" + std::to_string(count) +
         ", dtype=" + dataTypeName(dtype) + ")";
}

std::string describe(const char* coll, size_t count, DataType dtype, ReduceOp op) {
  return std::string("gloo ") + coll + "(count=" + std::to_string(count) +
         ", dtype=" + dataTypeName(dtype) + ", op=" + reduceOpName(op) + ")";
}

// Gloo reports both a dead peer and an expired wait as IoException; only the
// message tells them apart ("Timed out waiting ...", "Read timeout ...").
Status ioStatus(const std::string& msg) {
  const bool timedOut =
      msg.find("Timed out") != std::string::npos || msg.find("timeout") != std::string::npos;
  return Status(timedOut ? Code::kTimeout : Code::kRemoteError,
                msg + " (a peer rank may have died or stalled)");
}

uint64_t sumCounts(const std::vector<size_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), uint64_t{0});
}

// Hora's own slot space for ring reduce-scatter: Gloo's collectives put their
// prefix (0x01..0x08) in the top byte and the tag in bits 24..55, and the old
// algorithms use small context->nextSlot() values, so a top byte of 0x48
// cannot collide with either. The low 24 bits carry the ring step.
constexpr uint64_t kReduceScatterSlotPrefix = 0x48;

uint64_t reduceScatterSlot(uint32_t tag, size_t step) {
  return (kReduceScatterSlotPrefix << 56) | (static_cast<uint64_t>(tag) << 24) |
         static_cast<uint64_t>(step & 0xffffff);
}

// Bytes per send/recv in ring reduce-scatter: two segments are in flight
// while the previous one is reduced, as in Gloo's ring allreduce.
constexpr size_t kSegmentBytes = 1 << 20;

// Gloo writes to its sockets with writev, which cannot pass MSG_NOSIGNAL: a
// write to a pair whose peer has closed (a dead rank, or one that aborted)
// raises SIGPIPE, whose default action kills the whole process instead of
// letting the write fail with EPIPE and become a Status. Only the default
// disposition is replaced; a handler the application installed is kept.
// (Python already ignores SIGPIPE, so framework processes see no change.)
void ignoreDefaultSigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current;
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL &&
        (current.sa_flags & SA_SIGINFO) == 0) {
      struct sigaction ignore = {};
      ignore.sa_handler = SIG_IGN;
      sigemptyset(&ignore.sa_mask);
      sigaction(SIGPIPE, &ignore, nullptr);
    }
  });
}

}  // namespace

bool parseGlooAlgorithm(const std::string& text, GlooAlgorithm* out) {
  if (text == "auto" || text.empty()) {
    *out = GlooAlgorithm::kAuto;
  } else if (text == "ring") {
    *out = GlooAlgorithm::kRing;
  } else if (text == "bcube") {
    *out = GlooAlgorithm::kBcube;
  } else {
    return false;
  }
  return true;
}

const char* glooAlgorithmName(GlooAlgorithm algorithm) {
  switch (algorithm) {
    case GlooAlgorithm::kRing:
      return "ring";
    case GlooAlgorithm::kBcube:
      return "bcube";
    default:
      return "auto";
  }
}

GlooBackend::GlooBackend(std::shared_ptr<gloo::Context> context,
                         std::shared_ptr<AbortableBuffers> buffers, int rank, int size,
                         std::chrono::milliseconds timeout, Algorithm algorithm)
    : context_(std::move(context)),
      buffers_(std::move(buffers)),
      rank_(rank),
      size_(size),
      timeout_(timeout),
      algorithm_(algorithm) {}

GlooBackend::~GlooBackend() = default;

Status GlooBackend::checkUsable(const std::string& what) const {
  if (aborted_.load(std::memory_order_acquire)) {
    return Status(Code::kRemoteError, what + ": backend was aborted (a peer rank was lost)");
  }
  std::lock_guard<std::mutex> lock(brokenMu_);
  if (!broken_.isOk()) {
    return Status(broken_.code(),
                  what + ": backend unusable after an earlier failure: " + broken_.message());
  }
  return Status::ok();
}

template <typename F>
Status GlooBackend::guarded(const std::string& what, F&& body) {
  Status s;
  try {
    body();
    return Status::ok();
  } catch (const gloo::IoException& e) {
    s = ioStatus(e.what());
  } catch (const gloo::EnforceNotMet& e) {
    s = Status(Code::kBackendError, std::string("gloo check failed: ") + e.what());
  } catch (const gloo::Exception& e) {
    s = Status(Code::kBackendError, e.what());
  } catch (const std::bad_alloc&) {
    s = Status(Code::kSystemError, "out of memory");
  } catch (const std::exception& e) {
    s = Status(Code::kBackendError, e.what());
  } catch (...) {
    s = Status(Code::kBackendError, "unknown exception from gloo");
  }
  if (aborted_.load(std::memory_order_acquire)) {
    s = Status(Code::kRemoteError, "backend was aborted (a peer rank was lost): " + s.message());
  }
  s = s.withContext(what);
  {
    std::lock_guard<std::mutex> lock(brokenMu_);
    if (broken_.isOk()) broken_ = s;
  }
  // Peers may be blocked on us; closing our ends makes them fail now instead
  // of at their timeout.
  closePairs("hora: peer rank " + std::to_string(rank_) + " failed: " + s.message());
  return s;
}

void GlooBackend::closePairs(const std::string& reason) noexcept {
  if (!context_) return;
  std::lock_guard<std::mutex> lock(closeMu_);
  for (int i = 0; i < size_; ++i) {
    if (i == rank_) continue;
    try {
      auto& pair = context_->getPair(i);
      if (!pair) continue;
      // No-op if the pair already failed (Gloo checks under the pair lock).
      signalPair(pair.get(), reason);
    } catch (...) {
      // Best effort: a pair that cannot be signalled is already broken.
    }
  }
}

void GlooBackend::tune(const TuningValues& v) {
  bcubeMaxBytes_ = static_cast<size_t>(std::max<int64_t>(v.glooBcubeMaxBytes, 0));
}

void GlooBackend::abort() noexcept {
  aborted_.store(true, std::memory_order_release);
  closePairs("hora: backend aborted on rank " + std::to_string(rank_));
  // The pairs' signal misses transfers cut part-way (gloo_mesh.h).
  if (buffers_) buffers_->failAll("hora: backend aborted on rank " + std::to_string(rank_));
}

Status GlooBackend::allreduce(void* data, size_t count, DataType dtype, ReduceOp op) {
  const std::string what = describe("allreduce", count, dtype, op);
  HORA_RETURN_IF_ERROR(checkUsable(what));
  ReduceFn fn = reduceFunction(dtype, op);
  if (fn == nullptr || !reduceOpSupported(op, dtype)) {
    return invalidArgument(what + ": unsupported dtype/op");
  }
  if (count == 0 || size_ == 1) return Status::ok();
  if (data == nullptr) return invalidArgument(what + ": null buffer");
  const size_t elementSize = dataTypeSize(dtype);
  Algorithm alg = algorithm_;
  if (alg == Algorithm::kAuto) {
    // Same inputs on every rank, so every rank picks the same algorithm.
    alg = count * elementSize >= kGlooBcubeMinBytes && count * elementSize <= bcubeMaxBytes_
              ? Algorithm::kBcube
              : Algorithm::kRing;
  }
  const uint32_t tag = nextTag();
  return guarded(what, [&] {
    gloo::AllreduceOptions opts(context_);
    withElementType(elementSize, [&](auto zero) {
      using T = decltype(zero);
      opts.setOutput<T>(static_cast<T*>(data), count);
    });
    opts.setReduceFunction(fn);
    opts.setAlgorithm(alg == Algorithm::kBcube ? gloo::AllreduceOptions::Algorithm::BCUBE
                                               : gloo::AllreduceOptions::Algorithm::RING);
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::allreduce(opts);
  });
}

Status GlooBackend::allreduceGather(void* staging, size_t count, DataType dtype, ReduceOp op,
                                    const PackFn& pack, const UnpackFn& unpack) {
  const std::string what = describe("allreduce", count, dtype, op);
  HORA_RETURN_IF_ERROR(checkUsable(what));
  if (reduceFunction(dtype, op) == nullptr || !reduceOpSupported(op, dtype)) {
    return invalidArgument(what + ": unsupported dtype/op");
  }
  if (count == 0) return Status::ok();
  if (staging == nullptr) return invalidArgument(what + ": null buffer");
  if (size_ == 1) {
    pack(0, count, staging);
    unpack(0, count, staging);
    return Status::ok();
  }
  // Same choice as allreduce(), from inputs every rank shares.
  const size_t bytes = count * dataTypeSize(dtype);
  // Up to 1 MiB latency dominates: Gloo's own allreduce (ring or bcube as
  // allreduce() chooses); above it, the ring that overlaps pack/unpack.
  if (algorithm_ == Algorithm::kBcube || bytes <= bcubeMaxBytes_) {
    return Backend::allreduceGather(staging, count, dtype, op, pack, unpack);
  }
  const uint32_t tag = nextTag();
  return guarded(what, [&] {
    ringAllreduce(static_cast<uint8_t*>(staging), count, dtype, op, tag, pack, unpack);
  });
}

Status GlooBackend::allgatherv(const void* in, void* out, const std::vector<size_t>& counts,
                               DataType dtype) {
  const uint64_t total = counts.size() == static_cast<size_t>(size_) ? sumCounts(counts) : 0;
  const std::string what = describe("allgatherv", total, dtype);
  HORA_RETURN_IF_ERROR(checkUsable(what));
  if (counts.size() != static_cast<size_t>(size_)) {
    return invalidArgument(what + ": expected " + std::to_string(size_) + " counts, got " +
                           std::to_string(counts.size()));
  }
  if (total == 0) return Status::ok();
  const size_t elementSize = dataTypeSize(dtype);
  const size_t mine = counts[rank_];
  if (out == nullptr || (mine > 0 && in == nullptr)) {
    return invalidArgument(what + ": null buffer");
  }
  const uint64_t myOffset = std::accumulate(counts.begin(), counts.begin() + rank_, uint64_t{0});
  uint8_t* myRegion = static_cast<uint8_t*>(out) + myOffset * elementSize;
  if (size_ == 1) {
    if (in != myRegion) std::memmove(myRegion, in, mine * elementSize);
    return Status::ok();
  }
  // Without an input Gloo gathers in place (our region of `out` is sent as is).
  const bool inPlace = mine == 0 || in == myRegion;
  const uint32_t tag = nextTag();
  return guarded(what, [&] {
    gloo::AllgathervOptions opts(context_);
    withElementType(elementSize, [&](auto zero) {
      using T = decltype(zero);
      if (!inPlace) opts.setInput<T>(static_cast<T*>(const_cast<void*>(in)), mine);
      opts.setOutput<T>(static_cast<T*>(out), counts);
    });
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::allgatherv(opts);
  });
}

Status GlooBackend::broadcast(void* data, size_t count, DataType dtype, int root) {
  const std::string what = describe("broadcast", count, dtype) + " root " + std::to_string(root);
  HORA_RETURN_IF_ERROR(checkUsable(what));
  if (root < 0 || root >= size_) return invalidArgument(what + ": root out of range");
  if (count == 0 || size_ == 1) return Status::ok();
  if (data == nullptr) return invalidArgument(what + ": null buffer");
  const size_t elementSize = dataTypeSize(dtype);
  const uint32_t tag = nextTag();
  return guarded(what, [&] {
    gloo::BroadcastOptions opts(context_);
    withElementType(elementSize, [&](auto zero) {
      using T = decltype(zero);
      opts.setOutput<T>(static_cast<T*>(data), count);
    });
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::broadcast(opts);
  });
}

Status GlooBackend::alltoallv(const void* in, const std::vector<int64_t>& send, void* out,
                              const std::vector<int64_t>& recv, DataType dtype) {
  int64_t sendTotal = 0, recvTotal = 0;
  bool negative = false;
  for (int64_t v : send) sendTotal += v, negative |= v < 0;
  for (int64_t v : recv) recvTotal += v, negative |= v < 0;
  const std::string what =
      describe("alltoallv", static_cast<size_t>(std::max<int64_t>(0, sendTotal)), dtype);
  HORA_RETURN_IF_ERROR(checkUsable(what));
  if (send.size() != static_cast<size_t>(size_) || recv.size() != static_cast<size_t>(size_)) {
    return invalidArgument(what + ": expected " + std::to_string(size_) + " send and recv splits");
  }
  if (negative) return invalidArgument(what + ": negative split");
  if (send[rank_] != recv[rank_]) {
    return invalidArgument(what + ": send and recv splits for this rank differ");
  }
  if ((sendTotal > 0 && in == nullptr) || (recvTotal > 0 && out == nullptr)) {
    return invalidArgument(what + ": null buffer");
  }
  const size_t elementSize = dataTypeSize(dtype);
  if (size_ == 1) {
    if (sendTotal > 0 && in != out) std::memmove(out, in, sendTotal * elementSize);
    return Status::ok();
  }
  // Every rank exchanges a (possibly empty) message with every other rank, so
  // even a rank with nothing to send or receive must take part. Empty buffers
  // get a valid dummy address.
  static uint64_t dummy = 0;
  void* inPtr = sendTotal > 0 ? const_cast<void*>(in) : &dummy;
  void* outPtr = recvTotal > 0 ? out : &dummy;
  const uint32_t tag = nextTag();
  return guarded(what, [&] {
    gloo::AlltoallvOptions opts(context_);
    withElementType(elementSize, [&](auto zero) {
      using T = decltype(zero);
      opts.setInput<T>(static_cast<T*>(inPtr), send);
      opts.setOutput<T>(static_cast<T*>(outPtr), recv);
    });
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::alltoallv(opts);
  });
}

Status GlooBackend::reducescatter(void* inout, const std::vector<size_t>& counts, DataType dtype,
                                  ReduceOp op) {
  const uint64_t total = counts.size() == static_cast<size_t>(size_) ? sumCounts(counts) : 0;
  const std::string what = describe("reducescatter", total, dtype, op);
  HORA_RETURN_IF_ERROR(checkUsable(what));
  if (counts.size() != static_cast<size_t>(size_)) {
    return invalidArgument(what + ": expected " + std::to_string(size_) + " counts, got " +
                           std::to_string(counts.size()));
  }
  if (reduceFunction(dtype, op) == nullptr || !reduceOpSupported(op, dtype)) {
    return invalidArgument(what + ": unsupported dtype/op");
  }
  if (total == 0 || size_ == 1) return Status::ok();
  if (inout == nullptr) return invalidArgument(what + ": null buffer");
  const uint32_t tag = nextTag();
  return guarded(what,
                 [&] { ringReduceScatter(static_cast<uint8_t*>(inout), counts, dtype, op, tag); });
}

// Ring reduce-scatter over the context's unbound buffers. Chunk c is the
// region counts[c] elements long that rank c ends up owning. At step s
// (0 <= s < n-1) rank r sends chunk (r-s-1) mod n to r+1 and receives chunk
// (r-s-2) mod n from r-1, reducing it into its own copy; the chunk received at
// step s is the one sent at step s+1, and the last one received is chunk r,
// now reduced over all ranks. Each rank sends (n-1)/n of the data once.
// Within a step the received chunk is split into segments with two receives
// in flight, so the reduction of one overlaps the transfer of the next.
// Segments complete in posting order: they share a slot and a peer, and
// Gloo matches same-slot operations on one pair first-in first-out.
void GlooBackend::ringReduceScatter(uint8_t* data, const std::vector<size_t>& counts,
                                    DataType dtype, ReduceOp op, uint32_t tag) {
  const int n = size_;
  const size_t elementSize = dataTypeSize(dtype);
  const int next = (rank_ + 1) % n;
  const int prev = (rank_ + n - 1) % n;

  std::vector<size_t> offsets(n);  // in bytes
  size_t total = 0;
  size_t largest = 0;
  for (int c = 0; c < n; ++c) {
    offsets[c] = total;
    total += counts[c] * elementSize;
    largest = std::max(largest, counts[c] * elementSize);
  }
  const size_t segBytes =
      std::max(elementSize, std::min(largest, kSegmentBytes / elementSize * elementSize));
  std::vector<uint8_t> scratch(2 * segBytes);
  auto dataBuf = context_->createUnboundBuffer(data, total);
  auto tmpBuf = context_->createUnboundBuffer(scratch.data(), scratch.size());

  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  auto remaining = [&] {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    return std::max(left, std::chrono::milliseconds(1));
  };
  auto segLen = [&](size_t chunkBytes, size_t j) {
    return std::min(segBytes, chunkBytes - j * segBytes);
  };

  for (int s = 0; s < n - 1; ++s) {
    const int sendChunk = ((rank_ - s - 1) % n + n) % n;
    const int recvChunk = ((rank_ - s - 2) % n + n) % n;
    const size_t sendBytes = counts[sendChunk] * elementSize;
    const size_t recvBytes = counts[recvChunk] * elementSize;
    const size_t sendSegs = (sendBytes + segBytes - 1) / segBytes;
    const size_t recvSegs = (recvBytes + segBytes - 1) / segBytes;
    const uint64_t slot = reduceScatterSlot(tag, static_cast<size_t>(s));

    // The chunk sent now was fully reduced in the previous step, so all of
    // its segments can go at once; sends are zero-copy from `data`.
    for (size_t j = 0; j < sendSegs; ++j) {
      dataBuf->send(next, slot, offsets[sendChunk] + j * segBytes, segLen(sendBytes, j));
    }
    for (size_t j = 0; j < std::min<size_t>(2, recvSegs); ++j) {
      tmpBuf->recv(prev, slot, (j % 2) * segBytes, segLen(recvBytes, j));
    }
    for (size_t j = 0; j < recvSegs; ++j) {
      checkWait(tmpBuf->waitRecv(remaining()), "reducescatter receive");
      const size_t len = segLen(recvBytes, j);
      reduceInto(dtype, op, data + offsets[recvChunk] + j * segBytes,
                 scratch.data() + (j % 2) * segBytes, len / elementSize);
      if (j + 2 < recvSegs) {
        tmpBuf->recv(prev, slot, (j % 2) * segBytes, segLen(recvBytes, j + 2));
      }
    }
    for (size_t j = 0; j < sendSegs; ++j)
      checkWait(dataBuf->waitSend(remaining()), "reducescatter send");
  }
}

Status GlooBackend::barrier() {
  const std::string what = "gloo barrier";
  HORA_RETURN_IF_ERROR(checkUsable(what));
  if (size_ == 1) return Status::ok();
  const uint32_t tag = nextTag();
  return guarded(what, [&] {
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
  });
}

Result<std::unique_ptr<Backend>> createGlooBackend(std::shared_ptr<Store> store,
                                                   const std::string& prefix, int rank, int size,
                                                   const GlooBackendOptions& opts) {
  const std::string what = "gloo backend (rank " + std::to_string(rank) + " of " +
                           std::to_string(size) + ", prefix '" + prefix + "')";
  if (size < 1 || rank < 0 || rank >= size) {
    return invalidArgument(what + ": bad rank or size");
  }
  if (opts.timeout.count() <= 0) return invalidArgument(what + ": timeout must be positive");
  const GlooAlgorithm alg = opts.algorithm;
  if (size == 1) {
    // No peers: every collective is local, no device or sockets needed.
    return std::unique_ptr<Backend>(
        new GlooBackend(nullptr, nullptr, rank, size, opts.timeout, alg));
  }
  if (!store) return invalidArgument(what + ": null store");
  ignoreDefaultSigpipe();

  std::shared_ptr<Store> scoped =
      prefix.empty() ? store : std::make_shared<PrefixStore>(store, prefix);
  GlooStoreAdapter adapter(scoped, opts.timeout);
  Status failure;
  try {
    gloo::transport::tcp::attr attr;
    if (!opts.iface.empty()) {
      attr.iface = opts.iface;
    } else {
      attr.hostname = opts.hostname;
    }
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<MeshContext>(rank, size);
    context->setTimeout(opts.timeout);
    Status lost = context->connectMesh(adapter, device, opts.setUpWatch);
    if (!lost.isOk()) return lost.withContext(what + ": connect");
    return std::unique_ptr<Backend>(
        new GlooBackend(context, context->sharedBuffers(), rank, size, opts.timeout, alg));
  } catch (const gloo::IoException& e) {
    failure = ioStatus(e.what());
  } catch (const gloo::EnforceNotMet& e) {
    failure = Status(Code::kBackendError, std::string("gloo check failed: ") + e.what());
  } catch (const std::bad_alloc&) {
    failure = Status(Code::kSystemError, "out of memory");
  } catch (const std::exception& e) {
    failure = Status(Code::kBackendError, e.what());
  } catch (...) {
    failure = Status(Code::kBackendError, "unknown exception from gloo");
  }
  // A store failure (e.g. kTimeout naming the missing rank's key) says more
  // than the IoException Gloo wrapped it in.
  Status storeError = adapter.firstError();
  if (!storeError.isOk()) failure = storeError;
  return failure.withContext(what + ": connect");
}

}  // namespace hora
