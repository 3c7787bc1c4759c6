// Timeline: a Chrome-trace (Perfetto, chrome://tracing) record of every
// tensor's way through this rank, written into one file for the whole job.
//
// One per runtime, shared by its process sets' Telemetry (core/telemetry.h),
// which records the events from the threads that see them (framework,
// control, executor). Events go into a bounded in-memory buffer (fixed-size
// records, names interned); the control thread's telemetry tick flushes it.
//
// One file for every rank: each rank appends its events to the same path
// with O_APPEND, one write(2) per batch of whole lines, so batches of
// different ranks never interleave mid-line (on one host, or a shared file
// system). Rank 0 creates the file and writes the opening "[" at start; the
// others append only once the file holds something. The JSON Array Format
// tolerates the trailing comma and missing "]" of a file still being written
// or of a job that died. Start it on every rank at the same point (init, or
// after the same collective): a rank that starts before rank 0 truncates the
// file of an earlier run would lose what it appended to it. Timestamps are the wall clock
// (CLOCK_REALTIME) in microseconds: identical across processes of one host, NTP-aligned across
// hosts.
//
// Bounded: at most HORA_TIMELINE_BUFFER_EVENTS unflushed events (more are
// dropped and counted) and HORA_TIMELINE_MAX_MB written by this rank; past
// either, a "timeline: N events dropped" marker says so.
//
// Thread-safe. start()/stop() from framework threads (hora_timeline_start,
// HORA_TIMELINE at init), record() from any thread, flush() from control threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/clock.h"
#include "core/status.h"

namespace hora {

// `s` as the inside of a JSON string (quotes, backslashes, control characters
// escaped); also what core/telemetry.cc writes its JSON with.
std::string jsonEscape(const std::string& s);

enum class TimelineLane : uint8_t {
  kNegotiation = 0,
  kQueue = 1,
  kDataPlane = 2,
  kMarkers = 3,
  kPointToPoint = 4,
};
constexpr int kTimelineLanes = 5;

struct TimelineOptions {
  int rank = 0;  // global
  std::string host;
  size_t bufferEvents = 1 << 16;
  int64_t maxBytes = int64_t{1} << 30;
};

class Timeline {
 public:
  explicit Timeline(TimelineOptions options);
  ~Timeline();

  // Starts recording into `path` (rank 0 creates or truncates it). A second
  // start while recording is refused naming the file; an unwritable path is
  // refused naming it and errno.
  Status start(const std::string& path, bool markCycles);
  // Flushes what is buffered and stops; false if it was not recording.
  bool stop();
  bool active() const { return active_.load(std::memory_order_relaxed); }
  bool markCycles() const { return markCycles_.load(std::memory_order_relaxed); }
  std::string path() const;

  // A span [startNs, endNs] (Clock nanoseconds) or, with endNs == 0, an
  // instant; `detail` becomes the event's args ("" none; else a JSON object).
  // packNs/unpackNs (>= 0) join the args as pack_us/unpack_us; kept as
  // numbers so that a detail repeated every step is interned once.
  void record(TimelineLane lane, const std::string& name, const char* category, int64_t startNs,
              int64_t endNs, const std::string& detail = "", int64_t packNs = -1,
              int64_t unpackNs = -1);
  // Writes the buffered events; control thread (any set's tick).
  void flush();

  uint64_t dropped() const { return dropped_.load(); }

 private:
  struct Event {  // 48 bytes
    int64_t startNs;
    int64_t endNs;
    uint32_t name;
    uint32_t detail;
    const char* category;      // a literal
    int32_t packUs, unpackUs;  // -1: none
    TimelineLane lane;
  };
  uint32_t intern(const std::string& s);  // under mu_
  void writeLocked(const std::string& text);

  const TimelineOptions opts_;
  // Clock -> wall clock, taken once.
  const int64_t wallMinusSteadyNs_;
  std::atomic<bool> active_{false}, markCycles_{false};
  std::atomic<uint64_t> dropped_{0};

  mutable std::mutex mu_;  // guards everything below
  std::string path_;
  int fd_ = -1;
  int64_t written_ = 0;
  bool headerDone_ = false;
  bool truncatedNoted_ = false;
  std::vector<Event> buffer_;
  std::vector<std::string> strings_;
  std::unordered_map<std::string, uint32_t> ids_;
};

}  // namespace hora
