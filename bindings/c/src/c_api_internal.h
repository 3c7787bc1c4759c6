// Helpers shared by the C ABI's translation units: the thread-local
// last-error slot. Used only inside libhora, on the calling (framework) thread.
#pragma once

#include <string>

#include "core/status.h"
#include "hora/hora.h"

namespace hora::capi {
hora_status_t setError(hora_status_t status, const std::string& message);
hora_status_t setError(const Status& status);
void clearError();
}  // namespace hora::capi
