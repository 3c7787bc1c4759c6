// Helpers shared by the C ABI's translation units: the thread-local
// last-error slot. Used only inside libhora, on the calling (framework) thread.
#pragma once

#include <exception>
#include <new>
#include <string>

#include "core/status.h"
#include "hora/hora.h"

namespace hora::capi {
hora_status_t setError(hora_status_t status, const std::string& message);
hora_status_t setError(const Status& status);
void clearError();

// Runs `body` (an entry point's work) with every exception turned into a
// status: nothing may cross extern "C".
template <typename F>
hora_status_t guarded(const char* fn, F&& body) {
  clearError();
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return setError(HORA_ERR_SYSTEM, std::string(fn) + ": out of memory");
  } catch (const std::exception& e) {
    return setError(HORA_ERR_INTERNAL, std::string(fn) + ": unexpected exception: " + e.what());
  } catch (...) {
    return setError(HORA_ERR_INTERNAL, std::string(fn) + ": unexpected non-standard exception");
  }
}

inline hora_status_t fail(Code code, const std::string& msg) {
  return setError(static_cast<hora_status_t>(code), msg);
}
}  // namespace hora::capi
