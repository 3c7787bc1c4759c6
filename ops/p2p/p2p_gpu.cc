// P2pGpu (ops/p2p/p2p_gpu.h): channels, their communicators, and the GPU
// thread that enqueues transfers and polls their events.
#include "ops/p2p/p2p_gpu.h"

#include <algorithm>
#include <cstdio>
#include <deque>

namespace hora {

struct P2pGpu::Channel {
  int peer = 0;
  bool send = true;  // this rank sends on it
  enum State { kIdle, kCreating, kReady, kFailed } state = kIdle;
  std::deque<Transfer> queued;  // submitted, not yet enqueued on the stream
  struct InFlight {
    Transfer t;
    hora_gpu_event_t event = nullptr;
    Clock::time_point issued;
  };
  std::deque<InFlight> inflight;  // enqueued, in order
  std::thread creator;            // creates comm and stream (kCreating)
  hora_gpu_comm_t comm = nullptr;
  hora_gpu_stream_t stream = nullptr;
  Status failure;  // kFailed: later transfers fail with it
  bool fatal = false;
  // failPeer(): what is in flight may still complete until then (the peer
  // finished its half before it left); what is queued fails at once.
  Clock::time_point graceUntil{};
};

P2pGpu::P2pGpu(P2pGpuOptions options) : opts_(std::move(options)) {
  channels_.resize(opts_.globalRanks.size() * 2);
}

P2pGpu::~P2pGpu() {
  shutdown(Status(Code::kShutDown, "the process set was destroyed"), Clock::now());
}

std::string P2pGpu::rankText(int setRank) const {
  std::string s = "rank " + std::to_string(setRank);
  if (opts_.globalRanks[setRank] != setRank)
    s += " (global " + std::to_string(opts_.globalRanks[setRank]) + ")";
  return s;
}

Status P2pGpu::check(const Device& dev, const std::string& what) {
  if (!opts_.plugin) return Status(Code::kNotSupported, what + ": no GPU plugin configured");
  auto api = opts_.plugin->get();
  if (!api.isOk()) return api.status().withContext(what);
  if (!HORA_GPU_PLUGIN_HAS(api.value(), p2p_group))
    return Status(Code::kNotSupported,
                  what + ": the GPU plugin " + opts_.plugin->path() + " (" + api.value()->name +
                      ") predates point-to-point (its table has no p2p_group); use the "
                      "libhora_cuda.so built with this libhora, or copy the tensor to the CPU");
  std::lock_guard<std::mutex> lk(mu_);
  if (!api_) api_ = api.value();
  if (device_ >= 0 && device_ != dev.index)
    return invalidArgument(what + ": point-to-point in process set " + opts_.setName +
                           " already runs on cuda:" + std::to_string(device_) +
                           " on this rank; all GPU tensors a rank sends or receives in one "
                           "process set must be on one device (got " +
                           deviceName(dev) + ")");
  if (!failed_.isOk()) return failed_;
  if (device_ < 0) device_ = dev.index;
  return Status::ok();
}

Device P2pGpu::device() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (device_ >= 0) return Device{DeviceKind::kCuda, device_};
  }
  auto count = opts_.plugin ? opts_.plugin->deviceCount() : Result<int>(0);
  const int index = count.isOk() && count.value() > 0 ? opts_.localRank % count.value() : 0;
  Device dev{DeviceKind::kCuda, index};
  std::string what = "point-to-point receive without a buffer";
  return check(dev, what).isOk() ? dev : Device{DeviceKind::kCuda, index};
}

Result<std::shared_ptr<void>> P2pGpu::allocate(size_t bytes, const std::string& what) {
  const Device dev = device();
  const hora_gpu_plugin_v1_t* api;
  {
    std::lock_guard<std::mutex> lk(mu_);
    api = api_;
  }
  if (!api) return Status(Code::kNotSupported, what + ": the GPU plugin is not loaded");
  void* data = nullptr;
  HORA_GPU_CALL(*opts_.plugin, api, what, device_alloc, dev.index, std::max<size_t>(bytes, 1),
                &data);
  const int index = dev.index;
  return std::shared_ptr<void>(data, [api, index](void* p) { api->device_free(index, p); });
}

