// The mock GPU plugin's test hooks (tests/gpu/mock/mock_gpu_plugin.cc), for
// the multi-rank tests that run libhora against it: dlopen of the same path
// yields the instance libhora loads (or will load), so both see one set of
// counters. Also CUDA-described tensors over host memory, which is what the
// mock's "device" memory is. Any thread.
#pragma once

#include <dlfcn.h>

#include <cstdint>
#include <vector>

#include "hora/hora.h"
#include "rank_harness.h"
#include "tensor_util.h"

namespace htest {

template <typename Fn>
Fn mockHook(const char* name) {
  void* h = ::dlopen(HORA_GPU_MOCK_PATH, RTLD_NOW | RTLD_LOCAL);
  return h ? reinterpret_cast<Fn>(::dlsym(h, name)) : nullptr;  // stays loaded, like libhora's
}

// How often the named plugin function was called.
inline long mockCalls(const char* fn) {
  auto f = mockHook<long (*)(const char*)>("hora_gpu_mock_calls");
  return f ? f(fn) : -1;
}
// The mock's call order: how many plugin calls so far, and where the last
// wait on an external event came.
inline long mockSeq() {
  auto f = mockHook<long (*)()>("hora_gpu_mock_seq");
  return f ? f() : -1;
}
inline long mockEventWaitSeq(const void* ev) {
  auto f = mockHook<long (*)(const void*)>("hora_gpu_mock_event_wait_seq");
  return f ? f(ev) : -1;
}
// While held, no event completes (GPU work still running); released, the
// events report what their streams finished.
inline void mockHoldEvents(bool hold) {
  if (auto f = mockHook<void (*)(int)>("hora_gpu_mock_hold_events")) f(hold ? 1 : 0);
}

inline DLTensor cudaTensor(void* data, DLDataType dt, std::vector<int64_t>* shape, int device = 0) {
  DLTensor t = makeTensor(data, dt, shape);
  t.device.device_type = kDLCUDA;
  t.device.device_id = device;
  return t;
}

}  // namespace htest
