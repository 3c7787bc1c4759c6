#include "dump_signal.h"

#include <signal.h>

#include <mutex>

namespace hora {

namespace {

std::atomic<uint64_t> gDumpRequests{0};

extern "C" void onDumpSignal(int) { gDumpRequests.fetch_add(1, std::memory_order_relaxed); }

}  // namespace

const std::atomic<uint64_t>* dumpSignalCounter() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction old {};
    if (sigaction(SIGUSR1, nullptr, &old) != 0 || old.sa_handler != SIG_DFL ||
        (old.sa_flags & SA_SIGINFO))
      return;
    struct sigaction sa {};
    sa.sa_handler = onDumpSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, nullptr);
  });
  return &gDumpRequests;
}

}  // namespace hora
