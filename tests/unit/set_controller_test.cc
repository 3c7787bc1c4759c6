// SetController with one rank against a fake CoordinatorLink: what it sends
// to the coordinator (full requests, cache hits, resends after a nack), how it
// applies responses (cache, validation, claiming entries, inline completion of
// control-only groups, order behind queued work), and how failures spread
// (to the peers through the link, to every pending request). The test plays
// the coordinator (through the link) and the executor (popping the queue).
#include "controllers/set_controller.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <future>
#include <limits>
#include <map>

#include "core/memory_store.h"
#include "runtime_fakes.h"

namespace hora {
namespace {

// Records what the controller sends; the test answers by calling the
// controller's Client methods on the control thread.
class FakeLink : public CoordinatorLink {
 public:
  void attach(Client* client) override { client_ = client; }
  void submit(RequestList list) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      submitted_.push_back(std::move(list));
    }
    cv_.notify_all();
  }
  void reportFailure(const Status& why) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      reported_.push_back(why);
    }
    cv_.notify_all();
  }
  void onFrame(int, FrameType, std::string) override {}
  Status describeLoss(int, const Status& why) const override { return why; }

  // The n-th submission (0-based), waiting for it.
  RequestList submission(size_t n) {
    std::unique_lock<std::mutex> lk(mu_);
    EXPECT_TRUE(cv_.wait_for(lk, 10s, [&] { return submitted_.size() > n; }))
        << "no submission #" << n;
    return submitted_.size() > n ? submitted_[n] : RequestList();
  }
  std::vector<Status> reported(size_t atLeast) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait_for(lk, 10s, [&] { return reported_.size() >= atLeast; });
    return reported_;
  }
  size_t submissions() {
    std::lock_guard<std::mutex> lk(mu_);
    return submitted_.size();
  }

 private:
  Client* client_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<RequestList> submitted_;
  std::vector<Status> reported_;
};

struct ControllerHarness {
  // `setSize` > 1: the controller is rank 0 of that many (the link is fake,
  // so no peer exists; it only changes whether failures are reported).
  // `configure` runs before the controller starts.
  explicit ControllerHarness(Seconds grace = Seconds(10), int setSize = 1,
                             size_t inlineMaxBytes = 0,
                             std::function<void(SetController&)> configure = nullptr,
                             size_t inlineMaxOtherBytes = SIZE_MAX)
      : health("global", Logger(LogLevel::kOff, "[ctl-test]"), grace) {
    ControlPlaneOptions cpo;
    cpo.globalRanks = {0};
    auto c = ControlPlane::create(std::make_shared<MemoryStore>(), cpo, Logger());
    EXPECT_TRUE(c.isOk()) << c.status().toString();
    cp = c.take();
    auto l = std::make_unique<FakeLink>();
    link = l.get();
    SetControllerOptions o;
    for (int r = 0; r < setSize; ++r) o.globalRanks.push_back(r);
    o.cacheCapacity = 16;
    o.inlineMaxBytes = inlineMaxBytes;
    o.inlineMaxOtherBytes = inlineMaxOtherBytes == SIZE_MAX ? inlineMaxBytes : inlineMaxOtherBytes;
    controller = std::make_unique<SetController>(o, *cp, std::move(l), health, queue,
                                                 Logger(LogLevel::kOff, "[ctl-test]"));
    if (configure) configure(*controller);
    controller->start();
  }
  ~ControllerHarness() {
    controller->stop();
    controller.reset();
  }
  // Runs fn on the control thread and waits for it.
  void onControlThread(std::function<void()> fn) {
    std::promise<void> done;
    boost::asio::post(cp->io(), [&] {
      fn();
      done.set_value();
    });
    ASSERT_EQ(done.get_future().wait_for(10s), std::future_status::ready);
  }
  void respond(const ResponseList& list) {
    onControlThread([&] { controller->onResponses(list); });
  }
  EntryPtr allreduce(const std::string& name, std::shared_ptr<RecordingSink> sink,
                     std::vector<int64_t> shape = {4}) {
    return makeEntry(CollectiveKind::kAllreduce, name, DataType::kFloat32, std::move(shape),
                     nullptr, nullptr, std::move(sink));
  }

  std::unique_ptr<ControlPlane> cp;
  SetHealth health;
  GroupQueue queue;
  FakeLink* link = nullptr;
  std::unique_ptr<SetController> controller;
};

