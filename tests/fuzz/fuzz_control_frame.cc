// Fuzz target: the control plane's frames as they arrive on a socket
// (controllers/control_plane.h): a stream of [u32 length][u8 type][payload],
// each header checked by parseFrameHeader, each payload handed to the decoder
// of its type (hello, request/response lists, nacks, aborts), as the control
// thread does.
#include <cstring>

#include "controllers/control_plane.h"
#include "controllers/coordinator_link.h"
#include "core/message.h"
#include "core/wire.h"
#include "tests/fuzz/fuzz_target.h"

using namespace hora;  // NOLINT(build/namespaces): a test program

namespace {
std::string frame(FrameType type, const std::string& payload) {
  std::string f(5, '\0');
  uint32_t len = static_cast<uint32_t>(payload.size() + 1);
  std::memcpy(&f[0], &len, 4);
  f[4] = static_cast<char>(type);
  return f + payload;
}
}  // namespace

std::vector<std::string> horaFuzzSeeds() {
  ByteWriter hello;
  hello.str("hora-ctrl-v1");
  hello.i32(1);
  hello.str("0123456789abcdef0123456789abcdef");
  RequestList rl;
  Request r;
  r.name = "x";
  r.shape = {2};
  rl.requests.push_back(r);
  ResponseList resp;
  ResponseGroup g;
  g.items.push_back(ResponseItem{});
  resp.groups.push_back(g);
  return {frame(FrameType::kHello, hello.take()),
          frame(FrameType::kRequests, encode(rl)) + frame(FrameType::kHeartbeat, ""),
          frame(FrameType::kResponses, encode(resp)) + frame(FrameType::kNack, encode(rl)),
          frame(FrameType::kAbort, encodeAbort(Status(Code::kRemoteError, "lost"))) +
              frame(FrameType::kGoodbye, "")};
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* p = reinterpret_cast<const char*>(data);
  size_t left = size;
  while (left >= 5) {
    uint32_t len = 0;
    FrameType type;
    if (!parseFrameHeader(p, &len, &type).isOk()) return 0;
    HORA_FUZZ_CHECK(len < kMaxControlFrameBytes);
    p += 5;
    left -= 5;
    if (len > left) return 0;  // the socket would wait for the rest
    std::string payload(p, len);
    p += len;
    left -= len;
    switch (type) {
      case FrameType::kHello: {
        Hello h;
        if (parseHello(payload, &h).isOk())
          HORA_FUZZ_CHECK(h.magic.size() <= 64 && h.token.size() <= 256);
        break;
      }
      case FrameType::kRequests:
      case FrameType::kNack: {
        RequestList l;
        (void)decode(payload, &l);
        break;
      }
      case FrameType::kResponses: {
        ResponseList l;
        (void)decode(payload, &l);
        break;
      }
      case FrameType::kAbort:
        (void)decodeAbort(payload);
        break;
      default:
        break;
    }
  }
  return 0;
}
