// Internal to core/tcp_store_server.cc and core/tcp_store_client.cc: the
// hora store wire protocol they share (frame layout, opcodes, protocol
// limits, the Writer/Reader payload codecs and the handshake MAC). Not part of
// hora's API; include core/tcp_store.h instead.
//
// Everything here is a constant, a pure function or a value type with no
// shared state, so it is safe to use from any thread; a Writer or Reader
// instance itself belongs to one thread.
#pragma once

#include <fcntl.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/hmac.h"
#include "core/status.h"
#include "core/wire.h"

namespace hora::tcp_store_wire {

// ---- Wire protocol ----------------------------------------------------------
// Frame: [kMagic][kVersion][opcode][flags = 0][payload length u32][payload],
// in core/wire.h's encoding (little-endian, as every hora message): str = u32
// length + bytes; u64 = 8 bytes (i64 as two's complement). Handshake: server kChallenge(nonce) ->
// client kAuth(mac) -> server kAuthOk or kReplyError(u32 code, message) and close. Requests:
//   kSet(str key, str value)      -> kReplyOk()
//   kGet(str key, u64 timeoutMs)  -> kReplyOk(value bytes) | kReplyTimeout(message)
//   kAdd(str key, u64 delta)      -> kReplyOk(u64 new value)
//   kWait(u32 n, n x str key, u64 timeoutMs) -> kReplyOk() | kReplyTimeout(message)
//   kCheck(str key)               -> kReplyOk(u8 exists)
//   kRemove(str key)              -> kReplyOk()
// Any request may also get kReplyError(u32 code, message). One request in
// flight per connection; a second one before the reply is a protocol error.
constexpr uint8_t kMagic = 0x68;  // 'h'
constexpr uint8_t kVersion = 2;   // 2: little-endian, core/wire.h's codec
constexpr size_t kHeaderSize = 8;
constexpr size_t kNonceSize = 32;
constexpr size_t kMacSize = 32;
constexpr size_t kMaxKey = 4096;
constexpr size_t kMaxValue = size_t{64} << 20;
constexpr size_t kMaxFrame = kMaxValue + 2 * kMaxKey;  // a set: key + value + their lengths
constexpr size_t kMaxPreAuthFrame = 64;
constexpr uint32_t kMaxWaitKeys = 65536;
constexpr uint64_t kMaxWaitMs = uint64_t{7} * 24 * 3600 * 1000;  // a week: "forever"
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

inline bool isRequestOp(uint8_t op) { return op >= kSet && op <= kRemove; }

inline std::string hexByte(uint8_t b) { return "0x" + toHex(std::string(1, static_cast<char>(b))); }

// Builds one frame: header space first, patched by frame(). The payload's
// fields are core/wire.h's encoding, the one hora uses for every message.
class Writer {
 public:
  Writer() { w_.buffer().assign(kHeaderSize, '\0'); }
  Writer& u8(uint8_t v) {
    w_.u8(v);
    return *this;
  }
  Writer& u32(uint32_t v) {
    w_.u32(v);
    return *this;
  }
  Writer& u64(uint64_t v) {
    w_.u64(v);
    return *this;
  }
  Writer& str(const std::string& s) {
    w_.str(s);
    return *this;
  }
  Writer& raw(const std::string& s) {
    w_.buffer() += s;
    return *this;
  }
  std::string frame(uint8_t op) {
    std::string& buf = w_.buffer();
    const uint32_t len = static_cast<uint32_t>(buf.size() - kHeaderSize);
    ByteWriter header;
    header.u8(kMagic);
    header.u8(kVersion);
    header.u8(op);
    header.u8(0);
    header.u32(len);
    buf.replace(0, kHeaderSize, header.buffer());
    return w_.take();
  }

 private:
  ByteWriter w_;
};

// Bounds-checked payload reader over core/wire.h's ByteReader; every accessor
// fails instead of overrunning.
class Reader {
 public:
  explicit Reader(const std::string& buf) : r_(buf) {}
  bool u8(uint8_t* v) { return r_.u8(v, "u8").isOk(); }
  bool u32(uint32_t* v) { return r_.u32(v, "u32").isOk(); }
  bool u64(uint64_t* v) { return r_.u64(v, "u64").isOk(); }
  // Reads a length-prefixed string of at most maxLen bytes; `why` says what failed.
  bool str(std::string* out, size_t maxLen, const char* field, std::string* why) {
    uint32_t len = 0;
    if (!u32(&len)) return truncated(why);
    if (len > maxLen) {
      *why = std::string(field) + " of " + std::to_string(len) + " bytes exceeds the " +
             std::to_string(maxLen) + "-byte limit";
      return false;
    }
    if (!r_.bytes(out, len, field).isOk()) return truncated(why);
    return true;
  }
  std::string rest() {
    std::string out;
    (void)r_.bytes(&out, r_.remaining(), "rest");
    return out;
  }
  bool done() const { return r_.done(); }