ResponseList listOf(std::vector<Response> group, int32_t cacheBit = -1) {
  ResponseList list;
  ResponseGroup g;
  for (auto& r : group) {
    ResponseItem item;
    item.cacheBit = cacheBit;
    if (cacheBit < 0) item.response = r;
    g.items.push_back(item);
  }
  list.groups.push_back(g);
  return list;
}

TEST(SetControllerTest, RequestsGoInFullThenAsCacheHits) {
  ControllerHarness h;
  auto sink = std::make_shared<RecordingSink>();
  auto e = h.allreduce("w", sink);
  ASSERT_TRUE(h.controller->enqueue({e}).isOk());
  RequestList first = h.link->submission(0);
  ASSERT_EQ(first.requests.size(), 1u);
  EXPECT_TRUE(first.hits.empty());
  EXPECT_EQ(first.requests[0].name, "w");
  EXPECT_EQ(first.requests[0].rank, 0);

  h.respond(listOf({responseFor(*e)}));
  AgreedGroup g;
  ASSERT_TRUE(h.queue.pop(&g));
  ASSERT_EQ(g.entries.size(), 1u);
  EXPECT_EQ(g.entries[0], e) << "the entry is claimed for the executor";
  h.queue.finished();

  auto e2 = h.allreduce("w", std::make_shared<RecordingSink>());
  ASSERT_TRUE(h.controller->enqueue({e2}).isOk()) << "the name is free again";
  RequestList second = h.link->submission(1);
  EXPECT_TRUE(second.requests.empty());
  ASSERT_EQ(second.hits.size(), 1u);
  EXPECT_EQ(second.hits[0].bit, 0u);
  EXPECT_EQ(second.hits[0].signature, e2->request.signature());

  // The coordinator answers the hit with the bit: resolved from the cache.
  h.respond(listOf({Response()}, /*cacheBit=*/0));
  ASSERT_TRUE(h.queue.pop(&g));
  EXPECT_EQ(g.entries[0], e2);
  EXPECT_EQ(g.responses[0].name, "w");
  EXPECT_EQ(g.responses[0].signature, e2->request.signature());
  h.queue.finished();
}

// What a pack ahead published for the peers is withdrawn before every
// request list goes out (setPacker's withdraw): a published pack names a
// tensor, and the next submission of that tensor must not find it. Each
// withdrawal comes before its list reaches the link.
TEST(SetControllerTest, APublishedPackIsWithdrawnBeforeEveryRequestList) {
  FakeLink* link = nullptr;
  std::mutex mu;
  std::vector<size_t> sentAtWithdrawal;
  ControllerHarness h(Seconds(10), 2, 0, [&](SetController& c) {
    c.setPacker([](TensorEntry&, const std::function<bool()>&) { return false; }, false,
                [&] {
                  std::lock_guard<std::mutex> lk(mu);
                  sentAtWithdrawal.push_back(link->submissions());
                });
  });
  link = h.link;
  for (int k = 0; k < 3; ++k) {
    auto e = h.allreduce("w" + std::to_string(k), std::make_shared<RecordingSink>());
    ASSERT_TRUE(h.controller->enqueue({e}).isOk());
    h.link->submission(static_cast<size_t>(k));
  }
  std::lock_guard<std::mutex> lk(mu);
  EXPECT_EQ(sentAtWithdrawal, (std::vector<size_t>{0, 1, 2}));
}

TEST(SetControllerTest, ANackedHitIsResentInFull) {
  ControllerHarness h;
  auto e = h.allreduce("w", std::make_shared<RecordingSink>());
  ASSERT_TRUE(h.controller->enqueue({e}).isOk());
  h.link->submission(0);
  h.respond(listOf({responseFor(*e)}));
  AgreedGroup g;
  ASSERT_TRUE(h.queue.pop(&g));
  h.queue.finished();
  auto e2 = h.allreduce("w", std::make_shared<RecordingSink>());
  ASSERT_TRUE(h.controller->enqueue({e2}).isOk());
  RequestList hit = h.link->submission(1);
  ASSERT_EQ(hit.hits.size(), 1u);
  h.onControlThread([&] { h.controller->onNacks(hit.hits); });
  RequestList resent = h.link->submission(2);
  ASSERT_EQ(resent.requests.size(), 1u);
  EXPECT_EQ(resent.requests[0].name, "w");
  EXPECT_EQ(resent.requests[0].signature(), e2->request.signature());
}

