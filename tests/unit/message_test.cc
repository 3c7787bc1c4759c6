// Unit tests for core/message.h: encode/decode round trips of every message,
// request signatures, and robustness of the decoders against truncated,
// mutated and random input (they must return kProtocolError, never crash).
#include "core/message.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/wire.h"

namespace hora {
namespace {

constexpr uint8_t kRequestListTag = 0x51;
constexpr uint8_t kResponseListTag = 0x52;

// ------------------------------------------------------------------ helpers

bool sameDouble(double a, double b) { return std::memcmp(&a, &b, sizeof(a)) == 0; }

void expectEqual(const Request& a, const Request& b) {
  EXPECT_EQ(a.rank, b.rank);
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.op, b.op);
  EXPECT_EQ(a.device, b.device);
  EXPECT_EQ(a.root, b.root);
  EXPECT_TRUE(sameDouble(a.prescale, b.prescale)) << a.prescale << " vs " << b.prescale;
  EXPECT_TRUE(sameDouble(a.postscale, b.postscale)) << a.postscale << " vs " << b.postscale;
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.shape, b.shape);
  EXPECT_EQ(a.splits, b.splits);
  EXPECT_EQ(a.payload, b.payload);
  EXPECT_EQ(a.signature(), b.signature());
}

void expectEqual(const Response& a, const Response& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.op, b.op);
  EXPECT_EQ(a.device, b.device);
  EXPECT_EQ(a.root, b.root);
  EXPECT_TRUE(sameDouble(a.prescale, b.prescale));
  EXPECT_TRUE(sameDouble(a.postscale, b.postscale));
  EXPECT_EQ(a.shape, b.shape);
  EXPECT_EQ(a.sizes, b.sizes);
  EXPECT_EQ(a.joined, b.joined);
  EXPECT_EQ(a.lastJoinedRank, b.lastJoinedRank);
  EXPECT_EQ(a.errorCode, b.errorCode);
  EXPECT_EQ(a.error, b.error);
  EXPECT_EQ(a.signature, b.signature);
}

void expectEqual(const RequestList& a, const RequestList& b) {
  ASSERT_EQ(a.requests.size(), b.requests.size());
  for (size_t i = 0; i < a.requests.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    expectEqual(a.requests[i], b.requests[i]);
  }
  ASSERT_EQ(a.hits.size(), b.hits.size());
  for (size_t i = 0; i < a.hits.size(); ++i) {
    EXPECT_EQ(a.hits[i].bit, b.hits[i].bit);
    EXPECT_EQ(a.hits[i].signature, b.hits[i].signature);
    EXPECT_EQ(a.hits[i].payload, b.hits[i].payload);
  }
}

void expectEqual(const ResponseList& a, const ResponseList& b) {
  ASSERT_EQ(a.groups.size(), b.groups.size());
  for (size_t g = 0; g < a.groups.size(); ++g) {
    ASSERT_EQ(a.groups[g].items.size(), b.groups[g].items.size()) << "group " << g;
    for (size_t i = 0; i < a.groups[g].items.size(); ++i) {
      SCOPED_TRACE("group " + std::to_string(g) + " item " + std::to_string(i));
      const ResponseItem& x = a.groups[g].items[i];
      const ResponseItem& y = b.groups[g].items[i];
      EXPECT_EQ(x.cacheBit, y.cacheBit);
      EXPECT_EQ(x.result, y.result);
      if (x.cacheBit < 0) expectEqual(x.response, y.response);
    }
  }
}

Request fullRequest(int i = 0) {
  Request r;
  r.rank = 3 + i;
  r.kind = CollectiveKind::kAlltoall;
  r.dtype = DataType::kBfloat16;
  r.op = ReduceOp::kProduct;
  r.device = Device{DeviceKind::kCuda, 7};
  r.root = 2;
  r.prescale = 0.125;
  r.postscale = -3.5;
  r.name = "layer" + std::to_string(i) + "/weights:grad";
  r.shape = {4, 3, 2};
  r.splits = {1, 0, 2, 1};
  return r;
}

Response fullResponse(int i = 0) {
  Response r;
  r.kind = ResponseKind::kAllgather;
  r.name = "resp" + std::to_string(i);
  r.dtype = DataType::kInt16;
  r.op = ReduceOp::kMax;
  r.device = Device{DeviceKind::kCuda, 1};
  r.root = 5;
  r.prescale = 2.0;
  r.postscale = 0.5;
  r.shape = {10, 4};
  r.sizes = {2, 3, 5};
  r.joined = {1, 4};
  r.lastJoinedRank = 4;
  r.errorCode = static_cast<int32_t>(Code::kMismatch);
  r.error = "some error text";
  r.signature = 0xdeadbeefcafef00dull + static_cast<uint64_t>(i);
  return r;
}

RequestList roundTrip(const RequestList& in) {
  RequestList out;
  Status s = decode(encode(in), &out);
  EXPECT_TRUE(s.isOk()) << s.toString();
  return out;
}

ResponseList roundTrip(const ResponseList& in) {
  ResponseList out;
  Status s = decode(encode(in), &out);
  EXPECT_TRUE(s.isOk()) << s.toString();
  return out;
}

