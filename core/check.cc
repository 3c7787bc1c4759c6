#include "core/check.h"

#include <cstdio>
#include <cstdlib>

namespace hora::detail {

CheckFailure::CheckFailure(const char* file, int line, const char* expression) {
  stream_ << file << ":" << line << ": hora internal check failed: " << expression << " ";
}

CheckFailure::~CheckFailure() {
  std::fprintf(stderr, "%s (a bug in hora; please report it)\n", stream_.str().c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace hora::detail
