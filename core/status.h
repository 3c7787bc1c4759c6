// Status: the error channel inside hora (code + one-line message).
//
// Every fallible function below the C ABI returns a Status (or Result<T>).
// Exceptions are never used to signal recoverable conditions inside hora;
// third-party code that throws (Gloo, std:: allocation) is caught at the
// boundary that calls it and converted here. The codes mirror the C ABI's
// hora_status_t values one to one so the C layer only copies them.
//
// Thread-safety: value types, no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace hora {

// Keep in sync with HORA_STATUS_* in bindings/c/include/hora/hora.h (values are ABI).
enum class Code : int32_t {
  kOk = 0,
  kInvalidArgument = 1,  // caller passed something wrong; nothing else was disturbed
  kInvalidUsage = 2,     // valid arguments, wrong moment (lifecycle, duplicate name in flight)
  kNotInitialized = 3,
  kShutDown = 4,        // the runtime is shutting down or shut down
  kSystemError = 5,     // OS call failed (socket, memory)
  kBackendError = 6,    // the data-plane library failed
  kRemoteError = 7,     // a peer rank was lost or failed
  kTimeout = 8,         // a deadline passed (wait, rendezvous, stall)
  kInProgress = 9,      // not an error: the request is still running
  kNotSupported = 10,   // valid request hora cannot serve here (e.g. GPU without plugin)
  kMismatch = 11,       // ranks submitted disagreeing requests for one tensor
  kAuthError = 12,      // rendezvous authentication failed
  kProtocolError = 13,  // malformed message on the wire
  kInternal = 14,       // a bug in hora
  kMembership = 15,     // elastic: a member was lost or joins; restore and re-form
};

// The largest valid code: decoders of codes from the wire check against it.
constexpr Code kLastCode = Code::kMembership;

const char* codeName(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }
  bool isOk() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "<code name>: <message>" for logs.
  std::string toString() const;
  // Returns a copy with `context` prepended to the message ("context: message").
  Status withContext(const std::string& context) const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline Status invalidArgument(std::string m) {
  return Status(Code::kInvalidArgument, std::move(m));
}
inline Status invalidUsage(std::string m) { return Status(Code::kInvalidUsage, std::move(m)); }
inline Status systemError(std::string m) { return Status(Code::kSystemError, std::move(m)); }
inline Status internalError(std::string m) { return Status(Code::kInternal, std::move(m)); }
inline Status membershipError(std::string m) { return Status(Code::kMembership, std::move(m)); }
inline Status protocolError(std::string m) { return Status(Code::kProtocolError, std::move(m)); }
inline Status timeoutError(std::string m) { return Status(Code::kTimeout, std::move(m)); }

// Result<T>: a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}  // NOLINT
  bool isOk() const { return status_.isOk(); }
  const Status& status() const { return status_; }
  T& value() { return value_; }
  const T& value() const { return value_; }
  T&& take() { return std::move(value_); }

 private:
  Status status_;
  T value_{};
};

}  // namespace hora

#define HORA_RETURN_IF_ERROR(expr)                 \
  do {                                             \
    ::hora::Status hora_status_ = (expr);          \
    if (!hora_status_.isOk()) return hora_status_; \
  } while (0)