RequestList sampleRequestList() {
  RequestList l;
  l.requests = {fullRequest(0), fullRequest(1)};
  Request plain;
  plain.name = "plain";
  l.requests.push_back(plain);
  Request small;  // an allreduce carrying its tensor (float32[2])
  small.name = "small";
  small.shape = {2};
  small.payload = std::string("\x00\x00\x80\x3f\x00\x00\x00\x40", 8);
  l.requests.push_back(small);
  l.hits = {{0, 1}, {17, 0xffffffffffffffffull}, {0xffffffffu, 42}, {9, 7, std::string("abcd")}};
  return l;
}

ResponseList sampleResponseList() {
  ResponseList l;
  ResponseGroup g1;
  g1.items.push_back({-1, fullResponse(0)});
  g1.items.push_back({3, Response{}});
  g1.items.push_back({-1, fullResponse(1)});
  ResponseGroup g2;
  g2.items.push_back({0, Response{}});
  ResponseGroup g4;  // inline results, on a cached and on a full response
  g4.items.push_back({6, Response{}, std::string("\x01\x02\x03\x04", 4)});
  ResponseGroup g3;
  Response err;
  err.kind = ResponseKind::kError;
  err.name = "bad";
  err.errorCode = static_cast<int32_t>(Code::kTimeout);
  err.error = "waited too long";
  g3.items.push_back({-1, err});
  ResponseGroup g5;
  Response small;
  small.name = "small";
  small.shape = {1};
  g5.items.push_back({-1, small, std::string("\x00\x00\x80\x3f", 4)});
  l.groups = {g1, g2, g3, g4, g5};
  return l;
}

// ------------------------------------------------------------- round trips

TEST(MessageRoundTripTest, RequestWithEveryFieldSet) {
  RequestList in;
  in.requests = {fullRequest()};
  RequestList out = roundTrip(in);
  expectEqual(in, out);
}

TEST(MessageRoundTripTest, RequestEveryKindDtypeOp) {
  RequestList in;
  int i = 0;
  for (uint8_t k = 0; k < static_cast<uint8_t>(CollectiveKind::kCount); ++k)
    for (uint8_t d = 0; d < static_cast<uint8_t>(DataType::kCount); ++d)
      for (uint8_t o = 0; o < static_cast<uint8_t>(ReduceOp::kCount); ++o) {
        Request r = fullRequest(i++);
        r.kind = static_cast<CollectiveKind>(k);
        r.dtype = static_cast<DataType>(d);
        r.op = static_cast<ReduceOp>(o);
        r.device = Device{(i % 2) ? DeviceKind::kCpu : DeviceKind::kCuda, i % 5};
        in.requests.push_back(r);
      }
  RequestList out = roundTrip(in);
  expectEqual(in, out);
}

TEST(MessageRoundTripTest, RequestExtremeValues) {
  Request r;
  r.rank = std::numeric_limits<int32_t>::max();
  r.root = std::numeric_limits<int32_t>::min();
  r.device.index = -1;
  r.prescale = std::numeric_limits<double>::infinity();
  r.postscale = -0.0;
  r.shape = {0, std::numeric_limits<int64_t>::max()};
  r.splits = {-5, std::numeric_limits<int64_t>::min()};  // splits are not validated here
  RequestList in;
  in.requests = {r};
  RequestList out = roundTrip(in);
  expectEqual(in, out);
  EXPECT_TRUE(std::signbit(out.requests[0].postscale));
}

TEST(MessageRoundTripTest, RequestNanScaleKeepsBits) {
  Request r;
  r.prescale = std::numeric_limits<double>::quiet_NaN();
  RequestList in;
  in.requests = {r};
  RequestList out = roundTrip(in);
  EXPECT_TRUE(sameDouble(in.requests[0].prescale, out.requests[0].prescale));
}

TEST(MessageRoundTripTest, RequestMaxDims) {
  Request r;
  r.shape.assign(64, 1);
  RequestList in;
  in.requests = {r};
  expectEqual(in, roundTrip(in));
}

TEST(MessageRoundTripTest, RequestTooManyDimsRejected) {
  Request r;
  r.shape.assign(65, 1);
  RequestList in;
  in.requests = {r};
  RequestList out;
  Status s = decode(encode(in), &out);
  EXPECT_EQ(s.code(), Code::kProtocolError);
  EXPECT_NE(s.message().find("request shape"), std::string::npos) << s.message();
}

TEST(MessageRoundTripTest, LongNames) {
  RequestList in;
  Request r;
  r.name = std::string(64 * 1024, 'n');  // the decoder's limit
  in.requests.push_back(r);
  r.name = std::string(1000, '\0') + "binary\xff\x01";
  in.requests.push_back(r);
  expectEqual(in, roundTrip(in));

  ResponseList rl;
  Response resp;
  resp.name = std::string(64 * 1024, 'r');
  resp.error = std::string(100000, 'e');
  rl.groups.push_back(ResponseGroup{{ResponseItem{-1, resp}}});
  expectEqual(rl, roundTrip(rl));
}

TEST(MessageRoundTripTest, OverlongNameRejected) {
  RequestList in;
  Request r;
  r.name = std::string(64 * 1024 + 1, 'n');
  in.requests.push_back(r);
  RequestList out;
  Status s = decode(encode(in), &out);
  EXPECT_EQ(s.code(), Code::kProtocolError);
  EXPECT_NE(s.message().find("request name"), std::string::npos) << s.message();

  ResponseList rl;
  Response resp;
  resp.name = std::string(64 * 1024 + 1, 'r');
  rl.groups.push_back(ResponseGroup{{ResponseItem{-1, resp}}});
  ResponseList rout;
  EXPECT_EQ(decode(encode(rl), &rout).code(), Code::kProtocolError);
}