P2pGpu::Channel& P2pGpu::channelLocked(int peer, bool send) {
  auto& slot = channels_[static_cast<size_t>(peer) * 2 + (send ? 0 : 1)];
  if (!slot) {
    slot = std::make_unique<Channel>();
    slot->peer = peer;
    slot->send = send;
  }
  return *slot;
}

Status P2pGpu::submit(Transfer t) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!failed_.isOk()) return failed_;
  if (stop_) return Status(Code::kShutDown, "point-to-point is shutting down");
  Channel& ch = channelLocked(t.peer, t.send);
  if (ch.state == Channel::kFailed) return ch.failure;
  ch.queued.push_back(std::move(t));
  if (!threadStarted_) {
    threadStarted_ = true;
    thread_ = std::thread([this] { run(); });
  }
  cv_.notify_all();
  return Status::ok();
}

bool P2pGpu::busyWith(int peer) const {
  std::lock_guard<std::mutex> lk(mu_);
  for (bool send : {true, false}) {
    const auto& ch = channels_[static_cast<size_t>(peer) * 2 + (send ? 0 : 1)];
    if (ch && (!ch->queued.empty() || !ch->inflight.empty())) return true;
  }
  return false;
}

void P2pGpu::failChannelLocked(Channel& ch, const Status& why,
                               std::vector<std::pair<Transfer, Status>>& out) {
  if (ch.state != Channel::kFailed) {
    ch.failure = why;
    // Only work to cancel needs an abort: an idle channel (a clean shutdown)
    // is destroyed normally, and its peer may still be reading what it sent.
    const bool work = !ch.queued.empty() || !ch.inflight.empty();
    if (work && ch.state == Channel::kReady && ch.comm) api_->comm_abort(ch.comm);  // any thread
    // A channel being created stays kCreating until its helper returns.
    if (ch.state != Channel::kCreating) ch.state = Channel::kFailed;
  }
  for (auto& t : ch.queued) out.emplace_back(std::move(t), why);
  ch.queued.clear();
}

void P2pGpu::failPeer(int peer, const Status& why) {
  std::lock_guard<std::mutex> lk(mu_);
  for (bool send : {true, false}) {
    auto& ch = channels_[static_cast<size_t>(peer) * 2 + (send ? 0 : 1)];
    if (!ch || (ch->queued.empty() && ch->inflight.empty())) continue;
    // The GPU thread completes the transfers (the caller holds the engine's lock).
    if (ch->failure.isOk()) {
      ch->failure = why;
      ch->graceUntil = Clock::now() + std::chrono::seconds(1);
    }
  }
  cv_.notify_all();
}

void P2pGpu::fail(const Status& why) {
  std::lock_guard<std::mutex> lk(mu_);
  if (failed_.isOk()) failed_ = why;
  cv_.notify_all();
}

void P2pGpu::create(Channel& ch) {
  Status s = createComm(ch);
  std::lock_guard<std::mutex> lk(mu_);
  if (!s.isOk()) {
    if (ch.failure.isOk()) {
      ch.failure = s;
      ch.fatal = true;
    }
  }
  ch.state = ch.failure.isOk() ? Channel::kReady : Channel::kFailed;
  if (ch.state == Channel::kFailed && ch.comm) api_->comm_abort(ch.comm);
  cv_.notify_all();
}

