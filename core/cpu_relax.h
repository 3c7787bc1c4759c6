// cpuRelax(): the spin-wait hint for threads that poll shared memory (the
// shared-memory allreduce, a point-to-point waiter). It lets the sibling
// hyperthread run and keeps the poll from flooding the memory system; it is
// no system call and does not give up the core.
#pragma once

namespace hora {

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace hora
