// TuningValues: the performance settings hora's autotuner may change while a
// job runs (core/autotune.h), as one value type every layer shares.
//
// Who uses which value:
//  - fusion threshold and cycle time: set rank 0's coordinator only
//    (controllers/), when it plans fusion and decides when to emit;
//  - shm chunk, shm min bytes and the Gloo bcube cut-over: the data plane of
//    every rank (core/backend.h, Backend::tune). These must change
//    identically on every rank between two collectives, so the coordinator
//    sends them with a response list (core/message.h, ResponseList::tuning)
//    and each rank's executor applies them before the first data-plane group
//    of that list (or, when the list has none, of a later one).
// All values travel together so every rank can report the full set in its
// metrics. Pure values; no threads.
#pragma once

#include <cstdint>
#include <string>

namespace hora {

// The tuned dimensions, in the order the tuner searches them (the most
// influential first).
enum class TuneDim : int {
  kFusionThreshold = 0,
  kCycleTime = 1,
  kShmChunk = 2,
  kShmMinBytes = 3,
  kGlooBcubeMax = 4,
};
constexpr int kTuneDims = 5;

// A set on one host makes its shared-memory segments' slots at least this
// large whatever chunk it starts with, so that autotune can try chunks up to
// it (bench/results/2026-11-25-shm-chunk.md: 1 MiB chunks were faster for the
// ResNet-50 step and for 2 ranks with a core each, 4 MiB ones for single
// 4-16 MiB allreduces with more ranks than cores). The hierarchy's local
// stage, which autotune does not tune, makes its slots of one chunk.
constexpr int64_t kShmMinSlotBytes = int64_t{4} << 20;
// The default chunk when every rank on the host has a CPU of its own
// (HORA_SHM_CHUNK_BYTES unset): with the executors bound, 256 KiB chunks ran
// the ResNet-50 step 1.1-1.2x faster than 1 MiB ones at 2 ranks on 2 cores,
// and 4 ranks on those cores were faster with 1 MiB
// (bench/results/2026-11-27-chunk-by-cores.md).
constexpr int64_t kShmChunkBytesWhenRanksFit = int64_t{256} << 10;

struct TuningValues {
  int64_t fusionThresholdBytes = int64_t{128} << 20;
  int64_t cycleTimeUs = 1000;
  int64_t shmChunkBytes = int64_t{1} << 20;
  int64_t shmMinBytes = 0;
  // Gloo allreduce payloads up to this many bytes use Gloo's own allreduce
  // (bcube under HORA_GLOO_ALGORITHM=auto); larger ones hora's overlapped ring.
  int64_t glooBcubeMaxBytes = int64_t{1} << 20;

  int64_t get(TuneDim d) const;
  void set(TuneDim d, int64_t v);
  bool operator==(const TuningValues& o) const;
  bool operator!=(const TuningValues& o) const { return !(*this == o); }
  // "fusion 64 MiB, cycle 1 ms, shm chunk 4 MiB, shm min 0 B, gloo bcube <= 1 MiB"
  std::string describe() const;
};

// The HORA_* parameter each dimension starts from ("HORA_FUSION_THRESHOLD_BYTES").
const char* tuneDimParam(TuneDim d);
// A short column name for logs and the CSV ("fusion_threshold_bytes").
const char* tuneDimColumn(TuneDim d);
// "64 MiB", "1 ms" (a value of dimension d, for people).
std::string formatTuneValue(TuneDim d, int64_t v);

}  // namespace hora
