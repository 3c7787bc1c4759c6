#include "core/telemetry.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <sstream>

namespace hora {

namespace {

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

int64_t entryBytes(const TensorEntry& e) {
  const Request& r = e.request;
  if (r.kind == CollectiveKind::kBarrier || r.kind == CollectiveKind::kJoin) return 0;
  return numElements(r.shape) * static_cast<int64_t>(dataTypeSize(r.dtype));
}

void relaxedAdd(std::atomic<uint64_t>& a, uint64_t v) { a.fetch_add(v, std::memory_order_relaxed); }
uint64_t load(const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); }

// Prometheus label values escape backslash, quote and newline.
std::string labelEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    out += c == '\n' ? 'n' : c;
  }
  return out;
}

std::string mkdirs(const std::string& dir) {
  std::string path;
  std::stringstream ss(dir);
  std::string part;
  if (!dir.empty() && dir[0] == '/') path = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    path += part + "/";
    if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) return std::strerror(errno);
  }
  return "";
}

// Readers (a person, a metrics collector) never see a half-written file.
Result<std::string> writeAtomically(const std::string& dir, const std::string& file,
                                    const std::string& text, const char* param) {
  if (std::string err = mkdirs(dir); !err.empty())
    return Status(Code::kSystemError,
                  "cannot create the directory " + dir + ": " + err + " (" + param + " sets it)");
  const std::string path = dir + "/" + file;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
    if (!f.flush()) {
      std::remove(tmp.c_str());
      return Status(Code::kSystemError, "cannot write " + tmp + " (disk full or not writable? " +
                                            param + " sets the directory)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return Status(Code::kSystemError, "cannot rename " + tmp + ": " + std::strerror(errno));
  return path;
}

}  // namespace

const char* flightStateName(FlightState s) {
  switch (s) {
    case FlightState::kSubmitted:
      return "submitted";
    case FlightState::kSent:
      return "negotiating";
    case FlightState::kAgreed:
      return "agreed, queued";
    case FlightState::kRunning:
      return "running";
    case FlightState::kDone:
      return "done";
    case FlightState::kFailed:
      return "failed";
  }
  return "?";
}

Telemetry::Telemetry(TelemetryOptions options)
    : opts_(std::move(options)), born_(Clock::now()), ring_(opts_.flightEntries) {}

void Telemetry::record(const TensorEntry& e, FlightState s, int64_t ns, int32_t groupSize,
                       const std::string* plane, int32_t code) {
  if (ring_.empty() || e.trace.seq == 0) return;
  std::lock_guard<std::mutex> lk(ringMu_);
  FlightRecord& r = ring_[e.trace.seq % ring_.size()];
  if (r.seq != e.trace.seq) return;  // overwritten since
  r.state = s;
  switch (s) {
    case FlightState::kSent:
      r.cacheHit = e.trace.cacheHit;
      break;
    case FlightState::kAgreed:
      r.agreedNs = ns;
      r.groupSize = groupSize;
      break;
    case FlightState::kRunning:
      r.startNs = ns;
      break;
    case FlightState::kDone:
    case FlightState::kFailed:
      r.endNs = ns;
      r.code = code;
      if (plane) r.plane = *plane;
      break;
    case FlightState::kSubmitted:
      break;
  }
}

void Telemetry::submitted(TensorEntry& e) {
  relaxedAdd(submittedCount_, 1);
  e.trace.submitNs = nowNs();
  if (ring_.empty()) return;
  std::lock_guard<std::mutex> lk(ringMu_);
  e.trace.seq = nextSeq_++;
  FlightRecord& r = ring_[e.trace.seq % ring_.size()];
  r.seq = e.trace.seq;
  r.name = e.request.name;  // reuses the slot's capacity once the ring has wrapped
  r.kind = e.request.kind;
  r.dtype = e.request.dtype;
  r.bytes = entryBytes(e);
  r.state = FlightState::kSubmitted;
  r.cacheHit = false;
  r.groupSize = 0;
  r.code = 0;
  r.plane.clear();
  r.submitNs = e.trace.submitNs;
  r.agreedNs = r.startNs = r.endNs = 0;
}

void Telemetry::sent(TensorEntry& e, bool cacheHit) {
  const CollectiveKind k = e.request.kind;
  if (k == CollectiveKind::kAllreduce || k == CollectiveKind::kBroadcast ||
      k == CollectiveKind::kReducescatter)
    relaxedAdd(cacheHit ? cacheHits_ : cacheMisses_, 1);
  e.trace.cacheHit = cacheHit;
  record(e, FlightState::kSent, 0);
}

void Telemetry::agreed(const AgreedGroup& g) {
  const int64_t now = nowNs();
  Timeline* tl = timelineOn();
  for (const auto& e : g.entries) {
    if (!e) continue;
    e->trace.agreedNs = now;
    if (tl && e->trace.submitNs > 0)
      tl->record(TimelineLane::kNegotiation, e->request.name, "negotiate", e->trace.submitNs, now,
                 std::string("{\"kind\":\"") + collectiveName(e->request.kind) + "\",\"cache\":\"" +
                     (e->trace.cacheHit ? "hit" : "miss") + "\"}");
    if (e->trace.submitNs > 0)
      relaxedAdd(negotiationNs_, static_cast<uint64_t>(now - e->trace.submitNs));
    record(*e, FlightState::kAgreed, now, static_cast<int32_t>(g.entries.size()));
  }
}

void Telemetry::inlineDone(const AgreedGroup& g, const std::vector<Status>* outcomes) {
  const int64_t now = nowNs();
  const bool reduced = !g.responses[0].inlineResult.empty();
  static const std::string kInline = "inline";
  if (Timeline* tl = timelineOn()) {
    if (reduced) {
      // As a data-plane group, so that a trace shows every collective; its
      // plane is "inline" (the coordinator combined it) and it takes no time.
      std::string names;
      uint64_t bytes = 0;
      for (size_t i = 0; i < g.responses.size() && i < 64; ++i) {
        names += (i ? "\",\"" : "") + jsonEscape(g.responses[i].name);
        // This rank's tensor, as data-plane groups count it (an allgather's
        // result is every rank's).
        if (g.entries[i]) bytes += static_cast<uint64_t>(entryBytes(*g.entries[i]));
      }
      tl->record(
          TimelineLane::kDataPlane, groupLabel(g),
          collectiveName(static_cast<CollectiveKind>(g.responses[0].kind)), now, now,
          "{\"tensors\":[\"" + names + "\"],\"count\":" + std::to_string(g.responses.size()) +
              ",\"bytes\":" + std::to_string(bytes) + ",\"plane\":\"inline\",\"status\":\"ok\"}",
          0, 0);
    } else {
      tl->record(TimelineLane::kDataPlane, groupLabel(g),
                 g.responses[0].kind == ResponseKind::kError ? "error" : "control", now, 0);
    }
  }
  for (size_t i = 0; i < g.responses.size(); ++i) {
    const Response& r = g.responses[i];
    if (r.kind == ResponseKind::kError) relaxedAdd(errors_, 1);
    const auto k = static_cast<int>(r.kind);
    if (k < static_cast<int>(CollectiveKind::kCount) && r.kind != ResponseKind::kError)
      relaxedAdd(ops_[k], 1);
    const EntryPtr& e = g.entries[i];
    if (!r.inlineResult.empty()) {
      relaxedAdd(inlineCollectives_, 1);
      if (r.kind == ResponseKind::kAllreduce) relaxedAdd(inlineAllreduces_, 1);
      // This rank's tensor, as the data plane's groups count it.
      if (e) relaxedAdd(bytes_[k], static_cast<uint64_t>(entryBytes(*e)));
    }
    if (!e) continue;
    relaxedAdd(finishedCount_, 1);
    const bool refused = outcomes && i < outcomes->size() && !(*outcomes)[i].isOk();
    if (refused) relaxedAdd(errors_, 1);
    const bool failed = r.kind == ResponseKind::kError || refused;
    const int32_t code = r.kind == ResponseKind::kError ? r.errorCode
                         : refused ? static_cast<int32_t>((*outcomes)[i].code())
                                   : 0;
    record(*e, failed ? FlightState::kFailed : FlightState::kDone, now, 0,
           r.inlineResult.empty() ? nullptr : &kInline, code);
  }
}

void Telemetry::abandoned(const TensorEntry& e, const Status& why) {
  relaxedAdd(finishedCount_, 1);
  relaxedAdd(errors_, 1);
  record(e, FlightState::kFailed, nowNs(), 0, nullptr, static_cast<int32_t>(why.code()));
}

void Telemetry::ranOnControl() { relaxedAdd(controlGroups_, 1); }
void Telemetry::ranByCaller() { relaxedAdd(callerGroups_, 1); }
void Telemetry::packedAhead() { relaxedAdd(packedAhead_, 1); }
void Telemetry::packedAheadUsed() { relaxedAdd(packedAheadUsed_, 1); }
void Telemetry::peerPacksRead(uint64_t n) { relaxedAdd(peerPacksRead_, n); }
void Telemetry::callerHomed() { relaxedAdd(callerHomings_, 1); }

void Telemetry::started(const AgreedGroup& g) {
  const int64_t now = nowNs();
  int64_t agreedAt = 0;
  for (const auto& e : g.entries) {
    if (!e) continue;
    agreedAt = std::max(agreedAt, e->trace.agreedNs);
    record(*e, FlightState::kRunning, now);
  }
  if (agreedAt > 0) relaxedAdd(queueNs_, static_cast<uint64_t>(now - agreedAt));
  if (Timeline* tl = timelineOn(); tl && agreedAt > 0)
    tl->record(TimelineLane::kQueue, groupLabel(g), "queue", agreedAt, now);
}

void Telemetry::finished(const AgreedGroup& g, const Status& s, const std::string& plane, bool gpu,
                         int64_t packNs, int64_t unpackNs) {
  const int64_t now = nowNs();
  relaxedAdd(gpu ? gpuGroups_ : cpuGroups_, 1);
  int64_t startNs = 0;
  uint64_t bytes = 0;
  for (size_t i = 0; i < g.responses.size(); ++i) {
    const Response& r = g.responses[i];
    const auto k = static_cast<int>(r.kind);
    const EntryPtr& e = g.entries[i];
    const uint64_t b = e ? static_cast<uint64_t>(entryBytes(*e)) : 0;
    bytes += b;
    if (k < static_cast<int>(CollectiveKind::kCount)) {
      relaxedAdd(ops_[k], 1);
      relaxedAdd(bytes_[k], b);
    }
    if (!e) continue;
    relaxedAdd(finishedCount_, 1);
    {
      std::lock_guard<std::mutex> lk(ringMu_);
      if (!ring_.empty() && e->trace.seq != 0) {
        const FlightRecord& fr = ring_[e->trace.seq % ring_.size()];
        if (fr.seq == e->trace.seq && fr.startNs > 0) startNs = fr.startNs;
      }
    }
    record(*e, s.isOk() ? FlightState::kDone : FlightState::kFailed, now, 0, &plane,
           static_cast<int32_t>(s.code()));
  }
  if (!s.isOk()) relaxedAdd(errors_, 1);
  relaxedAdd(groups_, 1);
  relaxedAdd(groupTensors_, g.responses.size());
  if (g.responses.size() > 1) relaxedAdd(fusedGroups_, 1);
  relaxedAdd(groupBytes_, bytes);
  if (startNs > 0) relaxedAdd(dataPlaneNs_, static_cast<uint64_t>(now - startNs));
  if (Timeline* tl = timelineOn(); tl && startNs > 0) {
    std::string names;
    for (size_t i = 0; i < g.responses.size() && i < 64; ++i)
      names += (i ? "\",\"" : "") + jsonEscape(g.responses[i].name);
    tl->record(TimelineLane::kDataPlane, groupLabel(g),
               collectiveName(static_cast<CollectiveKind>(g.responses[0].kind)), startNs, now,
               "{\"tensors\":[\"" + names + "\"],\"count\":" + std::to_string(g.responses.size()) +
                   ",\"bytes\":" + std::to_string(bytes) + ",\"plane\":\"" + jsonEscape(plane) +
                   "\",\"status\":\"" + codeName(s.code()) + "\"}",
               packNs, unpackNs);
  }
}

Timeline* Telemetry::timelineOn() const {
  Timeline* tl = opts_.timeline.get();
  return tl && tl->active() ? tl : nullptr;
}

std::string Telemetry::groupLabel(const AgreedGroup& g) {
  const Response& r = g.responses.front();
  if (g.responses.size() == 1) return r.name;
  return r.name + " +" + std::to_string(g.responses.size() - 1) + " fused";
}

void Telemetry::cycle() {
  Timeline* tl = timelineOn();
  if (tl && tl->markCycles()) tl->record(TimelineLane::kMarkers, "cycle", "cycle", nowNs(), 0);
}

void Telemetry::stall(const std::string& warning) {
  if (Timeline* tl = timelineOn())
    tl->record(TimelineLane::kMarkers, "stall warning", "stall", nowNs(), 0,
               "{\"warning\":\"" + jsonEscape(warning) + "\"}");
}

void Telemetry::p2pDone(bool send, int peer, int64_t tag, int64_t bytes, int64_t postedNs,
                        const Status& s) {
  relaxedAdd(send ? p2pSends_ : p2pRecvs_, 1);
  if (s.isOk())
    relaxedAdd(p2pBytes_, static_cast<uint64_t>(std::max<int64_t>(bytes, 0)));
  else
    relaxedAdd(p2pErrors_, 1);
  Timeline* tl = timelineOn();
  if (!tl || postedNs == 0) return;
  // The name carries direction and peer (what one looks for in a pipeline's
  // trace); tag and bytes vary, so they go to the args.
  tl->record(TimelineLane::kPointToPoint,
             std::string(send ? "send to " : "recv from ") + std::to_string(peer),
             send ? "send" : "recv", postedNs, std::max(nowNs(), postedNs + 1),
             "{\"tag\":" + std::to_string(tag) + ",\"bytes\":" + std::to_string(bytes) +
                 ",\"status\":\"" + codeName(s.code()) + "\"}");
}

void Telemetry::flushTimeline() {
  if (opts_.timeline) opts_.timeline->flush();
}

void Telemetry::lastArrival(int setRank, Clock::duration waited, const std::string& tensor) {
  const int global =
      setRank < static_cast<int>(opts_.globalRanks.size()) ? opts_.globalRanks[setRank] : setRank;
  if (Timeline* tl = timelineOn(); tl && waited > std::chrono::microseconds(100)) {
    const int64_t now = nowNs();
    tl->record(
        TimelineLane::kNegotiation, "waited for rank " + std::to_string(global), "wait",
        now - std::chrono::duration_cast<std::chrono::nanoseconds>(waited).count(), now,
        "{\"tensor\":\"" + jsonEscape(tensor) + "\",\"last_rank\":" + std::to_string(global) + "}");
  }
  std::lock_guard<std::mutex> lk(stragglerMu_);
  ++stragglerSamples_;
  arrivals_.push_back(
      {global, std::chrono::duration_cast<std::chrono::nanoseconds>(waited).count()});
  while (arrivals_.size() > std::max<size_t>(1, opts_.stragglerWindow)) arrivals_.pop_front();
}

uint64_t Telemetry::inFlight() const {
  const uint64_t sub = load(submittedCount_), fin = load(finishedCount_);
  return sub > fin ? sub - fin : 0;
}

MetricsSnapshot Telemetry::snapshot() const {
  MetricsSnapshot m;
  m.setName = opts_.setName;
  m.rank = myGlobal();
  m.setSize = static_cast<int>(opts_.globalRanks.size());
  m.uptimeS = Seconds(Clock::now() - born_).count();
  for (int k = 0; k < static_cast<int>(CollectiveKind::kCount); ++k) {
    m.ops[k] = load(ops_[k]);
    m.bytes[k] = load(bytes_[k]);
  }
  m.groups = load(groups_);
  m.groupTensors = load(groupTensors_);
  m.fusedGroups = load(fusedGroups_);
  m.groupBytes = load(groupBytes_);
  m.inlineAllreduces = load(inlineAllreduces_);
  m.inlineCollectives = load(inlineCollectives_);
  m.controlGroups = load(controlGroups_);
  m.callerGroups = load(callerGroups_);
  m.packedAhead = load(packedAhead_);
  m.packedAheadUsed = load(packedAheadUsed_);
  m.peerPacksRead = load(peerPacksRead_);
  m.callerHomings = load(callerHomings_);
  m.cacheHits = load(cacheHits_);
  m.cacheMisses = load(cacheMisses_);
  m.errors = load(errors_);
  m.negotiationNs = load(negotiationNs_);
  m.queueNs = load(queueNs_);
  m.dataPlaneNs = load(dataPlaneNs_);
  m.cpuGroups = load(cpuGroups_);
  m.gpuGroups = load(gpuGroups_);
  const uint64_t sub = load(submittedCount_), fin = load(finishedCount_);
  m.inFlight = sub > fin ? sub - fin : 0;
  m.p2pSends = load(p2pSends_);
  m.p2pRecvs = load(p2pRecvs_);
  m.p2pBytes = load(p2pBytes_);
  m.p2pErrors = load(p2pErrors_);
  {
    std::lock_guard<std::mutex> at(autotuneMu_);
    m.autotune = autotune_;
  }
  std::lock_guard<std::mutex> lk(stragglerMu_);
  m.stragglerSamples = stragglerSamples_;
  std::map<int, StragglerScore> by;
  double total = 0;
  for (const auto& a : arrivals_) {
    StragglerScore& s = by[a.rank];
    s.rank = a.rank;
    ++s.last;
    s.waitMs += a.waitNs / 1e6;
    total += a.waitNs / 1e6;
  }
  for (auto& [r, s] : by) {
    s.share = total > 0 ? s.waitMs / total : 0;
    m.stragglers.push_back(s);
  }
  std::sort(m.stragglers.begin(), m.stragglers.end(),
            [](const StragglerScore& a, const StragglerScore& b) { return a.waitMs > b.waitMs; });
  return m;
}

std::string Telemetry::flightText(const std::string& reason) const {
  std::vector<FlightRecord> recs;
  {
    std::lock_guard<std::mutex> lk(ringMu_);
    for (const auto& r : ring_)
      if (r.seq != 0) recs.push_back(r);
  }
  std::sort(recs.begin(), recs.end(),
            [](const FlightRecord& a, const FlightRecord& b) { return a.seq < b.seq; });
  const int64_t now = nowNs();
  const auto ago = [now](int64_t ns) -> std::string {
    if (ns == 0) return "-";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", (now - ns) / 1e9);
    return buf;
  };
  std::ostringstream o;
  const std::time_t wall = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", std::localtime(&wall));
  o << "hora flight recorder: rank " << myGlobal() << " (set rank " << opts_.setRank << " of "
    << opts_.globalRanks.size() << ") in process set " << opts_.setName << " on host " << opts_.host
    << ", pid " << ::getpid() << ", " << when << "\n";
  o << "why: " << reason << "\n";
  o << "last " << recs.size() << " collectives of " << ring_.size()
    << " kept, oldest first; times are seconds before this dump\n";
  o << "seq\tstate\tkind\tname\tdtype\tbytes\tcache\tgroup\tplane\tsubmitted\tagreed\tstarted\t"
       "ended\tcode\n";
  for (const auto& r : recs)
    o << r.seq << '\t' << flightStateName(r.state) << '\t' << collectiveName(r.kind) << '\t'
      << r.name << '\t' << dataTypeName(r.dtype) << '\t' << r.bytes << '\t'
      << (r.cacheHit ? "hit" : "-") << '\t' << r.groupSize << '\t'
      << (r.plane.empty() ? "-" : r.plane) << '\t' << ago(r.submitNs) << '\t' << ago(r.agreedNs)
      << '\t' << ago(r.startNs) << '\t' << ago(r.endNs) << '\t'
      << (r.state == FlightState::kFailed ? codeName(static_cast<Code>(r.code)) : "-") << '\n';
  std::vector<const FlightRecord*> open;
  for (const auto& r : recs)
    if (r.state != FlightState::kDone && r.state != FlightState::kFailed) open.push_back(&r);
  o << "not finished: " << open.size() << "\n";
  for (const FlightRecord* r : open)
    o << "  " << collectiveName(r->kind) << " \"" << r->name << "\": " << flightStateName(r->state)
      << " for " << ago(r->state == FlightState::kRunning ? r->startNs : r->submitNs) << " s\n";
  if (p2pReport_) o << p2pReport_();
  return o.str();
}

Result<std::string> Telemetry::dumpFlight(const std::string& reason) const {
  if (ring_.empty()) return Status(Code::kInvalidArgument, "the flight recorder is off");
  return dumpText("flight", flightText(reason));
}

Result<std::string> Telemetry::dumpText(const std::string& stem, const std::string& text) const {
  return writeAtomically(opts_.dumpDir.empty() ? "." : opts_.dumpDir,
                         "hora-" + stem + "-" + opts_.setName + "-rank" +
                             std::to_string(myGlobal()) + "-pid" + std::to_string(::getpid()) +
                             "-" + std::to_string(dumps_.fetch_add(1) + 1) + ".txt",
                         text, "HORA_FLIGHT_RECORDER_DIR");
}

Result<std::string> Telemetry::dumpPrometheus(const std::string& dir,
                                              const std::string& text) const {
  return writeAtomically(dir,
                         "hora-" + opts_.setName + "-rank" + std::to_string(myGlobal()) + ".prom",
                         text, "HORA_METRICS_PROMETHEUS_DIR");
}

void Telemetry::autotuneStart(bool enabled, const TuningValues& configured) {
  std::lock_guard<std::mutex> lk(autotuneMu_);
  autotune_.enabled = enabled;
  autotune_.values = configured;
}

void Telemetry::tuned(const TuningValues& v) {
  std::lock_guard<std::mutex> lk(autotuneMu_);
  autotune_.values = v;
  ++autotune_.changes;
  // FNV-1a over the values, chained: the same sequence gives the same digest.
  uint64_t h = autotune_.digest ^ 0xcbf29ce484222325ull;
  for (int d = 0; d < kTuneDims; ++d) {
    h ^= static_cast<uint64_t>(v.get(TuneDim(d)));
    h *= 0x100000001b3ull;
  }
  autotune_.digest = h;
}

void Telemetry::autotuneProgress(bool settled, uint64_t windows, uint64_t searches, double bestCost,
                                 const std::string& unit) {
  std::lock_guard<std::mutex> lk(autotuneMu_);
  autotune_.tuner = true;
  autotune_.settled = settled;
  autotune_.windows = windows;
  autotune_.searches = searches;
  autotune_.bestCost = bestCost;
  autotune_.unit = unit;
}

std::string metricsJson(const MetricsSnapshot& m) {
  std::ostringstream o;
  o << "{\"set\":\"" << jsonEscape(m.setName) << "\",\"rank\":" << m.rank
    << ",\"set_size\":" << m.setSize << ",\"uptime_s\":" << m.uptimeS << ",\"collectives\":{";
  bool first = true;
  for (int k = 0; k < static_cast<int>(CollectiveKind::kCount); ++k) {
    if (!first) o << ',';
    first = false;
    o << '"' << collectiveName(static_cast<CollectiveKind>(k)) << "\":{\"count\":" << m.ops[k]
      << ",\"bytes\":" << m.bytes[k] << '}';
  }
  o << "},\"groups\":" << m.groups << ",\"group_tensors\":" << m.groupTensors
    << ",\"fused_groups\":" << m.fusedGroups << ",\"group_bytes\":" << m.groupBytes
    << ",\"inline_allreduces\":" << m.inlineAllreduces
    << ",\"inline_collectives\":" << m.inlineCollectives
    << ",\"control_thread_groups\":" << m.controlGroups
    << ",\"caller_driven_groups\":" << m.callerGroups << ",\"packed_ahead\":" << m.packedAhead
    << ",\"packed_ahead_used\":" << m.packedAheadUsed << ",\"peer_packs_read\":" << m.peerPacksRead
    << ",\"caller_homings\":" << m.callerHomings << ",\"cache_hits\":" << m.cacheHits
    << ",\"cache_misses\":" << m.cacheMisses << ",\"errors\":" << m.errors
    << ",\"negotiation_s\":" << m.negotiationNs / 1e9 << ",\"queue_s\":" << m.queueNs / 1e9
    << ",\"data_plane_s\":" << m.dataPlaneNs / 1e9 << ",\"cpu_groups\":" << m.cpuGroups
    << ",\"gpu_groups\":" << m.gpuGroups << ",\"in_flight\":" << m.inFlight
    << ",\"p2p\":{\"sends\":" << m.p2pSends << ",\"recvs\":" << m.p2pRecvs
    << ",\"bytes\":" << m.p2pBytes << ",\"errors\":" << m.p2pErrors
    << "},\"straggler_samples\":" << m.stragglerSamples << ",\"stragglers\":[";
  for (size_t i = 0; i < m.stragglers.size(); ++i) {
    const auto& s = m.stragglers[i];
    o << (i ? "," : "") << "{\"rank\":" << s.rank << ",\"last\":" << s.last
      << ",\"wait_ms\":" << s.waitMs << ",\"share\":" << s.share << '}';
  }
  const AutotuneMetrics& a = m.autotune;
  o << "],\"autotune\":{\"enabled\":" << (a.enabled ? "true" : "false");
  for (int d = 0; d < kTuneDims; ++d)
    o << ",\"" << tuneDimColumn(TuneDim(d)) << "\":" << a.values.get(TuneDim(d));
  o << ",\"changes\":" << a.changes << ",\"digest\":\"" << std::hex << a.digest << std::dec << '"';
  if (a.tuner)
    o << ",\"settled\":" << (a.settled ? "true" : "false") << ",\"windows\":" << a.windows
      << ",\"searches\":" << a.searches << ",\"best_cost\":" << a.bestCost << ",\"unit\":\""
      << a.unit << '"';
  o << "}}";
  return o.str();
}

std::string metricsPrometheus(const MetricsSnapshot& m) {
  std::ostringstream o;
  const std::string base =
      "set=\"" + labelEscape(m.setName) + "\",rank=\"" + std::to_string(m.rank) + "\"";
  auto metric = [&](const char* name, const char* type, const char* help) {
    o << "# HELP hora_" << name << ' ' << help << "\n# TYPE hora_" << name << ' ' << type << '\n';
  };
  metric("collectives_total", "counter", "Collectives finished, by kind.");
  for (int k = 0; k < static_cast<int>(CollectiveKind::kCount); ++k)
    o << "hora_collectives_total{" << base << ",kind=\""
      << collectiveName(static_cast<CollectiveKind>(k)) << "\"} " << m.ops[k] << '\n';
  metric("collective_bytes_total", "counter", "Bytes this rank contributed, by kind.");
  for (int k = 0; k < static_cast<int>(CollectiveKind::kCount); ++k)
    o << "hora_collective_bytes_total{" << base << ",kind=\""
      << collectiveName(static_cast<CollectiveKind>(k)) << "\"} " << m.bytes[k] << '\n';
  auto one = [&](const char* name, const char* type, const char* help, double v) {
    metric(name, type, help);
    o << "hora_" << name << '{' << base << "} " << v << '\n';
  };
  one("groups_total", "counter", "Groups (fused or not) run on the data plane.",
      static_cast<double>(m.groups));
  one("group_tensors_total", "counter", "Tensors in those groups.",
      static_cast<double>(m.groupTensors));
  one("inline_allreduces_total", "counter",
      "Allreduces reduced by the coordinator inside the negotiation (HORA_INLINE_MAX_BYTES).",
      static_cast<double>(m.inlineAllreduces));
  one("inline_collectives_total", "counter",
      "Collectives of every kind (allreduces included) the coordinator combined inside the "
      "negotiation (HORA_INLINE_MAX_BYTES).",
      static_cast<double>(m.inlineCollectives));
  one("control_thread_groups_total", "counter",
      "Of those groups, the ones the control thread ran itself (HORA_RUN_ON_CONTROL_MAX_BYTES).",
      static_cast<double>(m.controlGroups));
  one("caller_driven_groups_total", "counter",
      "Of those, the ones a framework thread ran while it did the control thread's work "
      "(HORA_CALLER_DRIVES).",
      static_cast<double>(m.callerGroups));
  one("packed_ahead_total", "counter",
      "Allreduces whose first chunk this rank packed into shared memory before its negotiation "
      "was over (HORA_PACK_AHEAD).",
      static_cast<double>(m.packedAhead));
  one("packed_ahead_used_total", "counter",
      "Of those, the ones whose allreduce published what was packed ahead instead of packing it "
      "again (the others ran after another collective, fused, or not at all).",
      static_cast<double>(m.packedAheadUsed));
  one("peer_packs_read_total", "counter",
      "Peers' packs ahead that an allreduce read without waiting for the peer to pack (one per "
      "peer and allreduce; HORA_PACK_AHEAD).",
      static_cast<double>(m.peerPacksRead));
  one("caller_homings_total", "counter",
      "Times a framework thread waiting in hora_wait was moved back to its rank's CPU, where the "
      "set's ranks share one CPU mask and outnumber its CPUs evenly (HORA_HOME_CALLER).",
      static_cast<double>(m.callerHomings));
  one("cache_hits_total", "counter", "Requests sent as response-cache hits.",
      static_cast<double>(m.cacheHits));
  one("cache_misses_total", "counter", "Cacheable requests sent in full.",
      static_cast<double>(m.cacheMisses));
  one("errors_total", "counter", "Collectives that failed.", static_cast<double>(m.errors));
  one("negotiation_seconds_total", "counter", "Submit to agreed, summed over tensors.",
      m.negotiationNs / 1e9);
  one("queue_seconds_total", "counter", "Agreed to data-plane start, summed over groups.",
      m.queueNs / 1e9);
  one("data_plane_seconds_total", "counter", "Time on the data plane, summed over groups.",
      m.dataPlaneNs / 1e9);
  one("in_flight", "gauge", "Collectives submitted and not finished.",
      static_cast<double>(m.inFlight));
  metric("p2p_total", "counter", "Point-to-point operations completed, by direction.");
  o << "hora_p2p_total{" << base << ",dir=\"send\"} " << m.p2pSends << '\n';
  o << "hora_p2p_total{" << base << ",dir=\"recv\"} " << m.p2pRecvs << '\n';
  one("p2p_bytes_total", "counter", "Bytes moved by point-to-point operations that succeeded.",
      static_cast<double>(m.p2pBytes));
  one("p2p_errors_total", "counter", "Point-to-point operations that failed.",
      static_cast<double>(m.p2pErrors));
  if (!m.stragglers.empty()) {
    metric("straggler_wait_ms", "gauge",
           "Time the other ranks waited for this rank over the sliding window (coordinator's "
           "view).");
    for (const auto& s : m.stragglers)
      o << "hora_straggler_wait_ms{set=\"" << labelEscape(m.setName) << "\",rank=\"" << s.rank
        << "\"} " << s.waitMs << '\n';
  }
  if (m.autotune.enabled) {
    metric("autotune_value", "gauge", "The value autotune has in force, by parameter.");
    for (int d = 0; d < kTuneDims; ++d)
      o << "hora_autotune_value{" << base << ",param=\"" << tuneDimColumn(TuneDim(d)) << "\"} "
        << m.autotune.values.get(TuneDim(d)) << '\n';
    one("autotune_changes_total", "counter", "Value sets autotune applied on this rank.",
        static_cast<double>(m.autotune.changes));
  }
  return o.str();
}

std::string metricsSummaryLine(const MetricsSnapshot& m) {
  uint64_t ops = 0, bytes = 0;
  for (int k = 0; k < static_cast<int>(CollectiveKind::kCount); ++k) {
    ops += m.ops[k];
    bytes += m.bytes[k];
  }
  char buf[512];
  const double hitRate =
      m.cacheHits + m.cacheMisses ? 100.0 * m.cacheHits / (m.cacheHits + m.cacheMisses) : 0;
  std::snprintf(buf, sizeof buf,
                "metrics: set %s rank %d: %llu collectives, %.1f MB; negotiation %.3f s, queue "
                "%.3f s, data plane %.3f s; %.1f tensors/group; cache hits %.0f%%; errors %llu",
                m.setName.c_str(), m.rank, static_cast<unsigned long long>(ops), bytes / 1e6,
                m.negotiationNs / 1e9, m.queueNs / 1e9, m.dataPlaneNs / 1e9,
                m.groups ? static_cast<double>(m.groupTensors) / m.groups : 0.0, hitRate,
                static_cast<unsigned long long>(m.errors));
  std::string line = buf;
  if (m.p2pSends + m.p2pRecvs > 0) {
    std::snprintf(buf, sizeof buf, "; p2p %llu sends, %llu recvs, %.1f MB, errors %llu",
                  static_cast<unsigned long long>(m.p2pSends),
                  static_cast<unsigned long long>(m.p2pRecvs), m.p2pBytes / 1e6,
                  static_cast<unsigned long long>(m.p2pErrors));
    line += buf;
  }
  if (m.autotune.enabled)
    line += std::string("; autotune ") +
            (m.autotune.tuner ? (m.autotune.settled ? "settled" : "searching") : "on") + " (" +
            m.autotune.values.describe() + ")";
  if (!m.stragglers.empty() && m.stragglers[0].waitMs >= 1.0) {
    const auto& s = m.stragglers[0];
    uint64_t window = 0;
    for (const auto& x : m.stragglers) window += x.last;
    std::snprintf(buf, sizeof buf,
                  "; slowest rank %d (others waited %.1f ms for it over the last %llu tensors, "
                  "%.0f%% of all waiting)",
                  s.rank, s.waitMs, static_cast<unsigned long long>(window), 100 * s.share);
    line += buf;
  }
  return line;
}

}  // namespace hora
