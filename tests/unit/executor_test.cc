// Executor against a fake Backend and recording sinks (runtime_fakes.h): the
// CPU path's packing, scaling and stand-ins, outputs allocated through the
// sink, control-only groups, and what happens to a group whose collective
// fails: a data-plane failure waits for the set's final status without
// blocking the executor; a local failure breaks the set at once.
#include "ops/executor/executor.h"

#include <gtest/gtest.h>

#include <limits>

#include "core/response_counts.h"
#include "runtime_fakes.h"

namespace hora {
namespace {

struct ExecutorHarness {
  explicit ExecutorHarness(Seconds grace = Seconds(10))
      : health("global", Logger(LogLevel::kOff, "[exec-test]"), grace) {
    health.addListener([this](const Status& why, bool tellPeers) {
      told = tellPeers;
      backend.abort();
    });
    ExecContext ctx;
    ctx.setName = "global";
    ctx.rank = 0;
    ctx.globalRanks = {0, 1};
    ctx.backend = &backend;
    ctx.health = &health;
    ctx.logger = Logger(LogLevel::kOff, "[exec-test]");
    ctx.peerTimeout = std::chrono::milliseconds(2000);
    executor = std::make_unique<Executor>(ctx, queue, GpuPathOptions{});
    executor->start();
  }
  ~ExecutorHarness() {
    queue.close();
    executor->join();
  }
  void run(std::vector<EntryPtr> entries, std::vector<Response> responses) {
    AgreedGroup g;
    g.entries = std::move(entries);
    g.responses = std::move(responses);
    queue.push(std::move(g));
  }
  bool idle() { return queue.waitIdle(Clock::now() + 10s); }

