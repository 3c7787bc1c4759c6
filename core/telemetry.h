// Telemetry: a process set's always-on metrics and flight recorder, and the
// straggler ranking its coordinator keeps. One per process set, owned by the
// set's assembly; every thread of the set reports into it:
//  - framework threads: submitted() when a request's entries are enqueued;
//  - the control thread: sent() (cache hit or full request), agreed() when a
//    group every rank agreed to is claimed, inlineDone() for barrier, join,
//    error and inline groups it completes itself (the executor
//    calls it for those queued behind work); on set rank 0, lastArrival() from the
//    coordinator (who submitted a tensor last, and how long the others waited);
//  - the executor thread: started() and finished() around each group;
//  - any thread: snapshot(), flightText(), dumpFlight(); metricsJson() and
//    metricsPrometheus() format a snapshot.
//
// Cost: counters are relaxed atomics; the flight recorder is a fixed ring of
// HORA_FLIGHT_RECORDER_ENTRIES records under one mutex, touched at each stage
// of a tensor (submit, send, agree, start, end), never resized. A tensor's record is found
// again through TensorEntry::trace.seq; a record the ring has overwritten since
// is simply not updated.
//
// Why the straggler ranking lives here and not in the Coordinator: the
// coordinator only sees arrivals; the ranking is a sliding window of them that
// every reader (the C ABI, the periodic log line, the Prometheus file) shares.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/agreed_group.h"
#include "core/clock.h"
#include "core/status.h"
#include "core/timeline.h"
#include "core/types.h"

namespace hora {

struct TelemetryOptions {
  std::string setName = "global";
  int setRank = 0;
  std::vector<int> globalRanks;  // set rank -> global rank
  size_t flightEntries = 1024;   // 0: no flight recorder
  size_t stragglerWindow = 256;  // tensors the ranking looks back over
  std::string dumpDir;           // where dumpFlight() writes
  std::string host;
  // The runtime's timeline (shared by its sets); null: none.
  std::shared_ptr<Timeline> timeline;
};

enum class FlightState : uint8_t { kSubmitted, kSent, kAgreed, kRunning, kDone, kFailed };
const char* flightStateName(FlightState s);

// One collective as this rank saw it. Times are Clock nanoseconds; 0 = not yet.
struct FlightRecord {
  uint64_t seq = 0;  // 0: empty slot
  std::string name;
  CollectiveKind kind = CollectiveKind::kAllreduce;
  DataType dtype = DataType::kFloat32;
  int64_t bytes = 0;
  FlightState state = FlightState::kSubmitted;
  bool cacheHit = false;
  int32_t groupSize = 0;  // tensors in the group it ran in
  int32_t code = 0;       // hora::Code when it ended
  std::string plane;      // data plane it ran on
  int64_t submitNs = 0, agreedNs = 0, startNs = 0, endNs = 0;
};

struct StragglerScore {
  int rank = -1;      // global rank
  uint64_t last = 0;  // tensors of the window it submitted last
  double waitMs = 0;  // the others' waiting for it, summed over the window
  double share = 0;   // waitMs / the window's total wait
};

// Autotune as one rank sees it (core/autotune.h).
struct AutotuneMetrics {
  bool enabled = false;
  TuningValues values;   // the values in force on this rank (applied by its executor)
  uint64_t changes = 0;  // value sets applied on this rank
  // A hash of the sequence of value sets applied: equal on every rank of a
  // set once they have run the same collectives.
  uint64_t digest = 0;
  // Set rank 0 only (the tuner runs there).
  bool tuner = false;
  bool settled = false;
  uint64_t windows = 0, searches = 0;
  double bestCost = 0;  // the incumbent's cost, in `unit`
  std::string unit;
};

struct MetricsSnapshot {
  std::string setName;
  int rank = 0;  // global
  int setSize = 0;
  double uptimeS = 0;
  uint64_t ops[static_cast<int>(CollectiveKind::kCount)] = {};
  uint64_t bytes[static_cast<int>(CollectiveKind::kCount)] = {};
  uint64_t groups = 0;        // groups run on the data plane
  uint64_t groupTensors = 0;  // tensors in them
  uint64_t fusedGroups = 0;   // groups of two or more tensors
  uint64_t groupBytes = 0;
  // Allreduces the coordinator reduced inside the negotiation (no data plane).
  uint64_t inlineAllreduces = 0;
  // Collectives of every kind (allreduces included) combined there.
  uint64_t inlineCollectives = 0;
  // Of `groups`, those the control thread ran itself (HORA_RUN_ON_CONTROL_MAX_BYTES).
  uint64_t controlGroups = 0;
  uint64_t callerGroups = 0;
  // Allreduces packed ahead of their negotiation's answer (HORA_PACK_AHEAD),
  // and of those, the ones whose data plane used that instead of packing.
  uint64_t packedAhead = 0;
  uint64_t packedAheadUsed = 0;
  // Peers' packs ahead an allreduce read without waiting for them (one per
  // peer and allreduce).
  uint64_t peerPacksRead = 0;
  // Times a framework thread in hora_wait was moved back to its rank's CPU
  // (HORA_HOME_CALLER).
  uint64_t callerHomings = 0;
  uint64_t cacheHits = 0, cacheMisses = 0;  // cacheable kinds only
  uint64_t errors = 0;
  uint64_t negotiationNs = 0;  // submit -> agreed, summed over tensors
  uint64_t queueNs = 0;        // agreed -> data plane start, summed over groups
  uint64_t dataPlaneNs = 0;    // data plane, summed over groups
  uint64_t cpuGroups = 0, gpuGroups = 0;
  uint64_t inFlight = 0;  // submitted, not yet finished
  // Point-to-point operations completed (failed ones in p2pErrors too), and
  // the bytes they moved.
  uint64_t p2pSends = 0, p2pRecvs = 0, p2pBytes = 0, p2pErrors = 0;
  // Set rank 0 only (the coordinator sees arrivals): ranked by waitMs.
  uint64_t stragglerSamples = 0;
  std::vector<StragglerScore> stragglers;
  AutotuneMetrics autotune;
};

class Telemetry {
 public:
  explicit Telemetry(TelemetryOptions options);

