#include "core/status.h"

namespace hora {

const char* codeName(Code code) {
  switch (code) {
    case Code::kOk:
      return "ok";
    case Code::kInvalidArgument:
      return "invalid argument";
    case Code::kInvalidUsage:
      return "invalid usage";
    case Code::kNotInitialized:
      return "not initialized";
    case Code::kShutDown:
      return "shut down";
    case Code::kSystemError:
      return "system error";
    case Code::kBackendError:
      return "backend error";
    case Code::kRemoteError:
      return "remote error";
    case Code::kTimeout:
      return "timeout";
    case Code::kInProgress:
      return "in progress";
    case Code::kNotSupported:
      return "not supported";
    case Code::kMismatch:
      return "mismatch";
    case Code::kAuthError:
      return "authentication error";
    case Code::kProtocolError:
      return "protocol error";
    case Code::kInternal:
      return "internal error";
    case Code::kMembership:
      return "membership changed";
  }
  return "unknown status";
}

std::string Status::toString() const {
  if (isOk()) return "ok";
  return std::string(codeName(code_)) + ": " + message_;
}

Status Status::withContext(const std::string& context) const {
  if (isOk()) return *this;
  return Status(code_, context + ": " + message_);
}

}  // namespace hora