TEST(MessageRoundTripTest, LargeSplits) {
  RequestList in;
  Request r;
  r.kind = CollectiveKind::kAlltoall;
  for (int i = 0; i < 4096; ++i) r.splits.push_back(i * 3);
  in.requests.push_back(r);
  expectEqual(in, roundTrip(in));
}

TEST(MessageRoundTripTest, EmptyRequestList) {
  RequestList in;
  std::string bytes = encode(in);
  EXPECT_EQ(bytes.size(), 2u + 4 + 4);
  RequestList out;
  out.requests.push_back(fullRequest());  // decode replaces old content
  out.hits.push_back({1, 2});
  ASSERT_TRUE(decode(bytes, &out).isOk());
  EXPECT_TRUE(out.requests.empty());
  EXPECT_TRUE(out.hits.empty());
}

TEST(MessageRoundTripTest, HitsOnly) {
  RequestList in;
  for (uint32_t i = 0; i < 1000; ++i) in.hits.push_back({i, i * 0x9e3779b97f4a7c15ull});
  expectEqual(in, roundTrip(in));
}

TEST(MessageRoundTripTest, RequestsAndHits) {
  RequestList in = sampleRequestList();
  expectEqual(in, roundTrip(in));
}

TEST(MessageRoundTripTest, ResponseWithEveryFieldSet) {
  ResponseList in;
  in.groups.push_back(ResponseGroup{{ResponseItem{-1, fullResponse()}}});
  expectEqual(in, roundTrip(in));
}

TEST(MessageRoundTripTest, ResponseEveryKindDtypeOp) {
  ResponseList in;
  int i = 0;
  for (uint8_t k = 0; k <= static_cast<uint8_t>(ResponseKind::kError); ++k) {
    ResponseGroup g;
    for (uint8_t d = 0; d < static_cast<uint8_t>(DataType::kCount); ++d)
      for (uint8_t o = 0; o < static_cast<uint8_t>(ReduceOp::kCount); ++o) {
        Response r = fullResponse(i++);
        r.kind = static_cast<ResponseKind>(k);
        r.dtype = static_cast<DataType>(d);
        r.op = static_cast<ReduceOp>(o);
        r.device = Device{(i % 2) ? DeviceKind::kCpu : DeviceKind::kCuda, i % 3};
        g.items.push_back({-1, r});
      }
    in.groups.push_back(g);
  }
  expectEqual(in, roundTrip(in));
}

TEST(MessageRoundTripTest, CachedItemsCarryOnlyTheBit) {
  ResponseList in;
  ResponseGroup g;
  g.items.push_back({5, fullResponse()});  // the response is not sent for cached items
  in.groups.push_back(g);
  std::string bytes = encode(in);
  EXPECT_EQ(bytes.size(), 2u + 4 + 4 + 4 + 4);  // ... the bit and an empty result
  ResponseList out;
  ASSERT_TRUE(decode(bytes, &out).isOk());
  ASSERT_EQ(out.groups.size(), 1u);
  ASSERT_EQ(out.groups[0].items.size(), 1u);
  EXPECT_EQ(out.groups[0].items[0].cacheBit, 5);
  EXPECT_EQ(out.groups[0].items[0].response.name, "");
}

TEST(MessageRoundTripTest, InlineDataPastTheCapIsRefused) {
  // A payload or result longer than kMaxInlineBytes cannot come from a correct
  // peer (HORA_INLINE_MAX_BYTES is capped there): refused before it is kept.
  RequestList rq;
  Request r;
  r.name = "big";
  r.shape = {static_cast<int64_t>(kMaxInlineBytes / 4 + 1)};
  r.payload.assign(kMaxInlineBytes + 4, 'x');
  rq.requests = {r};
  RequestList rqOut;
  EXPECT_EQ(decode(encode(rq), &rqOut).code(), Code::kProtocolError);
  RequestList hits;
  hits.hits = {{1, 2, std::string(kMaxInlineBytes + 1, 'x')}};
  EXPECT_EQ(decode(encode(hits), &rqOut).code(), Code::kProtocolError);
  ResponseList rs;
  rs.groups.push_back(
      ResponseGroup{{ResponseItem{3, Response{}, std::string(kMaxInlineBytes + 1, 'x')}}});
  ResponseList rsOut;
  EXPECT_EQ(decode(encode(rs), &rsOut).code(), Code::kProtocolError);
  // At the cap it passes.
  rs.groups[0].items[0].result.assign(kMaxInlineBytes, 'x');
  EXPECT_TRUE(decode(encode(rs), &rsOut).isOk());
}

TEST(MessageRoundTripTest, MixedCachedAndFullItems) {
  ResponseList in = sampleResponseList();
  expectEqual(in, roundTrip(in));
}

TEST(MessageRoundTripTest, EmptyResponseList) {
  ResponseList in;
  std::string bytes = encode(in);
  EXPECT_EQ(bytes.size(), 2u + 4);
  ResponseList out;
  out.groups.push_back(ResponseGroup{{ResponseItem{}}});
  ASSERT_TRUE(decode(bytes, &out).isOk());
  EXPECT_TRUE(out.groups.empty());
}

TEST(MessageRoundTripTest, EmptyResponseFieldsRoundTrip) {
  ResponseList in;
  Response r;  // all defaults, empty vectors and strings
  in.groups.push_back(ResponseGroup{{ResponseItem{-1, r}}});
  expectEqual(in, roundTrip(in));
}

