#include "core/logging.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>

namespace hora {

bool parseLogLevel(const std::string& text, LogLevel* out) {
  std::string t = text;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "trace") *out = LogLevel::kTrace;
  else if (t == "debug") *out = LogLevel::kDebug;
  else if (t == "info") *out = LogLevel::kInfo;
  else if (t == "warning" || t == "warn") *out = LogLevel::kWarning;
  else if (t == "error") *out = LogLevel::kError;
  else if (t == "off" || t == "none") *out = LogLevel::kOff;
  else return false;
  return true;
}

const char* logLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return "TRACE";
    case LogLevel::kDebug: return "DEBUG";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kWarning: return "WARNING";
    case LogLevel::kError: return "ERROR";
    case LogLevel::kOff: return "OFF";
  }
  return "?";
}

void Logger::log(LogLevel level, const std::string& message) const {
  if (!enabled(level)) return;
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char ts[32];
  std::strftime(ts, sizeof(ts), "%H:%M:%S", &tm);
  // One call so concurrent lines do not interleave.
  std::fprintf(stderr, "%s.%03lld %s %s %s\n", ts, static_cast<long long>(ms), prefix_.c_str(),
               logLevelName(level), message.c_str());
}

}  // namespace hora
