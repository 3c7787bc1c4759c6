// Small helpers shared by the C-ABI benches (hora-p2p-bench,
// hora-coll-bench): fatal errors that name the program and rank, a check of
// hora's status codes, and "4,64K,1M" size lists. Header-only; main thread.
#pragma once

#include <hora/hora.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace bench_util {

// Which program and rank a fatal error names (set rank once it is known).
struct Who {
  const char* program;
  int rank = 0;
};

// Prints "[program rank r] what" and exits with status 2 (a run that failed,
// as opposed to 1: a wrong result).
[[noreturn]] inline void fatal(const Who& who, const std::string& what) {
  std::fprintf(stderr, "[%s rank %d] %s\n", who.program, who.rank, what.c_str());
  std::exit(2);
}

inline void check(const Who& who, hora_status_t s, const std::string& what) {
  if (s != HORA_SUCCESS)
    fatal(who, what + ": " + hora_status_string(s) + ": " + hora_last_error_message());
}

// "64", "64K", "1M": bytes.
inline size_t parseBytes(const Who& who, const std::string& s) {
  char* end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (end == s.c_str()) fatal(who, "bad size '" + s + "'");
  if (*end == 'K' || *end == 'k')
    v <<= 10, ++end;
  else if (*end == 'M' || *end == 'm')
    v <<= 20, ++end;
  if (*end != '\0') fatal(who, "bad size '" + s + "'");
  return static_cast<size_t>(v);
}

// "a,b,,c" -> {"a", "b", "c"}.
inline std::vector<std::string> splitList(const std::string& list) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= list.size()) {
    size_t comma = list.find(',', at);
    if (comma == std::string::npos) comma = list.size();
    if (comma > at) out.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

inline std::vector<size_t> parseSizes(const Who& who, const std::string& list) {
  std::vector<size_t> out;
  for (const auto& s : splitList(list)) out.push_back(parseBytes(who, s));
  return out;
}

}  // namespace bench_util