TEST(MessageRoundTripTest, EmptyGroupIsRejected) {
  // The coordinator never emits an empty group; the decoder treats one as corrupt.
  ResponseList in;
  in.groups.push_back(ResponseGroup{});
  ResponseList out;
  Status s = decode(encode(in), &out);
  EXPECT_EQ(s.code(), Code::kProtocolError);
  EXPECT_NE(s.message().find("group size 0"), std::string::npos) << s.message();
}

// Found by tests/fuzz/fuzz_message.cc's review: a count was checked against the
// bytes left (one byte per entry), so a 64 MiB frame could make a rank
// allocate gigabytes of Requests or ResponseItems before failing.
TEST(MessageRoundTripTest, CountsAreBoundedByEncodedSizeAndLimit) {
  {
    // 1,000 requests claimed in 1,000 bytes: fewer than 44 bytes each cannot be.
    ByteWriter w;
    w.u8(0x51);
    w.u8(kWireVersion);
    w.u32(1000);
    w.buffer().append(1000, '\0');
    RequestList out;
    Status s = decode(w.take(), &out);
    EXPECT_EQ(s.code(), Code::kProtocolError);
    EXPECT_NE(s.message().find("request count 1000 exceeds message"), std::string::npos)
        << s.message();
  }
  {
    // Cache bits are 4 bytes each, but no list holds more than 2^18 items.
    ResponseList in;
    in.groups.resize(2);
    in.groups[0].items.resize(1 << 17, ResponseItem{1, Response{}});
    in.groups[1].items.resize((1 << 17) + 1, ResponseItem{1, Response{}});
    ResponseList out;
    Status s = decode(encode(in), &out);
    EXPECT_EQ(s.code(), Code::kProtocolError);
    EXPECT_NE(s.message().find("exceeds the limit of 262144"), std::string::npos) << s.message();
    in.groups[1].items.pop_back();
    EXPECT_TRUE(decode(encode(in), &out).isOk());
  }
}

TEST(MessageRoundTripTest, FieldHelpersRoundTrip) {
  ByteWriter w;
  encodeRequest(w, fullRequest());
  encodeResponse(w, fullResponse());
  std::string bytes = w.take();
  ByteReader rd(bytes);
  Request req;
  Response resp;
  ASSERT_TRUE(decodeRequest(rd, &req).isOk());
  ASSERT_TRUE(decodeResponse(rd, &resp).isOk());
  EXPECT_TRUE(rd.done());
  expectEqual(fullRequest(), req);
  expectEqual(fullResponse(), resp);
}

TEST(MessageRoundTripTest, EncodingIsDeterministic) {
  EXPECT_EQ(encode(sampleRequestList()), encode(sampleRequestList()));
  EXPECT_EQ(encode(sampleResponseList()), encode(sampleResponseList()));
  EXPECT_EQ(static_cast<uint8_t>(encode(sampleRequestList())[0]), kRequestListTag);
  EXPECT_EQ(static_cast<uint8_t>(encode(sampleResponseList())[0]), kResponseListTag);
  EXPECT_EQ(static_cast<uint8_t>(encode(sampleRequestList())[1]), kWireVersion);
}

// -------------------------------------------------------------- signatures

TEST(SignatureTest, EqualForEqualRequestsFromDifferentRanks) {
  Request a = fullRequest();
  Request b = a;
  b.rank = a.rank + 5;
  EXPECT_EQ(a.signature(), b.signature());
  Request c;
  Request d;
  d.rank = 1;
  EXPECT_EQ(c.signature(), d.signature());
}

TEST(SignatureTest, DeviceIndexIsNotPartOfIt) {
  // Rank i may hold the tensor on cuda:i; the ranks' signatures must agree.
  Request a;
  a.name = "g";
  a.device = Device{DeviceKind::kCuda, 0};
  Request b = a;
  b.device.index = 3;
  EXPECT_EQ(a.signature(), b.signature());
}

TEST(SignatureTest, StableAcrossRoundTrip) {
  RequestList in;
  in.requests = {fullRequest()};
  RequestList out = roundTrip(in);
  EXPECT_EQ(in.requests[0].signature(), out.requests[0].signature());
}

TEST(SignatureTest, DiffersWhenAnyFieldDiffers) {
  const Request base = fullRequest();
  const uint64_t s0 = base.signature();
  std::vector<std::pair<const char*, Request>> variants;
  auto add = [&](const char* what, auto mutate) {
    Request r = base;
    mutate(r);
    variants.push_back({what, r});
  };
  add("kind", [](Request& r) { r.kind = CollectiveKind::kAllreduce; });
  add("dtype", [](Request& r) { r.dtype = DataType::kFloat16; });
  add("op", [](Request& r) { r.op = ReduceOp::kSum; });
  add("device kind", [](Request& r) { r.device.kind = DeviceKind::kCpu; });
  add("root", [](Request& r) { r.root = 0; });
  add("prescale", [](Request& r) { r.prescale = 0.25; });
  add("postscale", [](Request& r) { r.postscale = 3.5; });
  add("postscale sign of zero", [](Request& r) { r.postscale = -0.0; });
  add("name", [](Request& r) { r.name += "x"; });
  add("name one char", [](Request& r) { r.name[0] = 'L'; });
  add("empty name", [](Request& r) { r.name.clear(); });
  add("shape value", [](Request& r) { r.shape[1] = 5; });
  add("shape rank", [](Request& r) { r.shape.push_back(1); });
  add("shape order", [](Request& r) { r.shape = {3, 4, 2}; });
  add("scalar", [](Request& r) { r.shape.clear(); });
  add("splits value", [](Request& r) { r.splits[0] = 2; });
  add("splits length", [](Request& r) { r.splits.push_back(0); });
  add("no splits", [](Request& r) { r.splits.clear(); });
  add("shape/splits boundary", [](Request& r) {
    // Same concatenated numbers, split differently between the two vectors.
    r.shape = {4, 3, 2, 1};
    r.splits = {0, 2, 1};
  });
  for (const auto& [what, r] : variants) EXPECT_NE(r.signature(), s0) << what;
  // And all variants differ from one another.
  for (size_t i = 0; i < variants.size(); ++i)
    for (size_t j = i + 1; j < variants.size(); ++j)
      EXPECT_NE(variants[i].second.signature(), variants[j].second.signature())
          << variants[i].first << " vs " << variants[j].first;
}

