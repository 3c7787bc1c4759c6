// The registry of HORA_* environment parameters: one table with each
// parameter's type, default and documentation, read once per runtime.
//
// Who calls it: Runtime creation (framework thread, once), the launcher's
// documentation dump (docs/params.md is generated from dumpMarkdown()).
// A Params object is immutable after parse(); safe to share across threads.
//
// Tests pass an explicit map instead of touching the process environment, so
// two runtimes in one process can be configured differently.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"

namespace hora {

enum class ParamType { kInt, kFloat, kString, kBool };

struct ParamSpec {
  const char* name;
  ParamType type;
  const char* defaultValue;  // as text; "" for unset strings
  const char* doc;
  // Strings with a fixed set of values: "a|b|c". Checked (case-insensitive)
  // when the parameters are read, and stored lower-case, so a bad value fails
  // hora_init naming the choices and the code using it parses it once.
  const char* choices = nullptr;
};

// Every parameter hora reads. Units are in the names.
const std::vector<ParamSpec>& paramRegistry();

// A Horovod environment variable (HOROVOD_*) hora honours or reports: an
// alias that sets a HORA_* parameter when that parameter itself is not set
// (HORA_* always wins), converted to hora's unit and spelling; or one hora has
// no equivalent for (horaName nullptr), reported as ignored. Every HOROVOD_*
// variable a process used is named in one log line (Params::horovodSummary()).
struct HorovodAlias {
  const char* horovodName;
  const char* horaName;  // nullptr: no equivalent in hora; ignored with a warning
  // Horovod's value -> the HORA_* parameter's text; nullptr: the same text.
  // False with *error when the value is unusable; true with *out empty when
  // the value asks for nothing hora would change (HOROVOD_STALL_CHECK_DISABLE=0).
  bool (*convert)(const std::string& in, std::string* out, std::string* error);
  const char* note;  // for docs/params.md and the log line
};

// Every HOROVOD_* variable hora reads, aliases in the order they take effect
// (the first one set wins among aliases of one parameter).
const std::vector<HorovodAlias>& horovodAliases();

// What became of one HOROVOD_* variable found in the environment.
struct HorovodUse {
  enum class Outcome { kApplied, kOverridden, kIgnored, kNoEffect };
  std::string horovodName;
  std::string value;
  std::string horaName;  // empty for ignored variables
  Outcome outcome;
  std::string detail;  // applied: the HORA_* value; overridden: by whom; ignored: why
};

class Params {
 public:
  // Reads every registered name through `lookup` (nullptr = not set) and
  // validates types and ranges. Unknown HORA_* names in `environment` (when
  // given) are reported as warnings by the caller via unknownNames().
  static Result<Params> parse(const std::function<const char*(const char*)>& lookup);
  static Result<Params> fromEnvironment();
  static Result<Params> fromMap(const std::map<std::string, std::string>& values);

  int64_t getInt(const char* name) const;
  double getFloat(const char* name) const;
  const std::string& getString(const char* name) const;
  bool getBool(const char* name) const;
  // Whether the value came from the environment/map rather than the default.
  bool isSet(const char* name) const;
  // The HOROVOD_* variables that were set, in horovodAliases() order.
  const std::vector<HorovodUse>& horovodUses() const { return horovodUses_; }
  // One log line naming each of them and what it did; "" when none was set.
  std::string horovodSummary() const;

  // Markdown table of every parameter, for docs/params.md.
  static std::string dumpMarkdown();

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, bool> set_;
  std::vector<HorovodUse> horovodUses_;
};

}  // namespace hora