  const TelemetryOptions& options() const { return opts_; }

  // Framework thread, under the set's table lock (so seq order is submit order).
  void submitted(TensorEntry& e);
  // Control thread: sent as a cache hit or in full.
  void sent(TensorEntry& e, bool cacheHit);
  // Control thread: a group every rank agreed to, entries claimed.
  void agreed(const AgreedGroup& g);
  // Control or executor thread: a barrier/join/error/inline group
  // completed without the data plane. `outcomes` (one per entry, or null:
  // every one ok): an inline output the caller's allocator refused fails
  // its entry only, and is recorded so.
  void inlineDone(const AgreedGroup& g, const std::vector<Status>* outcomes = nullptr);
  // Any thread: an entry failed before every rank agreed to it (set broken,
  // shut down, refused locally).
  void abandoned(const TensorEntry& e, const Status& why);
  // Control thread: the group it is about to run on the data plane itself
  // (SetController's small groups), not handed to the executor.
  void ranOnControl();
  // Of those, a group a framework thread ran while it drove the set
  // (HORA_CALLER_DRIVES), in the control thread's stead.
  void ranByCaller();
  // Control thread: it packed an allreduce's first chunk ahead of the
  // negotiation's answer (HORA_PACK_AHEAD).
  void packedAhead();
  // Executor thread (or control thread): an allreduce published what was
  // packed ahead for it instead of packing it again.
  void packedAheadUsed();
  // Executor thread (or control thread): an allreduce read `n` peers' packs
  // ahead without waiting for them to pack.
  void peerPacksRead(uint64_t n);
  // Framework thread in hora_wait: it was moved back to its rank's CPU
  // (HORA_HOME_CALLER).
  void callerHomed();
  // Executor thread (or the control thread, for the groups above), around one
  // group on the data plane.
  // `plane`: the data plane it ran on (known once it ran: the GPU path picks
  // NCCL or staging at its first group).
  void started(const AgreedGroup& g);
  // packNs/unpackNs: time spent copying into and out of the data plane's
  // memory, summed over ranges (the backends interleave it with the network);
  // negative = not measured.
  void finished(const AgreedGroup& g, const Status& s, const std::string& plane, bool gpu,
                int64_t packNs = -1, int64_t unpackNs = -1);
  // Coordinator (set rank 0's control thread): `setRank` completed a tensor
  // the others had been waiting for since `waited` ago.
  void lastArrival(int setRank, Clock::duration waited, const std::string& tensor);
  // Control thread: a response list was applied (a timeline cycle marker).
  void cycle();
  // Coordinator: a stall warning (a timeline marker carrying its text).
  void stall(const std::string& warning);
  // Point-to-point (ops/p2p's engine, on whichever thread completes the
  // operation): counted in the metrics, and with the timeline recording a
  // span from post to completion on its own lane. `peer`: the global rank;
  // `postedNs`: Clock nanoseconds at post, 0 when not taken (the engine
  // reads the clock only while the timeline records: p2pTimed()).
  void p2pDone(bool send, int peer, int64_t tag, int64_t bytes, int64_t postedNs, const Status& s);
  bool p2pTimed() const { return timelineOn() != nullptr; }
  // What the point-to-point engine has pending, appended to every flight
  // dump (sends and receives do not pass the ring: they are matched by the
  // peers, not negotiated). Set once by the assembly, before any thread
  // may dump; the report runs on the dumping thread.
  void setP2pReport(std::function<std::string()> report) { p2pReport_ = std::move(report); }
  // Control thread tick: writes the timeline's buffered events.
  void flushTimeline();
  // Autotune: whether it runs and the configured values (assembly); values
  // applied by this rank's executor (executor thread); the tuner's progress
  // (set rank 0's control thread).
  void autotuneStart(bool enabled, const TuningValues& configured);
  void tuned(const TuningValues& values);
  void autotuneProgress(bool settled, uint64_t windows, uint64_t searches, double bestCost,
                        const std::string& unit);