Status P2pGpu::createComm(Channel& ch) {
  const int from = ch.send ? opts_.rank : ch.peer;
  const int to = ch.send ? ch.peer : opts_.rank;
  const std::string what =
      "point-to-point from " + rankText(from) + " to " + rankText(to) + " in process set " +
      opts_.setName + " (creating the pair's GPU communicator on cuda:" + std::to_string(device_) +
      ")";
  const std::string key = "gpu/" + std::to_string(from) + "-" + std::to_string(to);
  std::string id(api_->unique_id_bytes, '\0');
  if (ch.send) {
    HORA_GPU_CALL(*opts_.plugin, api_, what, comm_unique_id, &id[0]);
    Status s = opts_.store->set(key, id);
    if (!s.isOk()) return s.withContext(what + ": publishing the communicator id");
  } else {
    auto v = opts_.store->get(key, opts_.peerTimeout);
    if (!v.isOk()) return v.status().withContext(what + ": waiting for the sender's id");
    if (v.value().size() != id.size())
      return protocolError(what + ": the id has " + std::to_string(v.value().size()) +
                           " bytes, not " + std::to_string(id.size()));
    id = v.value();
    (void)opts_.store->remove(key);  // a later runtime of the sender publishes a new one
  }
  hora_gpu_comm_t comm = nullptr;
  HORA_GPU_CALL(*opts_.plugin, api_, what, comm_init, device_, 2, ch.send ? 0 : 1, id.data(),
                opts_.peerTimeout.count(), &comm);
  hora_gpu_stream_t stream = nullptr;
  const int rc = api_->stream_create(device_, &stream);
  if (rc != 0) {
    Status s = opts_.plugin->check(rc, "stream_create", what);
    api_->comm_destroy(comm);
    return s;
  }
  std::lock_guard<std::mutex> lk(mu_);
  ch.comm = comm;
  ch.stream = stream;
  return Status::ok();
}

