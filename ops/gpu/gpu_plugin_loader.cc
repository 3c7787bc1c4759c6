#include "ops/gpu/gpu_plugin_loader.h"

#include <dlfcn.h>

#include <vector>

namespace hora {
namespace {

// The directory libhora itself was loaded from.
std::string ownDirectory() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&ownDirectory), &info) == 0 || !info.dli_fname) return "";
  std::string p = info.dli_fname;
  size_t slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

}  // namespace

Result<const hora_gpu_plugin_v1_t*> GpuPlugin::get() {
  std::call_once(once_, [this] { loadError_ = load(); });
  if (!loadError_.isOk()) return loadError_;
  return api_;
}

Status GpuPlugin::load() {
  std::vector<std::string> candidates;
  if (!explicitPath_.empty()) {
    candidates.push_back(explicitPath_);
  } else {
    const std::string dir = ownDirectory();
    if (!dir.empty()) {
      candidates.push_back(dir + "/libhora_cuda.so");
      candidates.push_back(dir + "/../../ops/cuda/libhora_cuda.so");  // build tree
    }
    candidates.push_back("libhora_cuda.so");
  }
  std::string tried;
  for (const auto& c : candidates) {
    // RTLD_LOCAL: the plugin's CUDA/NCCL symbols stay out of the global namespace.
    void* h = ::dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* err = ::dlerror();
      tried += "\n  " + c + ": " + (err ? err : "not loadable");
      continue;
    }
    auto getter = reinterpret_cast<hora_gpu_plugin_get_fn>(::dlsym(h, HORA_GPU_PLUGIN_ENTRY));
    if (!getter) {
      tried += "\n  " + c + ": no symbol " HORA_GPU_PLUGIN_ENTRY " (not a hora GPU plugin)";
      continue;
    }
    const hora_gpu_plugin_v1_t* api = getter(HORA_GPU_PLUGIN_ABI_VERSION);
    if (!api || api->abi_version != HORA_GPU_PLUGIN_ABI_VERSION ||
        api->struct_size < HORA_GPU_PLUGIN_V1_MIN_SIZE) {
      tried += "\n  " + c + ": does not speak GPU plugin ABI v" +
               std::to_string(HORA_GPU_PLUGIN_ABI_VERSION) + " (a different hora version?)";
      continue;
    }
    api_ = api;
    path_ = c;
    return Status::ok();
  }
  return Status(Code::kNotSupported,
                "GPU tensors need hora's GPU plugin (libhora_cuda.so, CUDA + NCCL), which could "
                "not be loaded; tried:" +
                    tried +
                    "\nBuild hora with CUDA (cmake -DHORA_WITH_CUDA=ON; needs nvcc and NCCL), set "
                    "HORA_GPU_PLUGIN=/path/to/libhora_cuda.so, or copy the tensor to the CPU");
}

Result<int> GpuPlugin::deviceCount() {
  auto api = get();
  if (!api.isOk()) return api.status();
  std::call_once(countOnce_, [this] {
    Status s = check(api_->device_count(&devices_), "device_count", "");
    if (!s.isOk())
      countError_ =
          Status(Code::kNotSupported, "no usable GPU (the GPU plugin " + path_ + " loaded, but " +
                                          s.message().substr(2) + "); copy the tensor to the CPU");
  });
  if (!countError_.isOk()) return countError_;
  return devices_;
}

Status GpuPlugin::check(int rc, const char* fn, const std::string& what) const {
  if (rc == 0) return Status::ok();
  const char* err = api_ && api_->last_error ? api_->last_error() : nullptr;
  return Status(Code::kBackendError,
                what + ": " + fn + " failed: " + (err && *err ? err : "no detail from the plugin"));
}

}  // namespace hora