  MetricsSnapshot snapshot() const;
  // Submitted and not yet finished on this rank.
  uint64_t inFlight() const;
  // The ring, oldest first, as a table a person reads without any tool.
  std::string flightText(const std::string& reason) const;
  // Writes flightText() to <dumpDir>/hora-flight-<set>-rank<R>-pid<P>-<n>.txt
  // (n counts this set's dumps: a failure never hides the stall before it);
  // returns the path.
  Result<std::string> dumpFlight(const std::string& reason) const;
  // Writes `text` to <dumpDir>/hora-<stem>-<set>-rank<R>-pid<P>-<n>.txt; returns the path.
  Result<std::string> dumpText(const std::string& stem, const std::string& text) const;
  // Rewrites <dir>/hora-<set>-rank<R>.prom (for a node exporter's textfile
  // collector) with `text`, atomically; returns the path.
  Result<std::string> dumpPrometheus(const std::string& dir, const std::string& text) const;

 private:
  void record(const TensorEntry& e, FlightState s, int64_t ns, int32_t groupSize = 0,
              const std::string* plane = nullptr, int32_t code = 0);
  Timeline* timelineOn() const;  // the timeline if it records now
  static std::string groupLabel(const AgreedGroup& g);
  int myGlobal() const { return opts_.globalRanks.empty() ? 0 : opts_.globalRanks[opts_.setRank]; }

  const TelemetryOptions opts_;
  const Clock::time_point born_;

  std::atomic<uint64_t> ops_[static_cast<int>(CollectiveKind::kCount)] = {};
  std::atomic<uint64_t> bytes_[static_cast<int>(CollectiveKind::kCount)] = {};
  std::atomic<uint64_t> groups_{0}, groupTensors_{0}, fusedGroups_{0}, groupBytes_{0};
  std::atomic<uint64_t> inlineAllreduces_{0};
  std::atomic<uint64_t> inlineCollectives_{0};
  std::atomic<uint64_t> controlGroups_{0};
  std::atomic<uint64_t> callerGroups_{0};
  std::atomic<uint64_t> packedAhead_{0};
  std::atomic<uint64_t> packedAheadUsed_{0};
  std::atomic<uint64_t> peerPacksRead_{0};
  std::atomic<uint64_t> callerHomings_{0};
  std::atomic<uint64_t> cacheHits_{0}, cacheMisses_{0}, errors_{0};
  std::atomic<uint64_t> negotiationNs_{0}, queueNs_{0}, dataPlaneNs_{0};
  std::atomic<uint64_t> cpuGroups_{0}, gpuGroups_{0};
  std::atomic<uint64_t> submittedCount_{0}, finishedCount_{0};
  std::atomic<uint64_t> p2pSends_{0}, p2pRecvs_{0}, p2pBytes_{0}, p2pErrors_{0};
  std::function<std::string()> p2pReport_;
  mutable std::atomic<uint64_t> dumps_{0};

  mutable std::mutex ringMu_;  // guards ring_, nextSeq_
  std::vector<FlightRecord> ring_;
  uint64_t nextSeq_ = 1;

  mutable std::mutex stragglerMu_;  // guards arrivals_, stragglerSamples_
  struct Arrival {
    int rank;
    int64_t waitNs;
  };
  std::deque<Arrival> arrivals_;
  uint64_t stragglerSamples_ = 0;

  mutable std::mutex autotuneMu_;  // guards autotune_
  AutotuneMetrics autotune_;
};

// The snapshot as one JSON object (hora_metrics_snapshot, hora.metrics()).
std::string metricsJson(const MetricsSnapshot& m);
// The snapshot in Prometheus' text exposition format, labelled by set and rank.
std::string metricsPrometheus(const MetricsSnapshot& m);
// One log line: ops, bytes, time split, fusion, cache and the top straggler.
std::string metricsSummaryLine(const MetricsSnapshot& m);

}  // namespace hora
