// Unit tests for the coordinator's inline allreduce (controllers/coordinator.h,
// step 5; the other collectives: inline_collectives_test.cc): payloads reduced in rank order, what
// leaves a tensor to the data plane (a rank without its payload, a joined rank, an op the dtype has
// no kernel for), cache hits carrying payloads, the result on the wire for a cached response, and
// malformed payloads as protocol errors. Pure logic.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "controllers/coordinator.h"
#include "core/agreed_group.h"

namespace hora {
namespace {

template <typename T>
std::string bytesOf(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

template <typename T>
std::vector<T> valuesOf(const std::string& s) {
  std::vector<T> v(s.size() / sizeof(T));
  std::memcpy(v.data(), s.data(), v.size() * sizeof(T));
  return v;
}

Request allreduce(const std::string& name, DataType dtype, int64_t n, std::string payload,
                  ReduceOp op = ReduceOp::kSum) {
  Request r;
  r.kind = CollectiveKind::kAllreduce;
  r.name = name;
  r.dtype = dtype;
  r.op = op;
  r.shape = {n};
  r.payload = std::move(payload);
  return r;
}

class InlineTest : public ::testing::Test {
 protected:
  void make(int size) {
    CoordinatorOptions o;
    o.size = size;
    cache_ = std::make_unique<ResponseCache>(64);
    coord_ = std::make_unique<Coordinator>(o, cache_.get(), Logger(LogLevel::kOff, "[test]"));
  }
  Status submit(int rank, const Request& r) {
    RequestList l;
    l.requests = {r};
    return coord_->onRequests(rank, l, t0_, &nacks_);
  }
  Status hit(int rank, CacheHit h) {
    RequestList l;
    l.hits = {std::move(h)};
    return coord_->onRequests(rank, l, t0_, &nacks_);
  }
  // The single response of the next emit, as the coordinator's own rank sees
  // it, and the wire item the others get.
  Response emitOne(ResponseItem* wire = nullptr) {
    std::vector<std::vector<Response>> resolved;
    ResponseList l = coord_->emit(&resolved);
    EXPECT_EQ(resolved.size(), 1u);
    EXPECT_EQ(l.groups.size(), 1u);
    if (resolved.size() != 1 || resolved[0].size() != 1 || l.groups[0].items.size() != 1) {
      ADD_FAILURE() << "expected one response alone in its group";
      return Response{};
    }
    if (wire) *wire = l.groups[0].items[0];
    return resolved[0][0];
  }

  Clock::time_point t0_ = Clock::time_point() + std::chrono::hours(1000);
  std::unique_ptr<ResponseCache> cache_;
  std::unique_ptr<Coordinator> coord_;
  std::vector<CacheHit> nacks_;
};

TEST_F(InlineTest, SumOfEveryRanksPayloadTravelsWithTheResponse) {
  make(3);
  for (int r = 0; r < 3; ++r)
    ASSERT_TRUE(
        submit(r, allreduce("t", DataType::kFloat32, 2, bytesOf(std::vector<float>{1.0f + r, 10})))
            .isOk());
  ResponseItem wire;
  Response resp = emitOne(&wire);
  EXPECT_EQ(resp.kind, ResponseKind::kAllreduce);
  EXPECT_EQ(valuesOf<float>(resp.inlineResult), (std::vector<float>{6, 30}));
  // The wire carries the result beside the response, not inside it.
  EXPECT_EQ(wire.result, resp.inlineResult);
  EXPECT_TRUE(wire.response.inlineResult.empty());
  EXPECT_FALSE(resp.fusable());
}

TEST_F(InlineTest, RankOrderAndEveryOp) {
  make(2);
  struct Case {
    ReduceOp op;
    std::vector<int32_t> want;
  };
  const std::vector<int32_t> a{3, -7, 5}, b{4, 2, -5};
  for (const Case& c : {Case{ReduceOp::kSum, {7, -5, 0}}, Case{ReduceOp::kMin, {3, -7, -5}},
                        Case{ReduceOp::kMax, {4, 2, 5}}, Case{ReduceOp::kProduct, {12, -14, -25}},
                        // Average sums here; each rank divides (reductionOf).
                        Case{ReduceOp::kAverage, {7, -5, 0}}}) {
    const std::string name = std::string("t.") + reduceOpName(c.op);
    ASSERT_TRUE(submit(1, allreduce(name, DataType::kInt32, 3, bytesOf(b), c.op)).isOk());
    ASSERT_TRUE(submit(0, allreduce(name, DataType::kInt32, 3, bytesOf(a), c.op)).isOk());
    EXPECT_EQ(valuesOf<int32_t>(emitOne().inlineResult), c.want) << reduceOpName(c.op);
  }
}

TEST_F(InlineTest, FloatSumIsInRankOrderWhateverTheArrivalOrder) {
  // (big + 1) - big is 0 in float32, big + (1 - big) is 1: the order shows.
  const float big = 1e8f;
  for (int first : {0, 1, 2}) {
    make(3);
    const std::vector<std::vector<float>> v{{big}, {1.0f}, {-big}};
    for (int k = 0; k < 3; ++k) {
      const int r = (first + k) % 3;
      ASSERT_TRUE(submit(r, allreduce("t", DataType::kFloat32, 1, bytesOf(v[r]))).isOk());
    }
    EXPECT_EQ(valuesOf<float>(emitOne().inlineResult), (std::vector<float>{(big + 1.0f) - big}))
        << "first arrival " << first;
  }
}

TEST_F(InlineTest, ARankWithoutItsPayloadLeavesTheTensorToTheDataPlane) {
  make(2);
  ASSERT_TRUE(
      submit(0, allreduce("t", DataType::kFloat32, 1, bytesOf(std::vector<float>{1}))).isOk());
  ASSERT_TRUE(submit(1, allreduce("t", DataType::kFloat32, 1, "")).isOk());
  Response r = emitOne();
  EXPECT_EQ(r.kind, ResponseKind::kAllreduce);
  EXPECT_TRUE(r.inlineResult.empty());
  EXPECT_TRUE(r.fusable());
}

TEST_F(InlineTest, AJoinedRankLeavesTheTensorToTheDataPlane) {
  make(2);
  Request j;
  j.kind = CollectiveKind::kJoin;
  j.name = "join";
  ASSERT_TRUE(submit(1, j).isOk());
  ASSERT_TRUE(
      submit(0, allreduce("t", DataType::kFloat32, 1, bytesOf(std::vector<float>{1}))).isOk());
  Response r = emitOne();
  EXPECT_EQ(r.joined, (std::vector<int32_t>{1}));
  EXPECT_TRUE(r.inlineResult.empty());
}

TEST_F(InlineTest, AMismatchIsStillAnErrorResponse) {
  make(2);
  ASSERT_TRUE(
      submit(0, allreduce("t", DataType::kFloat32, 1, bytesOf(std::vector<float>{1}))).isOk());
  ASSERT_TRUE(
      submit(1, allreduce("t", DataType::kFloat32, 2, bytesOf(std::vector<float>{1, 2}))).isOk());
  Response r = emitOne();
  EXPECT_EQ(r.kind, ResponseKind::kError);
  EXPECT_EQ(r.errorCode, static_cast<int32_t>(Code::kMismatch));
  EXPECT_TRUE(r.inlineResult.empty());
}

TEST_F(InlineTest, CacheHitsCarryPayloadsAndTheCacheKeepsNoData) {
  make(2);
  auto req = [](float x) {
    return allreduce("t", DataType::kFloat32, 1, bytesOf(std::vector<float>{x}));
  };
  ASSERT_TRUE(submit(0, req(1)).isOk());
  ASSERT_TRUE(submit(1, req(2)).isOk());
  EXPECT_EQ(valuesOf<float>(emitOne().inlineResult), (std::vector<float>{3}));
  const int32_t bit = cache_->lookup("t", req(0).signature());
  ASSERT_GE(bit, 0);
  EXPECT_TRUE(cache_->peek(static_cast<uint32_t>(bit), req(0).signature())->inlineResult.empty());
  // Second step: both ranks hit; the result rides on the bit-only item.
  const uint64_t sig = req(0).signature();
  ASSERT_TRUE(
      hit(0, CacheHit{static_cast<uint32_t>(bit), sig, bytesOf(std::vector<float>{10})}).isOk());
  ASSERT_TRUE(
      hit(1, CacheHit{static_cast<uint32_t>(bit), sig, bytesOf(std::vector<float>{20})}).isOk());
  EXPECT_TRUE(nacks_.empty());
  ResponseItem wire;
  Response r = emitOne(&wire);
  EXPECT_EQ(wire.cacheBit, bit);
  EXPECT_EQ(valuesOf<float>(wire.result), (std::vector<float>{30}));
  EXPECT_EQ(valuesOf<float>(r.inlineResult), (std::vector<float>{30}));
  // And it survives the wire.
  ResponseList l;
  l.groups.push_back(ResponseGroup{{wire}});
  ResponseList back;
  ASSERT_TRUE(decode(encode(l), &back).isOk());
  EXPECT_EQ(back.groups[0].items[0].result, wire.result);
}

TEST_F(InlineTest, AMalformedPayloadIsAProtocolError) {
  make(2);
  // Two bytes for a float32[1].
  Status s = submit(1, allreduce("t", DataType::kFloat32, 1, "ab"));
  EXPECT_EQ(s.code(), Code::kProtocolError);
  EXPECT_NE(s.message().find("rank 1 sent 2 bytes of inline data"), std::string::npos)
      << s.message();
  // A payload on a barrier never decodes...
  Request b = allreduce("b", DataType::kFloat32, 1, bytesOf(std::vector<float>{1}));
  b.kind = CollectiveKind::kBarrier;
  RequestList l;
  l.requests = {b};
  RequestList back;
  EXPECT_EQ(decode(encode(l), &back).code(), Code::kProtocolError);
  // ...and a broadcast's only from its root: the coordinator refuses one
  // from another rank.
  b.kind = CollectiveKind::kBroadcast;
  b.root = 0;
  s = submit(1, b);
  EXPECT_EQ(s.code(), Code::kProtocolError);
  EXPECT_NE(s.message().find("broadcast from its root only"), std::string::npos) << s.message();
  // A GPU tensor never travels inline.
  Request g = allreduce("g", DataType::kFloat32, 1, bytesOf(std::vector<float>{1}));
  g.device.kind = DeviceKind::kCuda;
  EXPECT_EQ(submit(0, g).code(), Code::kProtocolError);
  // A cache hit's payload is checked against the cached shape.
  ASSERT_TRUE(submit(0, allreduce("c", DataType::kFloat32, 1, "")).isOk());
  ASSERT_TRUE(submit(1, allreduce("c", DataType::kFloat32, 1, "")).isOk());
  emitOne();
  const uint64_t sig = allreduce("c", DataType::kFloat32, 1, "").signature();
  const int32_t bit = cache_->lookup("c", sig);
  ASSERT_GE(bit, 0);
  EXPECT_EQ(hit(0, CacheHit{static_cast<uint32_t>(bit), sig, "abcdefgh"}).code(),
            Code::kProtocolError);
}

TEST_F(InlineTest, CompletionAppliesPostscaleAndAverage) {
  // What a rank does with the result (core/agreed_group.h).
  struct Sink : RequestSink {
    Result<void*> allocateOutput(const std::vector<int64_t>&, DataType, const Device&,
                                 DeviceMemory*) override {
      return internalError("unused");
    }
    void setReceivedSplits(std::vector<int64_t>) override {}
    void setLastJoinedRank(int32_t) override {}
    void completeEntry(const Status& s) override { status = s; }
    Status status = internalError("not completed");
  };
  std::vector<float> out(2, -1);
  auto e = std::make_shared<TensorEntry>();
  auto sink = std::make_shared<Sink>();
  e->sink = sink;
  e->out = out.data();
  AgreedGroup g;
  Response r;
  r.kind = ResponseKind::kAllreduce;
  r.dtype = DataType::kFloat32;
  r.op = ReduceOp::kAverage;
  r.postscale = 3.0;
  r.shape = {2};
  r.inlineResult = bytesOf(std::vector<float>{8, 4});
  g.responses = {r};
  g.entries = {e};
  EXPECT_FALSE(needsDataPlane(g));
  completeWithoutDataPlane(g, 0, {0, 1, 2, 3});
  EXPECT_TRUE(sink->status.isOk()) << sink->status.message();
  EXPECT_EQ(out, (std::vector<float>{6, 3}));  // 8 / 4 ranks * 3, 4 / 4 * 3
  g.responses[0].inlineResult.clear();
  EXPECT_TRUE(needsDataPlane(g));
}

TEST_F(InlineTest, AResponseListCarriesAtMostItsBudgetOfResults) {
  make(2);
  const size_t n = kMaxInlineListBytes / kMaxInlineBytes + 4;
  const std::string data(kMaxInlineBytes, '\0');
  for (size_t i = 0; i < n; ++i)
    for (int r = 0; r < 2; ++r)
      ASSERT_TRUE(submit(r, allreduce("t" + std::to_string(i), DataType::kFloat32,
                                      static_cast<int64_t>(kMaxInlineBytes / 4), data))
                      .isOk());
  std::vector<std::vector<Response>> resolved;
  ResponseList l = coord_->emit(&resolved);
  size_t results = 0, inlined = 0, onDataPlane = 0;
  for (size_t g = 0; g < l.groups.size(); ++g)
    for (size_t i = 0; i < l.groups[g].items.size(); ++i) {
      const std::string& r = l.groups[g].items[i].result;
      EXPECT_EQ(r, resolved[g][i].inlineResult);
      results += r.size();
      (r.empty() ? onDataPlane : inlined) += 1;
    }
  EXPECT_LE(results, kMaxInlineListBytes);
  EXPECT_EQ(inlined, kMaxInlineListBytes / kMaxInlineBytes);
  EXPECT_EQ(inlined + onDataPlane, n);
  // The rest fused, as any data-plane allreduces would.
  EXPECT_EQ(l.groups.size(), inlined + 1);
}

}  // namespace
}  // namespace hora
