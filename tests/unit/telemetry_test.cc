// Telemetry (core/telemetry.h) alone, with entries and groups built by hand:
// counters, the flight recorder ring (wrap, states, overwritten records left
// alone), the straggler window, the exports; and the coordinator's
// cross-rank hang report.
#include "core/telemetry.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <sstream>

#include "controllers/coordinator.h"

namespace hora {
namespace {

class NullSink : public RequestSink {
 public:
  Result<void*> allocateOutput(const std::vector<int64_t>&, DataType, const Device&,
                               DeviceMemory*) override {
    return Status(Code::kInternal, "unused");
  }
  void setReceivedSplits(std::vector<int64_t>) override {}
  void setLastJoinedRank(int32_t) override {}
  void completeEntry(const Status&) override {}
};

EntryPtr entry(const std::string& name, int64_t elems) {
  auto e = std::make_shared<TensorEntry>();
  e->request.name = name;
  e->request.kind = CollectiveKind::kAllreduce;
  e->request.dtype = DataType::kFloat32;
  e->request.shape = {elems};
  e->sink = std::make_shared<NullSink>();
  return e;
}

AgreedGroup group(std::vector<EntryPtr> es) {
  AgreedGroup g;
  for (auto& e : es) {
    Response r;
    r.kind = ResponseKind::kAllreduce;
    r.name = e->request.name;
    r.shape = e->request.shape;
    g.responses.push_back(r);
    g.entries.push_back(e);
  }
  return g;
}

TelemetryOptions opts(size_t entries) {
  TelemetryOptions o;
  o.globalRanks = {0, 1, 2};
  o.flightEntries = entries;
  o.stragglerWindow = 4;
  o.host = "test";
  return o;
}

TEST(Telemetry, CountsOneFusedGroupExactly) {
  Telemetry t(opts(16));
  auto a = entry("a", 10), b = entry("b", 6);
  t.submitted(*a);
  t.submitted(*b);
  t.sent(*a, false);
  t.sent(*b, true);
  AgreedGroup g = group({a, b});
  t.agreed(g);
  t.started(g);
  t.finished(g, Status::ok(), "shm+gloo", false);
  const MetricsSnapshot m = t.snapshot();
  EXPECT_EQ(m.ops[0], 2u);
  EXPECT_EQ(m.bytes[0], 64u);
  EXPECT_EQ(m.groups, 1u);
  EXPECT_EQ(m.groupTensors, 2u);
  EXPECT_EQ(m.fusedGroups, 1u);
  EXPECT_EQ(m.cacheHits, 1u);
  EXPECT_EQ(m.cacheMisses, 1u);
  EXPECT_EQ(m.cpuGroups, 1u);
  EXPECT_EQ(m.inFlight, 0u);
  EXPECT_EQ(m.errors, 0u);
  const std::string text = t.flightText("test");
  EXPECT_NE(text.find("done\tallreduce\ta\tfloat32\t40\t-\t2\tshm+gloo"), std::string::npos)
      << text;
  EXPECT_NE(text.find("done\tallreduce\tb\tfloat32\t24\thit\t2\tshm+gloo"), std::string::npos)
      << text;
}

TEST(Telemetry, RingKeepsTheLastEntriesAndLeavesOverwrittenRecordsAlone) {
  Telemetry t(opts(4));
  std::vector<EntryPtr> es;
  for (int i = 0; i < 10; ++i) {
    es.push_back(entry("t" + std::to_string(i), 1));
    t.submitted(*es.back());
  }
  // t0's record was overwritten by t8: finishing t0 must not touch it.
  AgreedGroup g = group({es[0]});
  t.agreed(g);
  t.started(g);
  t.finished(g, Status(Code::kTimeout, "x"), "gloo", false);
  const std::string text = t.flightText("wrap");
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(text.find("\tt" + std::to_string(i) + "\t"), std::string::npos) << i << text;
  for (int i = 6; i < 10; ++i)
    EXPECT_NE(text.find("submitted\tallreduce\tt" + std::to_string(i) + "\t"), std::string::npos)
        << i << text;
  EXPECT_NE(text.find("not finished: 4"), std::string::npos) << text;
  EXPECT_EQ(t.snapshot().errors, 1u);
}

TEST(Telemetry, AnInlineEntryWhoseOutputWasRefusedIsRecordedFailed) {
  Telemetry t(opts(16));
  auto a = entry("a", 2), b = entry("b", 2);
  t.submitted(*a);
  t.submitted(*b);
  AgreedGroup g = group({a, b});
  for (auto& r : g.responses) r.inlineResult = std::string(8, '\0');
  t.agreed(g);
  const std::vector<Status> outcomes = {Status::ok(), Status(Code::kSystemError, "no memory")};
  t.inlineDone(g, &outcomes);
  const std::string text = t.flightText("x");
  EXPECT_NE(text.find("done\tallreduce\ta\t"), std::string::npos) << text;
  EXPECT_NE(text.find("failed\tallreduce\tb\t"), std::string::npos) << text;
  EXPECT_EQ(t.snapshot().errors, 1u);
  EXPECT_EQ(t.snapshot().inlineCollectives, 2u);
}

TEST(Telemetry, OffRecorderStillCounts) {
  Telemetry t(opts(0));
  auto a = entry("a", 4);
  t.submitted(*a);
  AgreedGroup g = group({a});
  t.agreed(g);
  t.started(g);
  t.finished(g, Status::ok(), "gloo", false);
  EXPECT_EQ(t.snapshot().ops[0], 1u);
  EXPECT_FALSE(t.dumpFlight("x").isOk());
}

TEST(Telemetry, PointToPointCountsByDirectionAndTheEngineReportJoinsTheDump) {
  Telemetry t(opts(4));
  t.p2pDone(true, 1, 5, 64, 0, Status::ok());
  t.p2pDone(true, 1, 6, 32, 0, Status::ok());
  t.p2pDone(false, 1, 5, 128, 0, Status::ok());
  t.p2pDone(false, 1, 7, 512, 0, Status(Code::kRemoteError, "rank 1 exited"));
  MetricsSnapshot m = t.snapshot();
  EXPECT_EQ(m.p2pSends, 2u);
  EXPECT_EQ(m.p2pRecvs, 2u);
  EXPECT_EQ(m.p2pBytes, 224u) << "a failed operation moved nothing";
  EXPECT_EQ(m.p2pErrors, 1u);
  EXPECT_NE(metricsJson(m).find("\"p2p\":{\"sends\":2,\"recvs\":2,\"bytes\":224,\"errors\":1}"),
            std::string::npos)
      << metricsJson(m);
  EXPECT_NE(metricsSummaryLine(m).find("p2p 2 sends, 2 recvs"), std::string::npos)
      << metricsSummaryLine(m);
  EXPECT_EQ(t.flightText("x").find("point-to-point"), std::string::npos);
  t.setP2pReport([] { return std::string("point-to-point operations not finished: 1\n  recv\n"); });
  EXPECT_NE(t.flightText("x").find("point-to-point operations not finished: 1"), std::string::npos);
}

TEST(Telemetry, StragglerWindowRanksByWaitingCaused) {
  Telemetry t(opts(0));
  // Window of 4: the first two arrivals fall out.
  t.lastArrival(1, std::chrono::milliseconds(500), "x");
  t.lastArrival(1, std::chrono::milliseconds(500), "x");
  t.lastArrival(2, std::chrono::milliseconds(20), "x");
  t.lastArrival(0, std::chrono::milliseconds(1), "x");
  t.lastArrival(2, std::chrono::milliseconds(20), "x");
  t.lastArrival(2, std::chrono::milliseconds(20), "x");
  const MetricsSnapshot m = t.snapshot();
  ASSERT_EQ(m.stragglers.size(), 2u);
  EXPECT_EQ(m.stragglers[0].rank, 2);
  EXPECT_EQ(m.stragglers[0].last, 3u);
  EXPECT_NEAR(m.stragglers[0].waitMs, 60, 1e-6);
  EXPECT_NEAR(m.stragglers[0].share, 60.0 / 61.0, 1e-6);
  EXPECT_EQ(m.stragglerSamples, 6u);
  EXPECT_NE(metricsSummaryLine(m).find("slowest rank 2"), std::string::npos)
      << metricsSummaryLine(m);
  EXPECT_NE(metricsJson(m).find("\"stragglers\":[{\"rank\":2,\"last\":3,"), std::string::npos);
  EXPECT_NE(metricsPrometheus(m).find("hora_straggler_wait_ms{set=\"global\",rank=\"2\"} 60"),
            std::string::npos)
      << metricsPrometheus(m);
}

TEST(Telemetry, UnwritableFolderIsAClearError) {
  TelemetryOptions o = opts(4);
  o.dumpDir = "/proc/hora-no";
  Telemetry t(o);
  auto r = t.dumpFlight("x");
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("/proc/hora-no"), std::string::npos);
  EXPECT_NE(r.status().message().find("HORA_FLIGHT_RECORDER_DIR"), std::string::npos);
}

TEST(CoordinatorHangReport, NamesWhoWaitsAndWhoNeverSubmitted) {
  CoordinatorOptions o;
  o.size = 3;
  o.globalRanks = {0, 1, 2};
  Coordinator c(o, nullptr, Logger());
  const auto t0 = Clock::now();
  EXPECT_EQ(c.hangReport(t0), "");
  RequestList l;
  Request r;
  r.kind = CollectiveKind::kAllreduce;
  r.name = "grad.w";
  r.shape = {4};
  l.requests.push_back(r);
  std::vector<CacheHit> nacks;
  ASSERT_TRUE(c.onRequests(0, l, t0, &nacks).isOk());
  ASSERT_TRUE(c.onRequests(1, l, t0, &nacks).isOk());
  const std::string rep = c.hangReport(t0 + std::chrono::seconds(7));
  EXPECT_NE(rep.find("rank 0: stuck waiting in allreduce \"grad.w\""), std::string::npos) << rep;
  EXPECT_NE(rep.find("rank 2: never submitted allreduce \"grad.w\" (others waiting 7.0 s)"),
            std::string::npos)
      << rep;
  EXPECT_NE(rep.find("submitted by ranks 0,1; missing on ranks 2"), std::string::npos) << rep;
  EXPECT_NE(rep.find("Likely cause: ranks 2 never submitted \"grad.w\""), std::string::npos) << rep;
}

TEST(CoordinatorHangReport, TheLastArrivalFeedsTheStragglerRanking) {
  Telemetry t(opts(0));
  CoordinatorOptions o;
  o.size = 3;
  o.globalRanks = {0, 1, 2};
  o.telemetry = &t;
  Coordinator c(o, nullptr, Logger());
  RequestList l;
  Request r;
  r.kind = CollectiveKind::kAllreduce;
  r.name = "x";
  r.shape = {1};
  l.requests.push_back(r);
  std::vector<CacheHit> nacks;
  const auto t0 = Clock::now();
  ASSERT_TRUE(c.onRequests(1, l, t0, &nacks).isOk());
  ASSERT_TRUE(c.onRequests(0, l, t0 + std::chrono::milliseconds(2), &nacks).isOk());
  ASSERT_TRUE(c.onRequests(2, l, t0 + std::chrono::milliseconds(30), &nacks).isOk());
  const MetricsSnapshot m = t.snapshot();
  ASSERT_EQ(m.stragglers.size(), 1u);
  EXPECT_EQ(m.stragglers[0].rank, 2);
  EXPECT_NEAR(m.stragglers[0].waitMs, 30, 1e-6);
}

}  // namespace
}  // namespace hora

