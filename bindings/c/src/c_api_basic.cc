// The parts of the C ABI that need no runtime: version, status strings, the
// thread-local last-error slot, and struct initializers.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

#include "c_api_internal.h"
#include "hora/hora.h"

namespace hora::capi {

namespace {
thread_local std::string tlsLastError;
}

hora_status_t setError(hora_status_t status, const std::string& message) {
  tlsLastError = message;
  return status;
}

hora_status_t setError(const Status& status) {
  if (status.isOk()) return HORA_SUCCESS;
  tlsLastError = status.message();
  return static_cast<hora_status_t>(status.code());
}

void clearError() { tlsLastError.clear(); }

}  // namespace hora::capi

namespace {

// A library newer than the caller's header must not write past the caller's
// struct: the defaults go into a whole struct here and only the caller's
// `size` bytes (at most ours) are copied out, with struct_size saying so.
template <typename T>
void initSized(T* out, size_t size, void (*defaults)(T*)) {
  if (!out || size < sizeof(uint32_t)) return;
  T d;
  defaults(&d);
  const size_t n = std::min(size, sizeof(T));
  d.struct_size = static_cast<uint32_t>(n);
  std::memcpy(out, &d, n);
}

void configDefaults(hora_config_t* c) {
  std::memset(c, 0, sizeof(*c));
  c->struct_size = sizeof(*c);
  c->rank = c->size = c->local_rank = c->local_size = c->cross_rank = c->cross_size = -1;
  c->store_external = -1;
  c->cycle_time_ms = -1;
  c->fusion_threshold_bytes = -1;
  c->cache_capacity = -1;
  c->stall_warning_time_s = -1;
  c->stall_shutdown_time_s = -1;
  c->peer_timeout_s = -1;
  c->start_timeout_s = -1;
  c->elastic = -1;
  c->elastic_newcomer = -1;
}

void optionsDefaults(hora_options_t* o) {
  std::memset(o, 0, sizeof(*o));
  o->struct_size = sizeof(*o);
  o->op = HORA_OP_SUM;
  o->prescale = 1.0;
  o->postscale = 1.0;
}

// The structs as of 0.5.0, what the unsized entry points (for programs
// built against those headers) may fill: never change these.
constexpr size_t kConfigBytesV050 = offsetof(hora_config_t, elastic_newcomer) + sizeof(int32_t);
constexpr size_t kOptionsBytesV050 = offsetof(hora_options_t, ready_event) + sizeof(void*);

}  // namespace

extern "C" {

HORA_API void hora_get_version(int32_t* major, int32_t* minor, int32_t* patch) {
  if (major) *major = HORA_VERSION_MAJOR;
  if (minor) *minor = HORA_VERSION_MINOR;
  if (patch) *patch = HORA_VERSION_PATCH;
}

HORA_API const char* hora_status_string(hora_status_t status) {
  switch (status) {
    case HORA_SUCCESS:
      return "success";
    case HORA_ERR_INVALID_ARGUMENT:
      return "invalid argument: check the arguments named in hora_last_error_message()";
    case HORA_ERR_INVALID_USAGE:
      return "invalid usage: the call is not valid now (duplicate name in flight, wrong state)";
    case HORA_ERR_NOT_INITIALIZED:
      return "not initialized: call hora_init first";
    case HORA_ERR_SHUT_DOWN:
      return "shut down: the runtime (or a peer) shut down; no more collectives can run";
    case HORA_ERR_SYSTEM:
      return "system error: an OS call failed (network, memory, file)";
    case HORA_ERR_BACKEND:
      return "backend error: the data-plane library failed";
    case HORA_ERR_REMOTE:
      return "remote error: a peer rank was lost or failed; see the message for which";
    case HORA_ERR_TIMEOUT:
      return "timeout: a deadline passed";
    case HORA_IN_PROGRESS:
      return "in progress";
    case HORA_ERR_NOT_SUPPORTED:
      return "not supported in this build or on this device";
    case HORA_ERR_MISMATCH:
      return "mismatch: ranks submitted different requests for the same tensor";
    case HORA_ERR_AUTH:
      return "authentication failed: check HORA_SECRET / HORA_SECRET_FILE";
    case HORA_ERR_PROTOCOL:
      return "protocol error: malformed message (mixed hora versions or a stray client?)";
    case HORA_ERR_INTERNAL:
      return "internal error: a bug in hora, please report it";
    case HORA_ERR_MEMBERSHIP:
      return "membership changed: a member was lost or joins; restore the last commit and call "
             "hora_reform";
    default:
      return "unknown status code";
  }
}

HORA_API const char* hora_last_error_message(void) { return hora::capi::tlsLastError.c_str(); }

HORA_API void hora_config_init_sized(hora_config_t* c, size_t size) {
  initSized(c, size, configDefaults);
}

HORA_API void hora_options_init_sized(hora_options_t* o, size_t size) {
  initSized(o, size, optionsDefaults);
}

// The unsized entry points of headers before 0.5.1 (the header's macros of
// the same names call the sized ones).
#undef hora_config_init
#undef hora_options_init
HORA_API void hora_config_init(hora_config_t* c) { initSized(c, kConfigBytesV050, configDefaults); }

HORA_API void hora_options_init(hora_options_t* o) {
  initSized(o, kOptionsBytesV050, optionsDefaults);
}

}  // extern "C"
