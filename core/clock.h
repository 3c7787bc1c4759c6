// The clock and duration types every thread of the runtime shares: timeouts,
// deadlines and periods are std::chrono values, not doubles with the unit in
// a name. Parameters arrive as numbers (HORA_PEER_TIMEOUT_S=30) and become
// durations once, where the runtime reads them.
#pragma once

#include <time.h>

#include <chrono>

namespace hora {

using Clock = std::chrono::steady_clock;
// Seconds with a fraction: the unit of every *_S parameter.
using Seconds = std::chrono::duration<double>;

// Clock::now() at the kernel tick's resolution (a few milliseconds), for
// time stamps on a hot path that only stall checks compare: it reads no
// hardware clock (about a fifth of the cost here). CLOCK_MONOTONIC is
// steady_clock's base on Linux, so the two compare.
inline Clock::time_point coarseNow() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(
      std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec)));
}

// Rounds down to whole milliseconds (what socket and Gloo timeouts take).
template <typename Rep, typename Period>
std::chrono::milliseconds toMillis(std::chrono::duration<Rep, Period> d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d);
}

}  // namespace hora
