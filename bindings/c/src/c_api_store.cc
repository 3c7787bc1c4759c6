// extern "C" entry points for hosting the rendezvous store outside a rank:
// hora_store_server_start/port/stop over hora::TcpStoreServer. Called by
// launchers (horarun) on their main thread; the server itself serves on its
// own internal thread. Same conventions as c_api.cc: argument checks, status +
// thread-local last error, no exception crosses the ABI.
#include <cstdint>
#include <memory>
#include <string>

#include "c_api_internal.h"
#include "core/logging.h"
#include "core/params.h"
#include "core/tcp_store.h"
#include "hora/hora.h"

using hora::Code;
using hora::capi::clearError;
using hora::capi::fail;
using hora::capi::guarded;
using hora::capi::setError;

namespace {
constexpr uint32_t kServerMagic = 0x68737330;  // "hss0"
}  // namespace

struct hora_store_server_s {
  uint32_t magic = kServerMagic;
  std::unique_ptr<hora::TcpStoreServer> server;
};

namespace {

// The store has no runtime to take a logger from: the level comes from
// HORA_LOG_LEVEL through the parameter registry (default warning, which
// shows refused clients; also when some HORA_* variable is malformed, which
// the ranks themselves report).
hora::Logger storeLogger() {
  hora::LogLevel level = hora::LogLevel::kWarning;
  auto params = hora::Params::fromEnvironment();
  if (params.isOk() && !hora::parseLogLevel(params.value().getString("HORA_LOG_LEVEL"), &level))
    level = hora::LogLevel::kWarning;
  return hora::Logger(level, "[hora store]");
}

}  // namespace

extern "C" {

HORA_API hora_status_t hora_store_server_start(const char* bind_host, int32_t port,
                                               const char* secret, hora_store_server_t* out) {
  return guarded("hora_store_server_start", [&]() -> hora_status_t {
    if (!out) return fail(Code::kInvalidArgument, "hora_store_server_start: out is NULL");
    *out = nullptr;
    if (port < 0 || port > 65535)
      return fail(Code::kInvalidArgument, "hora_store_server_start: port " + std::to_string(port) +
                                              " is out of range (0..65535; 0 = ephemeral)");
    auto server = hora::TcpStoreServer::start(bind_host ? bind_host : "", port,
                                              secret ? secret : "", storeLogger());
    if (!server.isOk()) return setError(server.status());
    auto* h = new hora_store_server_s();
    h->server = server.take();
    *out = h;
    return HORA_SUCCESS;
  });
}

HORA_API hora_status_t hora_store_server_port(hora_store_server_t server, int32_t* out) {
  return guarded("hora_store_server_port", [&]() -> hora_status_t {
    if (!server || server->magic != kServerMagic || !out)
      return fail(Code::kInvalidArgument,
                  "hora_store_server_port: invalid server handle or out is NULL");
    *out = server->server->port();
    return HORA_SUCCESS;
  });
}

HORA_API hora_status_t hora_store_server_set(hora_store_server_t server, const char* key,
                                             const void* value, size_t len) {
  return guarded("hora_store_server_set", [&]() -> hora_status_t {
    if (!server || server->magic != kServerMagic || !key || (!value && len > 0))
      return fail(Code::kInvalidArgument,
                  "hora_store_server_set: invalid server handle, key NULL or value NULL");
    auto st = server->server->set(key, std::string(static_cast<const char*>(value), len));
    return st.isOk() ? HORA_SUCCESS : setError(st);
  });
}

HORA_API hora_status_t hora_store_server_add(hora_store_server_t server, const char* key,
                                             int64_t delta, int64_t* out) {
  return guarded("hora_store_server_add", [&]() -> hora_status_t {
    if (!server || server->magic != kServerMagic || !key)
      return fail(Code::kInvalidArgument,
                  "hora_store_server_add: invalid server handle or key NULL");
    auto next = server->server->add(key, delta);
    if (!next.isOk()) return setError(next.status());
    if (out) *out = next.value();
    return HORA_SUCCESS;
  });
}

HORA_API hora_status_t hora_store_server_check(hora_store_server_t server, const char* key,
                                               int32_t* out) {
  return guarded("hora_store_server_check", [&]() -> hora_status_t {
    if (!server || server->magic != kServerMagic || !key || !out)
      return fail(Code::kInvalidArgument,
                  "hora_store_server_check: invalid server handle, key NULL or out NULL");
    auto present = server->server->check(key);
    if (!present.isOk()) return setError(present.status());
    *out = present.value() ? 1 : 0;
    return HORA_SUCCESS;
  });
}

HORA_API hora_status_t hora_store_server_stop(hora_store_server_t server) {
  return guarded("hora_store_server_stop", [&]() -> hora_status_t {
    if (!server) return HORA_SUCCESS;
    if (server->magic != kServerMagic)
      return fail(Code::kInvalidArgument, "hora_store_server_stop: not a store server handle");
    server->magic = 0;
    delete server;
    return HORA_SUCCESS;
  });
}

}  // extern "C"
