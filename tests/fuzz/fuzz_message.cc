// Fuzz target: the coordinator protocol's RequestList and ResponseList codec
// (core/message.h), what a rank or the coordinator decodes from a peer's frame.
// The first byte picks the decoder; a list that decodes must re-encode to the
// same bytes (the codec has one encoding per value).
#include "core/message.h"
#include "tests/fuzz/fuzz_target.h"

using namespace hora;  // NOLINT(build/namespaces): a test program

namespace {

Request request(const std::string& name, CollectiveKind kind, std::vector<int64_t> shape) {
  Request r;
  r.rank = 1;
  r.kind = kind;
  r.dtype = DataType::kFloat32;
  r.name = name;
  r.shape = std::move(shape);
  if (kind == CollectiveKind::kAlltoall) r.splits = {1, 2};
  return r;
}

}  // namespace

std::vector<std::string> horaFuzzSeeds() {
  RequestList rl;
  rl.requests.push_back(request("grad.w", CollectiveKind::kAllreduce, {4, 3}));
  rl.requests.push_back(request("a2a", CollectiveKind::kAlltoall, {3}));
  rl.hits.push_back({7, 0x1234567890abcdefull});
  rl.requests[0].payload.assign(48, '\x01');  // an inline allreduce's float32[4,3]
  RequestList hitsOnly;
  hitsOnly.hits.push_back({1, 2});
  hitsOnly.hits.push_back({2, 3, std::string(8, '\x02')});

  ResponseList resp;
  ResponseGroup g;
  ResponseItem full;
  full.response.name = "grad.w";
  full.response.shape = {4, 3};
  full.response.joined = {2};
  full.response.signature = rl.requests[0].signature();
  g.items.push_back(full);
  ResponseItem cached;
  cached.cacheBit = 3;
  g.items.push_back(cached);
  ResponseItem reduced;  // an inline result on a cached response
  reduced.cacheBit = 4;
  reduced.result.assign(48, '\x03');
  g.items.push_back(reduced);
  resp.groups.push_back(g);
  ResponseGroup e;
  ResponseItem err;
  err.response.kind = ResponseKind::kError;
  err.response.errorCode = 3;
  err.response.error = "mismatched shape";
  e.items.push_back(err);
  resp.groups.push_back(e);

  return {'\0' + encode(rl), '\0' + encode(hitsOnly), '\0' + encode(RequestList{}),
          std::string(1, '\1') + encode(resp), std::string(1, '\1') + encode(ResponseList{})};
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    ResponseList list;
    if (decode(bytes, &list).isOk()) HORA_FUZZ_CHECK(encode(list) == bytes);
  } else {
    RequestList list;
    if (decode(bytes, &list).isOk()) {
      HORA_FUZZ_CHECK(encode(list) == bytes);
      for (const auto& r : list.requests) {
        (void)r.signature();
        (void)r.describe();
      }
    }
  }
  return 0;
}
