// The executor thread's GPU half: the set's GPU resources (stream, event,
// communicator, device fusion buffer, pinned staging), allreduce (single,
// fused, grouped) and broadcast of tensors in GPU memory, through the GPU
// plugin (ops/gpu/hora_gpu_plugin.h); allgather, alltoall and reducescatter
// are in gpu_collectives.cc. See process_set.h for the threading model.
//
// Two paths, chosen per group from what every rank shares (the response and
// HORA_GPU_BACKEND), so all ranks take the same one:
//  - communicator (NCCL): the set's communicator, created at the first GPU
//    group (every rank reaches that group at the same point of the agreed
//    order; the unique id goes through the rendezvous store); data never
//    leaves the device;
//  - staging (Gloo or shm): device -> pinned host, the set's CPU backend,
//    host -> device. For dtypes NCCL lacks (int16, bool), for
//    HORA_GPU_BACKEND=gloo, and where ranks share one GPU.
// Fused tensors are packed into one persistent device buffer per set and
// unpacked from it by the plugin's batched copy (one launch for all tensors,
// scale factors applied in the same pass). Everything runs on the set's own
// stream; completion is an event this thread polls, together with the
// communicator's asynchronous error and the set's broken flag (a lost peer
// aborts the communicator instead of waiting on it).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>

#include "core/host_buffer.h"
#include "core/host_identity.h"
#include "core/reduce.h"
#include "process_set.h"

namespace hora {

bool ncclHasType(DataType dt) { return dt != DataType::kInt16 && dt != DataType::kBool; }

Status ProcessSetImpl::gpuPrepare(const Device& dev, const std::string& what) {
  GpuState& g = gpu_;
  if (!g.api) {
    if (!opts_.gpu) return Status(Code::kNotSupported, what + ": no GPU plugin configured");
    auto api = opts_.gpu->get();
    if (!api.isOk()) return api.status().withContext(what);
    g.api = api.value();
  }
  if (g.device >= 0 && g.device != dev.index)
    return invalidArgument(what +
                           ": this process set already runs on cuda:" + std::to_string(g.device) +
                           "; all GPU tensors of one process set on a "
                           "rank must be on one device (got " +
                           deviceName(dev) + ")");
  if (!g.stream) {
    HORA_RETURN_IF_ERROR(
        opts_.gpu->check(g.api->stream_create(dev.index, &g.stream), "stream_create", what));
    g.device = dev.index;
  }
  if (!g.done)
    HORA_RETURN_IF_ERROR(
        opts_.gpu->check(g.api->event_create(g.device, &g.done), "event_create", what));
  return Status::ok();
}

Device ProcessSetImpl::localDevice(const Response& r,
                                   const std::vector<std::shared_ptr<TensorEntry>>& es) const {
  // The response carries rank 0's device; this rank's tensors may sit on
  // another index (rank i on cuda:i). A rank with no entry (joined) stays on
  // the device it used before, else takes the usual one for its local rank
  // (rank 0's index could be another rank's GPU, which NCCL refuses).
  for (const auto& e : es)
    if (e) return e->request.device;
  if (gpu_.device >= 0) return Device{DeviceKind::kCuda, gpu_.device};
  auto count = opts_.gpu ? opts_.gpu->deviceCount() : Result<int>(0);
  if (count.isOk() && count.value() > 0)
    return Device{DeviceKind::kCuda, opts_.localRank % count.value()};
  return r.device;
}

Status ProcessSetImpl::gpuChoosePath(bool dtypeOk, const std::string& what, bool* viaComm) {
  // Every input here is shared by the ranks (HORA_GPU_BACKEND is checked at
  // set-up, the dtype comes from the response, the sharing verdict is one
  // answer for all), so every rank takes the same path for a group.
  *viaComm = false;
  if (opts_.gpuBackend == "gloo" || !gpu_.api->comm_init || !dtypeOk) return Status::ok();
  HORA_RETURN_IF_ERROR(gpuComm(what));
  *viaComm = gpu_.comm != nullptr;
  return Status::ok();
}

Status ProcessSetImpl::gpuAfterReady(TensorEntry* e, const std::string& what) {
  if (!e || !e->readyEvent) return Status::ok();
  return opts_.gpu->check(gpu_.api->stream_wait_external_event(gpu_.stream, e->readyEvent),
                          "stream_wait_external_event", what);
}

Status ProcessSetImpl::gpuComm(const std::string& what) {
  GpuState& g = gpu_;
  if (g.comm || g.sharedGpu) return Status::ok();
  // A failed creation is final: the ranks may disagree on how far they got,
  // so trying again could pair one rank's second attempt with another's first.
  if (!g.commError.isOk()) return g.commError.withContext(what);
  Status s = createComm(what);
  if (!s.isOk()) g.commError = s;
  return s;
}

Status ProcessSetImpl::gpuSharing(const std::string& what, std::string* verdict) {
  // Set rank 0 gathers every rank's (host, physical GPU) and publishes which
  // ranks share one; the others wait for that answer.
  GpuState& g = gpu_;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(opts_.peerTimeoutS * 1000));
  char bus[64] = {0};
  HORA_RETURN_IF_ERROR(opts_.gpu->check(g.api->device_pci_bus_id(g.device, bus, sizeof(bus)),
                                        "device_pci_bus_id", what));
  const std::string mine = hostIdentity() + " " + bus;
  const std::string prefix = "gpu_sharing/";
  if (rank_ != 0) {
    HORA_RETURN_IF_ERROR(store_->set(prefix + std::to_string(rank_), mine));
    auto v = store_->get(prefix + "verdict", timeout);
    if (!v.isOk()) return v.status().withContext(what + ": waiting for rank 0's GPU sharing check");
    *verdict = v.take();
    return Status::ok();
  }
  std::map<std::string, int> owner;
  owner[mine] = 0;
  for (int r = 1; r < size(); ++r) {
    auto v = store_->get(prefix + std::to_string(r), timeout);
    if (!v.isOk())
      return v.status().withContext(what + ": waiting for rank " + std::to_string(globalRank(r)) +
                                    "'s GPU identity");
    auto it = owner.find(v.value());
    if (it == owner.end()) {
      owner[v.value()] = r;
    } else if (verdict->empty()) {
      *verdict = "ranks " + std::to_string(globalRank(it->second)) + " and " +
                 std::to_string(globalRank(r)) + " share the GPU at PCI " +
                 v.value().substr(v.value().rfind(' ') + 1);
    }
  }
  return store_->set(prefix + "verdict", *verdict);
}