TEST(SignatureTest, EveryDtypeAndKindDistinct) {
  std::vector<uint64_t> seen;
  for (uint8_t k = 0; k < static_cast<uint8_t>(CollectiveKind::kCount); ++k)
    for (uint8_t d = 0; d < static_cast<uint8_t>(DataType::kCount); ++d) {
      Request r;
      r.kind = static_cast<CollectiveKind>(k);
      r.dtype = static_cast<DataType>(d);
      uint64_t s = r.signature();
      for (uint64_t o : seen) EXPECT_NE(s, o);
      seen.push_back(s);
    }
}

// BUG (core/message.cc:46, Request::signature): the name is hashed without its
// length, immediately followed by the 8-byte shape count, so a name that ends
// in the bytes of a shape count collides with a shorter name plus a shape.
// Here {name "n", shape [0]} and {name "n\x01\0\0\0\0\0\0\0", shape []} hash
// the same, and a cache hit for one is accepted for the other at the same bit
// (ResponseCache::peek checks only the signature). Fix: hash name.size()
// before the name bytes.
TEST(SignatureTest, BUG_NameIsLengthPrefixed) {
  Request a;
  a.name = "n";
  a.shape = {0};
  Request b;
  b.name = std::string("n\x01\0\0\0\0\0\0\0", 9);
  b.shape = {};
  EXPECT_NE(a.signature(), b.signature())
      << "signature collision: name bytes run into the shape count";
}

TEST(DescribeTest, RequestDescribe) {
  Request r;
  r.name = "w";
  r.shape = {4, 3};
  EXPECT_EQ(r.describe(), "allreduce \"w\": float32[4,3]");
}

TEST(ResponseTest, FusableAndCacheable) {
  Response r;
  for (uint8_t k = 0; k <= static_cast<uint8_t>(ResponseKind::kError); ++k) {
    r.kind = static_cast<ResponseKind>(k);
    r.joined.clear();
    EXPECT_EQ(r.fusable(), r.kind == ResponseKind::kAllreduce) << int(k);
    bool cacheable = r.kind == ResponseKind::kAllreduce || r.kind == ResponseKind::kBroadcast ||
                     r.kind == ResponseKind::kReducescatter;
    EXPECT_EQ(r.cacheable(), cacheable) << int(k);
    r.joined = {1};
    EXPECT_FALSE(r.cacheable()) << int(k);
  }
}

TEST(ResponseTest, ByteSize) {
  Response r;
  r.dtype = DataType::kFloat64;
  r.shape = {3, 5};
  EXPECT_EQ(r.numElements(), 15);
  EXPECT_EQ(r.byteSize(), 120);
  r.shape = {};
  EXPECT_EQ(r.numElements(), 1);
  r.shape = {0, 7};
  EXPECT_EQ(r.byteSize(), 0);
  r.dtype = DataType::kBfloat16;
  r.shape = {1024};
  EXPECT_EQ(r.byteSize(), 2048);
}

// Issue 14: the limit every size computation relies on (core/types.h).
TEST(ShapeOverflowTest, FirstDimensionPastTheLimit) {
  const int64_t k2e40 = int64_t{1} << 40, k2e62 = int64_t{1} << 62;
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(kMaxTensorBytes, kMax);
  EXPECT_EQ(shapeOverflowDim({}, 4), -1);
  EXPECT_EQ(shapeOverflowDim({0}, 8), -1);
  EXPECT_EQ(shapeOverflowDim({3, 5}, 8), -1);
  EXPECT_EQ(shapeOverflowDim({k2e40, k2e40}, 4), 1);  // wrapped to 0 elements
  EXPECT_EQ(shapeOverflowDim({k2e62 + 1, 4}, 4), 0);  // wrapped to 4
  EXPECT_EQ(shapeOverflowDim({k2e62, 3}, 4), 0);      // wrapped negative
  EXPECT_EQ(shapeOverflowDim({kMax}, 1), -1);         // exactly the limit
  EXPECT_EQ(shapeOverflowDim({kMax}, 2), 0);
  EXPECT_EQ(shapeOverflowDim({k2e62, 2}, 1), 1);  // 2^63 bytes: one past
  EXPECT_EQ(shapeOverflowDim({1, 1, k2e62 - 1, 2}, 1), -1);
  EXPECT_EQ(shapeOverflowDim({0, k2e62, 4}, 1), 2);  // empty, but one row would overflow
  EXPECT_EQ(shapeOverflowDim({k2e62, 0}, 2), 0);     // the dimensions so far already do
  EXPECT_EQ(shapeOverflowDim({4, -1}, 4), 1);
  EXPECT_EQ(shapeOverflowDim({std::numeric_limits<int64_t>::min()}, 1), 0);
}

