// SIGUSR1 -> flight recorder dumps. A signal is process-wide by nature, so
// this is the one piece of process-wide state hora keeps, and it lives in the
// C layer: the handler only increments a counter; each process set's control
// thread notices the change on its telemetry tick (every 100 ms) and writes
// its dump there, where allocating and writing files is safe.
//
// Called by Runtime creation (framework thread); thread-safe.
#pragma once

#include <atomic>
#include <cstdint>

namespace hora {

// Installs the handler the first time (only if SIGUSR1 still has its default
// action: a framework's or the user's own handler is left alone, and then the
// counter never moves) and returns the counter.
const std::atomic<uint64_t>* dumpSignalCounter();

}  // namespace hora
