// Checks of tensor arguments for the C entry points (c_api.cc): DLPack dtype,
// layout, device and reduce options become a TensorInfo or a message naming
// the argument, the op, the tensor and the rank. Framework thread.
#include <cstdint>
#include <string>

#include "c_api_internal.h"
#include "process_set.h"

namespace hora::capi {

namespace {
// kDLBool (6) exists from DLPack 0.8 on; Debian ships 0.6.
constexpr uint8_t kDLPackBoolCode = 6;
}  // namespace

bool mapDType(DLDataType t, hora::DataType* out) {
  if (t.lanes != 1) return false;
  using hora::DataType;
  switch (t.code) {
    case kDLUInt:
      if (t.bits == 8) return *out = DataType::kUint8, true;
      return false;
    case kDLInt:
      if (t.bits == 8) return *out = DataType::kInt8, true;
      if (t.bits == 16) return *out = DataType::kInt16, true;
      if (t.bits == 32) return *out = DataType::kInt32, true;
      if (t.bits == 64) return *out = DataType::kInt64, true;
      return false;
    case kDLFloat:
      if (t.bits == 16) return *out = DataType::kFloat16, true;
      if (t.bits == 32) return *out = DataType::kFloat32, true;
      if (t.bits == 64) return *out = DataType::kFloat64, true;
      return false;
    case kDLBfloat:
      if (t.bits == 16) return *out = DataType::kBfloat16, true;
      return false;
    default:
      // kDLBool (6) exists from DLPack 0.8 on; Debian ships 0.6, so compare the value.
      if (t.code == kDLPackBoolCode && t.bits == 8) return *out = DataType::kBool, true;
      return false;
  }
}

// GPU tensors: a loadable plugin, a device that exists, and input and output
// on the same device.
Status checkDevice(hora::ProcessSet& set, hora::CollectiveKind kind, const TensorInfo& in,
                   const TensorInfo* out, const std::string& where) {
  if (out && out->device != in.device)
    return hora::invalidArgument(where + ": input is on " + hora::deviceName(in.device) +
                                 " but output on " + hora::deviceName(out->device));
  if (in.device.kind != hora::DeviceKind::kCuda) return Status::ok();
  auto devices = set.gpuPlugin()->deviceCount();
  if (!devices.isOk()) return devices.status().withContext(where);
  if (in.device.index < 0 || in.device.index >= devices.value())
    return hora::invalidArgument(where + " is on " + hora::deviceName(in.device) + " but " +
                                 std::to_string(devices.value()) + " GPU(s) are visible");
  return Status::ok();
}

// `where` = "allreduce "name" on rank 3, argument in"
Status checkTensor(const DLTensor* t, const std::string& where, TensorInfo* out) {
  if (!t) return hora::invalidArgument(where + " is NULL");
  out->device = hora::Device{};
  if (t->device.device_type == kDLCUDA) {
    out->device = hora::Device{hora::DeviceKind::kCuda, t->device.device_id};
  } else if (t->device.device_type != kDLCPU && t->device.device_type != kDLCUDAHost) {
    return Status(Code::kNotSupported,
                  where + " is in memory hora cannot serve (DLPack device type " +
                      std::to_string(t->device.device_type) +
                      "); supported: CPU, CUDA host (pinned) and CUDA device memory");
  }
  if (!mapDType(t->dtype, &out->dtype))
    return hora::invalidArgument(
        where + " has unsupported DLPack dtype (code " + std::to_string(t->dtype.code) + ", bits " +
        std::to_string(t->dtype.bits) + ", lanes " + std::to_string(t->dtype.lanes) +
        "); supported: uint8, int8/16/32/64, float16/32/64, bfloat16, bool");
  if (t->ndim < 0 || t->ndim > 32)
    return hora::invalidArgument(where + " has invalid ndim " + std::to_string(t->ndim));
  if (t->ndim > 0 && !t->shape)
    return hora::invalidArgument(where + " has ndim > 0 but a NULL shape");
  out->shape.assign(t->shape, t->shape + t->ndim);
  // Before anything multiplies the dimensions or reads the data: a shape whose size overflows
  // would wrap to a small or negative count and make the data planes read the wrong memory.
  if (int dim = hora::shapeOverflowDim(out->shape, hora::dataTypeSize(out->dtype)); dim >= 0) {
    const std::string shape = hora::describeTensor(out->dtype, out->shape);
    if (out->shape[dim] < 0)
      return hora::invalidArgument(where + " " + shape + " has a negative dimension " +
                                   std::to_string(dim) + " (" + std::to_string(out->shape[dim]) +
                                   "); check the DLTensor's shape");
    return hora::invalidArgument(
        where + " " + shape + " is too large: at dimension " + std::to_string(dim) + " (" +
        std::to_string(out->shape[dim]) + ") its size passes 2^63-1 bytes, so its element " +
        "count or byte size would overflow; the shape is corrupt (check the DLTensor's shape " +
        "and ndim) or the tensor must be split into smaller ones");
  }
  int64_t n = 1;
  for (int64_t d : out->shape) n *= d;  // cannot overflow: checked above
  out->count = n;
  if (t->strides &&
      n > 0) {  // empty tensors have no layout to check (torch exports odd strides for them)
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; --i) {
      if (t->shape[i] != 1 && t->strides[i] != expect)
        return hora::invalidArgument(
            where +
            " is not contiguous (strides do not describe a compact row-major "
            "layout); make it contiguous first (e.g. tensor.contiguous())");
      expect *= t->shape[i];
    }
  }
  if (!t->data && n > 0) return hora::invalidArgument(where + " has a NULL data pointer");
  // An empty tensor may come with NULL data and any byte_offset: no pointer
  // arithmetic on NULL (undefined behaviour; found by fuzz_capi under UBSan).
  out->data = t->data ? static_cast<char*>(t->data) + t->byte_offset : nullptr;
  // Elements must sit at their type's alignment: the reductions and scaling
  // access them as typed values (misaligned, undefined behaviour; found by
  // fuzz_capi under UBSan with a float tensor at byte_offset 3).
  const size_t align = hora::dataTypeSize(out->dtype);
  if (n > 0 && align > 1 && reinterpret_cast<uintptr_t>(out->data) % align != 0)
    return hora::invalidArgument(where + " starts at an address (data + byte_offset = " +
                                 std::to_string(reinterpret_cast<uintptr_t>(out->data)) +
                                 ") that is not a multiple of its element size " +
                                 std::to_string(align) +
                                 "; copy it into an aligned buffer (e.g. numpy.ascontiguousarray)");
  return Status::ok();
}

