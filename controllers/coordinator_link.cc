// RemoteCoordinator (a worker's CoordinatorLink) and the abort frame's codec.
#include "controllers/coordinator_link.h"

#include "core/wire.h"

namespace hora {

std::string encodeAbort(const Status& why) {
  ByteWriter w;
  w.i32(static_cast<int32_t>(why.code()));
  w.str(why.message());
  return w.take();
}

Status decodeAbort(const std::string& payload) {
  ByteReader rd(payload);
  int32_t code = 0;
  std::string msg;
  if (!rd.i32(&code, "abort code").isOk() || !rd.str(&msg, "abort message").isOk())
    return protocolError("the coordinator aborted the job with a malformed message");
  if (code <= 0 || code > static_cast<int32_t>(kLastCode))
    code = static_cast<int32_t>(Code::kRemoteError);
  return Status(static_cast<Code>(code), msg);
}

Status peerShutDown(const Status& goodbye) {
  return Status(Code::kShutDown, goodbye.message() +
                                     "; collectives that need it can no longer complete (did "
                                     "ranks run different numbers of steps? see hora_join for "
                                     "uneven data)");
}

RemoteCoordinator::RemoteCoordinator(ControlPlane& cp, std::string setName)
    : cp_(cp), setName_(std::move(setName)) {}

void RemoteCoordinator::submit(RequestList list) {
  cp_.send(0, FrameType::kRequests, encode(list));
}

void RemoteCoordinator::reportFailure(const Status& why) {
  // A goodbye needs no abort: the peers learn it from the goodbye itself.
  if (why.code() != Code::kShutDown) cp_.send(0, FrameType::kAbort, encodeAbort(why));
}

void RemoteCoordinator::onFrame(int, FrameType type, std::string payload) {
  switch (type) {
    case FrameType::kResponses: {
      ResponseList list;
      Status s = decode(payload, &list);
      if (!s.isOk())
        return client_->failSet(s.withContext("bad response message from the coordinator"), true);
      return client_->onResponses(list);
    }
    case FrameType::kNack: {
      RequestList n;
      Status s = decode(payload, &n);
      if (!s.isOk()) return client_->failSet(s.withContext("bad nack from the coordinator"), true);
      return client_->onNacks(n.hits);
    }
    case FrameType::kAbort:
      return client_->failSet(decodeAbort(payload), /*tellPeers=*/false);
    default:
      return client_->failSet(protocolError(std::string("unexpected ") + frameTypeName(type) +
                                            " frame from the coordinator"),
                              true);
  }
}

Status RemoteCoordinator::describeLoss(int, const Status& why) const {
  if (why.code() == Code::kShutDown) return peerShutDown(why);
  return Status(why.code(), "lost the coordinator of set " + setName_ + ": " + why.message());
}

}  // namespace hora