namespace hora {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Rank 1 starts (and has events) before rank 0 created the file: nothing of
// rank 1 goes out until rank 0's "[" is there, so the file always opens with it.
TEST(Timeline, OtherRanksWaitForRankZerosOpeningBracket) {
  char dir[] = "/tmp/hora-tl-unit-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/t.json";
  TimelineOptions o1;
  o1.rank = 1;
  Timeline r1(o1);
  ASSERT_TRUE(r1.start(path, false).isOk());
  r1.record(TimelineLane::kDataPlane, "early", "allreduce", 1000, 2000);
  r1.flush();
  EXPECT_EQ(slurp(path), "");
  TimelineOptions o0;
  o0.rank = 0;
  Timeline r0(o0);
  ASSERT_TRUE(r0.start(path, true).isOk());
  r1.flush();
  r0.record(TimelineLane::kMarkers, "cycle", "cycle", 1500, 0);
  r0.flush();
  const std::string text = slurp(path);
  EXPECT_EQ(text.rfind("[\n", 0), 0u) << text;
  EXPECT_NE(text.find("\"name\":\"early\",\"cat\":\"allreduce\",\"ph\":\"X\""), std::string::npos)
      << text;
  EXPECT_NE(text.find("\"ph\":\"i\""), std::string::npos) << text;
  // A second start is refused naming the file; stop twice says so.
  Status again = r0.start(path, false);
  EXPECT_EQ(again.code(), Code::kInvalidUsage);
  EXPECT_NE(again.message().find(path), std::string::npos);
  EXPECT_TRUE(r0.stop());
  EXPECT_FALSE(r0.stop());
  EXPECT_FALSE(r0.start("/proc/nope/t.json", false).isOk());
}

// Past HORA_TIMELINE_MAX_MB nothing more is written but one note.
TEST(Timeline, SizeLimitDropsWithOneNote) {
  char dir[] = "/tmp/hora-tl-unit-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/t.json";
  TimelineOptions o;
  o.maxBytes = 2000;
  Timeline t(o);
  ASSERT_TRUE(t.start(path, false).isOk());
  for (int round = 0; round < 5; ++round) {
    for (int i = 0; i < 50; ++i)
      t.record(TimelineLane::kDataPlane, "t" + std::to_string(i), "allreduce", 1000, 2000);
    t.flush();
  }
  const std::string text = slurp(path);
  EXPECT_LT(text.size(), 2000u + 16000u);
  size_t notes = 0;
  for (size_t at = text.find("events dropped"); at != std::string::npos;
       at = text.find("events dropped", at + 1))
    ++notes;
  EXPECT_EQ(notes, 1u) << text;
  EXPECT_NE(text.find("HORA_TIMELINE_MAX_MB reached"), std::string::npos);
}

}  // namespace
}  // namespace hora
