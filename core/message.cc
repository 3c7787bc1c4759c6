#include "core/message.h"

#include <cstring>
#include <sstream>

#include "core/wire.h"

namespace hora {
namespace {

constexpr uint8_t kRequestListTag = 0x51;
constexpr uint8_t kResponseListTag = 0x52;
constexpr uint8_t kTuningTag = 0x54;  // autotune values after the groups

uint64_t fnv(uint64_t h, const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
  return h;
}

template <typename T>
uint64_t fnvv(uint64_t h, const T& v) {
  return fnv(h, &v, sizeof(v));
}

// What one entry takes at least on the wire: a count passes only if that many
// entries could fit in what is left, so a corrupt count cannot make the
// decoder allocate more than a small multiple of the message's size.
constexpr size_t kMinRequestBytes =
    4 + 4 * 1 + 4 + 4 + 8 + 8 + 4 + 4 + 4 + 4;  // empty name/shape/splits/payload
constexpr size_t kMinHitBytes = 16;
constexpr size_t kMinItemBytes = 8;  // a cache bit and an empty result
// Entries (requests, hits, response items over all groups) in one list: far
// above any real cycle, low enough that a 64 MiB frame of cache bits cannot
// cost gigabytes of ResponseItems.
constexpr size_t kMaxListEntries = size_t{1} << 18;

Status countCheck(size_t n, size_t minBytes, size_t remaining, const char* what) {
  if (n > kMaxListEntries)
    return protocolError(std::string(what) + " " + std::to_string(n) + " exceeds the limit of " +
                         std::to_string(kMaxListEntries));
  if (n * minBytes > remaining)
    return protocolError(std::string(what) + " " + std::to_string(n) + " exceeds message");
  return Status::ok();
}

Status enumCheck(uint8_t v, uint8_t count, const char* what) {
  if (v >= count)
    return protocolError(std::string("invalid ") + what + " value " + std::to_string(v));
  return Status::ok();
}

}  // namespace

uint64_t Request::signature() const {
  uint64_t h = 1469598103934665603ull;
  h = fnvv(h, static_cast<uint8_t>(kind));
  h = fnvv(h, static_cast<uint8_t>(dtype));
  h = fnvv(h, static_cast<uint8_t>(op));
  // The device kind, not its index: rank i may hold its tensor on cuda:i.
  h = fnvv(h, static_cast<uint8_t>(device.kind));
  h = fnvv(h, root);
  h = fnvv(h, prescale);
  h = fnvv(h, postscale);
  h = fnvv(h, name.size());  // length-prefixed: "ab"+x never collides with "a"+"bx"
  h = fnv(h, name.data(), name.size());
  h = fnvv(h, shape.size());
  h = fnv(h, shape.data(), shape.size() * sizeof(int64_t));
  h = fnvv(h, splits.size());
  h = fnv(h, splits.data(), splits.size() * sizeof(int64_t));
  return h;
}

std::string Request::describe() const {
  std::ostringstream os;
  os << collectiveName(kind) << " \"" << name << "\": " << describeTensor(dtype, shape);
  return os.str();
}

int64_t Response::numElements() const { return hora::numElements(shape); }

void encodeRequest(ByteWriter& w, const Request& r) {
  w.i32(r.rank);
  w.u8(static_cast<uint8_t>(r.kind));
  w.u8(static_cast<uint8_t>(r.dtype));
  w.u8(static_cast<uint8_t>(r.op));
  w.u8(static_cast<uint8_t>(r.device.kind));
  w.i32(r.device.index);
  w.i32(r.root);
  w.f64(r.prescale);
  w.f64(r.postscale);
  w.str(r.name);
  w.i64s(r.shape);
  w.i64s(r.splits);
  w.str(r.payload);
}

Status decodeRequest(ByteReader& rd, Request* r) {
  uint8_t kind = 0, dtype = 0, op = 0, dev = 0;  // set by the reads below (GCC cannot tell)
  HORA_RETURN_IF_ERROR(rd.i32(&r->rank, "request rank"));
  HORA_RETURN_IF_ERROR(rd.u8(&kind, "request kind"));
  HORA_RETURN_IF_ERROR(enumCheck(kind, static_cast<uint8_t>(CollectiveKind::kCount), "collective"));
  HORA_RETURN_IF_ERROR(rd.u8(&dtype, "request dtype"));
  HORA_RETURN_IF_ERROR(enumCheck(dtype, static_cast<uint8_t>(DataType::kCount), "dtype"));
  HORA_RETURN_IF_ERROR(rd.u8(&op, "request op"));
  HORA_RETURN_IF_ERROR(enumCheck(op, static_cast<uint8_t>(ReduceOp::kCount), "reduce op"));
  HORA_RETURN_IF_ERROR(rd.u8(&dev, "request device"));
  HORA_RETURN_IF_ERROR(enumCheck(dev, 2, "device kind"));
  r->kind = static_cast<CollectiveKind>(kind);
  r->dtype = static_cast<DataType>(dtype);
  r->op = static_cast<ReduceOp>(op);
  r->device.kind = static_cast<DeviceKind>(dev);
  HORA_RETURN_IF_ERROR(rd.i32(&r->device.index, "request device index"));
  HORA_RETURN_IF_ERROR(rd.i32(&r->root, "request root"));
  HORA_RETURN_IF_ERROR(rd.f64(&r->prescale, "request prescale"));
  HORA_RETURN_IF_ERROR(rd.f64(&r->postscale, "request postscale"));
  HORA_RETURN_IF_ERROR(rd.str(&r->name, "request name", 64 * 1024));
  HORA_RETURN_IF_ERROR(rd.i64s(&r->shape, "request shape", 64));
  HORA_RETURN_IF_ERROR(rd.i64s(&r->splits, "request splits", 1 << 20));
  HORA_RETURN_IF_ERROR(rd.str(&r->payload, "request payload", kMaxInlineBytes));
  if (!r->payload.empty() &&
      (r->kind == CollectiveKind::kBarrier || r->kind == CollectiveKind::kJoin))
    return protocolError("a payload in a " + std::string(collectiveName(r->kind)) +
                         " request; it has no tensor to carry");
  for (int64_t d : r->shape)
    if (d < 0) return protocolError("negative dimension in request \"" + r->name + "\"");
  return Status::ok();
}

void encodeResponse(ByteWriter& w, const Response& r) {
  w.u8(static_cast<uint8_t>(r.kind));
  w.str(r.name);
  w.u8(static_cast<uint8_t>(r.dtype));
  w.u8(static_cast<uint8_t>(r.op));
  w.u8(static_cast<uint8_t>(r.device.kind));
  w.i32(r.device.index);
  w.i32(r.root);
  w.f64(r.prescale);
  w.f64(r.postscale);
  w.i64s(r.shape);
  w.i64s(r.sizes);
  w.i32s(r.joined);
  w.i32(r.lastJoinedRank);
  w.i32(r.errorCode);
  w.str(r.error);
  w.u64(r.signature);
}

Status decodeResponse(ByteReader& rd, Response* r) {
  uint8_t kind = 0, dtype = 0, op = 0, dev = 0;  // set by the reads below (GCC cannot tell)
  HORA_RETURN_IF_ERROR(rd.u8(&kind, "response kind"));
  HORA_RETURN_IF_ERROR(
      enumCheck(kind, static_cast<uint8_t>(ResponseKind::kError) + 1, "response kind"));
  r->kind = static_cast<ResponseKind>(kind);
  HORA_RETURN_IF_ERROR(rd.str(&r->name, "response name", 64 * 1024));
  HORA_RETURN_IF_ERROR(rd.u8(&dtype, "response dtype"));
  HORA_RETURN_IF_ERROR(enumCheck(dtype, static_cast<uint8_t>(DataType::kCount), "dtype"));
  HORA_RETURN_IF_ERROR(rd.u8(&op, "response op"));
  HORA_RETURN_IF_ERROR(enumCheck(op, static_cast<uint8_t>(ReduceOp::kCount), "reduce op"));
  HORA_RETURN_IF_ERROR(rd.u8(&dev, "response device"));
  HORA_RETURN_IF_ERROR(enumCheck(dev, 2, "device kind"));
  r->dtype = static_cast<DataType>(dtype);
  r->op = static_cast<ReduceOp>(op);
  r->device.kind = static_cast<DeviceKind>(dev);
  HORA_RETURN_IF_ERROR(rd.i32(&r->device.index, "response device index"));
  HORA_RETURN_IF_ERROR(rd.i32(&r->root, "response root"));
  HORA_RETURN_IF_ERROR(rd.f64(&r->prescale, "response prescale"));
  HORA_RETURN_IF_ERROR(rd.f64(&r->postscale, "response postscale"));
  HORA_RETURN_IF_ERROR(rd.i64s(&r->shape, "response shape", 64));
  HORA_RETURN_IF_ERROR(rd.i64s(&r->sizes, "response sizes", 1 << 22));
  HORA_RETURN_IF_ERROR(rd.i32s(&r->joined, "response joined ranks", 1 << 20));
  HORA_RETURN_IF_ERROR(rd.i32(&r->lastJoinedRank, "response last joined rank"));
  HORA_RETURN_IF_ERROR(rd.i32(&r->errorCode, "response error code"));
  HORA_RETURN_IF_ERROR(rd.str(&r->error, "response error", 1 << 20));
  HORA_RETURN_IF_ERROR(rd.u64(&r->signature, "response signature"));
  for (int64_t d : r->shape)
    if (d < 0) return protocolError("negative dimension in response \"" + r->name + "\"");
  return Status::ok();
}

std::string encode(const RequestList& list) {
  ByteWriter w;
  w.u8(kRequestListTag);
  w.u8(kWireVersion);
  w.u32(static_cast<uint32_t>(list.requests.size()));
  for (const auto& r : list.requests) encodeRequest(w, r);
  w.u32(static_cast<uint32_t>(list.hits.size()));
  for (const auto& h : list.hits) {
    w.u32(h.bit);
    w.u64(h.signature);
    w.str(h.payload);
  }
  return w.take();
}

namespace {
Status header(ByteReader& rd, uint8_t tag, const char* what) {
  uint8_t t = 0, v = 0;
  HORA_RETURN_IF_ERROR(rd.u8(&t, what));
  HORA_RETURN_IF_ERROR(rd.u8(&v, what));
  if (t != tag)
    return protocolError(std::string("not a ") + what + " (tag " + std::to_string(t) + ")");
  if (v != kWireVersion)
    return protocolError(std::string(what) + " has wire version " + std::to_string(v) +
                         ", this library speaks " + std::to_string(kWireVersion) +
                         ": are all ranks running the same hora version?");
  return Status::ok();
}
}  // namespace

Status decode(const std::string& bytes, RequestList* out) {
  ByteReader rd(bytes);
  HORA_RETURN_IF_ERROR(header(rd, kRequestListTag, "request list"));
  uint32_t n = 0;
  HORA_RETURN_IF_ERROR(rd.u32(&n, "request count"));
  HORA_RETURN_IF_ERROR(countCheck(n, kMinRequestBytes, rd.remaining(), "request count"));
  out->requests.resize(n);
  for (auto& r : out->requests) HORA_RETURN_IF_ERROR(decodeRequest(rd, &r));
  HORA_RETURN_IF_ERROR(rd.u32(&n, "cache hit count"));
  HORA_RETURN_IF_ERROR(countCheck(n, kMinHitBytes, rd.remaining(), "cache hit count"));
  out->hits.resize(n);
  for (auto& h : out->hits) {
    HORA_RETURN_IF_ERROR(rd.u32(&h.bit, "cache hit bit"));
    HORA_RETURN_IF_ERROR(rd.u64(&h.signature, "cache hit signature"));
    HORA_RETURN_IF_ERROR(rd.str(&h.payload, "cache hit payload", kMaxInlineBytes));
  }
  if (!rd.done()) return protocolError("trailing bytes after request list");
  return Status::ok();
}

std::string encode(const ResponseList& list) {
  ByteWriter w;
  w.u8(kResponseListTag);
  w.u8(kWireVersion);
  w.u32(static_cast<uint32_t>(list.groups.size()));
  for (const auto& g : list.groups) {
    w.u32(static_cast<uint32_t>(g.items.size()));
    for (const auto& it : g.items) {
      w.i32(it.cacheBit);
      if (it.cacheBit < 0) encodeResponse(w, it.response);
      w.str(it.result);
    }
  }
  if (list.tuning) {
    w.u8(kTuningTag);
    for (int d = 0; d < kTuneDims; ++d) w.i64(list.tuning->get(TuneDim(d)));
  }
  return w.take();
}

Status decode(const std::string& bytes, ResponseList* out) {
  ByteReader rd(bytes);
  HORA_RETURN_IF_ERROR(header(rd, kResponseListTag, "response list"));
  out->tuning.reset();
  uint32_t ng = 0;
  HORA_RETURN_IF_ERROR(rd.u32(&ng, "group count"));
  // A group is at least its size field (and then one item, checked below).
  HORA_RETURN_IF_ERROR(countCheck(ng, 4, rd.remaining(), "group count"));
  out->groups.resize(ng);
  size_t items = 0;
  for (auto& g : out->groups) {
    uint32_t ni = 0;
    HORA_RETURN_IF_ERROR(rd.u32(&ni, "group size"));
    if (ni == 0) return protocolError("group size 0 invalid");
    items += ni;
    HORA_RETURN_IF_ERROR(countCheck(items, 0, 0, "response item count"));
    HORA_RETURN_IF_ERROR(countCheck(ni, kMinItemBytes, rd.remaining(), "group size"));
    g.items.resize(ni);
    for (auto& it : g.items) {
      HORA_RETURN_IF_ERROR(rd.i32(&it.cacheBit, "cache bit"));
      if (it.cacheBit < 0) HORA_RETURN_IF_ERROR(decodeResponse(rd, &it.response));
      HORA_RETURN_IF_ERROR(rd.str(&it.result, "inline result", kMaxInlineBytes));
    }
  }
  if (!rd.done()) {
    uint8_t tag = 0;
    HORA_RETURN_IF_ERROR(rd.u8(&tag, "tuning tag"));
    if (tag != kTuningTag) return protocolError("trailing bytes after response list");
    TuningValues v;
    for (int d = 0; d < kTuneDims; ++d) {
      int64_t x = 0;
      HORA_RETURN_IF_ERROR(rd.i64(&x, "tuning value"));
      if (x < 0) return protocolError("negative tuning value in response list");
      v.set(TuneDim(d), x);
    }
    out->tuning = v;
  }
  if (!rd.done()) return protocolError("trailing bytes after response list");
  return Status::ok();
}

}  // namespace hora