Status ProcessSetImpl::createComm(const std::string& what) {
  GpuState& g = gpu_;
  if (opts_.gpuBackend == "auto" && size() > 1) {
    // NCCL refuses two ranks on one GPU; in auto mode such a set stages
    // instead of failing (HORA_GPU_BACKEND=nccl insists on NCCL).
    std::string shared;
    HORA_RETURN_IF_ERROR(gpuSharing(what, &shared));
    if (!shared.empty()) {
      g.sharedGpu = true;
      HORA_LOG(logger_, kInfo) << "process set " << name_ << ": " << shared
                               << ", which NCCL cannot serve; its GPU tensors are staged through "
                                  "host memory and the CPU data plane (give each rank its own "
                                  "GPU for NCCL, or set HORA_GPU_BACKEND=gloo to skip this check)";
      return Status::ok();
    }
  }
  std::string id(g.api->unique_id_bytes, '\0');
  const std::string key = "gpu_comm_id/" + std::to_string(g.commsCreated);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(opts_.peerTimeoutS * 1000));
  if (rank_ == 0) {
    HORA_RETURN_IF_ERROR(opts_.gpu->check(g.api->comm_unique_id(&id[0]), "comm_unique_id", what));
    HORA_RETURN_IF_ERROR(store_->set(key, id));
  } else {
    auto v = store_->get(key, timeout);
    if (!v.isOk()) return v.status().withContext(what + ": waiting for the communicator id");
    if (v.value().size() != id.size())
      return protocolError(what + ": communicator id of the wrong size from rank 0");
    id = v.take();
  }
  hora_gpu_comm_t comm = nullptr;
  HORA_RETURN_IF_ERROR(opts_.gpu->check(
      g.api->comm_init(g.device, size(), rank_, id.data(), timeout.count(), &comm), "comm_init",
      what + " (creating the set's GPU communicator, rank " + std::to_string(rank_) + " of " +
          std::to_string(size()) +
          (opts_.gpuBackend == "nccl"
               ? "; HORA_GPU_BACKEND=nccl: ranks that share a GPU need auto or gloo)"
               : ")")));
  g.comm = comm;
  ++g.commsCreated;
  return Status::ok();
}