// ---------------------------------------------------------- header errors

TEST(MessageHeaderTest, WrongVersionNamesVersion) {
  std::string bytes = encode(sampleRequestList());
  bytes[1] = static_cast<char>(kWireVersion + 1);
  RequestList out;
  Status s = decode(bytes, &out);
  EXPECT_EQ(s.code(), Code::kProtocolError);
  EXPECT_NE(s.message().find("version"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("wire version " + std::to_string(kWireVersion + 1)), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("speaks " + std::to_string(kWireVersion)), std::string::npos);

  std::string rbytes = encode(sampleResponseList());
  rbytes[1] = 0;
  ResponseList rout;
  s = decode(rbytes, &rout);
  EXPECT_EQ(s.code(), Code::kProtocolError);
  EXPECT_NE(s.message().find("wire version 0"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("response list"), std::string::npos) << s.message();
}

TEST(MessageHeaderTest, WrongTagRejected) {
  std::string bytes = encode(sampleRequestList());
  bytes[0] = 0x00;
  RequestList out;
  Status s = decode(bytes, &out);
  EXPECT_EQ(s.code(), Code::kProtocolError);
  EXPECT_NE(s.message().find("not a request list"), std::string::npos) << s.message();
}

TEST(MessageHeaderTest, ListsAreNotInterchangeable) {
  RequestList rq;
  ResponseList rs;
  Status a = decode(encode(sampleResponseList()), &rq);
  Status b = decode(encode(sampleRequestList()), &rs);
  EXPECT_EQ(a.code(), Code::kProtocolError);
  EXPECT_EQ(b.code(), Code::kProtocolError);
  EXPECT_NE(a.message().find("tag 82"), std::string::npos) << a.message();
  EXPECT_NE(b.message().find("tag 81"), std::string::npos) << b.message();
}

TEST(MessageHeaderTest, EmptyAndOneByteBuffers) {
  RequestList rq;
  ResponseList rs;
  EXPECT_EQ(decode(std::string(), &rq).code(), Code::kProtocolError);
  EXPECT_EQ(decode(std::string(), &rs).code(), Code::kProtocolError);
  EXPECT_EQ(decode(std::string(1, static_cast<char>(kRequestListTag)), &rq).code(),
            Code::kProtocolError);
  EXPECT_EQ(decode(std::string(1, static_cast<char>(kResponseListTag)), &rs).code(),
            Code::kProtocolError);
}

TEST(MessageHeaderTest, TrailingBytesRejected) {
  std::string bytes = encode(sampleRequestList()) + "x";
  RequestList out;
  Status s = decode(bytes, &out);
  EXPECT_EQ(s.code(), Code::kProtocolError);
  EXPECT_NE(s.message().find("trailing"), std::string::npos);
  std::string rbytes = encode(sampleResponseList()) + std::string(1, '\0');
  ResponseList rout;
  EXPECT_EQ(decode(rbytes, &rout).code(), Code::kProtocolError);
}

// ------------------------------------------------------------ enum ranges

// Offsets of the enum bytes in an encoded single-request list:
// tag(1) version(1) count(4) | rank(4) kind dtype op device ...
constexpr size_t kReqKindAt = 2 + 4 + 4;
// Offsets in a single-group, single-full-item response list:
// tag version groups(4) items(4) bit(4) | kind name(4+len) dtype op device ...
constexpr size_t kRespKindAt = 2 + 4 + 4 + 4;

Status decodeRequestWithByte(size_t offset, uint8_t value) {
  RequestList in;
  Request r;
  r.name = "t";
  in.requests = {r};
  std::string bytes = encode(in);
  bytes[offset] = static_cast<char>(value);
  RequestList out;
  return decode(bytes, &out);
}

TEST(MessageEnumTest, RequestEnumsOutOfRangeRejected) {
  struct Case {
    size_t offset;
    uint8_t firstBad;
    const char* what;
  };
  const Case cases[] = {
      {kReqKindAt, static_cast<uint8_t>(CollectiveKind::kCount), "collective"},
      {kReqKindAt + 1, static_cast<uint8_t>(DataType::kCount), "dtype"},
      {kReqKindAt + 2, static_cast<uint8_t>(ReduceOp::kCount), "reduce op"},
      {kReqKindAt + 3, 2, "device kind"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_TRUE(decodeRequestWithByte(c.offset, c.firstBad - 1).isOk());
    for (int v = c.firstBad; v <= 255; ++v) {
      Status s = decodeRequestWithByte(c.offset, static_cast<uint8_t>(v));
      ASSERT_EQ(s.code(), Code::kProtocolError) << v;
      EXPECT_NE(s.message().find(std::string("invalid ") + c.what), std::string::npos)
          << s.message();
      EXPECT_NE(s.message().find(std::to_string(v)), std::string::npos) << s.message();
    }
  }
}

Status decodeResponseWithByte(size_t offset, uint8_t value) {
  ResponseList in;
  Response r;
  r.name = "t";
  in.groups.push_back(ResponseGroup{{ResponseItem{-1, r}}});
  std::string bytes = encode(in);
  bytes[offset] = static_cast<char>(value);
  ResponseList out;
  return decode(bytes, &out);
}

TEST(MessageEnumTest, ResponseEnumsOutOfRangeRejected) {
  const size_t afterName = kRespKindAt + 1 + 4 + 1;  // name "t"
  struct Case {
    size_t offset;
    uint8_t firstBad;
    const char* what;
  };
  const Case cases[] = {
      {kRespKindAt, static_cast<uint8_t>(ResponseKind::kError) + 1, "response kind"},
      {afterName, static_cast<uint8_t>(DataType::kCount), "dtype"},
      {afterName + 1, static_cast<uint8_t>(ReduceOp::kCount), "reduce op"},
      {afterName + 2, 2, "device kind"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_TRUE(decodeResponseWithByte(c.offset, c.firstBad - 1).isOk());
    for (int v = c.firstBad; v <= 255; ++v) {
      Status s = decodeResponseWithByte(c.offset, static_cast<uint8_t>(v));
      ASSERT_EQ(s.code(), Code::kProtocolError) << v;
      EXPECT_NE(s.message().find(std::string("invalid ") + c.what), std::string::npos)
          << s.message();
    }
  }
}

TEST(MessageEnumTest, NegativeDimensionsRejected) {
  RequestList in;
  Request r;
  r.name = "neg";
  r.shape = {4, -1};
  in.requests = {r};
  RequestList out;
  Status s = decode(encode(in), &out);
  EXPECT_EQ(s.code(), Code::kProtocolError);
  EXPECT_NE(s.message().find("negative dimension"), std::string::npos);
  EXPECT_NE(s.message().find("neg"), std::string::npos);

  ResponseList rin;
  Response resp;
  resp.name = "negr";
  resp.shape = {-7};
  rin.groups.push_back(ResponseGroup{{ResponseItem{-1, resp}}});
  ResponseList rout;
  s = decode(encode(rin), &rout);
  EXPECT_EQ(s.code(), Code::kProtocolError);
  EXPECT_NE(s.message().find("negr"), std::string::npos);
}

TEST(MessageEnumTest, HugeCountsRejectedWithoutAllocating) {
  // Counts claim far more elements than the buffer holds.
  ByteWriter w;
  w.u8(kRequestListTag);
  w.u8(kWireVersion);
  w.u32(0xffffffffu);
  RequestList out;
  EXPECT_EQ(decode(w.take(), &out).code(), Code::kProtocolError);

  ByteWriter h;
  h.u8(kRequestListTag);
  h.u8(kWireVersion);
  h.u32(0);
  h.u32(0x7fffffffu);  // cache hits
  h.u32(1);
  EXPECT_EQ(decode(h.take(), &out).code(), Code::kProtocolError);

  ByteWriter g;
  g.u8(kResponseListTag);
  g.u8(kWireVersion);
  g.u32(0xffffffffu);
  ResponseList rout;
  EXPECT_EQ(decode(g.take(), &rout).code(), Code::kProtocolError);

  ByteWriter gi;
  gi.u8(kResponseListTag);
  gi.u8(kWireVersion);
  gi.u32(1);
  gi.u32(0xffffffffu);  // items in the group
  gi.i32(1);
  EXPECT_EQ(decode(gi.take(), &rout).code(), Code::kProtocolError);
}

// ------------------------------------------------------------- truncation

TEST(MessageTruncationTest, EveryPrefixOfRequestListFails) {
  const std::string full = encode(sampleRequestList());
  ASSERT_GT(full.size(), 100u);
  for (size_t n = 0; n < full.size(); ++n) {
    RequestList out;
    Status s = decode(full.substr(0, n), &out);
    ASSERT_FALSE(s.isOk()) << "prefix " << n << " of " << full.size() << " decoded";
    ASSERT_EQ(s.code(), Code::kProtocolError) << n << ": " << s.toString();
    ASSERT_FALSE(s.message().empty());
  }
}

TEST(MessageTruncationTest, EveryPrefixOfResponseListFails) {
  const std::string full = encode(sampleResponseList());
  ASSERT_GT(full.size(), 100u);
  for (size_t n = 0; n < full.size(); ++n) {
    ResponseList out;
    Status s = decode(full.substr(0, n), &out);
    ASSERT_FALSE(s.isOk()) << "prefix " << n << " of " << full.size() << " decoded";
    ASSERT_EQ(s.code(), Code::kProtocolError) << n << ": " << s.toString();
  }
}

TEST(MessageTruncationTest, EveryPrefixOfSingleFieldsFails) {
  ByteWriter w;
  encodeRequest(w, fullRequest());
  const std::string req = w.take();
  for (size_t n = 0; n < req.size(); ++n) {
    ByteReader rd(req.data(), n);
    Request out;
    Status s = decodeRequest(rd, &out);
    ASSERT_EQ(s.code(), Code::kProtocolError) << n;
    EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.message();
  }
  ByteWriter w2;
  encodeResponse(w2, fullResponse());
  const std::string resp = w2.take();
  for (size_t n = 0; n < resp.size(); ++n) {
    ByteReader rd(resp.data(), n);
    Response out;
    ASSERT_EQ(decodeResponse(rd, &out).code(), Code::kProtocolError) << n;
  }
}

// -------------------------------------------------------------------- fuzz

// Decoding must never crash; when it succeeds, the result must re-encode to
// exactly the input (the encoding is canonical).
void checkDecodesCleanly(const std::string& bytes, int* okCount) {
  RequestList rq;
  Status s = decode(bytes, &rq);
  if (s.isOk()) {
    ++*okCount;
    ASSERT_EQ(encode(rq), bytes);
  } else {
    ASSERT_EQ(s.code(), Code::kProtocolError) << s.toString();
  }
  ResponseList rs;
  s = decode(bytes, &rs);
  if (s.isOk()) {
    ++*okCount;
    ASSERT_EQ(encode(rs), bytes);
  } else {
    ASSERT_EQ(s.code(), Code::kProtocolError) << s.toString();
  }
}

TEST(MessageFuzzTest, RandomBuffers) {
  std::mt19937_64 rng(20240601);
  int ok = 0;
  for (int i = 0; i < 20000; ++i) {
    size_t len = rng() % 300;
    std::string bytes(len, '\0');
    for (auto& c : bytes) c = static_cast<char>(rng() & 0xff);
    // Half the time give it a valid header so the decoder gets past the tag.
    if (len >= 2 && (i % 2 == 0)) {
      bytes[0] = static_cast<char>((i % 4 == 0) ? kRequestListTag : kResponseListTag);
      bytes[1] = static_cast<char>(kWireVersion);
    }
    // Small counts so the body parsers are exercised, not just the count checks.
    if (len >= 6 && (i % 3 == 0)) {
      bytes[2] = static_cast<char>(rng() % 3);
      bytes[3] = bytes[4] = bytes[5] = 0;
    }
    checkDecodesCleanly(bytes, &ok);
    if (HasFatalFailure()) return;
  }
  RecordProperty("decoded_ok", ok);
}

TEST(MessageFuzzTest, MutatedValidEncodings) {
  std::mt19937_64 rng(7);
  const std::vector<std::string> seeds = {encode(sampleRequestList()), encode(sampleResponseList()),
                                          encode(RequestList{}), encode(ResponseList{})};
  int ok = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string bytes = seeds[i % seeds.size()];
    int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations; ++m) {
      switch (rng() % 5) {
        case 0:  // flip one bit
        case 1:
          if (!bytes.empty()) bytes[rng() % bytes.size()] ^= static_cast<char>(1u << (rng() % 8));
          break;
        case 2:  // replace a byte
          if (!bytes.empty()) bytes[rng() % bytes.size()] = static_cast<char>(rng() & 0xff);
          break;
        case 3:  // truncate
          if (!bytes.empty()) bytes.resize(rng() % bytes.size());
          break;
        case 4:  // insert a byte
          bytes.insert(bytes.begin() + static_cast<long>(rng() % (bytes.size() + 1)),
                       static_cast<char>(rng() & 0xff));
          break;
      }
    }
    checkDecodesCleanly(bytes, &ok);
    if (HasFatalFailure()) return;
  }
  // Some single-bit flips land in payload (names, scales) and stay valid.
  EXPECT_GT(ok, 0);
}

TEST(MessageFuzzTest, EveryByteOfValidEncodingEveryValue) {
  // Exhaustive single-byte substitution over a small request and response.
  RequestList rq;
  Request r;
  r.name = "ab";
  r.shape = {2};
  r.splits = {1};
  rq.requests = {r};
  rq.hits = {{1, 2}};
  ResponseList rs;
  Response resp;
  resp.name = "c";
  resp.shape = {3};
  resp.sizes = {1};
  resp.joined = {0};
  resp.error = "e";
  rs.groups.push_back(ResponseGroup{{ResponseItem{-1, resp}, ResponseItem{2, Response{}}}});
  int ok = 0;
  for (const std::string& seed : {encode(rq), encode(rs)}) {
    for (size_t pos = 0; pos < seed.size(); ++pos) {
      for (int v = 0; v < 256; ++v) {
        std::string bytes = seed;
        bytes[pos] = static_cast<char>(v);
        checkDecodesCleanly(bytes, &ok);
        if (HasFatalFailure()) return;
      }
    }
  }
  EXPECT_GT(ok, 0);
}

}  // namespace
}  // namespace hora