Status checkOp(const hora_options_t& o, hora::DataType dt, const std::string& where, bool scatter) {
  if (o.op < 0 || o.op >= static_cast<int32_t>(hora::ReduceOp::kCount))
    return hora::invalidArgument(where + ": unknown reduce op " + std::to_string(o.op));
  auto op = static_cast<hora::ReduceOp>(o.op);
  if (scatter && op != hora::ReduceOp::kSum && op != hora::ReduceOp::kAverage)
    return hora::invalidArgument(where + ": reducescatter supports sum and average only");
  if (!hora::reduceOpSupported(op, dt))
    return hora::invalidArgument(where + ": op " + hora::reduceOpName(op) + " is not defined for " +
                                 hora::dataTypeName(dt));
  if (!(o.prescale == o.prescale) || !(o.postscale == o.postscale))
    return hora::invalidArgument(where + ": prescale/postscale is NaN");
  if ((o.prescale != 1.0 || o.postscale != 1.0) && dt == hora::DataType::kBool)
    return hora::invalidArgument(where + ": scale factors are not defined for bool tensors");
  return Status::ok();
}

Status checkShapedInput(ProcessSet& set, CollectiveKind kind, const DLTensor* in,
                        const std::string& where, const char* scalarMessage,
                        const hora_options_t* reduce, TensorInfo* ti) {
  HORA_RETURN_IF_ERROR(checkTensor(in, where + ", input", ti));
  if (ti->shape.empty()) return invalidArgument(where + ": " + scalarMessage);
  if (reduce) HORA_RETURN_IF_ERROR(checkOp(*reduce, ti->dtype, where, true));
  return checkDevice(set, kind, *ti, nullptr, where);
}

Status checkAllreduceArgs(ProcessSet& set, const DLTensor* in, const DLTensor* out,
                          const hora_options_t& o, const std::string& where, TensorInfo* ti,
                          TensorInfo* to) {
  HORA_RETURN_IF_ERROR(checkTensor(in, where + ", input", ti));
  HORA_RETURN_IF_ERROR(checkTensor(out, where + ", output", to));
  // The same shape, not only the same element count (Horovod's rule, docs/errors.md): an
  // output of another shape is almost always a bug in the caller.
  if (ti->dtype != to->dtype || ti->shape != to->shape)
    return invalidArgument(where + ": output " + describeTensor(to->dtype, to->shape) +
                           " does not match input " + describeTensor(ti->dtype, ti->shape) +
                           "; the output must have the input's dtype and shape");
  HORA_RETURN_IF_ERROR(checkOp(o, ti->dtype, where, false));
  return checkDevice(set, CollectiveKind::kAllreduce, *ti, to, where);
}

}  // namespace hora::capi
