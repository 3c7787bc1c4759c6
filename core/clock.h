// The clock and duration types every thread of the runtime shares: timeouts,
// deadlines and periods are std::chrono values, not doubles with the unit in
// a name. Parameters arrive as numbers (HORA_PEER_TIMEOUT_S=30) and become
// durations once, where the runtime reads them.
#pragma once

#include <chrono>

namespace hora {

using Clock = std::chrono::steady_clock;
// Seconds with a fraction: the unit of every *_S parameter.
using Seconds = std::chrono::duration<double>;

// Rounds down to whole milliseconds (what socket and Gloo timeouts take).
template <typename Rep, typename Period>
std::chrono::milliseconds toMillis(std::chrono::duration<Rep, Period> d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d);
}

}  // namespace hora
