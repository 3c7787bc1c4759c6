// GpuPath, part 1: the set's GPU resources (stream, event, communicator and
// its set-up, device fusion buffer, pinned staging), the wait for GPU work,
// and library-owned device memory. The collectives are in gpu_collectives.cc.
#include "ops/gpu/gpu_path.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "core/cpu_affinity.h"
#include "core/cpu_relax.h"
#include "core/host_buffer.h"
#include "core/host_identity.h"

namespace hora {

bool parseGpuBackend(const std::string& text, GpuBackendChoice* out) {
  if (text == "auto") {
    *out = GpuBackendChoice::kAuto;
  } else if (text == "nccl") {
    *out = GpuBackendChoice::kNccl;
  } else if (text == "gloo") {
    *out = GpuBackendChoice::kGloo;
  } else {
    return false;
  }
  return true;
}

const char* gpuBackendName(GpuBackendChoice choice) {
  switch (choice) {
    case GpuBackendChoice::kNccl:
      return "nccl";
    case GpuBackendChoice::kGloo:
      return "gloo";
    default:
      return "auto";
  }
}

void gpuPollPause(const SpinPolicy& spin, Clock::duration waited) {
  if (spin.enabled() && waited < kGpuSpin) {
    if (spin.yield)
      ::sched_yield();
    else
      cpuRelax();
    return;
  }
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(waited);
  std::this_thread::sleep_for(
      std::clamp(us / 64, std::chrono::microseconds(1), std::chrono::microseconds(200)));
}

bool ncclHasType(DataType dt) { return dt != DataType::kInt16 && dt != DataType::kBool; }

Status GpuPath::prepare(const Device& dev, const std::string& what) {
  // The first calls load the plugin and create the device's context and
  // stream, where the driver may start threads of its own: like comm_init's,
  // they must not inherit the executor's one CPU.
  ScopedThreadCpus unbound(!api_ || !stream_ ? ctx_.processCpus : std::vector<int>());
  viaComm_ = false;
  if (!api_) {
    if (!plugin()) return Status(Code::kNotSupported, what + ": no GPU plugin configured");
    auto api = plugin()->get();
    if (!api.isOk()) return api.status().withContext(what);
    api_ = api.value();
  }
  if (device_ >= 0 && device_ != dev.index)
    return invalidArgument(what +
                           ": this process set already runs on cuda:" + std::to_string(device_) +
                           "; all GPU tensors of one process set on a rank must be on one device "
                           "(got " +
                           deviceName(dev) + ")");
  if (!stream_) {
    HORA_GPU_CALL(*plugin(), api_, what, stream_create, dev.index, &stream_);
    device_ = dev.index;
  }
  if (!done_) HORA_GPU_CALL(*plugin(), api_, what, event_create, device_, &done_);
  return Status::ok();
}

Device GpuPath::localDevice(const Response& r, const std::vector<EntryPtr>& es) const {
  // The response carries rank 0's device; this rank's tensors may sit on
  // another index (rank i on cuda:i).
  for (const auto& e : es)
    if (e) return e->request.device;
  if (device_ >= 0) return Device{DeviceKind::kCuda, device_};
  auto count = plugin() ? plugin()->deviceCount() : Result<int>(0);
  if (count.isOk() && count.value() > 0)
    return Device{DeviceKind::kCuda, opts_.localRank % count.value()};
  return r.device;
}

Status GpuPath::choosePath(bool dtypeOk, const std::string& what, bool* viaComm) {
  // Every input here is shared by the ranks (HORA_GPU_BACKEND is checked at
  // set-up, the dtype comes from the response, the sharing verdict is one
  // answer for all), so every rank takes the same path for a group.
  *viaComm = false;
  if (opts_.backend == GpuBackendChoice::kGloo || !api_->comm_init || !dtypeOk) return Status::ok();
  HORA_RETURN_IF_ERROR(comm(what));
  *viaComm = viaComm_ = comm_ != nullptr;
  return Status::ok();
}

Status GpuPath::afterReady(TensorEntry* e, const std::string& what) {
  if (!e || !e->readyEvent) return Status::ok();
  HORA_GPU_CALL(*plugin(), api_, what, stream_wait_external_event, stream_, e->readyEvent);
  return Status::ok();
}

Result<void*> GpuPath::allocateOutput(TensorEntry* e, const std::vector<int64_t>& shape,
                                      DataType dtype, const std::string& what) {
  auto o = e->sink->allocateOutput(shape, dtype, e->request.device, this);
  if (!o.isOk()) return o;
  // A caching allocator may give a block whose last use on the caller's
  // stream is still queued; the ready event was recorded before that use.
  if (void* ev = e->sink->allocatedOutputEvent())
    HORA_GPU_CALL(*plugin(), api_, what, stream_wait_external_event, stream_, ev);
  return o;
}

Status GpuPath::comm(const std::string& what) {
  if (comm_ || sharedGpu_) return Status::ok();
  // A failed creation is final: the ranks may disagree on how far they got,
  // so trying again could pair one rank's second attempt with another's first.
  if (!commError_.isOk()) return commError_.withContext(what);
  Status s = createComm(what);
  if (!s.isOk()) commError_ = s;
  return s;
}

Status GpuPath::sharingVerdict(const std::string& what, std::string* verdict) {
  // Every rank contributes a fixed-size record (an ok byte, then "<host
  // identity> <PCI bus id>") through the CPU data plane's allgather; every
  // rank then reads the same list, so all reach the same verdict. A rank that
  // cannot read its GPU's identity still takes part (ok byte 0), so its peers
  // fail with it instead of waiting for it.
  constexpr size_t kRecord = 256;
  char bus[64] = {0};
  const Status mine = plugin()->check(api_->device_pci_bus_id(device_, bus, sizeof(bus)),
                                      "device_pci_bus_id", what);
  std::vector<char> record(kRecord, 0), all(kRecord * ctx_.size(), 0);
  if (mine.isOk()) {
    record[0] = 1;
    const std::string id = hostIdentity() + " " + bus;
    std::memcpy(&record[1], id.data(), std::min(id.size(), kRecord - 2));
  }
  const std::vector<size_t> counts(ctx_.size(), kRecord);
  Status s = ctx_.backend->allgatherv(record.data(), all.data(), counts, DataType::kUint8);
  if (!s.isOk()) return dataPlaneFailure(ctx_, s, what + ": comparing the ranks' GPUs");
  if (!mine.isOk()) return mine;
  std::map<std::string, int> owner;
  for (int r = 0; r < ctx_.size(); ++r) {
    const char* rec = &all[r * kRecord];
    if (rec[0] != 1)
      return Status(Code::kBackendError,
                    what + ": rank " + std::to_string(ctx_.globalRank(r)) +
                        " could not read its GPU's identity (device_pci_bus_id failed there; "
                        "see that rank's error)");
    const std::string id(rec + 1);
    auto it = owner.find(id);
    if (it == owner.end()) {
      owner[id] = r;
    } else if (verdict->empty()) {
      *verdict = "ranks " + std::to_string(ctx_.globalRank(it->second)) + " and " +
                 std::to_string(ctx_.globalRank(r)) + " share the GPU at PCI " +
                 id.substr(id.rfind(' ') + 1);
    }
  }
  return Status::ok();
}

Status GpuPath::createComm(const std::string& what) {
  if (opts_.backend == GpuBackendChoice::kAuto && ctx_.size() > 1) {
    // NCCL refuses two ranks on one GPU; in auto mode such a set stages
    // instead of failing (HORA_GPU_BACKEND=nccl insists on NCCL).
    std::string shared;
    HORA_RETURN_IF_ERROR(sharingVerdict(what, &shared));
    if (!shared.empty()) {
      sharedGpu_ = true;
      HORA_LOG(ctx_.logger, kInfo)
          << "process set " << ctx_.setName << ": " << shared
          << ", which NCCL cannot serve; its GPU tensors are staged through host memory and the "
             "CPU data plane (give each rank its own GPU for NCCL, or set HORA_GPU_BACKEND=gloo "
             "to skip this check)";
      return Status::ok();
    }
  }
  // Rank 0 makes the communicator's id and broadcasts it over the CPU data
  // plane, behind an ok byte so that its failure fails every rank at once.
  std::vector<char> id(1 + api_->unique_id_bytes, 0);
  Status made;
  if (ctx_.rank == 0) {
    made = plugin()->check(api_->comm_unique_id(&id[1]), "comm_unique_id", what);
    id[0] = made.isOk() ? 1 : 0;
  }
  if (ctx_.size() > 1) {
    Status s = ctx_.backend->broadcast(id.data(), id.size(), DataType::kUint8, 0);
    if (!s.isOk()) return dataPlaneFailure(ctx_, s, what + ": sharing the communicator id");
  }
  if (!made.isOk()) return made;
  if (id[0] != 1)
    return Status(Code::kBackendError,
                  what + ": rank " + std::to_string(ctx_.globalRank(0)) +
                      " could not create the GPU communicator's id (comm_unique_id failed there; "
                      "see that rank's error)");
  hora_gpu_comm_t comm = nullptr;
  // NCCL starts its proxy threads here; bound to the executor's one CPU they
  // would compete with it for that CPU.
  ScopedThreadCpus unbound(ctx_.processCpus);
  HORA_RETURN_IF_ERROR(plugin()->check(
      api_->comm_init(device_, ctx_.size(), ctx_.rank, &id[1], ctx_.peerTimeout.count(), &comm),
      "comm_init",
      what + " (creating the set's GPU communicator, rank " + std::to_string(ctx_.rank) + " of " +
          std::to_string(ctx_.size()) +
          (opts_.backend == GpuBackendChoice::kNccl
               ? "; HORA_GPU_BACKEND=nccl: ranks that share a GPU need auto or gloo)"
               : ")")));
  comm_ = comm;
  return Status::ok();
}

Status GpuPath::fusion(size_t bytes, const std::string& what) {
  if (bytes <= fusionBytes_) return Status::ok();
  const size_t cap = grownCapacity(fusionBytes_, bytes);
  HORA_RETURN_IF_ERROR(settle(what));  // launched groups may still use it
  if (fusion_) api_->device_free(device_, fusion_);
  fusion_ = nullptr;
  fusionBytes_ = 0;
  void* p = nullptr;
  HORA_GPU_CALL(*plugin(), api_, what + " (" + std::to_string(cap >> 20) + " MiB)", device_alloc,
                device_, cap, &p);
  fusion_ = static_cast<char*>(p);
  fusionBytes_ = cap;
  return Status::ok();
}

Status GpuPath::pinned(size_t bytes, const std::string& what) {
  // Called before the host writes or reads the staging memory, which a
  // launched group's copies may still read.
  HORA_RETURN_IF_ERROR(settle(what));
  if (bytes <= pinnedBytes_) return Status::ok();
  const size_t cap = grownCapacity(pinnedBytes_, bytes);
  if (pinned_) api_->host_free_pinned(pinned_);
  pinned_ = nullptr;
  pinnedBytes_ = 0;
  void* p = nullptr;
  HORA_GPU_CALL(*plugin(), api_, what + " (" + std::to_string(cap >> 20) + " MiB)",
                host_alloc_pinned, cap, &p);
  std::memset(p, 0, cap);  // touch now, not on the hot path
  pinned_ = static_cast<char*>(p);
  pinnedBytes_ = cap;
  return Status::ok();
}

Status GpuPath::checkWhileWaiting(Clock::time_point since, const std::string& what) {
  Status s = checkHealth(since, what);
  // Once the communicator is aborted, work launched behind it cannot be
  // trusted even if its events fire: launched groups fail with this.
  if (!s.isOk() && aborted_.isOk()) aborted_ = s;
  return s;
}

Status GpuPath::checkHealth(Clock::time_point since, const std::string& what) {
  if (comm_) {
    int failed = 0;
    const int rc = api_->comm_async_error(comm_, &failed);
    if (rc != 0 || failed) {
      Status s = plugin()->check(rc ? rc : 1, "the GPU communicator", what);
      api_->comm_abort(comm_);
      return s;
    }
  }
  if (ctx_.health->broken()) {
    // A peer is gone: its part of the collective will never come. A
    // goodbye is different: that peer finished everything agreed before
    // it, so this work completes.
    Status why = ctx_.health->status();
    if (why.code() != Code::kShutDown) {
      if (comm_) api_->comm_abort(comm_);
      return why.withContext(what);
    }
  }
  // Like every data-plane wait, bounded by HORA_PEER_TIMEOUT_S: a peer whose
  // hora threads are alive but whose GPU work never arrives (its stream stuck
  // behind a kernel that does not end, a hung driver) would otherwise hold
  // this rank forever without any heartbeat going missing.
  if (Clock::now() >= since + ctx_.peerTimeout) {
    if (comm_) api_->comm_abort(comm_);
    char secs[32];
    std::snprintf(secs, sizeof(secs), "%g", Seconds(ctx_.peerTimeout).count());
    return Status(Code::kTimeout,
                  what + ": the GPU work did not complete within HORA_PEER_TIMEOUT_S=" + secs +
                      " s on rank " + std::to_string(ctx_.myGlobalRank()) +
                      " (cuda:" + std::to_string(device_) +
                      "); a peer's GPU work may be stalled (its stream stuck behind a kernel "
                      "that does not end) or this GPU hung" +
                      (comm_ ? "; the set's GPU communicator was aborted" : "") +
                      ". Raise HORA_PEER_TIMEOUT_S if one collective legitimately takes "
                      "this long");
  }
  return Status::ok();
}

Status GpuPath::wait(const std::string& what) {
  HORA_GPU_CALL(*plugin(), api_, what, event_record, done_, stream_);
  return waitEvent(done_, what);
}

Status GpuPath::waitEvent(hora_gpu_event_t event, const std::string& what) {
  const auto start = Clock::now();
  // Polled as gpuPollPause says (gpu_path.h); kGpuSpin covers one host's
  // collectives up to hundreds of MiB.
  const auto spinUntil = ctx_.spin.enabled() ? start + kGpuSpin : start;
  for (uint32_t i = 0;; ++i) {
    int done = 0;
    HORA_GPU_CALL(*plugin(), api_, what, event_query, event, &done);
    if (done) return Status::ok();
    const auto now = Clock::now();
    if (now < spinUntil && (i & 63) != 0) {  // the checks below every 64 polls
      gpuPollPause(ctx_.spin, now - start);
      continue;
    }
    HORA_RETURN_IF_ERROR(checkWhileWaiting(start, what));
    gpuPollPause(ctx_.spin, now - start);
  }
}

Status GpuPath::finish(const std::string& what) {
  if (!opts_.pipeline || !viaComm_) return wait(what);
  hora_gpu_event_t ev = nullptr;
  if (!freeEvents_.empty()) {
    ev = freeEvents_.back();
    freeEvents_.pop_back();
  } else if (api_->event_create(device_, &ev) != 0) {
    return wait(what);  // no event to launch with: wait for the group as without pipelining
  }
  if (api_->event_record(ev, stream_) != 0) {
    freeEvents_.push_back(ev);
    return wait(what);
  }
  launched_.push_back(Launch{ev, Clock::now(), what});
  tookLaunch_ = true;
  return Status::ok();
}

bool GpuPath::tookLaunch() {
  const bool took = tookLaunch_;
  tookLaunch_ = false;
  return took;
}

Result<bool> GpuPath::pollLaunched() {
  Launch& l = launched_.front();
  Status s = aborted_;
  int done = 0;
  if (s.isOk()) {
    s = plugin()->check(api_->event_query(l.event, &done), "event_query", l.what);
    if (!s.isOk()) {
      if (comm_) api_->comm_abort(comm_);
      aborted_ = s;
    }
  }
  if (s.isOk() && done) {
    freeEvents_.push_back(l.event);
    launched_.pop_front();
    // The next group's work starts once this one's ended: its own
    // HORA_PEER_TIMEOUT_S counts from here, not from its launch.
    if (!launched_.empty()) launched_.front().at = Clock::now();
    return true;
  }
  if (s.isOk()) s = checkWhileWaiting(l.at, l.what);
  if (s.isOk()) return false;
  // The stream is unusable behind the failed work (the communicator was
  // aborted; events may still fire, over aborted kernels): every launched
  // group fails with it.
  for (Launch& x : launched_) freeEvents_.push_back(x.event);
  launched_.clear();
  return s;
}

Status GpuPath::settle(const std::string& what) {
  // Each launched group in turn, with a timeout of its own (a burst of them
  // may take longer than one HORA_PEER_TIMEOUT_S together); the executor
  // completes them afterwards through pollLaunched().
  if (!aborted_.isOk()) return aborted_.withContext(what);
  for (const Launch& l : launched_) HORA_RETURN_IF_ERROR(waitEvent(l.event, l.what));
  return Status::ok();
}

Result<std::shared_ptr<void>> GpuPath::allocate(size_t bytes, const std::string& what) {
  // prepare() ran for this group: the plugin is loaded, the device known.
  void* data = nullptr;
  HORA_GPU_CALL(*plugin(), api_, what, device_alloc, device_, std::max<size_t>(bytes, 1), &data);
  const hora_gpu_plugin_v1_t* api = api_;
  const int index = device_;
  return std::shared_ptr<void>(data, [api, index](void* p) { api->device_free(index, p); });
}

void GpuPath::release() {
  if (!api_) return;
  if (comm_) api_->comm_destroy(comm_);
  if (fusion_) api_->device_free(device_, fusion_);
  if (pinned_) api_->host_free_pinned(pinned_);
  if (done_) api_->event_destroy(done_);
  for (const Launch& l : launched_) api_->event_destroy(l.event);
  for (hora_gpu_event_t ev : freeEvents_) api_->event_destroy(ev);
  launched_.clear();
  freeEvents_.clear();
  aborted_ = Status::ok();
  if (stream_) api_->stream_destroy(stream_);
  api_ = nullptr;
  device_ = -1;
  stream_ = nullptr;
  done_ = nullptr;
  comm_ = nullptr;
  commError_ = Status::ok();
  sharedGpu_ = false;
  fusion_ = pinned_ = nullptr;
  fusionBytes_ = pinnedBytes_ = 0;
}

}  // namespace hora
