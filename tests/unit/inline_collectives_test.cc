// Unit tests for the collectives other than allreduce travelling inside the
// negotiation (controllers/coordinator.h step 5, core/agreed_group.h): the
// coordinator combines every rank's payload (a reducescatter's reduction, a
// broadcast root's tensor, the concatenation an allgather or alltoall is cut
// from), leaves the collective to the data plane when a rank's data is
// missing or the result would pass the cap, and each rank cuts its own output
// from the result. Pure logic: ranks are simulated, one coordinator.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "controllers/coordinator.h"
#include "core/agreed_group.h"
#include "runtime_fakes.h"

namespace hora {
namespace {

std::string bytesOf(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

std::vector<float> floatsOf(const std::string& s) {
  std::vector<float> v(s.size() / sizeof(float));
  if (!v.empty()) std::memcpy(v.data(), s.data(), v.size() * sizeof(float));
  return v;
}

Request request(CollectiveKind kind, std::vector<int64_t> shape, std::string payload) {
  Request r;
  r.kind = kind;
  r.name = "t";
  r.dtype = DataType::kFloat32;
  r.shape = std::move(shape);
  r.payload = std::move(payload);
  return r;
}

class InlineKindsTest : public ::testing::Test {
 protected:
  void make(int size) {
    size_ = size;
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
  // Every rank's request (requests[r] from rank r), then the one response.
  Response agree(const std::vector<Request>& requests) {
    for (size_t r = 0; r < requests.size(); ++r) {
      Status s = submit(static_cast<int>(r), requests[r]);
      EXPECT_TRUE(s.isOk()) << s.toString();
    }
    std::vector<std::vector<Response>> resolved;
    coord_->emit(&resolved);
    if (resolved.size() != 1 || resolved[0].size() != 1) {
      ADD_FAILURE() << "expected one response alone in its group";
      return Response{};
    }
    return resolved[0][0];
  }
  // What rank `rank` does with the response: its entry completed without
  // the data plane into `sink` (an allreduce's or broadcast's output is `out`).
  Status complete(const Response& r, int rank, std::shared_ptr<RecordingSink> sink,
                  void* out = nullptr) {
    auto e = makeEntry(static_cast<CollectiveKind>(r.kind), r.name, r.dtype, r.shape, nullptr, out,
                       sink);
    AgreedGroup g;
    g.responses = {r};
    g.entries = {e};
    EXPECT_FALSE(needsDataPlane(g));
    std::vector<int> globalRanks;
    for (int i = 0; i < size_; ++i) globalRanks.push_back(10 + i);
    completeWithoutDataPlane(g, rank, globalRanks);
    EXPECT_TRUE(sink->done());
    return sink->status();
  }

  int size_ = 0;
  Clock::time_point t0_ = Clock::time_point() + std::chrono::hours(1000);
  std::unique_ptr<ResponseCache> cache_;
  std::unique_ptr<Coordinator> coord_;
  std::vector<CacheHit> nacks_;
};

TEST_F(InlineKindsTest, ReducescatterIsReducedOnceAndEachRankKeepsItsBlock) {
  make(3);
  // 4 rows of 2: blocks of 2, 1, 1 rows (the first dim0 % size ranks get one more).
  std::vector<Request> rs;
  for (int r = 0; r < 3; ++r) {
    std::vector<float> v;
    for (int i = 0; i < 8; ++i) v.push_back(static_cast<float>((r + 1) * 100 + i));
    rs.push_back(request(CollectiveKind::kReducescatter, {4, 2}, bytesOf(v)));
    rs.back().op = ReduceOp::kAverage;
    rs.back().postscale = 2;
  }
  const Response resp = agree(rs);
  ASSERT_EQ(resp.kind, ResponseKind::kReducescatter);
  // The whole sum, in rank order: 600 + 3i.
  std::vector<float> sum;
  for (int i = 0; i < 8; ++i) sum.push_back(600.0f + 3 * i);
  EXPECT_EQ(floatsOf(resp.inlineResult), sum);
  const std::vector<std::vector<float>> blocks = {{0, 1, 2, 3}, {4, 5}, {6, 7}};
  const std::vector<int64_t> rows = {2, 1, 1};
  for (int rank = 0; rank < 3; ++rank) {
    auto sink = std::make_shared<RecordingSink>();
    ASSERT_TRUE(complete(resp, rank, sink).isOk()) << rank;
    EXPECT_EQ(sink->shape(), (std::vector<int64_t>{rows[rank], 2})) << rank;
    std::vector<float> want;
    // Averaged over 3 ranks, then postscaled by 2.
    for (float i : blocks[rank]) want.push_back((600.0f + 3 * i) / 3 * 2);
    EXPECT_EQ(sink->output<float>(), want) << rank;
  }
}

TEST_F(InlineKindsTest, BroadcastCarriesOnlyTheRootsTensor) {
  make(3);
  std::vector<Request> rs(3, request(CollectiveKind::kBroadcast, {3}, ""));
  for (auto& r : rs) r.root = 1;
  rs[1].payload = bytesOf({7, 8, 9});
  const Response resp = agree(rs);
  EXPECT_EQ(floatsOf(resp.inlineResult), (std::vector<float>{7, 8, 9}));
  for (int rank = 0; rank < 3; ++rank) {
    std::vector<float> out(3, -1);
    ASSERT_TRUE(complete(resp, rank, std::make_shared<RecordingSink>(), out.data()).isOk());
    // The root's tensor is its output already: it is not written again.
    const std::vector<float> want =
        rank == 1 ? std::vector<float>(3, -1) : std::vector<float>{7, 8, 9};
    EXPECT_EQ(out, want) << rank;
  }
  // A root that sent no data (its HORA_INLINE_MAX_BYTES is lower) leaves it
  // to the data plane.
  for (auto& r : rs) r.payload.clear();
  EXPECT_TRUE(agree(rs).inlineResult.empty());
}

TEST_F(InlineKindsTest, AllgatherConcatenatesInRankOrderAndARankWithoutRowsSentAll) {
  make(3);
  // Rows 2, 0, 1 of 2 floats; rank 1 has nothing to send.
  std::vector<Request> rs = {
      request(CollectiveKind::kAllgather, {2, 2}, bytesOf({1, 2, 3, 4})),
      request(CollectiveKind::kAllgather, {0, 2}, ""),
      request(CollectiveKind::kAllgather, {1, 2}, bytesOf({5, 6})),
  };
  const Response resp = agree(rs);
  EXPECT_EQ(resp.shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(floatsOf(resp.inlineResult), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  for (int rank = 0; rank < 3; ++rank) {
    auto sink = std::make_shared<RecordingSink>();
    ASSERT_TRUE(complete(resp, rank, sink).isOk());
    EXPECT_EQ(sink->shape(), (std::vector<int64_t>{3, 2}));
    EXPECT_EQ(sink->output<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  }
  // A rank with rows that sent none: the data plane.
  rs[2].payload.clear();
  EXPECT_TRUE(agree(rs).inlineResult.empty());
}

TEST_F(InlineKindsTest, AlltoallConcatenatesAndEachRankTakesItsColumn) {
  make(3);
  // Rows of one float; value = 10 * sender + receiver, one row per unit of split.
  const std::vector<std::vector<int64_t>> splits = {{1, 0, 2}, {2, 1, 0}, {0, 0, 1}};
  std::vector<Request> rs;
  for (int s = 0; s < 3; ++s) {
    std::vector<float> v;
    for (int d = 0; d < 3; ++d)
      for (int64_t k = 0; k < splits[s][d]; ++k) v.push_back(static_cast<float>(10 * s + d));
    rs.push_back(request(CollectiveKind::kAlltoall, {static_cast<int64_t>(v.size())}, bytesOf(v)));
    rs.back().splits = splits[s];
  }
  const Response resp = agree(rs);
  ASSERT_EQ(resp.kind, ResponseKind::kAlltoall);
  EXPECT_EQ(floatsOf(resp.inlineResult), (std::vector<float>{0, 2, 2, 10, 10, 11, 22}));
  for (int rank = 0; rank < 3; ++rank) {
    auto sink = std::make_shared<RecordingSink>();
    ASSERT_TRUE(complete(resp, rank, sink).isOk());
    std::vector<float> want;
    std::vector<int64_t> recv;
    for (int s = 0; s < 3; ++s) {
      recv.push_back(splits[s][rank]);
      for (int64_t k = 0; k < splits[s][rank]; ++k)
        want.push_back(static_cast<float>(10 * s + rank));
    }
    EXPECT_EQ(sink->output<float>(), want) << rank;
    EXPECT_EQ(sink->splits(), recv) << rank;
    EXPECT_EQ(sink->shape(), (std::vector<int64_t>{static_cast<int64_t>(want.size())})) << rank;
  }
}

TEST_F(InlineKindsTest, AConcatenationPastTheCapTakesTheDataPlane) {
  // Each rank's tensor within the cap (ranks whose HORA_INLINE_MAX_BYTES
  // differ), the three together past it: the response list would repeat too much.
  make(3);
  const int64_t n = static_cast<int64_t>(kMaxInlineBytes / 3 / 4) + 1;
  const std::string data(static_cast<size_t>(n) * 4, '\0');
  std::vector<Request> rs(3, request(CollectiveKind::kAllgather, {n}, data));
  EXPECT_TRUE(agree(rs).inlineResult.empty());
  // Just within it: inline.
  const int64_t m = static_cast<int64_t>(kMaxInlineBytes / 3 / 4);
  std::vector<Request> fit(3, request(CollectiveKind::kAllgather, {m}, std::string(m * 4, '\0')));
  EXPECT_EQ(agree(fit).inlineResult.size(), static_cast<size_t>(3 * m * 4));
}

TEST_F(InlineKindsTest, AJoinedRankLeavesAnAllgatherToTheDataPlane) {
  make(2);
  Request j;
  j.kind = CollectiveKind::kJoin;
  j.name = "join";
  ASSERT_TRUE(submit(1, j).isOk());
  ASSERT_TRUE(submit(0, request(CollectiveKind::kAllgather, {1}, bytesOf({1}))).isOk());
  std::vector<std::vector<Response>> resolved;
  coord_->emit(&resolved);
  ASSERT_EQ(resolved.size(), 1u);
  EXPECT_EQ(resolved[0][0].joined, (std::vector<int32_t>{1}));
  EXPECT_TRUE(resolved[0][0].inlineResult.empty());
}

TEST_F(InlineKindsTest, AnOutputTheAllocatorRefusesFailsOnlyThatEntryNamingTheRank) {
  make(2);
  const Response resp = agree({request(CollectiveKind::kAllgather, {1}, bytesOf({1})),
                               request(CollectiveKind::kAllgather, {1}, bytesOf({2}))});
  auto sink = std::make_shared<RecordingSink>();
  sink->failAllocations(Status(Code::kSystemError, "the allocator said no"));
  const Status s = complete(resp, 1, sink);
  EXPECT_EQ(s.code(), Code::kSystemError);
  EXPECT_NE(s.message().find("the allocator said no"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("rank 11"), std::string::npos) << s.message();
  // The outcome reaches the hook (telemetry) before the entry completes.
  auto again = std::make_shared<RecordingSink>();
  again->failAllocations(Status(Code::kSystemError, "the allocator said no"));
  AgreedGroup g;
  g.responses = {resp};
  g.entries = {makeEntry(CollectiveKind::kAllgather, resp.name, resp.dtype, resp.shape, nullptr,
                         nullptr, again)};
  std::vector<Status> seen;
  bool doneBefore = true;
  completeWithoutDataPlane(g, 1, {10, 11}, [&](const std::vector<Status>& o) {
    seen = o;
    doneBefore = again->done();
  });
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].code(), Code::kSystemError) << seen[0].toString();
  EXPECT_FALSE(doneBefore) << "the entry completed before the hook saw its outcome";
  EXPECT_EQ(again->status().code(), Code::kSystemError);
}

TEST_F(InlineKindsTest, PayloadsOfTheWrongSizeOrDeviceAreProtocolErrors) {
  make(2);
  for (CollectiveKind k :
       {CollectiveKind::kAllgather, CollectiveKind::kAlltoall, CollectiveKind::kReducescatter}) {
    Request r = request(k, {2}, bytesOf({1}));  // 4 bytes for float32[2]
    if (k == CollectiveKind::kAlltoall) r.splits = {1, 1};
    Status s = submit(1, r);
    EXPECT_EQ(s.code(), Code::kProtocolError) << collectiveName(k);
    EXPECT_NE(s.message().find("rank 1 sent 4 bytes of inline data"), std::string::npos)
        << s.message();
    r.payload = bytesOf({1, 2});
    r.device.kind = DeviceKind::kCuda;
    EXPECT_EQ(submit(1, r).code(), Code::kProtocolError) << collectiveName(k);
  }
}

}  // namespace
}  // namespace hora
