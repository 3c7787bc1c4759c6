// Small helpers shared by the C-ABI benches (hora-p2p-bench,
// hora-coll-bench, ...): fatal errors that name the program and rank, a check
// of hora's status codes, checked numeric flags and "4,64K,1M" size lists.
// Header-only; main thread.
#pragma once

#include <hora/hora.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

// A 1-D CPU tensor of `count` elements of `dtype` over a caller's buffer.
struct Tensor1d {
  int64_t shape[1];
  DLTensor t;
  Tensor1d(void* data, size_t count, DLDataType dtype) {
    shape[0] = static_cast<int64_t>(count);
    std::memset(&t, 0, sizeof t);
    t.data = data;
    t.device.device_type = kDLCPU;
    t.ndim = 1;
    t.dtype = dtype;
    t.shape = shape;
  }
};

// hora_init with the default config (identity from the environment), this
// rank and the world size; who->rank is set for later messages.
inline hora_runtime_t initRuntime(Who* who, int32_t* rank, int32_t* size) {
  hora_config_t cfg;
  hora_config_init(&cfg);
  hora_runtime_t rt = nullptr;
  check(*who, hora_init(&cfg, &rt), "hora_init");
  check(*who, hora_rank(rt, rank), "hora_rank");
  check(*who, hora_size(rt, size), "hora_size");
  who->rank = *rank;
  return rt;
}

// A numeric flag's value: a whole number (readInt) or a decimal (readReal)
// within [lo, hi]. False for an empty, partial, non-finite or out-of-range
// text, which atoi/atof would have read as 0 or as its prefix.
inline bool readInt(const std::string& s, long long lo, long long hi, long long* out) {
  if (s.empty() || s.find_first_not_of("+-0123456789") != std::string::npos) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

inline bool readReal(const std::string& s, double lo, double hi, double* out) {
  if (s.empty() || s.find_first_not_of("+-.0123456789eE") != std::string::npos) return false;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (*end != '\0' || !std::isfinite(v) || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// "--iters expects an integer from 1 to 100000, got 'x'".
inline std::string badNumber(const std::string& flag, const std::string& s, double lo, double hi,
                             bool whole) {
  char range[96];
  std::snprintf(range, sizeof range, whole ? "%.0f to %.0f" : "%g to %g", lo, hi);
  return flag + " expects " + (whole ? "an integer" : "a number") + " from " + range + ", got '" +
         s + "'";
}

inline long long intFlag(const Who& who, const std::string& flag, const std::string& s,
                         long long lo, long long hi) {
  long long v = 0;
  if (!readInt(s, lo, hi, &v))
    fatal(who, badNumber(flag, s, static_cast<double>(lo), static_cast<double>(hi), true));
  return v;
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
