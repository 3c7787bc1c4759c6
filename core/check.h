// HORA_CHECK: invariants, i.e. programmer errors inside hora. A failed check
// prints file, line, the expression and the streamed detail, then aborts: it
// never signals a recoverable condition (those are a Status).
//
//   HORA_CHECK(group.entries.size() == group.responses.size()) << "group of " << n;
//
// Any thread. Costs one branch when the condition holds.
#pragma once

#include <sstream>

namespace hora::detail {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* expression);
  ~CheckFailure();  // aborts
  std::ostringstream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

}  // namespace hora::detail

#define HORA_CHECK(cond) \
  if (cond) {            \
  } else                 \
    ::hora::detail::CheckFailure(__FILE__, __LINE__, #cond).stream()
