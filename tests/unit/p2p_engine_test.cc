// P2pEngine (ops/p2p/p2p_engine.h) with ranks as objects: two or three
// engines in this process share a MemoryStore (where they publish their
// inboxes) and a temporary directory (instead of /dev/shm), and every
// operation completes into a recording RequestSink. Checked: eager and large
// messages arrive intact both ways and between three ranks; messages with one
// tag are matched in posted order and other tags may overtake them; a
// receive without a buffer gets one of the message's shape and dtype, and a
// failed allocation fails both sides; a dtype or size mismatch fails both
// sides and leaves the receive buffer untouched; post() refuses a peer
// outside the set, the rank itself and an op without a request, all or none;
// fail() completes everything pending with its status; shutdown() fails
// what is pending with kShutDown, and a peer waiting on the closed inbox
// fails naming the rank, also when it only ever received from it or reaches
// it after it left; a stalled operation passing the stall shutdown and a
// malformed frame reach onFatal; a peer on another host is refused, on both
// sides; a waiter's poll() returns when its request is done or its spin
// window ends.
//
// Every wait has a deadline (a hang fails the test instead of blocking it).
#include "ops/p2p/p2p_engine.h"

#include <sstream>

#include "p2p_engine_fixture.h"

namespace hora {
namespace {

// Sizes around the eager limit and beyond one ring, both directions at once,
// half the receives posted before the sends and half after.
TEST_F(P2pEngineTest, DeliversEagerAndLargeMessagesBothWays) {
  start(2);
  const std::vector<int64_t> counts = {
      0, 1, kEagerBytes / 4, kEagerBytes / 4 + 1, 50000, 3 * kRingBytes / 4 + 7};
  for (int recvFirst = 0; recvFirst < 2; ++recvFirst) {
    for (size_t i = 0; i < counts.size(); ++i) {
      const int64_t tag = recvFirst * 100 + static_cast<int64_t>(i);
      Buf out0(DataType::kFloat32, {counts[i]}), out1(DataType::kFloat32, {counts[i]});
      Buf in0(DataType::kFloat32, {counts[i]}), in1(DataType::kFloat32, {counts[i]});
      out0.stamp(0, tag);
      out1.stamp(1, tag);
      auto s0 = std::make_shared<Sink>(), s1 = std::make_shared<Sink>();
      auto r0 = std::make_shared<Sink>(), r1 = std::make_shared<Sink>();
      if (recvFirst) {
        ASSERT_TRUE(post(0, recvOp(1, tag, in0, r0)).isOk());
        ASSERT_TRUE(post(1, recvOp(0, tag, in1, r1)).isOk());
      }
      ASSERT_TRUE(post(0, sendOp(1, tag, out0, s0)).isOk());
      ASSERT_TRUE(post(1, sendOp(0, tag, out1, s1)).isOk());
      if (!recvFirst) {
        ASSERT_TRUE(post(1, recvOp(0, tag, in1, r1)).isOk());
        ASSERT_TRUE(post(0, recvOp(1, tag, in0, r0)).isOk());
      }
      for (auto* s : {&s0, &s1, &r0, &r1}) {
        Status st = waitFor(*s);
        ASSERT_TRUE(st.isOk()) << "count " << counts[i] << ": " << st.toString();
      }
      EXPECT_TRUE(in0.stamped(1, tag)) << "count " << counts[i];
      EXPECT_TRUE(in1.stamped(0, tag)) << "count " << counts[i];
    }
  }
  EXPECT_TRUE(drained(0));
  EXPECT_TRUE(drained(1));
  EXPECT_EQ(fatal_[0]->count() + fatal_[1]->count(), 0u);
}

// Every rank sends to both others with the same tags, in one batch with its
// receives: one ring per sender keeps the streams apart.
TEST_F(P2pEngineTest, ThreeRanksExchangeWithEachOther) {
  start(3);
  const int64_t counts[] = {3, 20000};
  std::vector<std::unique_ptr<Buf>> bufs;
  std::vector<std::shared_ptr<Sink>> sinks;
  struct Expect {
    Buf* buf;
    int from;
    int64_t id;
  };
  std::vector<Expect> expects;
  for (int r = 0; r < 3; ++r) {
    std::vector<P2pOp> ops;
    for (int peer = 0; peer < 3; ++peer) {
      if (peer == r) continue;
      for (int64_t c : counts) {
        bufs.push_back(std::make_unique<Buf>(DataType::kInt32, std::vector<int64_t>{c}));
        bufs.back()->stamp(r, peer * 10 + c);  // id: receiver and size
        sinks.push_back(std::make_shared<Sink>());
        ops.push_back(sendOp(peer, c, *bufs.back(), sinks.back()));
        bufs.push_back(std::make_unique<Buf>(DataType::kInt32, std::vector<int64_t>{c}));
        expects.push_back({bufs.back().get(), peer, r * 10 + c});
        sinks.push_back(std::make_shared<Sink>());
        ops.push_back(recvOp(peer, c, *bufs.back(), sinks.back()));
      }
    }
    ASSERT_TRUE(rank(r).post(std::move(ops)).isOk());
  }
  for (auto& s : sinks) ASSERT_TRUE(waitFor(s).isOk()) << s->status().toString();
  for (auto& e : expects) EXPECT_TRUE(e.buf->stamped(e.from, e.id)) << "from " << e.from;
}

// Rank 0 sends tags 5, 7, 5 (eager) and 9, 9 (large); rank 1 receives 7, 5,
// 5, 9, 9: one tag's messages in send order, another tag may overtake.
// Once with the receives posted before the sends, once after.
TEST_F(P2pEngineTest, MatchesOneTagInPostedOrderAndLetsOtherTagsOvertake) {
  start(2);
  const std::vector<int64_t> tags = {5, 7, 5, 9, 9};
  const std::vector<std::pair<int64_t, int>> order = {{7, 1}, {5, 0}, {5, 2}, {9, 3}, {9, 4}};
  for (int recvFirst = 0; recvFirst < 2; ++recvFirst) {
    const int64_t base = recvFirst * 1000;
    std::vector<std::unique_ptr<Buf>> out, in;
    std::vector<std::shared_ptr<Sink>> sends, recvs;
    auto postRecvs = [&] {
      for (auto [tag, idx] : order) {
        in.push_back(
            std::make_unique<Buf>(DataType::kFloat32, std::vector<int64_t>{tag == 9 ? 30000 : 10}));
        recvs.push_back(std::make_shared<Sink>());
        ASSERT_TRUE(post(1, recvOp(0, base + tag, *in.back(), recvs.back())).isOk());
      }
    };
    if (recvFirst) postRecvs();
    for (size_t i = 0; i < tags.size(); ++i) {
      out.push_back(std::make_unique<Buf>(DataType::kFloat32,
                                          std::vector<int64_t>{tags[i] == 9 ? 30000 : 10}));
      out.back()->stamp(0, static_cast<int64_t>(i));
      sends.push_back(std::make_shared<Sink>());
      ASSERT_TRUE(post(0, sendOp(1, base + tags[i], *out.back(), sends.back())).isOk());
    }
    if (!recvFirst) {
      // Rank 1 has no inbox until its first operation: make one, so the
      // messages arrive (unexpected) before their receives are posted.
      Buf other(DataType::kUint8, {1});
      auto otherSink = std::make_shared<Sink>();
      ASSERT_TRUE(post(1, recvOp(0, base + 77, other, otherSink)).isOk());
      std::this_thread::sleep_for(50ms);
      postRecvs();
      Buf one(DataType::kUint8, {1});
      auto oneSink = std::make_shared<Sink>();
      ASSERT_TRUE(post(0, sendOp(1, base + 77, one, oneSink)).isOk());
      ASSERT_TRUE(waitFor(otherSink).isOk());
      ASSERT_TRUE(waitFor(oneSink).isOk());
    }
    for (size_t i = 0; i < order.size(); ++i) {
      Status st = waitFor(recvs[i]);
      ASSERT_TRUE(st.isOk()) << st.toString();
      EXPECT_TRUE(in[i]->stamped(0, order[i].second))
          << "recvFirst " << recvFirst << ": receive " << i << " (tag " << order[i].first
          << ") should hold send " << order[i].second;
    }
    for (auto& s : sends) EXPECT_TRUE(waitFor(s).isOk()) << s->status().toString();
  }
}

// A receive without a buffer: the sink allocates one of the message's shape
// and dtype, eager, large and empty.
// A waiter's poll(): it returns at once for a completed request, gives up
// after HORA_P2P_SPIN_US when nothing comes (the caller then sleeps on the
// request), and returns once a message it polls for has been received.
TEST_F(P2pEngineTest, PollReturnsWhenDoneOrWhenTheSpinWindowEnds) {
  struct FlagSink : Sink {
    std::atomic<bool> finished{false};
    void completeEntry(const Status& s) override {
      Sink::completeEntry(s);
      finished.store(true, std::memory_order_release);
    }
  };
  // A window far longer than a loaded machine's scheduling delays, so that
  // "returns at once" and "polls the whole window" cannot be confused.
  constexpr int kSpinUs = 500000;
  start(2, [](P2pEngineOptions& o) { o.spinUs = kSpinUs; });
  std::atomic<bool> already{true};
  auto t0 = Clock::now();
  rank(1).poll(already);
  EXPECT_LT(Clock::now() - t0, 250ms);

  // Nothing sent: the whole window, then back to the caller.
  Buf in(DataType::kInt32, {3});
  auto r = std::make_shared<FlagSink>();
  ASSERT_TRUE(post(1, recvOp(0, 7, in, r)).isOk());
  t0 = Clock::now();
  rank(1).poll(r->finished);
  const auto waited = Clock::now() - t0;
  EXPECT_FALSE(r->finished.load());
  EXPECT_GE(waited, std::chrono::microseconds(kSpinUs));
  EXPECT_LT(waited, 5s);

  Buf out(DataType::kInt32, {3});
  out.stamp(0, 7);
  auto s = std::make_shared<Sink>();
  ASSERT_TRUE(post(0, sendOp(1, 7, out, s)).isOk());
  const auto until = Clock::now() + kDeadline;
  while (!r->finished.load() && Clock::now() < until) rank(1).poll(r->finished);
  ASSERT_TRUE(r->finished.load());
  EXPECT_TRUE(r->status().isOk()) << r->status().toString();
  EXPECT_TRUE(in.stamped(0, 7));
  EXPECT_TRUE(waitFor(s).isOk());
}

TEST_F(P2pEngineTest, ReceiveWithoutABufferAllocatesTheMessagesShape) {
  start(2);
  for (int64_t rows : {3, 4000, 0}) {
    Buf out(DataType::kInt64, {rows, 5});
    out.stamp(0, rows);
    auto recv = std::make_shared<Sink>(), send = std::make_shared<Sink>();
    ASSERT_TRUE(post(1, recvAnyShape(0, rows, recv)).isOk());
    ASSERT_TRUE(post(0, sendOp(1, rows, out, send)).isOk());
    ASSERT_TRUE(waitFor(recv).isOk()) << recv->status().toString();
    ASSERT_TRUE(waitFor(send).isOk()) << send->status().toString();
    EXPECT_EQ(recv->allocations(), 1);
    EXPECT_EQ(recv->shape(), (std::vector<int64_t>{rows, 5}));
    EXPECT_EQ(recv->dtype(), DataType::kInt64);
    ASSERT_GE(recv->output<char>().size(), out.bytes.size());
    EXPECT_EQ(std::memcmp(recv->output<char>().data(), out.bytes.data(), out.bytes.size()), 0);
  }
}

TEST_F(P2pEngineTest, FailedAllocationFailsBothSides) {
  start(2);
  for (int64_t count : {8, 20000}) {  // eager, large
    Buf out(DataType::kFloat32, {count});
    auto recv = std::make_shared<Sink>(), send = std::make_shared<Sink>();
    recv->failAllocations(Status(Code::kSystemError, "the test's allocator is empty"));
    ASSERT_TRUE(post(1, recvAnyShape(0, count, recv)).isOk());
    ASSERT_TRUE(post(0, sendOp(1, count, out, send)).isOk());
    Status r = waitFor(recv), s = waitFor(send);
    EXPECT_EQ(r.code(), Code::kMismatch) << r.toString();
    EXPECT_TRUE(contains(r, "allocating the receive buffer failed: the test's allocator is empty"))
        << r.toString();
    EXPECT_EQ(s.code(), Code::kMismatch) << s.toString();
    EXPECT_TRUE(contains(s, "rank 1 could not allocate")) << s.toString();
  }
  // The streams are still in step.
  Buf out(DataType::kFloat32, {10}), in(DataType::kFloat32, {10});
  out.stamp(0, 1);
  auto recv = std::make_shared<Sink>(), send = std::make_shared<Sink>();
  ASSERT_TRUE(post(1, recvOp(0, 1, in, recv)).isOk());
  ASSERT_TRUE(post(0, sendOp(1, 1, out, send)).isOk());
  EXPECT_TRUE(waitFor(recv).isOk());
  EXPECT_TRUE(waitFor(send).isOk());
  EXPECT_TRUE(in.stamped(0, 1));
}

TEST_F(P2pEngineTest, MismatchFailsBothSidesAndLeavesTheBufferUntouched) {
  start(2);
  struct Case {
    DataType sendType, recvType;
    int64_t sendCount, recvCount;
  };
  // Same bytes but another dtype; one element more; both large; large
  // against a small buffer; small against a large one.
  const std::vector<Case> cases = {{DataType::kFloat32, DataType::kInt32, 8, 8},
                                   {DataType::kFloat32, DataType::kFloat32, 8, 9},
                                   {DataType::kFloat32, DataType::kFloat32, 30000, 20000},
                                   {DataType::kFloat32, DataType::kFloat32, 30000, 8},
                                   {DataType::kUint8, DataType::kUint8, 10, 100000}};
  int64_t tag = 0;
  for (const Case& c : cases) {
    for (int recvFirst = 0; recvFirst < 2; ++recvFirst, ++tag) {
      Buf out(c.sendType, {c.sendCount}), in(c.recvType, {c.recvCount}, 0x5a);
      out.stamp(0, tag);
      auto recv = std::make_shared<Sink>(), send = std::make_shared<Sink>();
      if (recvFirst) {
        ASSERT_TRUE(post(1, recvOp(0, tag, in, recv)).isOk());
      }
      ASSERT_TRUE(post(0, sendOp(1, tag, out, send)).isOk());
      if (!recvFirst) {
        ASSERT_TRUE(post(1, recvOp(0, tag, in, recv)).isOk());
      }
      Status r = waitFor(recv), s = waitFor(send);
      EXPECT_EQ(r.code(), Code::kMismatch) << r.toString();
      EXPECT_TRUE(contains(r, "the message is")) << r.toString();
      EXPECT_TRUE(contains(r, "from rank 0 (tag " + std::to_string(tag) + ")")) << r.toString();
      EXPECT_EQ(s.code(), Code::kMismatch) << s.toString();
      EXPECT_TRUE(contains(s, "rank 1's matching receive expected")) << s.toString();
      EXPECT_TRUE(contains(s, "to rank 1 (tag " + std::to_string(tag) + ")")) << s.toString();
      EXPECT_TRUE(in.all(0x5a)) << "case " << tag << ": the receive buffer was written";
    }
  }
  Buf out(DataType::kFloat32, {30000}), in(DataType::kFloat32, {30000});
  out.stamp(0, 99);
  auto recv = std::make_shared<Sink>(), send = std::make_shared<Sink>();
  ASSERT_TRUE(post(1, recvOp(0, 99, in, recv)).isOk());
  ASSERT_TRUE(post(0, sendOp(1, 99, out, send)).isOk());
  EXPECT_TRUE(waitFor(recv).isOk()) << recv->status().toString();
  EXPECT_TRUE(waitFor(send).isOk()) << send->status().toString();
  EXPECT_TRUE(in.stamped(0, 99));
}

TEST_F(P2pEngineTest, PostRefusesABadPeerItselfAndAnOpWithoutARequest) {
  start(2);
  Buf b(DataType::kFloat32, {4});
  auto sink = std::make_shared<Sink>();
  for (int peer : {-1, 2, 1000}) {
    Status s = post(0, sendOp(peer, 0, b, sink));
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << peer;
    EXPECT_TRUE(contains(s, "peer " + std::to_string(peer) + " is not a rank of process set test"))
        << s.toString();
  }
  Status self = post(1, recvOp(1, 0, b, sink));
  EXPECT_EQ(self.code(), Code::kInvalidArgument);
  EXPECT_TRUE(contains(self, "names itself")) << self.toString();
  P2pOp noSink = sendOp(1, 0, b, nullptr);
  EXPECT_EQ(post(0, noSink).code(), Code::kInternal);
  // All or none: a good op beside a bad one is not posted either.
  std::vector<P2pOp> batch;
  batch.push_back(sendOp(1, 0, b, sink));
  batch.push_back(sendOp(0, 0, b, sink));
  EXPECT_EQ(rank(0).post(std::move(batch)).code(), Code::kInvalidArgument);
  EXPECT_EQ(rank(0).pending(), 0u);
  EXPECT_EQ(rank(1).pending(), 0u);
  EXPECT_EQ(sink->completions(), 0);
  // Nothing half-posted: a real exchange pairs up.
  Buf out(DataType::kFloat32, {4}), in(DataType::kFloat32, {4});
  out.stamp(0, 0);
  auto recv = std::make_shared<Sink>(), send = std::make_shared<Sink>();
  ASSERT_TRUE(post(1, recvOp(0, 0, in, recv)).isOk());
  ASSERT_TRUE(post(0, sendOp(1, 0, out, send)).isOk());
  EXPECT_TRUE(waitFor(recv).isOk());
  EXPECT_TRUE(waitFor(send).isOk());
  EXPECT_TRUE(in.stamped(0, 0));
  EXPECT_EQ(sink->completions(), 0);
}

// The set broke: whatever rank 0 has pending (a receive nobody sends, an
// eager and a large send nobody receives) completes once with fail()'s
// status; later posts are refused with it.
TEST_F(P2pEngineTest, FailCompletesEverythingPendingWithTheStatus) {
  start(2);
  Buf keep(DataType::kUint8, {1});
  auto rank1Recv = std::make_shared<Sink>();
  ASSERT_TRUE(post(1, recvOp(0, 1000, keep, rank1Recv)).isOk());  // rank 1's inbox exists
  Buf in(DataType::kFloat32, {4}), small(DataType::kFloat32, {4}),
      large(DataType::kFloat32, {20000});
  auto r = std::make_shared<Sink>(), s1 = std::make_shared<Sink>(), s2 = std::make_shared<Sink>();
  ASSERT_TRUE(post(0, recvOp(1, 1, in, r)).isOk());
  ASSERT_TRUE(post(0, sendOp(1, 2, small, s1)).isOk());
  ASSERT_TRUE(post(0, sendOp(1, 3, large, s2)).isOk());
  std::this_thread::sleep_for(20ms);  // let the sends reach rank 1's inbox
  EXPECT_EQ(rank(0).pending(), 3u);
  rank(0).fail(Status(Code::kRemoteError, "rank 1 vanished (the test says)"));
  for (auto* s : {&r, &s1, &s2}) {
    Status st = waitFor(*s);
    EXPECT_EQ(st.code(), Code::kRemoteError) << st.toString();
    EXPECT_TRUE(contains(st, "rank 1 vanished (the test says)")) << st.toString();
  }
  EXPECT_TRUE(contains(r->status(), "recv of float32[4] from rank 1 (tag 1)"))
      << r->status().toString();
  EXPECT_TRUE(contains(s2->status(), "send of float32[20000] to rank 1 (tag 3)"))
      << s2->status().toString();
  EXPECT_EQ(rank(0).pending(), 0u);
  Status later = post(0, sendOp(1, 4, small, std::make_shared<Sink>()));
  EXPECT_EQ(later.code(), Code::kRemoteError);
  EXPECT_EQ(fatal_[0]->count(), 0u);  // fail() comes from the set: no onFatal back
  rank(0).fail(Status(Code::kInternal, "a second failure"));  // no second completion
  for (auto* s : {&r, &s1, &s2}) EXPECT_EQ((*s)->completions(), 1);
}

// Rank 0 shuts down with a receive pending: it fails with kShutDown. Rank 1,
// waiting on a receive from rank 0, sees rank 0's inbox closed and fails
// naming rank 0, not at a stall timeout.
TEST_F(P2pEngineTest, ShutdownFailsPendingAndThePeerSeesTheClosedInbox) {
  start(2);
  // One message each way first: both ranks are connected to each other.
  Buf a(DataType::kFloat32, {4}), b(DataType::kFloat32, {4});
  auto sa = std::make_shared<Sink>(), ra = std::make_shared<Sink>();
  auto sb = std::make_shared<Sink>(), rb = std::make_shared<Sink>();
  ASSERT_TRUE(post(0, sendOp(1, 0, a, sa)).isOk());
  ASSERT_TRUE(post(1, recvOp(0, 0, b, rb)).isOk());
  ASSERT_TRUE(post(1, sendOp(0, 1, b, sb)).isOk());
  ASSERT_TRUE(post(0, recvOp(1, 1, a, ra)).isOk());
  for (auto* s : {&sa, &ra, &sb, &rb}) ASSERT_TRUE(waitFor(*s).isOk());

  auto mine = std::make_shared<Sink>(), theirs = std::make_shared<Sink>();
  ASSERT_TRUE(post(0, recvOp(1, 5, a, mine)).isOk());
  ASSERT_TRUE(post(1, recvOp(0, 6, b, theirs)).isOk());
  rank(0).shutdown("the test shut rank 0 down");
  ASSERT_TRUE(mine->waitDone(0ms)) << "shutdown() returned before failing what was pending";
  EXPECT_EQ(mine->status().code(), Code::kShutDown) << mine->status().toString();
  EXPECT_TRUE(contains(mine->status(), "the test shut rank 0 down")) << mine->status().toString();
  EXPECT_EQ(post(0, recvOp(1, 7, a, std::make_shared<Sink>())).code(), Code::kShutDown);
  rank(0).shutdown("again");  // idempotent

  Status st = waitFor(theirs);
  EXPECT_EQ(st.code(), Code::kShutDown) << st.toString();
  EXPECT_TRUE(contains(st, "rank 0 of process set test shut down")) << st.toString();
  EXPECT_TRUE(drained(1));
  EXPECT_EQ(fatal_[1]->count(), 0u);  // a goodbye is not a failure of the set
}

// As above, but rank 1 never sent anything to rank 0 (it only receives from
// it): it must still notice that rank 0's inbox closed.
TEST_F(P2pEngineTest, ShutdownIsSeenByAPeerThatOnlyReceives) {
  start(2);
  Buf a(DataType::kFloat32, {4}), b(DataType::kFloat32, {4});
  auto mine = std::make_shared<Sink>(), theirs = std::make_shared<Sink>();
  ASSERT_TRUE(post(0, recvOp(1, 5, a, mine)).isOk());  // rank 0's inbox exists
  ASSERT_TRUE(post(1, recvOp(0, 6, b, theirs)).isOk());
  std::this_thread::sleep_for(20ms);
  rank(0).shutdown("the test shut rank 0 down");
  EXPECT_EQ(mine->status().code(), Code::kShutDown);
  Status st = waitFor(theirs);
  EXPECT_EQ(st.code(), Code::kShutDown) << st.toString();
  EXPECT_TRUE(contains(st, "rank 0 of process set test shut down")) << st.toString();
}

// Rank 0 used point-to-point and shut down before rank 1 ever reached its
// inbox (the file is gone): rank 1's send and receive fail with kShutDown
// naming rank 0; the set is not broken.
TEST_F(P2pEngineTest, OperationsWithAPeerThatAlreadyShutDownFailWithShutDown) {
  start(2);
  Buf a(DataType::kFloat32, {4}), b(DataType::kFloat32, {4});
  auto mine = std::make_shared<Sink>();
  ASSERT_TRUE(post(0, recvOp(1, 5, a, mine)).isOk());  // rank 0's inbox exists
  rank(0).shutdown("the test shut rank 0 down");
  auto send = std::make_shared<Sink>(), recv = std::make_shared<Sink>();
  ASSERT_TRUE(post(1, sendOp(0, 5, b, send)).isOk());
  ASSERT_TRUE(post(1, recvOp(0, 6, b, recv)).isOk());
  for (auto* s : {&send, &recv}) {
    Status st = waitFor(*s);
    EXPECT_EQ(st.code(), Code::kShutDown) << st.toString();
    EXPECT_TRUE(contains(st, "rank 0 of process set test shut down")) << st.toString();
  }
  EXPECT_EQ(fatal_[1]->count(), 0u) << fatal_[1]->first().toString();
}

// A receiver that shuts down as soon as its receive returned: the sender's
// send still succeeds (the receive returns only once the sender has been
// told). Fresh ranks each time, so the receive is each pair's first
// operation (the case where the accept could be left unsent).
TEST_F(P2pEngineTest, ReceiverShuttingDownRightAfterItsReceiveDoesNotFailTheSend) {
  for (int i = 0; i < 40; ++i) {
    engines_.clear();
    fatal_.clear();
    store_ = std::make_shared<MemoryStore>();
    start(2);
    Buf out(DataType::kFloat32, {4}), in(DataType::kFloat32, {4});
    out.stamp(0, i);
    auto recv = std::make_shared<Sink>(), send = std::make_shared<Sink>();
    ASSERT_TRUE(post(1, recvOp(0, 1, in, recv)).isOk());
    if (i % 2) std::this_thread::sleep_for(1ms);
    ASSERT_TRUE(post(0, sendOp(1, 1, out, send)).isOk());
    ASSERT_TRUE(waitFor(recv).isOk()) << recv->status().toString();
    rank(1).shutdown("the receiver is done");
    Status st = waitFor(send);
    ASSERT_TRUE(st.isOk()) << "round " << i << ": " << st.toString();
    EXPECT_TRUE(in.stamped(0, i));
  }
}

// A receive nobody sends to, with a short stall shutdown: onFatal gets a
// timeout naming the peer and the tag (once), and the receive fails with it.
TEST_F(P2pEngineTest, StallPastTheShutdownTimeCallsOnFatal) {
  start(2, [](P2pEngineOptions& o) {
    o.stallWarning = Seconds(0.1);
    o.stallShutdown = Seconds(0.3);
  });
  Buf b(DataType::kFloat32, {4});
  auto recv = std::make_shared<Sink>();
  const auto t0 = Clock::now();
  ASSERT_TRUE(post(1, recvOp(0, 42, b, recv)).isOk());
  ASSERT_TRUE(fatal_[1]->wait()) << "no onFatal within 10 s";
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GE(took, 0.3);
  EXPECT_LT(took, 3.0);
  Status why = fatal_[1]->first();
  EXPECT_EQ(why.code(), Code::kTimeout) << why.toString();
  EXPECT_TRUE(contains(why, "recv of float32[4] from rank 0 (tag 42)")) << why.toString();
  EXPECT_TRUE(contains(why, "rank 0 has not sent a message with tag 42")) << why.toString();
  EXPECT_TRUE(contains(why, "HORA_STALL_SHUTDOWN_TIME_S")) << why.toString();
  Status st = waitFor(recv);
  EXPECT_EQ(st.code(), Code::kTimeout) << st.toString();
  // What the set's listener does next: fail() the engine; nothing more fires.
  rank(1).fail(why);
  std::this_thread::sleep_for(600ms);  // past the next stall check
  EXPECT_EQ(fatal_[1]->count(), 1u);
  EXPECT_EQ(post(1, recvOp(0, 43, b, std::make_shared<Sink>())).code(), Code::kTimeout);
}

// Bytes that are not a frame in a rank's inbox: the stream cannot be
// resynchronized, so the engine reports it through onFatal.
TEST_F(P2pEngineTest, MalformedFrameIsFatal) {
  start(2);
  Buf b(DataType::kFloat32, {4});
  auto recv = std::make_shared<Sink>();
  ASSERT_TRUE(post(1, recvOp(0, 1, b, recv)).isOk());
  auto published = store_->get("p2p/inbox/1", std::chrono::milliseconds(5000));
  ASSERT_TRUE(published.isOk()) << published.status().toString();
  std::istringstream is(published.value());
  std::string name;
  std::getline(is, name);
  auto inbox = P2pInbox::open(dir_, name);
  ASSERT_TRUE(inbox.isOk()) << inbox.status().toString();
  std::vector<char> junk(128, static_cast<char>(0xee));
  ASSERT_EQ(inbox.value()->write(0, junk.data(), junk.size()), junk.size());  // as rank 0
  inbox.value()->ring();
  ASSERT_TRUE(fatal_[1]->wait());
  Status why = fatal_[1]->first();
  EXPECT_EQ(why.code(), Code::kProtocolError) << why.toString();
  EXPECT_TRUE(contains(why, "malformed point-to-point frame from rank 0 to rank 1"))
      << why.toString();
  EXPECT_EQ(waitFor(recv).code(), Code::kProtocolError);
}

// Ranks on different hosts talk over TCP (the lower rank connects, with the
// acceptor's token from the store); eager and large messages both ways.
TEST_F(P2pEngineTest, PeerOnAnotherHostTalksOverTcp) {
  start(2, [](P2pEngineOptions& o) {
    o.hostname = "127.0.0.1";
    if (o.rank == 1) o.hostId = "host-b";
  });
  for (int64_t n : {4, 100000}) {
    Buf out(DataType::kFloat32, {n}), in(DataType::kFloat32, {n});
    out.stamp(1, n);
    auto recv = std::make_shared<Sink>();
    ASSERT_TRUE(post(0, recvOp(1, 7, in, recv)).isOk());
    auto send = std::make_shared<Sink>();
    ASSERT_TRUE(post(1, sendOp(0, 7, out, send)).isOk());
    EXPECT_TRUE(waitFor(send).isOk()) << waitFor(send).toString();
    EXPECT_TRUE(waitFor(recv).isOk()) << waitFor(recv).toString();
    EXPECT_TRUE(in.stamped(1, n));
  }
  EXPECT_EQ(fatal_[0]->count() + fatal_[1]->count(), 0u);
}

// Someone who finds rank 1's TCP port but not its token from the store (or
// claims to be rank 1 itself) is refused; the real peer still connects.
TEST_F(P2pEngineTest, ConnectionsWithoutTheStoreTokenAreRefused) {
  start(2, [](P2pEngineOptions& o) {
    o.hostname = "127.0.0.1";
    if (o.rank == 1) o.hostId = "host-b";
  });
  Buf in(DataType::kFloat32, {4}), out(DataType::kFloat32, {4});
  out.stamp(0, 3);
  auto recv = std::make_shared<Sink>();
  ASSERT_TRUE(post(1, recvOp(0, 3, in, recv)).isOk());  // rank 1 publishes its endpoint
  auto published = store_->get("p2p/inbox/1", std::chrono::milliseconds(5000));
  ASSERT_TRUE(published.isOk());
  std::istringstream is(published.value());
  std::string name, host, pid, addr, port, token;
  for (std::string* f : {&name, &host, &pid, &addr, &port, &token}) std::getline(is, *f);
  for (int claimed : {0, 1}) {
    P2pHello bad{};
    bad.magic = kP2pHelloMagic;
    bad.rank = claimed;
    std::snprintf(bad.token, sizeof bad.token, "%s",
                  claimed == 0 ? "not-the-token" : token.c_str());
    auto fd = p2pConnect(addr, std::atoi(port.c_str()), bad, 2000);
    ASSERT_TRUE(fd.isOk()) << fd.status().toString();
    // Refused: the engine closes the connection (an end of stream here).
    char byte;
    bool eof = false;
    for (int i = 0; i < 500 && !eof; ++i) {
      auto k = p2pRecv(fd.value(), &byte, 1, &eof);
      if (!k.isOk()) break;
      if (!eof) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(eof) << "a connection claiming rank " << claimed << " was kept";
    p2pClose(fd.value());
  }
  auto send = std::make_shared<Sink>();
  ASSERT_TRUE(post(0, sendOp(1, 3, out, send)).isOk());
  EXPECT_TRUE(waitFor(send).isOk());
  EXPECT_TRUE(waitFor(recv).isOk());
  EXPECT_TRUE(in.stamped(0, 3));
  EXPECT_EQ(fatal_[0]->count() + fatal_[1]->count(), 0u);
}

// HORA_P2P_TRANSPORT=shm and a peer on another host: both sides fail their
// operations with kNotSupported naming the reason; nothing breaks the set.
TEST_F(P2pEngineTest, PeerOnAnotherHostWithSharedMemoryOnlyIsNotSupported) {
  start(2, [](P2pEngineOptions& o) {
    o.transport = "shm";
    if (o.rank == 1) o.hostId = "host-b";
  });
  Buf b(DataType::kFloat32, {4});
  auto recv = std::make_shared<Sink>();
  ASSERT_TRUE(post(1, recvOp(0, 1, b, recv)).isOk());  // rank 1 publishes its endpoint
  auto send = std::make_shared<Sink>();
  ASSERT_TRUE(post(0, sendOp(1, 1, b, send)).isOk());
  Status st = waitFor(send);
  EXPECT_EQ(st.code(), Code::kNotSupported) << st.toString();
  EXPECT_TRUE(contains(st, "different hosts")) << st.toString();
  // Later operations with that peer fail at once with the same reason.
  auto again = std::make_shared<Sink>();
  ASSERT_TRUE(post(0, recvOp(1, 2, b, again)).isOk());
  EXPECT_EQ(waitFor(again).code(), Code::kNotSupported);
  // And so does the receive of rank 1, which never writes to rank 0.
  Status theirs = waitFor(recv);
  EXPECT_EQ(theirs.code(), Code::kNotSupported) << theirs.toString();
  EXPECT_EQ(fatal_[0]->count() + fatal_[1]->count(), 0u);
}

}  // namespace
}  // namespace hora
