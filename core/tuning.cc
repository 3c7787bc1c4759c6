#include "core/tuning.h"

namespace hora {

int64_t TuningValues::get(TuneDim d) const {
  switch (d) {
    case TuneDim::kFusionThreshold:
      return fusionThresholdBytes;
    case TuneDim::kCycleTime:
      return cycleTimeUs;
    case TuneDim::kShmChunk:
      return shmChunkBytes;
    case TuneDim::kShmMinBytes:
      return shmMinBytes;
    case TuneDim::kGlooBcubeMax:
      return glooBcubeMaxBytes;
  }
  return 0;
}

void TuningValues::set(TuneDim d, int64_t v) {
  switch (d) {
    case TuneDim::kFusionThreshold:
      fusionThresholdBytes = v;
      break;
    case TuneDim::kCycleTime:
      cycleTimeUs = v;
      break;
    case TuneDim::kShmChunk:
      shmChunkBytes = v;
      break;
    case TuneDim::kShmMinBytes:
      shmMinBytes = v;
      break;
    case TuneDim::kGlooBcubeMax:
      glooBcubeMaxBytes = v;
      break;
  }
}

bool TuningValues::operator==(const TuningValues& o) const {
  for (int i = 0; i < kTuneDims; ++i)
    if (get(TuneDim(i)) != o.get(TuneDim(i))) return false;
  return true;
}

const char* tuneDimParam(TuneDim d) {
  static const char* const kNames[kTuneDims] = {"HORA_FUSION_THRESHOLD_BYTES", "HORA_CYCLE_TIME_MS",
                                                "HORA_SHM_CHUNK_BYTES", "HORA_SHM_MIN_BYTES",
                                                "HORA_GLOO_ALGORITHM (auto's bcube cut-over)"};
  return kNames[static_cast<int>(d)];
}

const char* tuneDimColumn(TuneDim d) {
  static const char* const kNames[kTuneDims] = {"fusion_threshold_bytes", "cycle_time_us",
                                                "shm_chunk_bytes", "shm_min_bytes",
                                                "gloo_bcube_max_bytes"};
  return kNames[static_cast<int>(d)];
}

namespace {

std::string bytesText(int64_t v) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (u < 3 && v >= 1024 && v % 1024 == 0) {
    v /= 1024;
    ++u;
  }
  return std::to_string(v) + " " + units[u];
}

}  // namespace

std::string formatTuneValue(TuneDim d, int64_t v) {
  if (d != TuneDim::kCycleTime) return bytesText(v);
  if (v % 1000 == 0) return std::to_string(v / 1000) + " ms";
  return std::to_string(v) + " us";
}

std::string TuningValues::describe() const {
  return "fusion " + formatTuneValue(TuneDim::kFusionThreshold, fusionThresholdBytes) + ", cycle " +
         formatTuneValue(TuneDim::kCycleTime, cycleTimeUs) + ", shm chunk " +
         formatTuneValue(TuneDim::kShmChunk, shmChunkBytes) + ", shm min " +
         formatTuneValue(TuneDim::kShmMinBytes, shmMinBytes) +
         ", gloo bcube <= " + formatTuneValue(TuneDim::kGlooBcubeMax, glooBcubeMaxBytes);
}

}  // namespace hora
