#include "request_state.h"

#include <algorithm>

#include "core/check.h"

namespace hora {
namespace {
DLDataType toDLDataType(DataType dt) {
  switch (dt) {
    case DataType::kUint8:
      return {kDLUInt, 8, 1};
    case DataType::kInt8:
      return {kDLInt, 8, 1};
    case DataType::kInt16:
      return {kDLInt, 16, 1};
    case DataType::kInt32:
      return {kDLInt, 32, 1};
    case DataType::kInt64:
      return {kDLInt, 64, 1};
    case DataType::kFloat16:
      return {kDLFloat, 16, 1};
    case DataType::kBfloat16:
      return {kDLBfloat, 16, 1};
    case DataType::kFloat32:
      return {kDLFloat, 32, 1};
    case DataType::kFloat64:
      return {kDLFloat, 64, 1};
    case DataType::kBool:
      return {6 /* kDLBool from DLPack 0.8 */, 8, 1};
    default:
      return {kDLUInt, 8, 1};
  }
}
}  // namespace

Result<void*> RequestState::allocateOutput(const std::vector<int64_t>& shape, DataType dtype,
                                           const Device& device, DeviceMemory* deviceMemory) {
  const size_t bytes = static_cast<size_t>(numElements(shape)) * dataTypeSize(dtype);
  const bool onGpu = device.kind == DeviceKind::kCuda;
  outShape = shape;
  if (dlTypeFromOutput) dlType = toDLDataType(dtype);
  void* data = nullptr;
  if (alloc && onGpu && dlTypeFromOutput)
    // A receive without a buffer: hora_alloc_t cannot be told that the
    // message is in GPU memory, so its memory could be host memory.
    return Status(Code::kNotSupported,
                  "the message is in GPU memory, and options.alloc cannot be told so; receive "
                  "into a CUDA tensor, or without options.alloc for a library-owned output");
  if (alloc) {
    // For a GPU input the callback returns memory on the input's device.
    const int rc =
        alloc(allocUser, static_cast<int32_t>(shape.size()), shape.data(), dlType, bytes, &data);
    if (rc != 0 || (!data && bytes > 0))
      return Status(Code::kSystemError, "the output allocator callback failed (returned " +
                                            std::to_string(rc) + ") for " + std::to_string(bytes) +
                                            " bytes on " + deviceName(device));
  } else if (onGpu) {
    if (!deviceMemory)
      return internalError("no device memory for a library-owned output on " + deviceName(device));
    auto mem = deviceMemory->allocate(bytes, "the library-owned output (" + std::to_string(bytes) +
                                                 " bytes on " + deviceName(device) +
                                                 "; pass options.alloc to allocate it yourself)");
    if (!mem.isOk()) return mem.status();
    ownedDeviceOutput = mem.take();
    data = ownedDeviceOutput.get();
  } else {
    ownedOutput.resize(std::max<size_t>(bytes, 1));
    data = ownedOutput.data();
  }
  outTensor = DLTensor{};
  outTensor.data = data;
  outTensor.device = onGpu ? DLDevice{kDLCUDA, device.index} : DLDevice{kDLCPU, 0};
  outTensor.ndim = static_cast<int32_t>(outShape.size());
  outTensor.dtype = dlType;
  outTensor.shape = outShape.data();
  outTensor.strides = nullptr;
  outTensor.byte_offset = 0;
  hasOutput = true;
  return data;
}

void RequestState::completeEntry(const Status& s) {
  hora_callback_t cb = nullptr;
  Status final;
  {
    std::lock_guard<std::mutex> lk(mu);
    if (!s.isOk() && status.isOk()) status = s;
    HORA_CHECK(remaining > 0) << "an entry of a completed request completed again";
    if (--remaining > 0) return;
    resultsReady = true;
    final = status;
    cb = callback;
    if (!cb) {
      done = true;
      finished.store(true, std::memory_order_release);
    }
  }
  // The callback runs before waiters wake, so a caller that frees the request
  // right after hora_wait cannot race it; results are readable inside it.
  if (cb) {
    {
      std::lock_guard<std::recursive_mutex> lk(cbMu);
      if (handle) cb(callbackUser, handle, static_cast<hora_status_t>(final.code()));
    }
    std::lock_guard<std::mutex> lk(mu);
    done = true;
    finished.store(true, std::memory_order_release);
  }
  cv.notify_all();
}

void RequestState::releaseOutputsIfDone() {
  std::shared_ptr<void> device;
  std::vector<char> host;
  {
    std::lock_guard<std::mutex> lk(mu);
    // Not done: the executor may still write the output; it goes with the
    // last reference instead.
    if (!done) return;
    device.swap(ownedDeviceOutput);
    host.swap(ownedOutput);
    hasOutput = false;
    outTensor = DLTensor{};
  }
}

}  // namespace hora
