// P2pEngine's GPU glue (ops/p2p/p2p_engine.h): GPU operations are checked at
// post, matched through the same frames as host ones, and their payloads
// handed to P2pGpu (ops/p2p/p2p_gpu.h) once accepted; its thread reports back
// through gpuDone.
#include "ops/p2p/p2p_engine.h"
#include "ops/p2p/p2p_engine_internal.h"

namespace hora {

P2pGpu* P2pEngine::gpu() {
  std::call_once(gpuOnce_, [this] {
    if (!opts_.gpuPlugin) return;
    P2pGpuOptions o;
    o.setName = opts_.setName;
    o.rank = opts_.rank;
    o.globalRanks = opts_.globalRanks;
    o.store = opts_.store;
    o.plugin = opts_.gpuPlugin;
    o.localRank = opts_.localRank;
    o.peerTimeout = opts_.peerTimeout;
    o.logger = opts_.logger;
    o.onFatal = opts_.onFatal;
    gpu_ = std::make_unique<P2pGpu>(std::move(o));
    gpuPtr_.store(gpu_.get(), std::memory_order_release);
  });
  return gpu_.get();
}

Status P2pEngine::checkGpu(const P2pOp& op) {
  if (op.device.kind != DeviceKind::kCuda) return Status::ok();
  const std::string what = std::string("point-to-point ") +
                           (op.kind == P2pOp::kSend ? "send to " : "recv from ") +
                           rankText(op.peer) + " of " + describeTensor(op.dtype, op.shape) +
                           " on " + deviceName(op.device);
  P2pGpu* g = gpu();
  if (!g) return Status(Code::kNotSupported, what + ": no GPU plugin configured");
  return g->check(op.device, what);
}

void P2pEngine::transferGpuLocked(const OpPtr& op) {
  P2pGpu::Transfer t;
  t.send = op->p.kind == P2pOp::kSend;
  t.peer = op->p.peer;
  t.data = op->p.data;
  t.bytes = op->p.bytes;
  t.readyEvent = op->p.readyEvent;
  t.done = [this, op](const Status& s) { gpuDone(op, s); };
  P2pGpu* g = gpu();
  Status s = g ? g->submit(std::move(t))
               : Status(Code::kNotSupported, "a GPU payload without a GPU plugin");
  if (!s.isOk()) complete(op, s);
}

void P2pEngine::gpuDone(const OpPtr& op, const Status& s) {
  Taken done;
  std::vector<Status> fatal;
  {
    std::lock_guard<std::mutex> lk(mu_);
    complete(op, s);
    done.take(completions_);
    fatal.swap(fatal_);
  }
  deliver(done, fatal);
}

}  // namespace hora
