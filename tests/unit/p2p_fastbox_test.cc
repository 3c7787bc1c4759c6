// The point-to-point fast box (ops/p2p/p2p_fastbox.cc) with ranks as engine
// objects (tests/unit/p2p_engine_fixture.h). Checked: small messages go
// through the fast box and large ones through the ring, and one tag's
// messages keep their order across the two paths whether the receives come
// first or last, also when more small messages wait unmatched than the box
// has slots; every dtype and the shapes at the box's limits arrive intact
// (and those beyond them through the ring); a mismatch fails both sides and
// leaves the pair usable; HORA_P2P_FAST_BYTES=0 keeps everything on the ring;
// a malformed fast-box message reaches onFatal.
#include <cstring>
#include <sstream>

#include "ops/p2p/p2p_engine.h"
#include "ops/p2p/p2p_inbox.h"
#include "p2p_engine_fixture.h"

namespace hora {
namespace {

class P2pFastBoxTest : public P2pEngineTest {
 protected:
  // One message each way, so both engines have mapped each other's inbox
  // (a first send goes through the ring while its connection is made).
  void connect() {
    for (int from = 0; from < 2; ++from) {
      Buf out(DataType::kUint8, {1}), in(DataType::kUint8, {1});
      auto s = std::make_shared<Sink>(), r = std::make_shared<Sink>();
      ASSERT_TRUE(post(1 - from, recvOp(from, 999, in, r)).isOk());
      ASSERT_TRUE(post(from, sendOp(1 - from, 999, out, s)).isOk());
      ASSERT_TRUE(waitFor(r).isOk());
      ASSERT_TRUE(waitFor(s).isOk());
    }
  }
};

// Messages of one tag whose sizes alternate between the fast box (<= 32
// bytes) and the ring (eager and large), received without buffers so that
// each receive shows which message it got.
TEST_F(P2pFastBoxTest, OneTagKeepsItsOrderAcrossTheFastBoxAndTheRing) {
  start(2);
  connect();
  const std::vector<int64_t> sizes = {1, 8, 9000, 4, 33, 32, 2000, 0, 16, 9000, 8, 8};
  for (int recvFirst = 0; recvFirst < 2; ++recvFirst) {
    const uint64_t fastBefore = rank(0).fastSends();
    std::vector<std::unique_ptr<Buf>> out;
    std::vector<std::shared_ptr<Sink>> sends, recvs;
    auto postRecvs = [&] {
      for (size_t i = 0; i < sizes.size(); ++i) {
        recvs.push_back(std::make_shared<Sink>());
        ASSERT_TRUE(post(1, recvAnyShape(0, 3, recvs.back())).isOk());
      }
    };
    if (recvFirst) postRecvs();
    for (size_t i = 0; i < sizes.size(); ++i) {
      out.push_back(std::make_unique<Buf>(DataType::kUint8, std::vector<int64_t>{sizes[i]}));
      out.back()->stamp(0, static_cast<int64_t>(i));
      sends.push_back(std::make_shared<Sink>());
      ASSERT_TRUE(post(0, sendOp(1, 3, *out.back(), sends.back())).isOk());
    }
    if (!recvFirst) {
      std::this_thread::sleep_for(30ms);  // let them arrive unmatched
      postRecvs();
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      Status st = waitFor(recvs[i]);
      ASSERT_TRUE(st.isOk()) << st.toString();
      ASSERT_EQ(recvs[i]->shape(), std::vector<int64_t>{sizes[i]}) << "receive " << i;
      EXPECT_EQ(recvs[i]->output<char>(), out[i]->bytes)
          << "recvFirst " << recvFirst << ": receive " << i << " holds another message";
    }
    for (auto& s : sends) EXPECT_TRUE(waitFor(s).isOk()) << s->status().toString();
    // Every small message after a ring message waits for the ring to empty
    // (sends go to the fast box only when nothing is queued for the peer),
    // so count only that some went through it.
    EXPECT_GT(rank(0).fastSends(), fastBefore) << "recvFirst " << recvFirst;
  }
}

// More small messages unmatched than the fast box has slots: the rest go
// through the ring, all arrive in order once the receives are posted.
TEST_F(P2pFastBoxTest, MoreUnmatchedSmallMessagesThanSlotsOverflowToTheRing) {
  start(2);
  connect();
  const int n = 3 * static_cast<int>(kP2pFastSlots);
  const uint64_t fastBefore = rank(0).fastSends();
  std::vector<std::unique_ptr<Buf>> out, in;
  std::vector<std::shared_ptr<Sink>> sends, recvs;
  for (int i = 0; i < n; ++i) {
    out.push_back(std::make_unique<Buf>(DataType::kInt32, std::vector<int64_t>{2}));
    out.back()->stamp(0, i);
    sends.push_back(std::make_shared<Sink>());
    ASSERT_TRUE(post(0, sendOp(1, 4, *out.back(), sends.back())).isOk());
  }
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(rank(0).fastSends() - fastBefore, kP2pFastSlots)
      << "the fast box should hold exactly its slots' worth of unmatched messages";
  for (int i = 0; i < n; ++i) {
    in.push_back(std::make_unique<Buf>(DataType::kInt32, std::vector<int64_t>{2}));
    recvs.push_back(std::make_shared<Sink>());
    ASSERT_TRUE(post(1, recvOp(0, 4, *in.back(), recvs.back())).isOk());
  }
  for (int i = 0; i < n; ++i) {
    Status st = waitFor(recvs[i]);
    ASSERT_TRUE(st.isOk()) << st.toString();
    EXPECT_TRUE(in[i]->stamped(0, i)) << "receive " << i;
  }
  for (auto& s : sends) EXPECT_TRUE(waitFor(s).isOk()) << s->status().toString();
}

// Every dtype, and shapes at and beyond the box's limits (4 dimensions of
// at most 65535, 32 bytes); receives with and without buffers.
TEST_F(P2pFastBoxTest, CarriesEveryDtypeAndTheShapesAtItsLimits) {
  start(2);
  connect();
  struct Case {
    DataType dt;
    std::vector<int64_t> shape;
    bool fast;
  };
  std::vector<Case> cases;
  for (int d = 0; d <= static_cast<int>(DataType::kBool); ++d) {
    const auto dt = static_cast<DataType>(d);
    cases.push_back({dt, {}, true});                                             // a scalar
    cases.push_back({dt, {static_cast<int64_t>(32 / dataTypeSize(dt))}, true});  // 32 bytes
    cases.push_back({dt, {static_cast<int64_t>(32 / dataTypeSize(dt)) + 1}, false});
  }
  cases.push_back({DataType::kFloat32, {1, 2, 1, 2}, true});      // 4 dimensions
  cases.push_back({DataType::kFloat32, {1, 2, 1, 2, 1}, false});  // 5
  cases.push_back({DataType::kFloat32, {0, 65535}, true});
  cases.push_back({DataType::kFloat32, {0, 65536}, false});  // a dimension too large
  cases.push_back({DataType::kUint8, {0}, true});
  int64_t id = 0;
  for (const Case& c : cases) {
    for (int withBuffer = 0; withBuffer < 2; ++withBuffer, ++id) {
      const uint64_t fastBefore = rank(0).fastSends();
      Buf out(c.dt, c.shape), in(c.dt, c.shape, 0x5a);
      out.stamp(0, id);
      auto s = std::make_shared<Sink>(), r = std::make_shared<Sink>();
      ASSERT_TRUE(post(1, withBuffer ? recvOp(0, 6, in, r) : recvAnyShape(0, 6, r)).isOk());
      ASSERT_TRUE(post(0, sendOp(1, 6, out, s)).isOk());
      const std::string what = describeTensor(c.dt, c.shape) + (withBuffer ? "" : ", allocated");
      Status st = waitFor(r);
      ASSERT_TRUE(st.isOk()) << what << ": " << st.toString();
      ASSERT_TRUE(waitFor(s).isOk()) << what;
      if (withBuffer) {
        EXPECT_TRUE(in.stamped(0, id)) << what;
      } else {
        EXPECT_EQ(r->shape(), c.shape) << what;
        EXPECT_EQ(r->dtype(), c.dt) << what;
        EXPECT_EQ(r->output<char>(), out.bytes) << what;
      }
      EXPECT_EQ(rank(0).fastSends() - fastBefore, c.fast ? 1u : 0u) << what;
    }
  }
}

TEST_F(P2pFastBoxTest, MismatchFailsBothSidesAndThePairGoesOn) {
  start(2);
  connect();
  const uint64_t fastBefore = rank(0).fastSends();
  Buf out(DataType::kFloat32, {2}), in(DataType::kInt32, {2}, 0x11);
  auto s = std::make_shared<Sink>(), r = std::make_shared<Sink>();
  ASSERT_TRUE(post(1, recvOp(0, 8, in, r)).isOk());
  ASSERT_TRUE(post(0, sendOp(1, 8, out, s)).isOk());
  Status rs = waitFor(r), ss = waitFor(s);
  EXPECT_EQ(rs.code(), Code::kMismatch) << rs.toString();
  EXPECT_EQ(ss.code(), Code::kMismatch) << ss.toString();
  EXPECT_TRUE(contains(ss, "expected int32[2]")) << ss.toString();
  EXPECT_TRUE(in.all(0x11)) << "a rejected message wrote into the receive buffer";
  EXPECT_EQ(rank(0).fastSends() - fastBefore, 1u);
  // The slot the rejected message held is free again: a box's worth more.
  for (uint32_t i = 0; i <= kP2pFastSlots; ++i) {
    Buf o(DataType::kInt32, {2}), x(DataType::kInt32, {2});
    o.stamp(0, i);
    auto s2 = std::make_shared<Sink>(), r2 = std::make_shared<Sink>();
    ASSERT_TRUE(post(1, recvOp(0, 8, x, r2)).isOk());
    ASSERT_TRUE(post(0, sendOp(1, 8, o, s2)).isOk());
    ASSERT_TRUE(waitFor(r2).isOk());
    ASSERT_TRUE(waitFor(s2).isOk());
    EXPECT_TRUE(x.stamped(0, i));
  }
  EXPECT_EQ(rank(0).fastSends() - fastBefore, 2u + kP2pFastSlots);
}

TEST_F(P2pFastBoxTest, FastBytesZeroKeepsEverythingOnTheRing) {
  start(2, [](P2pEngineOptions& o) { o.fastBytes = 0; });
  connect();
  for (int i = 0; i < 4; ++i) {
    Buf out(DataType::kInt64, {1}), in(DataType::kInt64, {1});
    out.stamp(0, i);
    auto s = std::make_shared<Sink>(), r = std::make_shared<Sink>();
    ASSERT_TRUE(post(1, recvOp(0, 1, in, r)).isOk());
    ASSERT_TRUE(post(0, sendOp(1, 1, out, s)).isOk());
    ASSERT_TRUE(waitFor(r).isOk());
    ASSERT_TRUE(waitFor(s).isOk());
    EXPECT_TRUE(in.stamped(0, i));
  }
  EXPECT_EQ(rank(0).fastSends(), 0u);
}

// A slot whose header does not add up (5 bytes for one float32), written
// into rank 1's inbox as rank 0 would: onFatal, and the waiting receive
// fails with the protocol error.
TEST_F(P2pFastBoxTest, MalformedFastBoxMessageIsFatal) {
  start(2);
  Buf b(DataType::kFloat32, {1});
  auto recv = std::make_shared<Sink>();
  ASSERT_TRUE(post(1, recvOp(0, 1, b, recv)).isOk());
  auto published = store_->get("p2p/inbox/1", std::chrono::milliseconds(5000));
  ASSERT_TRUE(published.isOk()) << published.status().toString();
  std::istringstream is(published.value());
  std::string name;
  std::getline(is, name);
  auto inbox = P2pInbox::open(dir_, name);
  ASSERT_TRUE(inbox.isOk()) << inbox.status().toString();
  P2pFastSlot& slot = inbox.value()->fast(0).slots[0];
  slot.seqLow = 0;
  slot.tag = 1;
  slot.dtype = static_cast<uint8_t>(DataType::kFloat32);
  slot.ndim = 1;
  slot.dims[0] = 1;
  slot.bytes = 5;
  slot.stamp.store(1, std::memory_order_release);
  inbox.value()->ring();
  ASSERT_TRUE(fatal_[1]->wait());
  Status why = fatal_[1]->first();
  EXPECT_EQ(why.code(), Code::kProtocolError) << why.toString();
  EXPECT_TRUE(contains(why, "malformed point-to-point fast-box message from rank 0 to rank 1"))
      << why.toString();
  EXPECT_EQ(waitFor(recv).code(), Code::kProtocolError);
}

}  // namespace
}  // namespace hora