Status ProcessSetImpl::gpuFusion(size_t bytes, const std::string& what) {
  GpuState& g = gpu_;
  if (bytes <= g.fusionBytes) return Status::ok();
  const size_t cap = grownCapacity(g.fusionBytes, bytes);
  if (g.fusion) g.api->device_free(g.device, g.fusion);
  g.fusion = nullptr;
  g.fusionBytes = 0;
  void* p = nullptr;
  HORA_RETURN_IF_ERROR(opts_.gpu->check(g.api->device_alloc(g.device, cap, &p), "device_alloc",
                                        what + " (" + std::to_string(cap >> 20) + " MiB)"));
  g.fusion = static_cast<char*>(p);
  g.fusionBytes = cap;
  return Status::ok();
}

Status ProcessSetImpl::gpuPinned(size_t bytes, const std::string& what) {
  GpuState& g = gpu_;
  if (bytes <= g.pinnedBytes) return Status::ok();
  const size_t cap = grownCapacity(g.pinnedBytes, bytes);
  if (g.pinned) g.api->host_free_pinned(g.pinned);
  g.pinned = nullptr;
  g.pinnedBytes = 0;
  void* p = nullptr;
  HORA_RETURN_IF_ERROR(opts_.gpu->check(g.api->host_alloc_pinned(cap, &p), "host_alloc_pinned",
                                        what + " (" + std::to_string(cap >> 20) + " MiB)"));
  std::memset(p, 0, cap);  // touch now, not on the hot path
  g.pinned = static_cast<char*>(p);
  g.pinnedBytes = cap;
  return Status::ok();
}

Status ProcessSetImpl::gpuWait(const std::string& what) {
  GpuState& g = gpu_;
  HORA_RETURN_IF_ERROR(
      opts_.gpu->check(g.api->event_record(g.done, g.stream), "event_record", what));
  // Like every data-plane wait, bounded by HORA_PEER_TIMEOUT_S: a peer whose
  // hora threads are alive but whose GPU work never arrives (its stream stuck
  // behind a kernel that does not end, a hung driver) would otherwise hold
  // this rank forever without any heartbeat going missing.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(opts_.peerTimeoutS * 1000));
  auto pause = std::chrono::microseconds(0);
  for (;;) {
    int done = 0;
    HORA_RETURN_IF_ERROR(opts_.gpu->check(g.api->event_query(g.done, &done), "event_query", what));
    if (done) return Status::ok();
    if (g.comm) {
      int failed = 0;
      int rc = g.api->comm_async_error(g.comm, &failed);
      if (rc != 0 || failed) {
        Status s = opts_.gpu->check(rc ? rc : 1, "the GPU communicator", what);
        g.api->comm_abort(g.comm);
        return s;
      }
    }
    if (isBroken_) {
      // A peer is gone: its part of the collective will never come. A
      // goodbye is different: that peer finished everything agreed before
      // it, so this work completes.
      Status why = brokenStatus();
      if (why.code() != Code::kShutDown) {
        if (g.comm) g.api->comm_abort(g.comm);
        return why.withContext(what);
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      if (g.comm) g.api->comm_abort(g.comm);
      char secs[32];
      std::snprintf(secs, sizeof(secs), "%g", opts_.peerTimeoutS);
      return Status(Code::kTimeout,
                    what + ": the GPU work did not complete within HORA_PEER_TIMEOUT_S=" + secs +
                        " s on rank " + std::to_string(globalRank(rank_)) +
                        " (cuda:" + std::to_string(g.device) +
                        "); a peer's GPU work may be stalled (its stream stuck behind a kernel "
                        "that does not end) or this GPU hung" +
                        (g.comm ? "; the set's GPU communicator was aborted" : "") +
                        ". Raise HORA_PEER_TIMEOUT_S if one collective legitimately takes "
                        "this long");
    }
    // Short operations finish within a few yields; long ones are polled
    // every 200 us at most, off the framework thread.
    if (pause.count() == 0) {
      std::this_thread::yield();
      pause = std::chrono::microseconds(1);
    } else {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(200));
    }
  }
}

