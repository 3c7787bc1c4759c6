// Helpers shared by the tcp ring's two sources: tcp_ring.cc (the
// collectives, on the calling thread) and tcp_ring_setup.cc (connecting the
// ring, on the process set's init thread). Internal to ops/tcp; pure
// functions, any thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "ops/tcp/tcp_ring.h"

namespace hora {
namespace tcp_ring_detail {

using Clock = std::chrono::steady_clock;

inline std::string seconds(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

// A wait in milliseconds for poll(2): at least 1, at most about 12 days.
inline int toMs(std::chrono::milliseconds d) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(d.count(), 1 << 30)));
}

// How errors name ring rank r: the caller's name for it, or "ring rank r".
inline std::string rankName(const TcpRingOptions& o, int r) {
  return r >= 0 && r < static_cast<int>(o.rankNames.size()) ? o.rankNames[r]
                                                            : "ring rank " + std::to_string(r);
}

}  // namespace tcp_ring_detail
}  // namespace hora