TEST(SetControllerTest, ANameMayBeInFlightOnce) {
  ControllerHarness h;
  ASSERT_TRUE(h.controller->enqueue({h.allreduce("x", std::make_shared<RecordingSink>())}).isOk());
  Status s = h.controller->enqueue({h.allreduce("x", std::make_shared<RecordingSink>())});
  EXPECT_EQ(s.code(), Code::kInvalidUsage);
  EXPECT_NE(s.message().find("allreduce \"x\" on rank 0 in process set global: a request with "
                             "this name is already in flight (an earlier allreduce"),
            std::string::npos)
      << s.message();
  s = h.controller->enqueue({h.allreduce("y", std::make_shared<RecordingSink>()),
                             h.allreduce("y", std::make_shared<RecordingSink>())});
  EXPECT_EQ(s.code(), Code::kInvalidUsage) << "twice in one call";
}

TEST(SetControllerTest, ControlOnlyGroupsCompleteHereUnlessWorkIsAhead) {
  ControllerHarness h;
  auto bsink = std::make_shared<RecordingSink>();
  auto b = makeEntry(CollectiveKind::kBarrier, "b", DataType::kUint8, {}, nullptr, nullptr, bsink);
  ASSERT_TRUE(h.controller->enqueue({b}).isOk());
  h.respond(listOf({responseFor(*b)}));
  ASSERT_TRUE(bsink->waitDone());
  EXPECT_TRUE(bsink->status().isOk());
  EXPECT_EQ(h.queue.inFlight(), 0) << "completed on the control thread, not queued";

  // An allreduce is queued (nobody runs it yet): a barrier behind it waits.
  auto a = h.allreduce("a", std::make_shared<RecordingSink>());
  auto b2sink = std::make_shared<RecordingSink>();
  auto b2 =
      makeEntry(CollectiveKind::kBarrier, "b2", DataType::kUint8, {}, nullptr, nullptr, b2sink);
  ASSERT_TRUE(h.controller->enqueue({a, b2}).isOk());
  ResponseList both = listOf({responseFor(*a)});
  both.groups.push_back(listOf({responseFor(*b2)}).groups[0]);
  h.respond(both);
  EXPECT_FALSE(b2sink->done()) << "the barrier must not overtake the allreduce";
  EXPECT_EQ(h.queue.inFlight(), 2);
  AgreedGroup g;
  ASSERT_TRUE(h.queue.pop(&g));
  EXPECT_EQ(g.responses[0].name, "a");
  h.queue.finished();
  ASSERT_TRUE(h.queue.pop(&g));
  EXPECT_EQ(g.responses[0].name, "b2");
  h.queue.finished();
}

TEST(SetControllerTest, AnUnknownCacheBitBreaksTheSetAndFailsWhatIsPending) {
  ControllerHarness h(Seconds(10), /*setSize=*/2);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(h.controller->enqueue({h.allreduce("p", sink)}).isOk());
  h.link->submission(0);
  h.respond(listOf({Response()}, /*cacheBit=*/5));
  EXPECT_TRUE(h.health.broken());
  EXPECT_EQ(h.health.status().code(), Code::kProtocolError);
  EXPECT_NE(h.health.status().message().find("HORA_CACHE_CAPACITY"), std::string::npos);
  ASSERT_TRUE(sink->waitDone());
  EXPECT_EQ(sink->status().code(), Code::kProtocolError);
  EXPECT_EQ(
      sink->status().message().rfind("allreduce \"p\" on rank 0: response cache out of step", 0),
      0u)
      << sink->status().message();
  auto reported = h.link->reported(1);
  ASSERT_EQ(reported.size(), 1u) << "the coordinator is told";
  EXPECT_EQ(reported[0].code(), Code::kProtocolError);
  Status again = h.controller->enqueue({h.allreduce("later", std::make_shared<RecordingSink>())});
  EXPECT_EQ(again.code(), Code::kProtocolError) << "a broken set refuses new work with its cause";
}

TEST(SetControllerTest, AResponseThatDoesNotMatchTheRequestFailsIt) {
  ControllerHarness h;
  auto sink = std::make_shared<RecordingSink>();
  auto e = h.allreduce("m", sink, {4});
  ASSERT_TRUE(h.controller->enqueue({e}).isOk());
  Response r = responseFor(*e);
  r.shape = {5};
  r.signature = 12345;
  h.respond(listOf({r}));
  ASSERT_TRUE(sink->waitDone());
  EXPECT_EQ(sink->status().code(), Code::kProtocolError);
  EXPECT_NE(sink->status().message().find("does not match this request"), std::string::npos);
  EXPECT_TRUE(h.health.broken());
  EXPECT_NE(h.health.status().message().find("response for \"m\" does not match rank 0's request"),
            std::string::npos)
      << h.health.status().message();
}