void ProcessSetImpl::gpuRelease() {
  GpuState& g = gpu_;
  if (!g.api) return;
  if (g.comm) g.api->comm_destroy(g.comm);
  if (g.fusion) g.api->device_free(g.device, g.fusion);
  if (g.pinned) g.api->host_free_pinned(g.pinned);
  if (g.done) g.api->event_destroy(g.done);
  if (g.stream) g.api->stream_destroy(g.stream);
  g = GpuState();
}

Status ProcessSetImpl::runGpuAllreduce(std::vector<Response>& group,
                                       std::vector<std::shared_ptr<TensorEntry>>& es) {
  const Response& r0 = group.front();
  const DataType dt = r0.dtype;
  const size_t esz = dataTypeSize(dt);
  const ReduceOp op = reducingOp(r0);
  const double post = postFactor(r0, size());
  const double pre = r0.prescale;
  const std::string what =
      "allreduce \"" + r0.name + "\" (" + deviceName(localDevice(r0, es)) + ")" +
      (group.size() > 1 ? " (fused with " + std::to_string(group.size() - 1) + " more)" : "");
  HORA_RETURN_IF_ERROR(gpuPrepare(localDevice(r0, es), what));
  GpuState& g = gpu_;
  const auto* api = g.api;
  bool viaComm = false;
  HORA_RETURN_IF_ERROR(gpuChoosePath(ncclHasType(dt), what, &viaComm));
  for (auto& e : es) HORA_RETURN_IF_ERROR(gpuAfterReady(e.get(), what));

  std::vector<size_t> start(group.size() + 1, 0);
  for (size_t i = 0; i < group.size(); ++i)
    start[i + 1] = start[i] + static_cast<size_t>(group[i].numElements());
  const size_t total = start.back();
  const size_t bytes = total * esz;
  if (total == 0) return Status::ok();
  const auto dtc = static_cast<int32_t>(dt);

  // Where the reduction happens: a single tensor in its own output, a fused
  // group (or a joined rank's stand-in) in the set's device fusion buffer.
  const bool inOutput = group.size() == 1 && es[0];
  char* buf;
  if (inOutput) {
    buf = static_cast<char*>(es[0]->out);
    if (es[0]->in != es[0]->out || pre != 1.0) {
      hora_gpu_copy_t c{buf, es[0]->in, total};
      HORA_RETURN_IF_ERROR(opts_.gpu->check(api->batched_scale_copy(dtc, &c, 1, pre, g.stream),
                                            "batched_scale_copy", what));
    }
  } else {
    HORA_RETURN_IF_ERROR(gpuFusion(bytes, what));
    buf = g.fusion;
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
      HORA_RETURN_IF_ERROR(gpuPinned(bytes, what));
      for (size_t i = 0; i < group.size(); ++i) {
        if (es[i]) continue;
        const size_t off = start[i] * esz, n = start[i + 1] - start[i];
        fillIdentity(dt, op, g.pinned + off, n);
        HORA_RETURN_IF_ERROR(opts_.gpu->check(
            api->memcpy_async(buf + off, g.pinned + off, n * esz, g.stream), "memcpy_async", what));
      }
    }
    if (!copies.empty())
      HORA_RETURN_IF_ERROR(opts_.gpu->check(
          api->batched_scale_copy(dtc, copies.data(), copies.size(), pre, g.stream),
          "batched_scale_copy (pack)", what));
  }

  if (viaComm) {
    HORA_RETURN_IF_ERROR(opts_.gpu->check(
        api->allreduce(buf, buf, total, dtc, static_cast<int32_t>(op), g.comm, g.stream),
        "allreduce", what));
  } else {
    HORA_RETURN_IF_ERROR(gpuPinned(bytes, what));
    HORA_RETURN_IF_ERROR(
        opts_.gpu->check(api->memcpy_async(g.pinned, buf, bytes, g.stream), "memcpy_async", what));
    HORA_RETURN_IF_ERROR(gpuWait(what));
    Status s = backend_->allreduce(g.pinned, total, dt, op);
    if (!s.isOk()) return backendFailure(s, what);
    HORA_RETURN_IF_ERROR(
        opts_.gpu->check(api->memcpy_async(buf, g.pinned, bytes, g.stream), "memcpy_async", what));
  }

  if (inOutput) {
    if (post != 1.0) {
      hora_gpu_copy_t c{buf, buf, total};
      HORA_RETURN_IF_ERROR(opts_.gpu->check(api->batched_scale_copy(dtc, &c, 1, post, g.stream),
                                            "batched_scale_copy", what));
    }
  } else {
    std::vector<hora_gpu_copy_t> copies;
    for (size_t i = 0; i < group.size(); ++i)
      if (es[i]) copies.push_back({es[i]->out, buf + start[i] * esz, start[i + 1] - start[i]});
    if (!copies.empty())
      HORA_RETURN_IF_ERROR(opts_.gpu->check(
          api->batched_scale_copy(dtc, copies.data(), copies.size(), post, g.stream),
          "batched_scale_copy (unpack)", what));
  }
  return gpuWait(what);
}

