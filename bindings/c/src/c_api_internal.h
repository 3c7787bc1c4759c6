// Helpers shared by the C ABI's translation units: the thread-local
// last-error slot and the checks of tensor arguments (c_api_tensor.cc). Used
// only inside libhora, on the calling (framework) thread.
#pragma once

#include <exception>
#include <new>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/types.h"
#include "hora/hora.h"

namespace hora {
class ProcessSet;
}

namespace hora::capi {
hora_status_t setError(hora_status_t status, const std::string& message);
hora_status_t setError(const Status& status);
void clearError();

// Runs `body` (an entry point's work) with every exception turned into a
// status: nothing may cross extern "C".
template <typename F>
hora_status_t guarded(const char* fn, F&& body) {
  clearError();
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return setError(HORA_ERR_SYSTEM, std::string(fn) + ": out of memory");
  } catch (const std::exception& e) {
    return setError(HORA_ERR_INTERNAL, std::string(fn) + ": unexpected exception: " + e.what());
  } catch (...) {
    return setError(HORA_ERR_INTERNAL, std::string(fn) + ": unexpected non-standard exception");
  }
}

inline hora_status_t fail(Code code, const std::string& msg) {
  return setError(static_cast<hora_status_t>(code), msg);
}

// A DLTensor after checkTensor: its hora dtype, shape, first byte, element
// count and device.
struct TensorInfo {
  hora::DataType dtype;
  std::vector<int64_t> shape;
  char* data;
  int64_t count;
  hora::Device device;
};

// DLPack dtype -> hora dtype; false when hora has no such type.
bool mapDType(DLDataType t, hora::DataType* out);
// Layout, dtype, device kind and data pointer of one tensor argument.
// `where` = "allreduce "name" on rank 3, argument in".
Status checkTensor(const DLTensor* t, const std::string& where, TensorInfo* out);
// GPU tensors: the collectives that serve them, a loadable plugin, a device
// that exists, and input and output on the same device.
Status checkDevice(ProcessSet& set, CollectiveKind kind, const TensorInfo& in,
                   const TensorInfo* out, const std::string& where);
// Reduce op, scale factors and their validity for the dtype.
Status checkOp(const hora_options_t& o, DataType dt, const std::string& where, bool scatter);
// The input of an allgather, alltoall or reducescatter: the tensor, at least
// one dimension (else "<where>: <scalarMessage>"), for reducescatter
// (`reduce` non-null) the op and scales, and the device.
Status checkShapedInput(ProcessSet& set, CollectiveKind kind, const DLTensor* in,
                        const std::string& where, const char* scalarMessage,
                        const hora_options_t* reduce, TensorInfo* ti);
// Everything about one allreduce input/output pair: both tensors, equal
// dtype and size, the op and scales, the device.
Status checkAllreduceArgs(ProcessSet& set, const DLTensor* in, const DLTensor* out,
                          const hora_options_t& o, const std::string& where, TensorInfo* ti,
                          TensorInfo* to);

// One send or receive of a point-to-point call, as the C ABI received it.
struct P2pArg {
  bool send = true;
  int32_t peer = 0;
  int64_t tag = 0;
  const DLTensor* tensor = nullptr;  // receive: NULL = allocate
};
// Checks every operation, creates the request and posts them all (or none).
hora_status_t submitP2p(const char* fn, ProcessSet& set, const hora_options_t& o, const P2pArg* ops,
                        size_t n, hora_request_t* request);

}  // namespace hora::capi