TEST(SetControllerTest, AMalformedResponseIsAProtocolError) {
  ControllerHarness h;
  Response r;
  r.kind = ResponseKind::kAllgather;
  r.name = "g";
  r.shape = {2};  // but no per-rank sizes
  h.respond(listOf({r}));
  EXPECT_TRUE(h.health.broken());
  EXPECT_EQ(h.health.status().message(),
            "malformed response for \"g\" from the coordinator of set global: allgather needs a "
            "shape and one size per rank");
}

// Issue 14: the executor multiplies a response's shape and sizes (response_counts.h); values
// whose products or sums overflow cannot come from a correct coordinator and must be refused
// before anything computes with them. Each response matches the rank's own request, so
// validation is the only thing that can refuse it.
TEST(SetControllerTest, AResponseWhoseSizesOverflowIsAProtocolError) {
  const int64_t k2e40 = int64_t{1} << 40, k2e62 = int64_t{1} << 62;
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  struct Case {
    CollectiveKind kind;
    std::vector<int64_t> shape, sizes;
    std::string says;
    DataType dtype = DataType::kFloat32;
  };
  const std::vector<Case> cases = {
      {CollectiveKind::kAllreduce, {k2e40, k2e40}, {}, "overflows at dimension 1"},
      {CollectiveKind::kAllreduce, {k2e62 + 1, 4}, {}, "overflows at dimension 0"},
      {CollectiveKind::kBroadcast, {k2e62, 3}, {}, "overflows at dimension 0"},
      {CollectiveKind::kReducescatter,
       {0, k2e62, 8},
       {},
       "overflows at dimension 2",
       DataType::kUint8},
      {CollectiveKind::kAllgather, {4, k2e62}, {4}, "overflows at dimension 1"},
      // Sizes that are not the shape's rows; the allocated output would be too small.
      {CollectiveKind::kAllgather, {4}, {5}, "do not add up"},
      // Float32 rows: 2^62 of them pass the limit though the shape (1 row) does not.
      {CollectiveKind::kAlltoall, {1}, {k2e62}, "alltoall sizes to or from set rank 0 overflow"},
      {CollectiveKind::kAlltoall, {1}, {kMax}, "overflow", DataType::kInt16},
  };
  for (const Case& c : cases) {
    ControllerHarness h;
    auto sink = std::make_shared<RecordingSink>();
    auto e = makeEntry(c.kind, "big", c.dtype, c.shape, nullptr, nullptr, sink);
    ASSERT_TRUE(h.controller->enqueue({e}).isOk());
    Response r = responseFor(*e);
    r.sizes = c.sizes;
    h.respond(listOf({r}));
    ASSERT_TRUE(h.health.broken()) << describeTensor(c.dtype, c.shape) << " was accepted";
    EXPECT_EQ(h.health.status().code(), Code::kProtocolError);
    const std::string m = h.health.status().message();
    EXPECT_NE(m.find("malformed response for \"big\" from the coordinator of set global"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find(c.says), std::string::npos) << m;
    EXPECT_EQ(h.queue.inFlight(), 0) << "nothing reaches the executor";
  }
}

TEST(SetControllerTest, AResponseAtTheSizeLimitIsAccepted) {
  ControllerHarness h;
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  auto e = makeEntry(CollectiveKind::kAllgather, "edge", DataType::kUint8, {kMax}, nullptr, nullptr,
                     std::make_shared<RecordingSink>());
  ASSERT_TRUE(h.controller->enqueue({e}).isOk());
  Response r = responseFor(*e);
  r.sizes = {kMax};
  h.respond(listOf({r}));
  EXPECT_FALSE(h.health.broken()) << h.health.status().message();
  EXPECT_EQ(h.queue.inFlight(), 1);
}

TEST(SetControllerTest, AFailureFoundOnAnotherThreadReachesThePeersAndFailsWhatIsPending) {
  ControllerHarness h(Seconds(10), /*setSize=*/2);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(h.controller->enqueue({h.allreduce("q", sink)}).isOk());
  h.link->submission(0);
  std::thread executor(
      [&] { h.health.fail(Status(Code::kBackendError, "a plugin call failed"), true); });
  executor.join();
  ASSERT_TRUE(sink->waitDone());
  EXPECT_EQ(sink->status().message(), "allreduce \"q\" on rank 0: a plugin call failed");
  auto reported = h.link->reported(1);  // posted to the control thread, then sent
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_EQ(reported[0].message(), "a plugin call failed");
  // A failure the coordinator reported is not echoed back.
  ControllerHarness quiet(Seconds(10), 2);
  quiet.health.fail(Status(Code::kRemoteError, "from the coordinator"), false);
  quiet.onControlThread([] {});
  EXPECT_TRUE(quiet.link->reported(0).empty());
}

TEST(SetControllerTest, AOneRankSetHasNobodyToTell) {
  ControllerHarness h;
  h.health.fail(Status(Code::kBackendError, "alone"), true);
  h.onControlThread([] {});
  EXPECT_TRUE(h.link->reported(0).empty());
}

TEST(SetControllerTest, AfterShutdownBeginsNewRequestsAreRefused) {
  ControllerHarness h;
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(h.controller->enqueue({h.allreduce("pending", sink)}).isOk());
  EXPECT_TRUE(h.controller->beginShutdown());
  EXPECT_FALSE(h.controller->beginShutdown()) << "once";
  Status s = h.controller->enqueue({h.allreduce("new", std::make_shared<RecordingSink>())});
  EXPECT_EQ(s.code(), Code::kShutDown);
  EXPECT_NE(s.message().find("process set global on rank 0 is shut down"), std::string::npos);
  h.controller->failPending(Status(Code::kShutDown, "hora_shutdown was called"));
  ASSERT_TRUE(sink->waitDone());
  EXPECT_EQ(sink->status().message(), "allreduce \"pending\" on rank 0: hora_shutdown was called");
}

TEST(SetControllerTest, TheControlThreadSettlesAnUnnamedSuspicion) {
  ControllerHarness h(Seconds(0.05));
  h.health.suspect(Status(Code::kRemoteError, "gloo: eof"));
  const auto deadline = Clock::now() + 10s;
  while (!h.health.broken() && Clock::now() < deadline) std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(h.health.broken());
  EXPECT_EQ(h.health.status().message(), "gloo: eof");
}

TEST(SetControllerTest, AutomaticNamesCountPerKind) {
  ControllerHarness h;
  EXPECT_EQ(h.controller->autoName(CollectiveKind::kAllreduce), "allreduce.noname.0");
  EXPECT_EQ(h.controller->autoName(CollectiveKind::kAllreduce), "allreduce.noname.1");
  EXPECT_EQ(h.controller->autoName(CollectiveKind::kBroadcast), "broadcast.noname.0");
}

TEST(SetControllerTest, SmallAllreducesCarryTheirPrescaledTensorAndTakeTheResult) {
  ControllerHarness h(Seconds(10), /*setSize=*/2, /*inlineMaxBytes=*/16);
  auto bytesOf = [](std::vector<float> v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  };
  std::vector<float> in{1, 2, 3, 4}, out(4, -1), big(5, 1), bigOut(5);
  auto sink = std::make_shared<RecordingSink>();
  auto e = makeEntry(CollectiveKind::kAllreduce, "w", DataType::kFloat32, {4}, in.data(),
                     out.data(), sink);
  e->request.prescale = 2;
  e->request.postscale = 0.5;
  e->request.op = ReduceOp::kAverage;
  // 20 bytes: past the 16-byte limit, it goes without its data.
  auto large = makeEntry(CollectiveKind::kAllreduce, "big", DataType::kFloat32, {5}, big.data(),
                         bigOut.data(), std::make_shared<RecordingSink>());
  ASSERT_TRUE(h.controller->enqueue({e, large}).isOk());
  in.assign(4, 99);  // the tensor was copied at submission (prescaled)
  RequestList first = h.link->submission(0);
  ASSERT_EQ(first.requests.size(), 2u);
  EXPECT_EQ(first.requests[0].payload, bytesOf({2, 4, 6, 8}));
  EXPECT_TRUE(first.requests[1].payload.empty());
  // The coordinator's sum comes back: averaged over 2 ranks, postscaled, here
  // on the control thread (nothing is queued ahead).
  ResponseList list = listOf({responseFor(*e)});
  list.groups[0].items[0].result = bytesOf({10, 20, 30, 40});
  h.respond(list);
  ASSERT_TRUE(sink->waitDone());
  EXPECT_TRUE(sink->status().isOk()) << sink->status().toString();
  EXPECT_EQ(out, (std::vector<float>{2.5, 5, 7.5, 10}));
  EXPECT_EQ(h.queue.inFlight(), 0) << "an inline result never reaches the executor";

  // Next step: a cache hit with the data; a nack makes it a full request, with the data.
  in.assign({1, 1, 1, 1});
  auto e2 = makeEntry(CollectiveKind::kAllreduce, "w", DataType::kFloat32, {4}, in.data(),
                      out.data(), std::make_shared<RecordingSink>());
  e2->request.prescale = 2;
  e2->request.postscale = 0.5;
  e2->request.op = ReduceOp::kAverage;
  ASSERT_TRUE(h.controller->enqueue({e2}).isOk());
  RequestList hit = h.link->submission(1);
  ASSERT_EQ(hit.hits.size(), 1u);
  EXPECT_EQ(hit.hits[0].payload, bytesOf({2, 2, 2, 2}));
  h.onControlThread([&] { h.controller->onNacks(hit.hits); });
  RequestList resent = h.link->submission(2);
  ASSERT_EQ(resent.requests.size(), 1u);
  EXPECT_EQ(resent.requests[0].payload, bytesOf({2, 2, 2, 2}));
}

TEST(SetControllerTest, AListCarriesAtMostItsBudgetOfInlineData) {
  ControllerHarness h(Seconds(10), /*setSize=*/2, kMaxInlineBytes);
  const size_t n = kMaxInlineListBytes / kMaxInlineBytes + 8;
  std::vector<std::vector<float>> data(n, std::vector<float>(kMaxInlineBytes / 4, 1));
  std::vector<EntryPtr> es;
  for (size_t i = 0; i < n; ++i)
    es.push_back(makeEntry(CollectiveKind::kAllreduce, "t" + std::to_string(i), DataType::kFloat32,
                           {static_cast<int64_t>(kMaxInlineBytes / 4)}, data[i].data(),
                           data[i].data(), std::make_shared<RecordingSink>()));
  ASSERT_TRUE(h.controller->enqueue(es).isOk());
  size_t requests = 0, inlineBytes = 0, withData = 0;
  for (size_t k = 0; requests < n; ++k) {
    RequestList l = h.link->submission(k);
    if (l.requests.empty()) break;
    size_t listBytes = 0;
    for (const auto& r : l.requests) {
      listBytes += r.payload.size();
      withData += !r.payload.empty();
    }
    EXPECT_LE(listBytes, kMaxInlineListBytes);
    EXPECT_LT(encode(l).size(), size_t{64} << 20);
    inlineBytes += listBytes;
    requests += l.requests.size();
  }
  EXPECT_EQ(requests, n);
  EXPECT_GE(withData, kMaxInlineListBytes / kMaxInlineBytes);
  EXPECT_LT(withData, n) << "some went without their data";
}

TEST(SetControllerTest, AnInlineResultOfTheWrongSizeOrInAFusedGroupIsAProtocolError) {
  for (int variant = 0; variant < 2; ++variant) {
    ControllerHarness h(Seconds(10), /*setSize=*/2, /*inlineMaxBytes=*/64);
    std::vector<float> a(4), b(4);
    auto sa = std::make_shared<RecordingSink>(), sb = std::make_shared<RecordingSink>();
    auto ea =
        makeEntry(CollectiveKind::kAllreduce, "a", DataType::kFloat32, {4}, a.data(), a.data(), sa);
    auto eb =
        makeEntry(CollectiveKind::kAllreduce, "b", DataType::kFloat32, {4}, b.data(), b.data(), sb);
    ASSERT_TRUE(h.controller->enqueue({ea, eb}).isOk());
    h.link->submission(0);
    ResponseList list;
    if (variant == 0) {
      list = listOf({responseFor(*ea)});
      list.groups[0].items[0].result = std::string(12, 'x');  // 3 floats for 4
    } else {
      list = listOf({responseFor(*ea), responseFor(*eb)});    // fused...
      list.groups[0].items[1].result = std::string(16, 'x');  // ...with an inline one
    }
    h.respond(list);
    ASSERT_TRUE(sa->waitDone());
    EXPECT_EQ(sa->status().code(), Code::kProtocolError) << variant << sa->status().toString();
    EXPECT_TRUE(h.health.broken());
    EXPECT_EQ(a, std::vector<float>(4, 0)) << "nothing was written into the tensor";
  }
}

TEST(SetControllerTest, EveryKindCarriesItsTensorWhenItsResultFitsAndTakesItsOutput) {
  // 2 ranks, 16 bytes: what the response carries back must fit, so an
  // allgather or alltoall sends at most 8 (about 2 x its own); a broadcast
  // sends only from its root.
  ControllerHarness h(Seconds(10), /*setSize=*/2, /*inlineMaxBytes=*/16);
  std::vector<float> two{1, 2}, three{1, 2, 3}, four{1, 2, 3, 4}, bout(4, -1);
  auto mk = [&](CollectiveKind k, const std::string& name, std::vector<float>& v, int root = 0) {
    auto e = makeEntry(k, name, DataType::kFloat32, {static_cast<int64_t>(v.size())}, v.data(),
                       v.data(), std::make_shared<RecordingSink>());
    e->request.root = root;
    if (k == CollectiveKind::kAlltoall) e->request.splits = {1, static_cast<int64_t>(v.size()) - 1};
    return e;
  };
  std::vector<EntryPtr> es = {mk(CollectiveKind::kAllgather, "ag2", two),
                              mk(CollectiveKind::kAllgather, "ag3", three),
                              mk(CollectiveKind::kAlltoall, "a2a2", two),
                              mk(CollectiveKind::kReducescatter, "rs4", four),
                              mk(CollectiveKind::kBroadcast, "b-root", four, 0),
                              mk(CollectiveKind::kBroadcast, "b-other", four, 1)};
  ASSERT_TRUE(h.controller->enqueue(es).isOk());
  RequestList l = h.link->submission(0);
  ASSERT_EQ(l.requests.size(), es.size());
  std::map<std::string, size_t> sent;
  for (const auto& r : l.requests) sent[r.name] = r.payload.size();
  EXPECT_EQ(sent["ag2"], 8u);
  EXPECT_EQ(sent["ag3"], 0u) << "12 bytes x 2 ranks is past 16";
  EXPECT_EQ(sent["a2a2"], 8u);
  EXPECT_EQ(sent["rs4"], 16u);
  EXPECT_EQ(sent["b-root"], 16u);
  EXPECT_EQ(sent["b-other"], 0u) << "only the root sends a broadcast's tensor";

  // The coordinator's concatenation comes back: the allgather's output is
  // allocated and filled here, on the control thread.
  auto sink = std::make_shared<RecordingSink>();
  auto g = makeEntry(CollectiveKind::kAllgather, "g", DataType::kFloat32, {1}, two.data(), nullptr,
                     sink);
  ASSERT_TRUE(h.controller->enqueue({g}).isOk());
  h.link->submission(1);
  Response r = responseFor(*g);
  r.shape = {2};
  r.sizes = {1, 1};
  ResponseList list = listOf({r});
  const std::vector<float> gathered{5, 6};
  list.groups[0].items[0].result =
      std::string(reinterpret_cast<const char*>(gathered.data()), 2 * sizeof(float));
  h.respond(list);
  ASSERT_TRUE(sink->waitDone());
  EXPECT_TRUE(sink->status().isOk()) << sink->status().toString();
  EXPECT_EQ(sink->output<float>(), gathered);
  EXPECT_EQ(h.queue.inFlight(), 0) << "an inline result never reaches the executor";
}

TEST(SetControllerTest, AnInlineAlltoallResultOfTheWrongSizeIsAProtocolError) {
  ControllerHarness h(Seconds(10), /*setSize=*/2, /*inlineMaxBytes=*/64);
  std::vector<float> v{1, 2};
  auto sink = std::make_shared<RecordingSink>();
  auto e =
      makeEntry(CollectiveKind::kAlltoall, "x", DataType::kFloat32, {2}, v.data(), nullptr, sink);
  e->request.splits = {1, 1};
  ASSERT_TRUE(h.controller->enqueue({e}).isOk());
  h.link->submission(0);
  Response r = responseFor(*e);
  r.sizes = {1, 1, 1, 1};  // 4 rows in all: 16 bytes
  ResponseList list = listOf({r});
  list.groups[0].items[0].result = std::string(8, 'x');
  h.respond(list);
  ASSERT_TRUE(sink->waitDone());
  EXPECT_EQ(sink->status().code(), Code::kProtocolError) << sink->status().toString();
  EXPECT_TRUE(h.health.broken());
  EXPECT_NE(
      h.health.status().message().find("an inline result of 8 bytes for an alltoall of 4 rows"),
      std::string::npos)
      << h.health.status().message();
  EXPECT_EQ(sink->allocations(), 0) << "nothing was allocated for it";
}

TEST(SetControllerTest, TheOtherKindsHaveTheirOwnBudget) {
  // 16 bytes for allreduce, 8 for the others (across hosts by default a
  // quarter): a 16-byte allreduce carries its tensor, a 16-byte broadcast
  // or reducescatter does not, an 8-byte one does.
  ControllerHarness h(Seconds(10), /*setSize=*/2, /*inlineMaxBytes=*/16, nullptr,
                      /*inlineMaxOtherBytes=*/8);
  std::vector<float> four{1, 2, 3, 4}, two{1, 2};
  auto mk = [&](CollectiveKind k, const std::string& name, std::vector<float>& v) {
    return makeEntry(k, name, DataType::kFloat32, {static_cast<int64_t>(v.size())}, v.data(),
                     v.data(), std::make_shared<RecordingSink>());
  };
  ASSERT_TRUE(h.controller
                  ->enqueue({mk(CollectiveKind::kAllreduce, "ar16", four),
                             mk(CollectiveKind::kBroadcast, "bc16", four),
                             mk(CollectiveKind::kReducescatter, "rs16", four),
                             mk(CollectiveKind::kBroadcast, "bc8", two)})
                  .isOk());
  std::map<std::string, size_t> sent;
  for (const auto& r : h.link->submission(0).requests) sent[r.name] = r.payload.size();
  EXPECT_EQ(sent["ar16"], 16u);
  EXPECT_EQ(sent["bc16"], 0u);
  EXPECT_EQ(sent["rs16"], 0u);
  EXPECT_EQ(sent["bc8"], 8u);
}

// A sink whose output comes from the caller's allocator (hora.torch's, a
// Python callback that needs the GIL).
class CallerAllocatingSink : public RecordingSink {
 public:
  bool allocatesThroughCaller() const override { return true; }
};

TEST(SetControllerTest, AnInlineResultWhoseOutputTheCallerAllocatesGoesToTheExecutor) {
  // The control thread must not wait on the caller's allocator (its
  // heartbeats and, on rank 0, every rank's negotiation would wait too).
  ControllerHarness h(Seconds(10), /*setSize=*/2, /*inlineMaxBytes=*/64);
  std::vector<float> v{1};
  auto sink = std::make_shared<CallerAllocatingSink>();
  auto e =
      makeEntry(CollectiveKind::kAllgather, "g", DataType::kFloat32, {1}, v.data(), nullptr, sink);
  ASSERT_TRUE(h.controller->enqueue({e}).isOk());
  h.link->submission(0);
  Response r = responseFor(*e);
  r.shape = {2};
  r.sizes = {1, 1};
  ResponseList list = listOf({r});
  list.groups[0].items[0].result = std::string(8, '\0');
  h.respond(list);
  EXPECT_EQ(h.queue.inFlight(), 1) << "it waits for the executor";
  EXPECT_FALSE(sink->done());
  EXPECT_EQ(sink->allocations(), 0);
}

TEST(SetControllerTest, AResponseForAnotherDeviceIsAProtocolError) {
  // A GPU allgather answered as a host one with an inline result: copying
  // it into GPU memory with memcpy would crash; the response is refused.
  ControllerHarness h(Seconds(10), /*setSize=*/2, /*inlineMaxBytes=*/64);
  auto sink = std::make_shared<RecordingSink>();
  auto e =
      makeEntry(CollectiveKind::kAllgather, "g", DataType::kFloat32, {1}, nullptr, nullptr, sink);
  e->request.device.kind = DeviceKind::kCuda;
  ASSERT_TRUE(h.controller->enqueue({e}).isOk());
  h.link->submission(0);
  Response r = responseFor(*e);
  r.device.kind = DeviceKind::kCpu;
  r.shape = {2};
  r.sizes = {1, 1};
  ResponseList list = listOf({r});
  list.groups[0].items[0].result = std::string(8, '\0');
  h.respond(list);
  ASSERT_TRUE(sink->waitDone());
  EXPECT_EQ(sink->status().code(), Code::kProtocolError) << sink->status().toString();
  EXPECT_TRUE(h.health.broken());
  EXPECT_EQ(sink->allocations(), 0);
}

}  // namespace
}  // namespace hora
