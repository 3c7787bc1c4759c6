// Leveled logging with a rank prefix.
//
// A Logger is a small immutable value (level + prefix) owned by whoever needs
// it: each Runtime makes one with "[hora rank N]" so two runtimes in one
// process log distinguishably. Writes go to stderr, one fprintf per line so
// lines from different threads never interleave mid-line.
//
// Thread-safety: all methods are const and safe from any thread.
#pragma once

#include <sstream>
#include <string>

namespace hora {

enum class LogLevel : int { kTrace = 0, kDebug = 1, kInfo = 2, kWarning = 3, kError = 4, kOff = 5 };

// Parses "trace|debug|info|warning|error|off" (case-insensitive). False if unknown.
bool parseLogLevel(const std::string& text, LogLevel* out);
const char* logLevelName(LogLevel level);

class Logger {
 public:
  Logger() = default;
  Logger(LogLevel level, std::string prefix) : level_(level), prefix_(std::move(prefix)) {}
  bool enabled(LogLevel level) const { return level >= level_ && level_ != LogLevel::kOff; }
  void log(LogLevel level, const std::string& message) const;
  LogLevel level() const { return level_; }
  const std::string& prefix() const { return prefix_; }

 private:
  LogLevel level_ = LogLevel::kWarning;
  std::string prefix_ = "[hora]";
};

}  // namespace hora

// HORA_LOG(logger, kInfo) << "text " << value;
#define HORA_LOG(logger, lvl)                                        \
  for (bool hora_once_ = (logger).enabled(::hora::LogLevel::lvl); hora_once_; \
       hora_once_ = false)                                           \
  ::hora::detail::LogLine((logger), ::hora::LogLevel::lvl).stream()

namespace hora::detail {
class LogLine {
 public:
  LogLine(const Logger& logger, LogLevel level) : logger_(logger), level_(level) {}
  ~LogLine() { logger_.log(level_, stream_.str()); }
  std::ostringstream& stream() { return stream_; }

 private:
  const Logger& logger_;
  LogLevel level_;
  std::ostringstream stream_;
};
}  // namespace hora::detail
