// GpuPlugin (the loader of the GPU plugin): the GPU runtime (CUDA + NCCL), loaded with dlopen on
// first use so libhora links neither; see ops/gpu/hora_gpu_plugin.h for the table's contract and
// ops/cuda for the real plugin.
//
// One per Runtime, shared by its process sets. get() may be called from any
// thread (framework threads validating a GPU tensor, executor threads); the
// first call loads, later calls return the same table or the same error.
// Search order: HORA_GPU_PLUGIN (a path), then libhora_cuda.so next to
// libhora, then in the build tree's ops/cuda/, then the dynamic loader's
// search path. The library is never unloaded: CUDA and NCCL do not survive
// being unloaded while their threads or handles may still exist.
#pragma once

#include <mutex>
#include <string>

#include "core/status.h"
#include "ops/gpu/hora_gpu_plugin.h"

namespace hora {

class GpuPlugin {
 public:
  explicit GpuPlugin(std::string explicitPath) : explicitPath_(std::move(explicitPath)) {}
  // The table, or kNotSupported saying what was tried and what to do.
  Result<const hora_gpu_plugin_v1_t*> get();
  // The number of GPUs the plugin sees, asked once (the enqueue path checks
  // every GPU tensor against it), or kNotSupported when the plugin is
  // missing or no GPU is usable.
  Result<int> deviceCount();
  // rc == 0: OK; otherwise kBackendError "<what>: <fn> failed: <plugin's last_error>".
  Status check(int rc, const char* fn, const std::string& what) const;
  const std::string& path() const { return path_; }

 private:
  Status load();

  const std::string explicitPath_;
  std::once_flag once_;
  Status loadError_;  // written once under once_
  const hora_gpu_plugin_v1_t* api_ = nullptr;
  std::once_flag countOnce_;
  Status countError_;  // written once under countOnce_
  int devices_ = 0;
  std::string path_;
};

}  // namespace hora

// Calls the plugin table's `fn` through `api` and returns from the enclosing
// function on failure with "<what>: <fn> failed: <the plugin's last error>":
//   HORA_GPU_CALL(plugin, api, what, stream_create, device, &stream);
#define HORA_GPU_CALL(plugin, api, what, fn, ...) \
  HORA_RETURN_IF_ERROR((plugin).check((api)->fn(__VA_ARGS__), #fn, (what)))
