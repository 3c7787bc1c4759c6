// Where the shared sweeps (sweep_support.cc) put the tensors they describe as
// device memory, and how they read results back.
//
// Default: host memory, for kDLCPU and for kDLCUDA under the mock GPU plugin
// (whose "device" memory is host memory). The real-GPU suite
// (tests/gpu/gpu_runtime_test.cc) installs CUDA managed memory, which the host
// writes before submitting and reads once hora completed the request (hora
// synchronizes its stream first), and a device-to-host copy for
// library-owned outputs (plain device memory from the plugin).
// Set once, before any rank thread starts; read-only afterwards.
#pragma once

#include <hora/hora.h>

#include <cstddef>
#include <memory>
#include <vector>

namespace htest {

struct DeviceMemory {
  void* (*alloc)(size_t bytes) = nullptr;
  void (*release)(void* p) = nullptr;
  void (*toHost)(void* dst, const void* src, size_t bytes) = nullptr;
};
void setDeviceMemory(const DeviceMemory& m);

// `bytes` (at least 1) of memory for a tensor described as `device`.
class TestBuffer {
 public:
  TestBuffer(size_t bytes, DLDeviceType device);
  char* data() const { return p_.get(); }

 private:
  std::shared_ptr<char> p_;
};

// A result's bytes, on the host.
std::vector<char> outputBytes(const DLTensor* out);

}  // namespace htest