namespace hora {
namespace {

TEST(MessageTuningTest, TuningTravelsAfterTheGroupsOnlyWhenPresent) {
  ResponseList plain = sampleResponseList();
  const std::string without = encode(plain);
  ResponseList tuned = plain;
  TuningValues v;
  v.fusionThresholdBytes = 1 << 20;
  v.cycleTimeUs = 250;
  v.shmChunkBytes = 512 << 10;
  v.shmMinBytes = 4096;
  v.glooBcubeMaxBytes = 0;
  tuned.tuning = v;
  const std::string with = encode(tuned);
  EXPECT_EQ(with.size(), without.size() + 1 + 8 * kTuneDims);  // unchanged wire without it
  EXPECT_EQ(with.compare(0, without.size(), without), 0);
  ResponseList out;
  out.tuning = TuningValues();  // a reused list: decode clears it
  ASSERT_TRUE(decode(without, &out).isOk());
  EXPECT_FALSE(out.tuning.has_value());
  ASSERT_TRUE(decode(with, &out).isOk());
  ASSERT_TRUE(out.tuning.has_value());
  EXPECT_EQ(*out.tuning, v);
  expectEqual(out, plain);
  // Truncated, a wrong tag, a negative value: protocol errors.
  EXPECT_EQ(decode(with.substr(0, with.size() - 1), &out).code(), Code::kProtocolError);
  std::string badTag = with;
  badTag[without.size()] = 0x55;
  EXPECT_EQ(decode(badTag, &out).code(), Code::kProtocolError);
  tuned.tuning->shmMinBytes = -1;
  EXPECT_EQ(decode(encode(tuned), &out).code(), Code::kProtocolError);
}

}  // namespace
}  // namespace hora
