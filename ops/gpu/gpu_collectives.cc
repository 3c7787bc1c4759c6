// GpuPath, part 2: the collectives on GPU memory (allreduce single, fused and
// grouped; broadcast; allgather, alltoall and reducescatter, whose output is
// allocated after negotiation on the input's device). See gpu_path.h for the
// two ways (communicator, staging) and gpu_path.cc for the resources.
// Fused tensors are packed into one persistent device buffer and unpacked
// from it by the plugin's batched copy (one launch for all tensors, scale
// factors applied in the same pass).
#include <algorithm>
#include <numeric>

#include "core/reduce.h"
#include "core/response_counts.h"
#include "ops/gpu/gpu_path.h"

namespace hora {

namespace {

std::string describe(const char* op, const Response& r, const Device& dev) {
  return std::string(op) + " \"" + r.name + "\" (" + deviceName(dev) + ")";
}

}  // namespace

Status GpuPath::begin(const char* op, const Response& r, TensorEntry* e, std::string* what) {
  const Device dev = e ? e->request.device : localDevice(r, {});
  *what = describe(op, r, dev);
  HORA_RETURN_IF_ERROR(prepare(dev, *what));
  return afterReady(e, *what);
}

Status GpuPath::allreduce(const std::vector<Response>& group, const std::vector<EntryPtr>& es) {
  const Response& r0 = group.front();
  const Reduction x = reductionOf(r0, ctx_.size());
  const DataType dt = x.dtype;
  const size_t esz = x.elementSize;
  const Device dev = localDevice(r0, es);
  const std::string what =
      describe("allreduce", r0, dev) +
      (group.size() > 1 ? " (fused with " + std::to_string(group.size() - 1) + " more)" : "");
  HORA_RETURN_IF_ERROR(prepare(dev, what));
  bool viaComm = false;
  HORA_RETURN_IF_ERROR(choosePath(ncclHasType(dt), what, &viaComm));
  for (auto& e : es) HORA_RETURN_IF_ERROR(afterReady(e.get(), what));

  auto offsets = fusedOffsets(group);
  if (!offsets.isOk()) return offsets.status();
  const std::vector<size_t> start = offsets.take();
  const size_t total = start.back();
  const size_t bytes = total * esz;
  if (total == 0) return Status::ok();
  if (viaComm) return allreduceViaComm(group, es, x, start, what);
  const auto dtc = static_cast<int32_t>(dt);
  GpuPlugin& plug = *plugin();

  // Where the reduction happens: a single tensor in its own output, a fused
  // group (or a joined rank's stand-in) in the set's device fusion buffer.
  const bool inOutput = group.size() == 1 && es[0];
  char* buf;
  if (inOutput) {
    buf = static_cast<char*>(es[0]->out);
    if (es[0]->in != es[0]->out || x.pre != 1.0) {
      hora_gpu_copy_t c{buf, es[0]->in, total};
      HORA_GPU_CALL(plug, api_, what, batched_scale_copy, dtc, &c, 1, x.pre, stream_);
    }
  } else {
    HORA_RETURN_IF_ERROR(fusion(bytes, what));
    buf = fusion_;
    std::vector<hora_gpu_copy_t> copies;
    bool joinedHere = false;
    for (size_t i = 0; i < group.size(); ++i) {
      if (es[i]) {
        copies.push_back({buf + start[i] * esz, es[i]->in, start[i + 1] - start[i]});
      } else {
        joinedHere = true;
      }
    }
    if (joinedHere) {  // this rank joined: the op's identity, through pinned memory
      HORA_RETURN_IF_ERROR(pinned(bytes, what));
      for (size_t i = 0; i < group.size(); ++i) {
        if (es[i]) continue;
        const size_t off = start[i] * esz, n = start[i + 1] - start[i];
        fillIdentity(dt, x.op, pinned_ + off, n);
        HORA_GPU_CALL(plug, api_, what, memcpy_async, buf + off, pinned_ + off, n * esz, stream_);
      }
    }
    if (!copies.empty())
      HORA_RETURN_IF_ERROR(
          plug.check(api_->batched_scale_copy(dtc, copies.data(), copies.size(), x.pre, stream_),
                     "batched_scale_copy (pack)", what));
  }

  // Staged: device -> pinned host -> the CPU data plane -> device.
  HORA_RETURN_IF_ERROR(pinned(bytes, what));
  HORA_GPU_CALL(plug, api_, what, memcpy_async, pinned_, buf, bytes, stream_);
  HORA_RETURN_IF_ERROR(wait(what));
  Status s = ctx_.backend->allreduce(pinned_, total, dt, x.op);
  if (!s.isOk()) return dataPlaneFailure(ctx_, s, what);
  HORA_GPU_CALL(plug, api_, what, memcpy_async, buf, pinned_, bytes, stream_);

  if (inOutput) {
    if (x.post != 1.0) {
      hora_gpu_copy_t c{buf, buf, total};
      HORA_GPU_CALL(plug, api_, what, batched_scale_copy, dtc, &c, 1, x.post, stream_);
    }
  } else {
    std::vector<hora_gpu_copy_t> copies;
    for (size_t i = 0; i < group.size(); ++i)
      if (es[i]) copies.push_back({es[i]->out, buf + start[i] * esz, start[i + 1] - start[i]});
    if (!copies.empty())
      HORA_RETURN_IF_ERROR(
          plug.check(api_->batched_scale_copy(dtc, copies.data(), copies.size(), x.post, stream_),
                     "batched_scale_copy (unpack)", what));
  }
  return finish(what);
}

Status GpuPath::allreduceViaComm(const std::vector<Response>& group,
                                 const std::vector<EntryPtr>& es, const Reduction& x,
                                 const std::vector<size_t>& start, const std::string& what) {
  const size_t esz = x.elementSize;
  const auto dtc = static_cast<int32_t>(x.dtype);
  const auto op = static_cast<int32_t>(x.op);
  GpuPlugin& plug = *plugin();
  // Which tensors the communicator reduces one by one, in their own output:
  // a group of one, and in a fused group each tensor of kGpuDirectBytes or
  // more, for which packing into the fusion buffer and unpacking again (two
  // device copies) costs more than a launch of its own. Decided from the
  // responses alone, so every rank makes the same calls in the same order.
  // The others are packed and reduced together in the fusion buffer; so is a
  // joined rank's stand-in (the op's identity) for any of them.
  const size_t n = group.size();
  std::vector<char> direct(n);
  std::vector<size_t> at(n);  // element offset in the fusion buffer (packed or stand-in)
  size_t packed = 0;          // elements packed together, first in the buffer
  for (size_t i = 0; i < n; ++i) {
    const size_t count = start[i + 1] - start[i];
    direct[i] = n == 1 || count * esz >= kGpuDirectBytes;
    if (!direct[i]) at[i] = packed, packed += count;
  }
  size_t standIns = packed;  // joined stand-ins of direct tensors follow
  for (size_t i = 0; i < n; ++i)
    if (direct[i] && !es[i]) at[i] = standIns, standIns += start[i + 1] - start[i];
  char* buf = nullptr;
  if (standIns > 0) {
    HORA_RETURN_IF_ERROR(fusion(standIns * esz, what));
    buf = fusion_;
  }

  // A joined rank contributes the op's identity, through pinned memory.
  bool joinedHere = false;
  for (size_t i = 0; i < n; ++i) joinedHere = joinedHere || !es[i];
  if (joinedHere) {
    HORA_RETURN_IF_ERROR(pinned(standIns * esz, what));
    for (size_t i = 0; i < n; ++i) {
      if (es[i]) continue;
      const size_t off = at[i] * esz, count = start[i + 1] - start[i];
      fillIdentity(x.dtype, x.op, pinned_ + off, count);
      HORA_GPU_CALL(plug, api_, what, memcpy_async, buf + off, pinned_ + off, count * esz, stream_);
    }
  }
  std::vector<hora_gpu_copy_t> pack, prescaled, unpack, postscaled;
  for (size_t i = 0; i < n; ++i) {
    if (!es[i]) continue;
    const size_t count = start[i + 1] - start[i];
    char* out = static_cast<char*>(es[i]->out);
    if (!direct[i]) {
      pack.push_back({buf + at[i] * esz, es[i]->in, count});
      unpack.push_back({out, buf + at[i] * esz, count});
      continue;
    }
    // Reduced from its input into its output (out of place), unless a
    // prescale must first be applied: then scaled into the output and
    // reduced there.
    if (x.pre != 1.0) prescaled.push_back({out, es[i]->in, count});
    if (x.post != 1.0) postscaled.push_back({out, out, count});
  }
  // One launch for each kind of copy, skipped when there is none.
  auto copy = [&](const std::vector<hora_gpu_copy_t>& v, double scale, const char* call) {
    if (v.empty()) return Status::ok();
    return plug.check(api_->batched_scale_copy(dtc, v.data(), v.size(), scale, stream_), call,
                      what);
  };
  HORA_RETURN_IF_ERROR(copy(pack, x.pre, "batched_scale_copy (pack)"));
  HORA_RETURN_IF_ERROR(copy(prescaled, x.pre, "batched_scale_copy (prescale)"));
  for (size_t i = 0; i < n; ++i) {
    if (!direct[i]) continue;
    const size_t count = start[i + 1] - start[i];
    if (!es[i]) {
      char* p = buf + at[i] * esz;
      HORA_GPU_CALL(plug, api_, what, allreduce, p, p, count, dtc, op, comm_, stream_);
      continue;
    }
    const void* in = x.pre != 1.0 ? es[i]->out : es[i]->in;
    HORA_GPU_CALL(plug, api_, what, allreduce, in, es[i]->out, count, dtc, op, comm_, stream_);
  }
  if (packed > 0)
    HORA_GPU_CALL(plug, api_, what, allreduce, buf, buf, packed, dtc, op, comm_, stream_);
  HORA_RETURN_IF_ERROR(copy(unpack, x.post, "batched_scale_copy (unpack)"));
  HORA_RETURN_IF_ERROR(copy(postscaled, x.post, "batched_scale_copy (postscale)"));
  return finish(what);
}

Status GpuPath::broadcast(const Response& r, TensorEntry* e) {
  const size_t n = static_cast<size_t>(r.numElements());
  const size_t bytes = n * dataTypeSize(r.dtype);
  std::string what;
  HORA_RETURN_IF_ERROR(begin("broadcast", r, e, &what));
  if (n == 0) return Status::ok();
  GpuPlugin& plug = *plugin();
  char* data = e ? static_cast<char*>(e->out) : nullptr;
  if (!data) {  // joined: a stand-in buffer
    HORA_RETURN_IF_ERROR(fusion(bytes, what));
    data = fusion_;
  }
  if (e && e->in != e->out)
    HORA_GPU_CALL(plug, api_, what, memcpy_async, data, e->in, bytes, stream_);
  // Broadcast moves bytes: NCCL's uint8 serves every dtype.
  bool viaComm = false;
  HORA_RETURN_IF_ERROR(choosePath(true, what, &viaComm));
  if (viaComm) {
    HORA_GPU_CALL(plug, api_, what, broadcast, data, bytes, static_cast<int32_t>(DataType::kUint8),
                  r.root, comm_, stream_);
  } else {
    HORA_RETURN_IF_ERROR(pinned(bytes, what));
    HORA_GPU_CALL(plug, api_, what, memcpy_async, pinned_, data, bytes, stream_);
    HORA_RETURN_IF_ERROR(wait(what));
    Status s = ctx_.backend->broadcast(pinned_, n, r.dtype, r.root);
    if (!s.isOk()) return dataPlaneFailure(ctx_, s, what);
    HORA_GPU_CALL(plug, api_, what, memcpy_async, data, pinned_, bytes, stream_);
  }
  return finish(what);
}

Status GpuPath::output(TensorEntry* e, const std::vector<int64_t>& shape, size_t bytes,
                       bool viaComm, const std::string& what, char** out, Status* outputLost) {
  *out = nullptr;
  if (e) {
    auto o = allocateOutput(e, shape, e->request.dtype, what);
    if (o.isOk()) {
      *out = static_cast<char*>(o.value());
      return Status::ok();
    }
    *outputLost = o.status().withContext(what);
  }
  // Joined, or the output could not be allocated. Staging needs no device
  // buffer to take part; the communicator writes somewhere on the device:
  // the fusion buffer (if that allocation fails too, the set breaks).
  if (!viaComm || bytes == 0) return Status::ok();
  HORA_RETURN_IF_ERROR(fusion(bytes, what));
  *out = fusion_;
  return Status::ok();
}

Status GpuPath::staged(const void* in, size_t inBytes, char* out, size_t outBytes,
                       const std::function<Status(char* in, char* out)>& run,
                       const std::string& what) {
  GpuPlugin& plug = *plugin();
  // Pinned: [this rank's input | its output].
  HORA_RETURN_IF_ERROR(pinned(inBytes + outBytes, what));
  if (inBytes) HORA_GPU_CALL(plug, api_, what, memcpy_async, pinned_, in, inBytes, stream_);
  HORA_RETURN_IF_ERROR(wait(what));
  Status s = run(pinned_, pinned_ + inBytes);
  if (!s.isOk()) return dataPlaneFailure(ctx_, s, what);
  if (!out || outBytes == 0) return Status::ok();  // joined, or no output: taking part was all
  HORA_GPU_CALL(plug, api_, what, memcpy_async, out, pinned_ + inBytes, outBytes, stream_);
  return wait(what);
}

Status GpuPath::allgather(const Response& r, TensorEntry* e, Status* outputLost) {
  std::string what;
  HORA_RETURN_IF_ERROR(begin("allgather", r, e, &what));
  const DataType dt = r.dtype;
  const size_t esz = dataTypeSize(dt);
  const std::vector<size_t> counts = allgatherCounts(r, ctx_.size());
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  const size_t inBytes = counts[ctx_.rank] * esz, outBytes = total * esz;

  // total is the same on every rank: all skip an empty gather together.
  const std::vector<int64_t>& outShape = r.shape;  // the response carries the gathered shape
  bool viaComm = false;  // these move bytes: the communicator serves every dtype
  if (total > 0) HORA_RETURN_IF_ERROR(choosePath(true, what, &viaComm));
  char* out = nullptr;
  HORA_RETURN_IF_ERROR(output(e, outShape, outBytes, viaComm, what, &out, outputLost));
  if (total == 0) return Status::ok();
  const void* in = e ? e->in : nullptr;

  if (viaComm) {
    std::vector<size_t> bytes(counts.size());
    for (size_t i = 0; i < counts.size(); ++i) bytes[i] = counts[i] * esz;
    HORA_GPU_CALL(*plugin(), api_, what, allgatherv, in, out, bytes.data(),
                  static_cast<int32_t>(DataType::kUint8), comm_, stream_);
    return finish(what);
  }
  return staged(
      in, inBytes, out, outBytes,
      [&](char* pin, char* pout) { return ctx_.backend->allgatherv(pin, pout, counts, dt); }, what);
}

Status GpuPath::alltoall(const Response& r, TensorEntry* e, Status* outputLost) {
  std::string what;
  HORA_RETURN_IF_ERROR(begin("alltoall", r, e, &what));
  const DataType dt = r.dtype;
  const size_t esz = dataTypeSize(dt);
  const int n = ctx_.size();
  const AlltoallCounts c = alltoallCounts(r, ctx_.rank, n);
  const size_t inBytes = std::accumulate(c.send.begin(), c.send.end(), int64_t{0}) * esz;
  const size_t outBytes = std::accumulate(c.recv.begin(), c.recv.end(), int64_t{0}) * esz;

  std::vector<int64_t> outShape = r.shape;
  outShape[0] = c.outRows;
  if (e) e->sink->setReceivedSplits(c.recvRows);
  // No early return when this rank sends and receives nothing: its peers are
  // in the collective (Gloo needs every rank; the first GPU group also
  // creates the communicator on every rank).
  bool viaComm = false;  // these move bytes: the communicator serves every dtype
  HORA_RETURN_IF_ERROR(choosePath(true, what, &viaComm));
  char* out = nullptr;
  HORA_RETURN_IF_ERROR(output(e, outShape, outBytes, viaComm, what, &out, outputLost));
  const void* in = e ? e->in : nullptr;

  if (viaComm) {
    std::vector<size_t> sendB(n), recvB(n);
    for (int d = 0; d < n; ++d) {
      sendB[d] = static_cast<size_t>(c.send[d]) * esz;
      recvB[d] = static_cast<size_t>(c.recv[d]) * esz;
    }
    HORA_GPU_CALL(*plugin(), api_, what, alltoallv, in, sendB.data(), out, recvB.data(),
                  static_cast<int32_t>(DataType::kUint8), comm_, stream_);
    return finish(what);
  }
  return staged(
      in, inBytes, out, outBytes,
      [&](char* pin, char* pout) { return ctx_.backend->alltoallv(pin, c.send, pout, c.recv, dt); },
      what);
}

Status GpuPath::reducescatter(const Response& r, TensorEntry* e, Status* outputLost) {
  std::string what;
  HORA_RETURN_IF_ERROR(begin("reducescatter", r, e, &what));
  GpuPlugin& plug = *plugin();
  const Reduction x = reductionOf(r, ctx_.size());
  const DataType dt = x.dtype;
  const auto dtc = static_cast<int32_t>(dt);
  const size_t esz = x.elementSize;
  const ScatterCounts c = reducescatterCounts(r, ctx_.rank, ctx_.size());
  const size_t mine = c.counts[ctx_.rank];
  const size_t total = static_cast<size_t>(r.numElements());
  const size_t bytes = total * esz;

  // The whole input, prescaled, in the device fusion buffer; the collective
  // leaves this rank's region reduced there.
  HORA_RETURN_IF_ERROR(fusion(std::max<size_t>(bytes, 1), what));
  char* buf = fusion_;
  if (total > 0) {
    if (e) {
      hora_gpu_copy_t copy{buf, e->in, total};
      HORA_GPU_CALL(plug, api_, what, batched_scale_copy, dtc, &copy, 1, x.pre, stream_);
    } else {  // joined: contribute the op's identity
      HORA_RETURN_IF_ERROR(pinned(bytes, what));
      fillIdentity(dt, x.op, pinned_, total);
      HORA_GPU_CALL(plug, api_, what, memcpy_async, buf, pinned_, bytes, stream_);
    }
    bool viaComm = false;
    HORA_RETURN_IF_ERROR(choosePath(ncclHasType(dt), what, &viaComm));
    if (viaComm) {
      HORA_GPU_CALL(plug, api_, what, reducescatter, buf, c.counts.data(), dtc,
                    static_cast<int32_t>(x.op), comm_, stream_);
    } else {
      HORA_RETURN_IF_ERROR(pinned(bytes, what));
      HORA_GPU_CALL(plug, api_, what, memcpy_async, pinned_, buf, bytes, stream_);
      HORA_RETURN_IF_ERROR(wait(what));
      Status s = ctx_.backend->reducescatter(pinned_, c.counts, dt, x.op);
      if (!s.isOk()) return dataPlaneFailure(ctx_, s, what);
      if (mine)
        HORA_GPU_CALL(plug, api_, what, memcpy_async, buf + c.before * esz,
                      pinned_ + c.before * esz, mine * esz, stream_);
    }
  }
  if (!e) return finish(what);

  std::vector<int64_t> outShape = r.shape;
  if (!outShape.empty()) outShape[0] = c.rows;
  auto o = allocateOutput(e, outShape, dt, what);
  if (!o.isOk()) {
    *outputLost = o.status().withContext(what);
    return finish(what);
  }
  if (mine) {
    hora_gpu_copy_t copy{o.value(), buf + c.before * esz, mine};
    HORA_GPU_CALL(plug, api_, what, batched_scale_copy, dtc, &copy, 1, x.post, stream_);
  }
  return finish(what);
}

}  // namespace hora