Status ProcessSetImpl::runGpuBroadcast(const Response& r, TensorEntry* e) {
  const Device dev = e ? e->request.device : localDevice(r, {});
  const std::string what = "broadcast \"" + r.name + "\" (" + deviceName(dev) + ")";
  HORA_RETURN_IF_ERROR(gpuPrepare(dev, what));
  GpuState& g = gpu_;
  const auto* api = g.api;
  const size_t n = static_cast<size_t>(r.numElements());
  const size_t bytes = n * dataTypeSize(r.dtype);
  if (n == 0) return Status::ok();
  HORA_RETURN_IF_ERROR(gpuAfterReady(e, what));
  char* data = e ? static_cast<char*>(e->out) : nullptr;
  if (!data) {  // joined: a stand-in buffer
    HORA_RETURN_IF_ERROR(gpuFusion(bytes, what));
    data = g.fusion;
  }
  if (e && e->in != e->out)
    HORA_RETURN_IF_ERROR(
        opts_.gpu->check(api->memcpy_async(data, e->in, bytes, g.stream), "memcpy_async", what));
  // Broadcast moves bytes: NCCL's uint8 serves every dtype.
  bool viaComm = false;
  HORA_RETURN_IF_ERROR(gpuChoosePath(true, what, &viaComm));
  if (viaComm) {
    HORA_RETURN_IF_ERROR(
        opts_.gpu->check(api->broadcast(data, bytes, static_cast<int32_t>(DataType::kUint8), r.root,
                                        g.comm, g.stream),
                         "broadcast", what));
  } else {
    HORA_RETURN_IF_ERROR(gpuPinned(bytes, what));
    HORA_RETURN_IF_ERROR(
        opts_.gpu->check(api->memcpy_async(g.pinned, data, bytes, g.stream), "memcpy_async", what));
    HORA_RETURN_IF_ERROR(gpuWait(what));
    Status s = backend_->broadcast(g.pinned, n, r.dtype, r.root);
    if (!s.isOk()) return backendFailure(s, what);
    HORA_RETURN_IF_ERROR(
        opts_.gpu->check(api->memcpy_async(data, g.pinned, bytes, g.stream), "memcpy_async", what));
  }
  return gpuWait(what);
}

}  // namespace hora