  FakeBackend backend;
  SetHealth health;
  GroupQueue queue;
  std::unique_ptr<Executor> executor;
  std::atomic<bool> told{false};
};

TEST(ExecutorTest, FusedAllreduceScalesAndAveragesThroughOneBackendCall) {
  ExecutorHarness h;
  std::vector<std::vector<float>> in = {{1, 2}, {3, 4, 5}, {6}}, out = {{0, 0}, {0, 0, 0}, {0}};
  std::vector<EntryPtr> es;
  std::vector<Response> rs;
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (size_t i = 0; i < in.size(); ++i) {
    sinks.push_back(std::make_shared<RecordingSink>());
    es.push_back(makeEntry(CollectiveKind::kAllreduce, "t" + std::to_string(i), DataType::kFloat32,
                           {static_cast<int64_t>(in[i].size())}, in[i].data(), out[i].data(),
                           sinks.back()));
    es.back()->request.op = ReduceOp::kAverage;
    es.back()->request.prescale = 2.0;
    rs.push_back(responseFor(*es.back()));
  }
  h.run(es, rs);
  for (auto& s : sinks) {
    ASSERT_TRUE(s->waitDone());
    EXPECT_TRUE(s->status().isOk()) << s->status().toString();
  }
  EXPECT_EQ(h.backend.calls(), 1) << "one collective for the fused group";
  EXPECT_EQ(h.backend.contributed(), (std::vector<float>{2, 4, 6, 8, 10, 12})) << "prescaled";
  // (2x + 1) / 2: the other rank contributes 1, average over two ranks.
  EXPECT_EQ(out[0], (std::vector<float>{1.5f, 2.5f}));
  EXPECT_EQ(out[1], (std::vector<float>{3.5f, 4.5f, 5.5f}));
  EXPECT_EQ(out[2], (std::vector<float>{6.5f}));
  EXPECT_FALSE(h.health.broken());
}

TEST(ExecutorTest, AJoinedRankContributesTheIdentity) {
  ExecutorHarness h;
  Response r;
  r.kind = ResponseKind::kAllreduce;
  r.name = "w";
  r.shape = {4};
  r.joined = {0};  // this rank joined: no entry of its own
  h.run({nullptr}, {r});
  ASSERT_TRUE(h.idle());
  EXPECT_EQ(h.backend.calls(), 1) << "a joined rank still takes part";
  EXPECT_EQ(h.backend.contributed(), (std::vector<float>{0, 0, 0, 0}));
}

TEST(ExecutorTest, AllgatherAllocatesTheGatheredShapeThroughTheSink) {
  ExecutorHarness h;
  std::vector<float> in = {1, 2, 3, 4, 5, 6};
  auto sink = std::make_shared<RecordingSink>();
  auto e = makeEntry(CollectiveKind::kAllgather, "g", DataType::kFloat32, {2, 3}, in.data(),
                     nullptr, sink);
  Response r = responseFor(*e);
  r.shape = {5, 3};  // rank 0 has 2 rows, rank 1 has 3
  r.sizes = {2, 3};
  h.run({e}, {r});
  ASSERT_TRUE(sink->waitDone());
  EXPECT_TRUE(sink->status().isOk()) << sink->status().toString();
  EXPECT_EQ(sink->shape(), (std::vector<int64_t>{5, 3}));
  std::vector<float> want = {1, 2, 3, 4, 5, 6, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_EQ(sink->output<float>(), want);
}

TEST(ExecutorTest, AnOutputThatCannotBeAllocatedFailsOnlyItsRequest) {
  ExecutorHarness h;
  std::vector<float> in = {1, 2};
  auto sink = std::make_shared<RecordingSink>();
  sink->failAllocations(Status(Code::kSystemError, "the allocator said no"));
  auto e =
      makeEntry(CollectiveKind::kAllgather, "g", DataType::kFloat32, {2}, in.data(), nullptr, sink);
  Response r = responseFor(*e);
  r.shape = {4};
  r.sizes = {2, 2};
  h.run({e}, {r});
  ASSERT_TRUE(sink->waitDone());
  EXPECT_EQ(sink->status().code(), Code::kSystemError);
  EXPECT_EQ(sink->status().message(), "allgather \"g\" on rank 0: the allocator said no");
  EXPECT_EQ(h.backend.calls(), 1) << "the rank took part anyway, so its peers finish";
  EXPECT_FALSE(h.health.broken()) << "the set goes on";
}

TEST(ExecutorTest, ADataPlaneFailureWaitsForTheNamedCauseWithoutBlocking) {
  ExecutorHarness h;
  h.backend.failWith(Status(Code::kRemoteError, "gloo: connection closed by peer"));
  std::vector<float> a = {1}, b = {2};
  auto sa = std::make_shared<RecordingSink>(), sb = std::make_shared<RecordingSink>();
  auto ea =
      makeEntry(CollectiveKind::kAllreduce, "a", DataType::kFloat32, {1}, a.data(), a.data(), sa);
  auto eb =
      makeEntry(CollectiveKind::kAllreduce, "b", DataType::kFloat32, {1}, b.data(), b.data(), sb);
  h.run({ea}, {responseFor(*ea)});
  h.run({eb}, {responseFor(*eb)});
  ASSERT_TRUE(h.idle()) << "the executor does not wait for the cause to be named";
  EXPECT_TRUE(h.health.suspected());
  EXPECT_FALSE(h.health.broken());
  EXPECT_EQ(h.backend.calls(), 1) << "no collective runs on a data plane that just failed";
  EXPECT_FALSE(sa->done());
  EXPECT_FALSE(sb->done());
  // The control thread names the lost peer.
  h.health.fail(Status(Code::kRemoteError, "rank 1 at 10.0.0.2 closed its connection"), true);
  ASSERT_TRUE(sa->waitDone());
  ASSERT_TRUE(sb->waitDone());
  EXPECT_EQ(sa->status().code(), Code::kRemoteError);
  EXPECT_EQ(sa->status().message(),
            "allreduce \"a\" on rank 0: rank 1 at 10.0.0.2 closed its connection");
  EXPECT_EQ(sb->status().message(),
            "allreduce \"b\" on rank 0: rank 1 at 10.0.0.2 closed its connection");
}

TEST(ExecutorTest, AnUnnamedDataPlaneFailureStandsAfterTheGrace) {
  ExecutorHarness h(Seconds(0.05));
  h.backend.failWith(Status(Code::kBackendError, "gloo: bad things"));
  std::vector<float> a = {1};
  auto sa = std::make_shared<RecordingSink>();
  auto ea =
      makeEntry(CollectiveKind::kAllreduce, "a", DataType::kFloat32, {1}, a.data(), a.data(), sa);
  h.run({ea}, {responseFor(*ea)});
  ASSERT_TRUE(h.idle());
  std::this_thread::sleep_for(60ms);
  h.health.settle(Clock::now());  // the control thread's timer, in the runtime
  ASSERT_TRUE(sa->waitDone());
  EXPECT_EQ(sa->status().code(), Code::kBackendError);
  EXPECT_EQ(sa->status().message(), "allreduce \"a\" on rank 0: allreduce \"a\": gloo: bad things");
  EXPECT_TRUE(h.told) << "the peers are told";
  EXPECT_TRUE(h.backend.aborted());
}

TEST(ExecutorTest, AFailureOnlyThisRankSawBreaksTheSetAtOnce) {
  ExecutorHarness h;
  std::vector<float> a = {1};
  auto sa = std::make_shared<RecordingSink>();
  auto ea =
      makeEntry(CollectiveKind::kAllreduce, "gpu", DataType::kFloat32, {1}, a.data(), a.data(), sa);
  ea->request.device = Device{DeviceKind::kCuda, 0};
  h.run({ea}, {responseFor(*ea)});  // no GPU plugin in this executor
  ASSERT_TRUE(sa->waitDone());
  EXPECT_EQ(sa->status().code(), Code::kNotSupported);
  EXPECT_NE(sa->status().message().find("no GPU plugin configured"), std::string::npos)
      << sa->status().message();
  EXPECT_TRUE(h.health.broken()) << "its peers are inside the collective: the set is done";
  EXPECT_TRUE(h.told);
  EXPECT_EQ(h.backend.calls(), 0);
}

// Issue 14: fused offsets of tensors whose sizes add up past kMaxTensorBytes (only a corrupt
// response list holds such a group; each response alone was validated) are a protocol error.
TEST(ResponseCountsTest, FusedOffsetsAreCheckedForOverflow) {
  auto resp = [](int64_t elems, DataType dt) {
    Response r;
    r.name = "t" + std::to_string(elems);
    r.dtype = dt;
    r.shape = {elems};
    return r;
  };
  auto ok = fusedOffsets(
      {resp(2, DataType::kFloat32), resp(3, DataType::kFloat32), resp(1, DataType::kFloat32)});
  ASSERT_TRUE(ok.isOk()) << ok.status().toString();
  EXPECT_EQ(ok.value(), (std::vector<size_t>{0, 2, 5, 6}));
  const int64_t k2e62 = int64_t{1} << 62;
  // Exactly 2^63-1 bytes: fine.
  auto edge = fusedOffsets({resp(k2e62 - 1, DataType::kUint8), resp(k2e62, DataType::kUint8)});
  ASSERT_TRUE(edge.isOk()) << edge.status().toString();
  EXPECT_EQ(edge.value().back(), static_cast<size_t>(std::numeric_limits<int64_t>::max()));
  // Four 2^62-byte tensors: 2^64 elements, which wrapped to 0 in size_t.
  auto wrap = fusedOffsets(std::vector<Response>(4, resp(k2e62, DataType::kUint8)));
  EXPECT_EQ(wrap.status().code(), Code::kProtocolError);
  EXPECT_NE(wrap.status().message().find("fused allreduce of 4 tensors"), std::string::npos)
      << wrap.status().message();
  // 2^61 float32 elements: the count fits, the bytes do not.
  auto bytes = fusedOffsets(std::vector<Response>(2, resp(k2e62 / 4, DataType::kFloat32)));
  EXPECT_EQ(bytes.status().code(), Code::kProtocolError);
}

TEST(ExecutorTest, AFusedGroupPastTheSizeLimitFailsWithoutTouchingMemory) {
  ExecutorHarness h;
  uint8_t tiny[4][8] = {};
  std::vector<EntryPtr> es;
  std::vector<Response> rs;
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int i = 0; i < 4; ++i) {
    sinks.push_back(std::make_shared<RecordingSink>());
    es.push_back(makeEntry(CollectiveKind::kAllreduce, "t" + std::to_string(i), DataType::kUint8,
                           {int64_t{1} << 62}, tiny[i], tiny[i], sinks.back()));
    rs.push_back(responseFor(*es.back()));
  }
  h.run(es, rs);
  for (auto& s : sinks) {
    ASSERT_TRUE(s->waitDone());
    EXPECT_EQ(s->status().code(), Code::kProtocolError) << s->status().toString();
  }
  EXPECT_EQ(h.backend.calls(), 0);
  EXPECT_TRUE(h.health.broken());
}

TEST(ExecutorTest, ControlOnlyGroupsNeverTouchTheDataPlane) {
  ExecutorHarness h;
  auto barrier = std::make_shared<RecordingSink>(), join = std::make_shared<RecordingSink>(),
       error = std::make_shared<RecordingSink>();
  auto eb =
      makeEntry(CollectiveKind::kBarrier, "b", DataType::kUint8, {}, nullptr, nullptr, barrier);
  auto ej = makeEntry(CollectiveKind::kJoin, "j", DataType::kUint8, {}, nullptr, nullptr, join);
  auto ee =
      makeEntry(CollectiveKind::kAllreduce, "e", DataType::kFloat32, {1}, nullptr, nullptr, error);
  Response rb = responseFor(*eb), rj = responseFor(*ej), re;
  rj.lastJoinedRank = 1;
  re.kind = ResponseKind::kError;
  re.name = "e";
  re.errorCode = static_cast<int32_t>(Code::kMismatch);
  re.error = "mismatched shape";
  h.run({eb}, {rb});
  h.run({ej}, {rj});
  h.run({ee}, {re});
  ASSERT_TRUE(error->waitDone());
  EXPECT_TRUE(barrier->status().isOk());
  EXPECT_TRUE(join->status().isOk());
  EXPECT_EQ(join->lastJoined(), 1);
  EXPECT_EQ(error->status().code(), Code::kMismatch);
  EXPECT_EQ(error->status().message(), "mismatched shape");
  EXPECT_EQ(h.backend.calls(), 0);
}

TEST(ExecutorTest, AlltoallReportsTheRowsReceivedFromEachRank) {
  ExecutorHarness h;
  std::vector<float> in(6, 1.0f);
  auto sink = std::make_shared<RecordingSink>();
  auto e = makeEntry(CollectiveKind::kAlltoall, "x", DataType::kFloat32, {3, 2}, in.data(), nullptr,
                     sink);
  Response r = responseFor(*e);
  r.sizes = {1, 2, 3, 0};  // [src*size+dst]: rank 0 keeps 1 row and sends 2; rank 1 sends 3
  h.run({e}, {r});
  ASSERT_TRUE(sink->waitDone());
  EXPECT_TRUE(sink->status().isOk()) << sink->status().toString();
  EXPECT_EQ(sink->splits(), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(sink->shape(), (std::vector<int64_t>{4, 2}));
}

TEST(ExecutorTest, ReducescatterWritesThisRanksBlockScaled) {
  ExecutorHarness h;
  std::vector<float> in = {1, 2, 3, 4, 5};
  auto sink = std::make_shared<RecordingSink>();
  auto e = makeEntry(CollectiveKind::kReducescatter, "rs", DataType::kFloat32, {5, 1}, in.data(),
                     nullptr, sink);
  e->request.prescale = 2.0;
  e->request.postscale = 3.0;
  h.run({e}, {responseFor(*e)});
  ASSERT_TRUE(sink->waitDone());
  EXPECT_TRUE(sink->status().isOk()) << sink->status().toString();
  EXPECT_EQ(sink->shape(), (std::vector<int64_t>{3, 1})) << "rank 0 of 2 gets rows 0-2 of 5";
  // The fake reduce-scatter leaves the buffer as packed: 2x in, then x3 after.
  EXPECT_EQ(sink->output<float>(), (std::vector<float>{6, 12, 18}));
}

}  // namespace
}  // namespace hora