void P2pGpu::run() {
  using Done = std::vector<std::pair<Transfer, Status>>;
  std::unique_lock<std::mutex> lk(mu_);
  auto pause = std::chrono::microseconds(0);
  for (;;) {
    Done done;
    std::vector<Status> fatal;
    bool busy = false, moved = false, creating = false;
    for (auto& slot : channels_) {
      if (!slot) continue;
      Channel& ch = *slot;
      if (ch.state == Channel::kCreating) {
        creating = true;
        continue;
      }
      if (ch.creator.joinable()) ch.creator.join();  // it set the state and returned
      const Status why = !failed_.isOk() ? failed_ : ch.failure;
      const bool grace = failed_.isOk() && !ch.inflight.empty() && Clock::now() < ch.graceUntil;
      if (!why.isOk() && grace) {
        for (auto& t : ch.queued) done.emplace_back(std::move(t), why);
        ch.queued.clear();
      } else if (!why.isOk()) {
        failChannelLocked(ch, why, done);
        for (auto& f : ch.inflight) {
          done.emplace_back(std::move(f.t), why);
          api_->event_destroy(f.event);
        }
        ch.inflight.clear();
        if (ch.fatal) {
          fatal.push_back(why);
          ch.fatal = false;
        }
        continue;
      }
      if (ch.state == Channel::kIdle && !ch.queued.empty()) {
        ch.state = Channel::kCreating;
        creating = true;
        Channel* c = &ch;
        ch.creator = std::thread([this, c] { create(*c); });
        continue;
      }
      if (ch.state != Channel::kReady) continue;
      // Enqueue what is queued, in order, then poll what is in flight.
      Status err;
      while (!ch.queued.empty() && err.isOk()) {
        Channel::InFlight f;
        f.t = std::move(ch.queued.front());
        ch.queued.pop_front();
        const int device = device_;
        lk.unlock();
        const std::string what = std::string("point-to-point GPU ") +
                                 (f.t.send ? "send to " : "receive from ") + rankText(f.t.peer) +
                                 " (" + std::to_string(f.t.bytes) +
                                 " bytes on cuda:" + std::to_string(device) + ")";
        auto call = [&](int rc, const char* fn) {
          if (err.isOk()) err = opts_.plugin->check(rc, fn, what);
        };
        if (f.t.readyEvent)
          call(api_->stream_wait_external_event(ch.stream, f.t.readyEvent),
               "stream_wait_external_event");
        if (err.isOk()) {
          hora_gpu_p2p_op_t op{f.t.send ? HORA_GPU_P2P_SEND : HORA_GPU_P2P_RECV, f.t.send ? 1 : 0,
                               f.t.data, f.t.bytes};
          call(api_->p2p_group(&op, 1, ch.comm, ch.stream), "p2p_group");
        }
        if (err.isOk()) call(api_->event_create(device, &f.event), "event_create");
        if (err.isOk()) call(api_->event_record(f.event, ch.stream), "event_record");
        f.issued = Clock::now();
        lk.lock();
        moved = true;
        if (!err.isOk()) {
          if (f.event) api_->event_destroy(f.event);
          done.emplace_back(std::move(f.t), err);
        } else {
          ch.inflight.push_back(std::move(f));
        }
      }
      while (!ch.inflight.empty() && err.isOk()) {
        Channel::InFlight& f = ch.inflight.front();
        int finished = 0;
        lk.unlock();
        const int rc = api_->event_query(f.event, &finished);
        lk.lock();
        if (rc != 0) {
          err = opts_.plugin->check(rc, "event_query",
                                    std::string("point-to-point GPU ") +
                                        (f.t.send ? "send to " : "receive from ") +
                                        rankText(f.t.peer));
          break;
        }
        if (!finished) {
          if (Clock::now() - f.issued > opts_.peerTimeout) {
            char secs[32];
            std::snprintf(secs, sizeof secs, "%g", Seconds(opts_.peerTimeout).count());
            err = Status(Code::kTimeout,
                         std::string("point-to-point GPU ") +
                             (f.t.send ? "send to " : "receive from ") + rankText(f.t.peer) +
                             " did not complete within HORA_PEER_TIMEOUT_S=" + secs + " s on " +
                             rankText(opts_.rank) + " (cuda:" + std::to_string(device_) +
                             "); the peer's GPU work may be stalled; the pair's communicator "
                             "was aborted");
          }
          break;
        }
        api_->event_destroy(f.event);
        done.emplace_back(std::move(f.t), Status::ok());
        ch.inflight.pop_front();
        moved = true;
      }
      if (!err.isOk() && ch.failure.isOk()) {
        // The channel's stream order is lost: fail it (and, through onFatal,
        // the set, so the peer's half does not wait for its own timeout).
        ch.failure = err;
        ch.fatal = true;
        moved = true;
      }
      busy = busy || !ch.inflight.empty();
    }
    if (!done.empty() || !fatal.empty()) {
      lk.unlock();
      for (auto& d : done) d.first.done(d.second);
      for (auto& s : fatal)
        if (opts_.onFatal) opts_.onFatal(s);
      lk.lock();
      continue;
    }
    if (moved) {
      pause = std::chrono::microseconds(0);
      continue;
    }
    bool queued = false;
    for (auto& slot : channels_) queued = queued || (slot && !slot->queued.empty());
    if (stop_ && !busy && !creating && !queued) break;
    if (busy) {
      // Short transfers finish within a few rounds; long ones are polled
      // every 200 us at most.
      pause = std::min(std::max(pause * 2, std::chrono::microseconds(2)),
                       std::chrono::microseconds(200));
      cv_.wait_for(lk, pause);
    } else {
      cv_.wait_for(lk, std::chrono::milliseconds(creating ? 1 : 100));
    }
  }
}

void P2pGpu::shutdown(const Status& why, Clock::time_point deadline) {
  std::thread t;
  {
    std::unique_lock<std::mutex> lk(mu_);
    auto idle = [&] {
      for (auto& slot : channels_)
        if (slot && (!slot->queued.empty() || !slot->inflight.empty())) return false;
      return true;
    };
    // Matched transfers complete within moments when both sides are alive.
    while (!idle() && failed_.isOk() && Clock::now() < deadline)
      cv_.wait_for(lk, std::chrono::milliseconds(1));
    if (failed_.isOk()) failed_ = why;
    stop_ = true;
    cv_.notify_all();
    t = std::move(thread_);
  }
  if (t.joinable()) t.join();
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& slot : channels_) {
    if (!slot) continue;
    if (slot->creator.joinable()) slot->creator.join();
    if (slot->stream) api_->stream_destroy(slot->stream);
    // A failed channel's communicator was aborted; comm_destroy frees what is left.
    if (slot->comm) api_->comm_destroy(slot->comm);
    slot->stream = nullptr;
    slot->comm = nullptr;
  }
}

}  // namespace hora