 private:
  static bool truncated(std::string* why) {
    *why = "truncated request payload";
    return false;
  }
  ByteReader r_;
};

struct Header {
  uint8_t op = 0;
  uint32_t length = 0;
};

// Returns "" when the header is well formed, else the reason.
inline std::string decodeHeader(const std::array<unsigned char, kHeaderSize>& h, Header* out) {
  if (h[0] != kMagic) return "bad magic byte " + hexByte(h[0]) + " (not a hora store client?)";
  if (h[1] != kVersion)
    return "protocol version " + std::to_string(h[1]) + ", expected " + std::to_string(kVersion) +
           " (mixed hora versions?)";
  if (h[3] != 0) return "nonzero reserved flags " + hexByte(h[3]);
  out->op = h[2];
  ByteReader length(reinterpret_cast<const char*>(h.data()) + 4, 4);
  (void)length.u32(&out->length, "frame length");  // 4 bytes are there
  return "";
}

// One request's payload, parsed (the server's half of the codec).
struct Request {
  uint8_t op = 0;
  std::vector<std::string> keys;  // one key, except kWait: n keys
  std::string value;              // kSet
  uint64_t number = 0;            // kAdd: the delta; kGet/kWait: timeoutMs (clamped to kMaxWaitMs)
};

// Parses the payload of a request frame with opcode `op`. Returns "" when it is
// well formed, else the reason ("malformed set request: ..."); never reads
// past `body` and never allocates more than a bounded multiple of its size.
inline std::string parseRequest(uint8_t op, const std::string& body, Request* out) {
  Reader r(body);
  std::string why;
  out->op = op;
  out->keys.clear();
  auto malformed = [&](const char* name) {
    if (why.empty()) why = "trailing bytes";
    return std::string("malformed ") + name + " request: " + why;
  };
  auto oneKey = [&]() {
    out->keys.emplace_back();
    return r.str(&out->keys.back(), kMaxKey, "key", &why);
  };
  switch (op) {
    case kSet:
      if (!oneKey() || !r.str(&out->value, kMaxValue, "value", &why) || !r.done())
        return malformed("set");
      return "";
    case kAdd:
      if (!oneKey() || !r.u64(&out->number) || !r.done()) return malformed("add");
      return "";
    case kCheck:
      if (!oneKey() || !r.done()) return malformed("check");
      return "";
    case kRemove:
      if (!oneKey() || !r.done()) return malformed("remove");
      return "";
    case kGet:
      if (!oneKey() || !r.u64(&out->number) || !r.done()) return malformed("get");
      out->number = std::min(out->number, kMaxWaitMs);
      return "";
    case kWait: {
      uint32_t n = 0;
      if (!r.u32(&n)) return malformed("wait");
      if (n > kMaxWaitKeys) {
        why = std::to_string(n) + " keys exceed the limit of " + std::to_string(kMaxWaitKeys);
        return malformed("wait");
      }
      for (uint32_t i = 0; i < n; ++i)
        if (!oneKey()) return malformed("wait");
      if (!r.u64(&out->number) || !r.done()) return malformed("wait");
      out->number = std::min(out->number, kMaxWaitMs);
      return "";
    }
    default:
      return "unknown opcode " + hexByte(op);
  }
}

// The payload of a kReplyError frame: u32 code (a hora::Code) + message.
// Returns false for a malformed one (short, or a code out of range).
inline bool parseErrorReply(const std::string& payload, Code* code, std::string* message) {
  Reader rd(payload);
  uint32_t raw = 0;
  if (!rd.u32(&raw) || raw == 0 || raw > static_cast<uint32_t>(kLastCode)) return false;
  *code = static_cast<Code>(raw);
  *message = rd.rest();
  return true;
}

inline std::string authMac(const std::string& secret, const std::string& nonce) {
  return hmacSha256(secret, std::string(kAuthContext) + nonce);
}

inline std::string hostPort(const std::string& host, int port) {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

// Sockets must not leak into processes the launcher or a rank forks.
inline void setCloseOnExec(int fd) {
  int flags = ::fcntl(fd, F_GETFD);
  if (flags >= 0) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
}

}  // namespace hora::tcp_store_wire
