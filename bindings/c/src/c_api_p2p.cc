// The point-to-point half of the C ABI (hora_send_async, hora_recv_async,
// hora_p2p_batch_async): argument checks and the request, on the calling
// framework thread; the engine (ops/p2p/p2p_engine.h) does the rest.
#include <boost/container/small_vector.hpp>
#include <string>
#include <vector>

#include "c_api_internal.h"
#include "process_set.h"
#include "request_state.h"

namespace hora::capi {

hora_status_t submitP2p(const char* fn, ProcessSet& set, const hora_options_t& o,
                        const P2pArg* args, size_t n, hora_request_t* request) {
  const int me = set.globalRank(set.rank());
  // The handle owns the state from the start; the operations' sinks are
  // its only other references (each reference is an atomic operation, and a
  // small message's whole path is about a microsecond).
  std::unique_ptr<hora_request_s> h(new hora_request_s());
  h->state = std::make_shared<RequestState>();
  RequestState* st = h->state.get();
  st->noOutputs = true;
  boost::container::small_vector<P2pOp, 1> ops;
  ops.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const P2pArg& a = args[i];
    // Built only for an error message: five string allocations were a
    // measurable share of a small message's latency.
    auto where = [&] {
      return std::string(fn) + ": " + (a.send ? "send to" : "recv from") + " rank " +
             std::to_string(a.peer) + " (tag " + std::to_string(a.tag) + ") in process set " +
             set.name() + " on rank " + std::to_string(me) + ", tensor";
    };
    // The peer's range and the caller itself are checked by the engine's post().
    P2pOp op;
    op.kind = a.send ? P2pOp::kSend : P2pOp::kRecv;
    op.peer = a.peer;
    op.tag = a.tag;
    op.sink = h->state;
    if (!a.send && !a.tensor) {
      if (n != 1)
        return fail(Code::kInvalidArgument,
                    where() +
                        " is NULL: receives in a batch need their buffers (a receive "
                        "without one is hora_recv_async)");
      op.allocate = true;
      st->dlTypeFromOutput = true;
      st->noOutputs = false;
    } else {
      TensorInfo ti;
      // checkTensor is deterministic: a tensor it refuses is checked again,
      // with the text that names the call, for the message.
      Status s = checkTensor(a.tensor, std::string(), &ti);
      if (!s.isOk()) return setError(checkTensor(a.tensor, where(), &ti));
      // GPU memory: the plugin must load and the device exist; the payload
      // then moves through the plugin (ops/p2p/p2p_gpu.h).
      if (ti.device.kind == DeviceKind::kCuda) {
        Status d = checkDevice(set, CollectiveKind::kAllreduce, ti, nullptr, where());
        if (!d.isOk()) return setError(d);
        op.readyEvent = o.ready_event;
      }
      if (ti.shape.size() > static_cast<size_t>(kP2pMaxDims))
        return fail(Code::kInvalidArgument, where() + " has " + std::to_string(ti.shape.size()) +
                                                " dimensions; " +
                                                "point-to-point messages carry at most " +
                                                std::to_string(kP2pMaxDims) + " (reshape it)");
      op.dtype = ti.dtype;
      op.device = ti.device;
      op.shape = std::move(ti.shape);
      op.data = ti.data;
      op.bytes = static_cast<size_t>(ti.count) * dataTypeSize(ti.dtype);
      st->dlType = a.tensor->dtype;
    }
    ops.push_back(std::move(op));
  }
  st->remaining = static_cast<int>(ops.size());
  st->callback = o.callback;
  st->callbackUser = o.callback_user;
  st->alloc = o.alloc;
  st->allocUser = o.alloc_user;
  st->p2p = set.p2p();
  st->handle = h.get();
  Status s = set.p2p()->post(ops.data(), ops.size());
  if (!s.isOk()) return setError(s.withContext(fn));
  *request = h.release();
  return HORA_SUCCESS;
}

}  // namespace hora::capi
