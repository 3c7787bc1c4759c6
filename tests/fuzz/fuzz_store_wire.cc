// Fuzz target: the rendezvous store's wire format (core/tcp_store_wire.h), the
// bytes its server reads from any process that can reach the port, and the
// replies its client reads: a stream of frames, each header checked by
// decodeHeader against the server's limits, each request payload parsed by
// parseRequest and each error reply by parseErrorReply.
#include "core/tcp_store_wire.h"
#include "tests/fuzz/fuzz_target.h"

using namespace hora;                  // NOLINT(build/namespaces): a test program
using namespace hora::tcp_store_wire;  // NOLINT(build/namespaces)

std::vector<std::string> horaFuzzSeeds() {
  return {
      Writer().raw(std::string(kMacSize, 'm')).frame(kAuth) +
          Writer().str("rank/0").str("10.0.0.1:4000").frame(kSet),
      Writer().str("key").u64(5000).frame(kGet) + Writer().str("counter").u64(1).frame(kAdd),
      Writer().u32(2).str("a").str("b").u64(100).frame(kWait) + Writer().str("a").frame(kCheck) +
          Writer().str("a").frame(kRemove),
      Writer().u32(static_cast<uint32_t>(Code::kAuthError)).raw("bad HMAC").frame(kReplyError),
  };
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string in(reinterpret_cast<const char*>(data), size);
  size_t pos = 0;
  while (in.size() - pos >= kHeaderSize) {
    std::array<unsigned char, kHeaderSize> raw{};
    for (size_t i = 0; i < kHeaderSize; ++i) raw[i] = static_cast<unsigned char>(in[pos + i]);
    pos += kHeaderSize;
    Header h;
    if (!decodeHeader(raw, &h).empty() || h.length > kMaxFrame) return 0;
    if (h.length > in.size() - pos) return 0;
    std::string body = in.substr(pos, h.length);
    pos += h.length;
    if (isRequestOp(h.op)) {
      Request req;
      if (parseRequest(h.op, body, &req).empty()) {
        HORA_FUZZ_CHECK(req.op == kWait ? req.keys.size() <= kMaxWaitKeys : req.keys.size() == 1);
        for (const auto& k : req.keys) HORA_FUZZ_CHECK(k.size() <= kMaxKey);
        if (req.op == kGet || req.op == kWait) HORA_FUZZ_CHECK(req.number <= kMaxWaitMs);
      }
    } else if (h.op == kReplyError) {
      Code code;
      std::string message;
      if (parseErrorReply(body, &code, &message))
        HORA_FUZZ_CHECK(static_cast<int>(code) > 0 && code <= kLastCode);
    }
  }
  return 0;
}
