// Unit tests for core/params.h (the HORA_* registry, defaults, overrides and
// validation) and for log-level parsing in core/logging.h.
#include "core/params.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/logging.h"

namespace hora {
namespace {

const ParamSpec* spec(const std::string& name) {
  for (const auto& s : paramRegistry())
    if (name == s.name) return &s;
  return nullptr;
}

Params defaults() {
  Result<Params> p = Params::fromMap({});
  EXPECT_TRUE(p.isOk()) << p.status().toString();
  return p.take();
}

// ---------------------------------------------------------------- registry

TEST(ParamRegistryTest, EveryEntryHasPrefixedNameAndDoc) {
  ASSERT_FALSE(paramRegistry().empty());
  for (const auto& s : paramRegistry()) {
    ASSERT_NE(s.name, nullptr);
    ASSERT_NE(s.doc, nullptr);
    ASSERT_NE(s.defaultValue, nullptr);
    EXPECT_EQ(std::string(s.name).rfind("HORA_", 0), 0u) << s.name;
    EXPECT_GT(std::strlen(s.name), std::strlen("HORA_")) << s.name;
    EXPECT_GT(std::strlen(s.doc), 0u) << s.name;
  }
}

TEST(ParamRegistryTest, NamesAreUnique) {
  std::set<std::string> names;
  for (const auto& s : paramRegistry()) EXPECT_TRUE(names.insert(s.name).second) << s.name;
}

TEST(ParamRegistryTest, EveryDefaultPassesItsOwnValidation) {
  // Feeding each default back in explicitly must be accepted: the registry
  // cannot hold a default that a user could not also set.
  for (const auto& s : paramRegistry()) {
    if (s.type == ParamType::kString) continue;
    Result<Params> p = Params::fromMap({{s.name, s.defaultValue}});
    EXPECT_TRUE(p.isOk()) << s.name << ": " << p.status().toString();
  }
}

TEST(ParamRegistryTest, ExpectedDefaults) {
  const std::map<std::string, std::string> expected = {
      {"HORA_CYCLE_TIME_MS", "1"},           {"HORA_FUSION_THRESHOLD_BYTES", "134217728"},
      {"HORA_CACHE_CAPACITY", "1024"},       {"HORA_STALL_WARNING_TIME_S", "60"},
      {"HORA_STALL_SHUTDOWN_TIME_S", "300"},
  };
  for (const auto& [name, value] : expected) {
    const ParamSpec* s = spec(name);
    ASSERT_NE(s, nullptr) << name;
    EXPECT_STREQ(s->defaultValue, value.c_str()) << name;
  }
}

// ----------------------------------------------------------------- parsing

TEST(ParamsTest, DefaultsFromRegistry) {
  Params p = defaults();
  EXPECT_DOUBLE_EQ(p.getFloat("HORA_CYCLE_TIME_MS"), 1.0);
  EXPECT_EQ(p.getInt("HORA_FUSION_THRESHOLD_BYTES"), 134217728);
  EXPECT_EQ(p.getInt("HORA_FUSION_THRESHOLD_BYTES"), int64_t{128} << 20);
  EXPECT_EQ(p.getInt("HORA_CACHE_CAPACITY"), 1024);
  EXPECT_DOUBLE_EQ(p.getFloat("HORA_STALL_WARNING_TIME_S"), 60.0);
  EXPECT_DOUBLE_EQ(p.getFloat("HORA_STALL_SHUTDOWN_TIME_S"), 300.0);
  EXPECT_EQ(p.getInt("HORA_RANK"), -1);
  EXPECT_EQ(p.getInt("HORA_STORE_PORT"), 29500);
  EXPECT_FALSE(p.getBool("HORA_STORE_EXTERNAL"));
  EXPECT_EQ(p.getString("HORA_STORE_ADDR"), "");
  EXPECT_EQ(p.getString("HORA_LOG_LEVEL"), "warning");
  EXPECT_EQ(p.getString("HORA_GLOO_ALGORITHM"), "auto");
}

TEST(ParamsTest, NothingIsSetByDefault) {
  Params p = defaults();
  for (const auto& s : paramRegistry()) EXPECT_FALSE(p.isSet(s.name)) << s.name;
}

TEST(ParamsTest, EveryRegisteredNameIsReadable) {
  Params p = defaults();
  for (const auto& s : paramRegistry()) EXPECT_EQ(p.getString(s.name), s.defaultValue) << s.name;
}

TEST(ParamsTest, FromMapOverrides) {
  Result<Params> r = Params::fromMap({
      {"HORA_CYCLE_TIME_MS", "2.5"},
      {"HORA_FUSION_THRESHOLD_BYTES", "0"},
      {"HORA_CACHE_CAPACITY", "16"},
      {"HORA_STALL_WARNING_TIME_S", "10"},
      {"HORA_STALL_SHUTDOWN_TIME_S", "0"},
      {"HORA_STORE_EXTERNAL", "true"},
      {"HORA_STORE_ADDR", "10.0.0.1"},
      {"HORA_RANK", "3"},
  });
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  const Params& p = r.value();
  EXPECT_DOUBLE_EQ(p.getFloat("HORA_CYCLE_TIME_MS"), 2.5);
  EXPECT_EQ(p.getInt("HORA_FUSION_THRESHOLD_BYTES"), 0);
  EXPECT_EQ(p.getInt("HORA_CACHE_CAPACITY"), 16);
  EXPECT_DOUBLE_EQ(p.getFloat("HORA_STALL_WARNING_TIME_S"), 10.0);
  EXPECT_DOUBLE_EQ(p.getFloat("HORA_STALL_SHUTDOWN_TIME_S"), 0.0);
  EXPECT_TRUE(p.getBool("HORA_STORE_EXTERNAL"));
  EXPECT_EQ(p.getString("HORA_STORE_ADDR"), "10.0.0.1");
  EXPECT_EQ(p.getInt("HORA_RANK"), 3);
  EXPECT_TRUE(p.isSet("HORA_CACHE_CAPACITY"));
  EXPECT_TRUE(p.isSet("HORA_STORE_ADDR"));
  EXPECT_FALSE(p.isSet("HORA_SIZE"));
  EXPECT_EQ(p.getInt("HORA_SIZE"), -1);
}

TEST(ParamsTest, SettingTheDefaultValueStillCountsAsSet) {
  Result<Params> r = Params::fromMap({{"HORA_CACHE_CAPACITY", "1024"}});
  ASSERT_TRUE(r.isOk());
  EXPECT_TRUE(r.value().isSet("HORA_CACHE_CAPACITY"));
}

TEST(ParamsTest, EmptyStringIsAValidString) {
  Result<Params> r = Params::fromMap({{"HORA_HOSTNAME", ""}});
  ASSERT_TRUE(r.isOk());
  EXPECT_TRUE(r.value().isSet("HORA_HOSTNAME"));
  EXPECT_EQ(r.value().getString("HORA_HOSTNAME"), "");
}

TEST(ParamsTest, BoolSpellings) {
  for (const char* v : {"1", "true"}) {
    Result<Params> r = Params::fromMap({{"HORA_STORE_EXTERNAL", v}});
    ASSERT_TRUE(r.isOk()) << v;
    EXPECT_TRUE(r.value().getBool("HORA_STORE_EXTERNAL")) << v;
  }
  for (const char* v : {"0", "false"}) {
    Result<Params> r = Params::fromMap({{"HORA_STORE_EXTERNAL", v}});
    ASSERT_TRUE(r.isOk()) << v;
    EXPECT_FALSE(r.value().getBool("HORA_STORE_EXTERNAL")) << v;
  }
}

TEST(ParamsTest, NumericSpellingsAccepted) {
  for (const char* v : {"0", "-1", "42", "9223372036854775807"}) {
    EXPECT_TRUE(Params::fromMap({{"HORA_STORE_PORT", v}}).isOk()) << v;
  }
  for (const char* v : {"0", "0.5", "1e3", "-2", ".25"}) {
    EXPECT_TRUE(Params::fromMap({{"HORA_CYCLE_TIME_MS", v}}).isOk()) << v;
  }
  Result<Params> r = Params::fromMap({{"HORA_CYCLE_TIME_MS", "1e3"}});
  EXPECT_DOUBLE_EQ(r.value().getFloat("HORA_CYCLE_TIME_MS"), 1000.0);
}

void expectInvalid(const std::string& name, const std::string& value) {
  Result<Params> r = Params::fromMap({{name, value}});
  ASSERT_FALSE(r.isOk()) << name << "=" << value;
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << name << "=" << value;
  const std::string& m = r.status().message();
  const ParamSpec* s = spec(name);
  ASSERT_NE(s, nullptr);
  EXPECT_NE(m.find(name), std::string::npos) << m;
  EXPECT_NE(m.find(std::string("default ") + s->defaultValue), std::string::npos) << m;
  EXPECT_NE(m.find("'" + value + "'"), std::string::npos) << m;
}

TEST(ParamsTest, InvalidIntegers) {
  for (const char* v : {"", "abc", "12abc", "1.5", "0x10", "1 ", "99999999999999999999999"}) {
    expectInvalid("HORA_CACHE_CAPACITY", v);
  }
  expectInvalid("HORA_FUSION_THRESHOLD_BYTES", "128MiB");
}

TEST(ParamsTest, InvalidIntegerMessageSaysInteger) {
  Result<Params> r = Params::fromMap({{"HORA_CACHE_CAPACITY", "lots"}});
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("not an integer"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("default 1024"), std::string::npos);
}

TEST(ParamsTest, InvalidFloats) {
  // inf was accepted (strtod reads it) and overflowed the durations made of it (found by
  // tests/fuzz/fuzz_params.cc).
  for (const char* v : {"", "fast", "1.5s", "nan", "NaN", "1e999", "inf", "-inf", "Infinity"}) {
    expectInvalid("HORA_STALL_WARNING_TIME_S", v);
  }
  Result<Params> r = Params::fromMap({{"HORA_CYCLE_TIME_MS", "x"}});
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("not a number"), std::string::npos);
  EXPECT_NE(r.status().message().find("default 1"), std::string::npos);
}

TEST(ParamsTest, InvalidBools) {
  for (const char* v : {"", "yes", "no", "2", "TRUE", "on"}) {
    expectInvalid("HORA_STORE_EXTERNAL", v);
  }
  Result<Params> r = Params::fromMap({{"HORA_STORE_EXTERNAL", "yes"}});
  EXPECT_NE(r.status().message().find("boolean"), std::string::npos);
}

TEST(ParamsTest, UnknownNameRejected) {
  Result<Params> r = Params::fromMap({{"HORA_CACHE_CAPACITYY", "5"}});
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("HORA_CACHE_CAPACITYY"), std::string::npos);
  EXPECT_NE(r.status().message().find("unknown parameter"), std::string::npos);
  // Even alongside valid names, and even when not HORA_-prefixed.
  EXPECT_FALSE(Params::fromMap({{"HORA_RANK", "0"}, {"NOT_HORA", "1"}}).isOk());
}

TEST(ParamsTest, FirstInvalidParameterFailsWholeParse) {
  Result<Params> r = Params::fromMap({{"HORA_RANK", "0"}, {"HORA_SIZE", "two"}});
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("HORA_SIZE"), std::string::npos);
}

TEST(ParamsTest, ParseWithLookupFunction) {
  int calls = 0;
  Result<Params> r = Params::parse([&](const char* name) -> const char* {
    ++calls;
    return std::string(name) == "HORA_CACHE_CAPACITY" ? "7" : nullptr;
  });
  ASSERT_TRUE(r.isOk());
  // Every parameter once, and every Horovod name once (aliases and ignored ones).
  EXPECT_EQ(calls, static_cast<int>(paramRegistry().size() + horovodAliases().size()));
  EXPECT_EQ(r.value().getInt("HORA_CACHE_CAPACITY"), 7);
  EXPECT_TRUE(r.value().isSet("HORA_CACHE_CAPACITY"));
  EXPECT_FALSE(r.value().isSet("HORA_RANK"));
}

TEST(ParamsTest, ParseWithNullLookupGivesDefaults) {
  Result<Params> r = Params::parse(nullptr);
  ASSERT_TRUE(r.isOk());
  EXPECT_EQ(r.value().getInt("HORA_CACHE_CAPACITY"), 1024);
}

TEST(ParamsTest, UnregisteredGettersReturnZeroValues) {
  Params p = defaults();
  EXPECT_EQ(p.getInt("HORA_NOPE"), 0);
  EXPECT_DOUBLE_EQ(p.getFloat("HORA_NOPE"), 0.0);
  EXPECT_EQ(p.getString("HORA_NOPE"), "");
  EXPECT_FALSE(p.getBool("HORA_NOPE"));
  EXPECT_FALSE(p.isSet("HORA_NOPE"));
}

// ---------------------------------------------------------------- markdown

TEST(ParamsTest, DumpMarkdownContainsEveryName) {
  const std::string md = Params::dumpMarkdown();
  EXPECT_EQ(md.rfind("| name | type | default | meaning |", 0), 0u);
  for (const auto& s : paramRegistry()) {
    EXPECT_NE(md.find(std::string("`") + s.name + "`"), std::string::npos) << s.name;
    EXPECT_NE(md.find(s.doc), std::string::npos) << s.name;
  }
  // Header, separator and one row per parameter, then the Horovod section.
  const std::string first = md.substr(0, md.find("\n## "));
  size_t lines = 0;
  for (char c : first) lines += c == '\n';
  EXPECT_EQ(lines, paramRegistry().size() + 2);
}

TEST(ParamsTest, DumpMarkdownShowsTypes) {
  const std::string md = Params::dumpMarkdown();
  EXPECT_NE(md.find("| `HORA_CACHE_CAPACITY` | int | `1024` |"), std::string::npos) << md;
  EXPECT_NE(md.find("| `HORA_CYCLE_TIME_MS` | float | `1` |"), std::string::npos);
  EXPECT_NE(md.find("| `HORA_STORE_EXTERNAL` | bool | `0` |"), std::string::npos);
  EXPECT_NE(md.find("| `HORA_LOG_LEVEL` | string | `warning` |"), std::string::npos);
}

// ------------------------------------------------------------------ logging

TEST(LogLevelTest, ParsesEveryLevelCaseInsensitively) {
  const std::map<std::string, LogLevel> cases = {
      {"trace", LogLevel::kTrace},     {"debug", LogLevel::kDebug},  {"info", LogLevel::kInfo},
      {"warning", LogLevel::kWarning}, {"warn", LogLevel::kWarning}, {"error", LogLevel::kError},
      {"off", LogLevel::kOff},         {"none", LogLevel::kOff},     {"TRACE", LogLevel::kTrace},
      {"Warning", LogLevel::kWarning}, {"eRRoR", LogLevel::kError},  {"OFF", LogLevel::kOff},
  };
  for (const auto& [text, level] : cases) {
    LogLevel out = LogLevel::kInfo;
    if (level == LogLevel::kInfo) out = LogLevel::kOff;
    EXPECT_TRUE(parseLogLevel(text, &out)) << text;
    EXPECT_EQ(out, level) << text;
  }
}

TEST(LogLevelTest, UnknownLeavesOutputUntouched) {
  for (const char* text : {"", "verbose", "warnings", " info", "info ", "3"}) {
    LogLevel out = LogLevel::kDebug;
    EXPECT_FALSE(parseLogLevel(text, &out)) << text;
    EXPECT_EQ(out, LogLevel::kDebug) << text;
  }
}

TEST(LogLevelTest, DefaultParamParses) {
  LogLevel out = LogLevel::kTrace;
  ASSERT_TRUE(parseLogLevel(defaults().getString("HORA_LOG_LEVEL"), &out));
  EXPECT_EQ(out, LogLevel::kWarning);
}

TEST(LogLevelTest, NamesRoundTrip) {
  for (LogLevel l : {LogLevel::kTrace, LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarning,
                     LogLevel::kError, LogLevel::kOff}) {
    LogLevel back = LogLevel::kInfo;
    if (l == LogLevel::kInfo) back = LogLevel::kOff;
    ASSERT_TRUE(parseLogLevel(logLevelName(l), &back)) << logLevelName(l);
    EXPECT_EQ(back, l);
  }
  EXPECT_STREQ(logLevelName(LogLevel::kWarning), "WARNING");
  EXPECT_STREQ(logLevelName(static_cast<LogLevel>(42)), "?");
}

TEST(LoggerTest, EnabledRespectsThreshold) {
  Logger info(LogLevel::kInfo, "[t]");
  EXPECT_FALSE(info.enabled(LogLevel::kTrace));
  EXPECT_FALSE(info.enabled(LogLevel::kDebug));
  EXPECT_TRUE(info.enabled(LogLevel::kInfo));
  EXPECT_TRUE(info.enabled(LogLevel::kError));
  Logger off(LogLevel::kOff, "[t]");
  for (LogLevel l : {LogLevel::kTrace, LogLevel::kInfo, LogLevel::kError, LogLevel::kOff})
    EXPECT_FALSE(off.enabled(l));
  Logger def;
  EXPECT_EQ(def.level(), LogLevel::kWarning);
  EXPECT_EQ(def.prefix(), "[hora]");
  EXPECT_FALSE(def.enabled(LogLevel::kInfo));
  EXPECT_TRUE(def.enabled(LogLevel::kWarning));
}

TEST(LoggerTest, MacroSkipsStreamWhenDisabled) {
  Logger off(LogLevel::kOff, "[t]");
  int evaluated = 0;
  auto sideEffect = [&]() { return ++evaluated; };
  HORA_LOG(off, kError) << "never " << sideEffect();
  EXPECT_EQ(evaluated, 0);
  Logger err(LogLevel::kError, "[hora test]");
  HORA_LOG(err, kInfo) << sideEffect();
  EXPECT_EQ(evaluated, 0);
}

TEST(LoggerTest, MacroEvaluatesOnceWhenEnabled) {
  Logger trace(LogLevel::kTrace, "[hora unit test]");
  int evaluated = 0;
  testing::internal::CaptureStderr();
  HORA_LOG(trace, kDebug) << "value " << ++evaluated;
  std::string out = testing::internal::GetCapturedStderr();
  EXPECT_EQ(evaluated, 1);
  EXPECT_NE(out.find("[hora unit test] DEBUG value 1"), std::string::npos) << out;
  EXPECT_EQ(out.back(), '\n');
}

}  // namespace
}  // namespace hora

namespace hora {
namespace {

TEST(ParamsTest, ChoicesAreCheckedAndStoredLowerCase) {
  auto p = Params::fromMap(
      {{"HORA_GPU_BACKEND", "NCCL"}, {"HORA_GLOO_ALGORITHM", "Ring"}, {"HORA_LOG_LEVEL", "INFO"}});
  ASSERT_TRUE(p.isOk()) << p.status().toString();
  EXPECT_EQ(p.value().getString("HORA_GPU_BACKEND"), "nccl");
  EXPECT_EQ(p.value().getString("HORA_GLOO_ALGORITHM"), "ring");
  EXPECT_EQ(p.value().getString("HORA_LOG_LEVEL"), "info");
  for (const auto& [name, value, choices] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"HORA_GLOO_ALGORITHM", "tree", "one of auto,ring,bcube"},
           {"HORA_GPU_BACKEND", "cuda", "one of auto,nccl,gloo"},
           {"HORA_LOG_LEVEL", "fatal", "one of trace,debug,info,warning,error,off"},
           {"HORA_GPU_BACKEND", "", "one of auto,nccl,gloo"}}) {
    auto bad = Params::fromMap({{name, value}});
    ASSERT_FALSE(bad.isOk()) << name << "=" << value;
    EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
    EXPECT_NE(bad.status().message().find(name + "='" + value + "' is not " + choices),
              std::string::npos)
        << bad.status().message();
  }
}

// ------------------------------------------------------ Horovod's variables

using Outcome = HorovodUse::Outcome;

Params parsed(const std::map<std::string, std::string>& env) {
  Result<Params> p = Params::fromMap(env);
  EXPECT_TRUE(p.isOk()) << p.status().toString();
  return p.isOk() ? p.take() : Params();
}

const HorovodUse* use(const Params& p, const std::string& name) {
  for (const auto& u : p.horovodUses())
    if (u.horovodName == name) return &u;
  return nullptr;
}

TEST(HorovodAliasTest, TableIsWellFormed) {
  std::set<std::string> seen;
  for (const auto& a : horovodAliases()) {
    SCOPED_TRACE(a.horovodName);
    EXPECT_EQ(std::string(a.horovodName).rfind("HOROVOD_", 0), 0u);
    EXPECT_TRUE(seen.insert(a.horovodName).second) << "listed twice";
    ASSERT_NE(a.note, nullptr);
    EXPECT_GT(std::strlen(a.note), 0u);
    if (a.horaName) EXPECT_NE(spec(a.horaName), nullptr) << "aliases an unknown parameter";
  }
}

// Every alias, one at a time: a Horovod value, the HORA_* value it gives.
TEST(HorovodAliasTest, EveryAliasSetsItsParameter) {
  const std::vector<std::tuple<std::string, std::string, std::string, std::string>> cases = {
      {"HOROVOD_RANK", "3", "HORA_RANK", "3"},
      {"HOROVOD_SIZE", "8", "HORA_SIZE", "8"},
      {"HOROVOD_LOCAL_RANK", "1", "HORA_LOCAL_RANK", "1"},
      {"HOROVOD_LOCAL_SIZE", "4", "HORA_LOCAL_SIZE", "4"},
      {"HOROVOD_CROSS_RANK", "1", "HORA_CROSS_RANK", "1"},
      {"HOROVOD_CROSS_SIZE", "2", "HORA_CROSS_SIZE", "2"},
      {"HOROVOD_HOSTNAME", "node7", "HORA_HOSTNAME", "node7"},
      {"HOROVOD_FUSION_THRESHOLD", "67108864", "HORA_FUSION_THRESHOLD_BYTES", "67108864"},
      {"HOROVOD_CYCLE_TIME", "3.5", "HORA_CYCLE_TIME_MS", "3.5"},
      {"HOROVOD_CACHE_CAPACITY", "0", "HORA_CACHE_CAPACITY", "0"},
      {"HOROVOD_STALL_CHECK_DISABLE", "1", "HORA_STALL_CHECK", "0"},
      {"HOROVOD_HIERARCHICAL_ALLREDUCE", "1", "HORA_HIER_ALLREDUCE", "hier"},
      {"HOROVOD_STALL_CHECK_TIME_SECONDS", "20", "HORA_STALL_WARNING_TIME_S", "20"},
      {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "0", "HORA_STALL_SHUTDOWN_TIME_S", "0"},
      {"HOROVOD_LOG_LEVEL", "DEBUG", "HORA_LOG_LEVEL", "debug"},
      {"HOROVOD_GLOO_TIMEOUT_SECONDS", "45", "HORA_PEER_TIMEOUT_S", "45"},
      {"HOROVOD_GLOO_IFACE", "eth1", "HORA_GLOO_IFACE", "eth1"},
      {"HOROVOD_START_TIMEOUT", "90", "HORA_START_TIMEOUT_S", "90"},
      {"HOROVOD_ELASTIC", "1", "HORA_ELASTIC", "1"},
      {"HOROVOD_ELASTIC_TIMEOUT", "120", "HORA_ELASTIC_TIMEOUT_S", "120"},
      {"HOROVOD_TIMELINE", "/tmp/t.json", "HORA_TIMELINE", "/tmp/t.json"},
      {"HOROVOD_TIMELINE_MARK_CYCLES", "1", "HORA_TIMELINE_MARK_CYCLES", "1"},
      {"HOROVOD_AUTOTUNE", "0", "HORA_AUTOTUNE", "0"},
      {"HOROVOD_AUTOTUNE_LOG", "/tmp/a.csv", "HORA_AUTOTUNE_LOG", "/tmp/a.csv"},
  };
  size_t mapped = 0;
  for (const auto& a : horovodAliases()) mapped += a.horaName != nullptr;
  EXPECT_EQ(cases.size(), mapped) << "an alias without a case here";
  for (const auto& [horovod, value, hora, expected] : cases) {
    SCOPED_TRACE(horovod);
    Params p = parsed({{horovod, value}});
    EXPECT_EQ(p.getString(hora.c_str()), expected);
    EXPECT_TRUE(p.isSet(hora.c_str()));
    ASSERT_EQ(p.horovodUses().size(), 1u);
    const HorovodUse& u = p.horovodUses()[0];
    EXPECT_EQ(u.horovodName, horovod);
    EXPECT_EQ(u.value, value);
    EXPECT_EQ(u.horaName, hora);
    EXPECT_EQ(u.outcome, Outcome::kApplied);
    EXPECT_EQ(u.detail, expected);
    EXPECT_NE(p.horovodSummary().find(horovod + "=" + value + " -> " + hora + "=" + expected),
              std::string::npos)
        << p.horovodSummary();
  }
}

TEST(HorovodAliasTest, HoraWinsWhenBothAreSet) {
  Params p = parsed({{"HORA_FUSION_THRESHOLD_BYTES", "1024"},
                     {"HOROVOD_FUSION_THRESHOLD", "2048"},
                     {"HORA_LOG_LEVEL", "error"},
                     {"HOROVOD_LOG_LEVEL", "trace"},
                     {"HORA_STALL_CHECK", "1"},
                     {"HOROVOD_STALL_CHECK_DISABLE", "1"}});
  EXPECT_EQ(p.getInt("HORA_FUSION_THRESHOLD_BYTES"), 1024);
  EXPECT_EQ(p.getString("HORA_LOG_LEVEL"), "error");
  EXPECT_TRUE(p.getBool("HORA_STALL_CHECK"));
  for (const char* name :
       {"HOROVOD_FUSION_THRESHOLD", "HOROVOD_LOG_LEVEL", "HOROVOD_STALL_CHECK_DISABLE"}) {
    const HorovodUse* u = use(p, name);
    ASSERT_NE(u, nullptr) << name;
    EXPECT_EQ(u->outcome, Outcome::kOverridden) << name;
    EXPECT_EQ(u->detail, u->horaName + " is set") << name;
  }
  EXPECT_NE(p.horovodSummary().find("HOROVOD_FUSION_THRESHOLD=2048 not used "
                                    "(HORA_FUSION_THRESHOLD_BYTES is set)"),
            std::string::npos)
      << p.horovodSummary();
}

TEST(HorovodAliasTest, OverriddenValuesAreNotValidated) {
  // HORA_* wins, so a malformed Horovod value it replaces does not fail the start.
  Params p = parsed({{"HORA_CACHE_CAPACITY", "8"}, {"HOROVOD_CACHE_CAPACITY", "lots"}});
  EXPECT_EQ(p.getInt("HORA_CACHE_CAPACITY"), 8);
}

TEST(HorovodAliasTest, BadHorovodValuesNameTheHorovodVariable) {
  for (const auto& [name, value] :
       std::vector<std::pair<std::string, std::string>>{{"HOROVOD_FUSION_THRESHOLD", "64MB"},
                                                        {"HOROVOD_CYCLE_TIME", "fast"},
                                                        {"HOROVOD_LOG_LEVEL", "loud"},
                                                        {"HOROVOD_STALL_CHECK_DISABLE", "yes"},
                                                        {"HOROVOD_ELASTIC", "on"}}) {
    SCOPED_TRACE(name);
    auto r = Params::fromMap({{name, value}});
    ASSERT_FALSE(r.isOk());
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_EQ(r.status().message().rfind(name + "='" + value + "'", 0), 0u) << r.status().message();
  }
}

TEST(HorovodAliasTest, HorovodFatalIsHoraError) {
  EXPECT_EQ(parsed({{"HOROVOD_LOG_LEVEL", "FATAL"}}).getString("HORA_LOG_LEVEL"), "error");
  EXPECT_EQ(parsed({{"HOROVOD_LOG_LEVEL", "Warning"}}).getString("HORA_LOG_LEVEL"), "warning");
}

TEST(HorovodAliasTest, HorovodBooleansAreIntegers) {
  // Horovod reads them with strtol: any non-zero integer is on.
  EXPECT_TRUE(parsed({{"HOROVOD_ELASTIC", "2"}}).getBool("HORA_ELASTIC"));
  EXPECT_FALSE(parsed({{"HOROVOD_ELASTIC", "0"}}).getBool("HORA_ELASTIC"));
  EXPECT_FALSE(parsed({{"HOROVOD_STALL_CHECK_DISABLE", "7"}}).getBool("HORA_STALL_CHECK"));
}

TEST(HorovodAliasTest, StallCheckDisableZeroChangesNothing) {
  Params p = parsed({{"HOROVOD_STALL_CHECK_DISABLE", "0"}});
  EXPECT_TRUE(p.getBool("HORA_STALL_CHECK"));
  EXPECT_FALSE(p.isSet("HORA_STALL_CHECK"));
  ASSERT_NE(use(p, "HOROVOD_STALL_CHECK_DISABLE"), nullptr);
  EXPECT_EQ(use(p, "HOROVOD_STALL_CHECK_DISABLE")->outcome, Outcome::kNoEffect);
}

TEST(HorovodAliasTest, HierarchicalAllreduceZeroKeepsHorasChoice) {
  // Horovod's 0 is its default; hora's default (auto) stays, so a job that
  // spells out Horovod's defaults keeps the hierarchy across hosts.
  Params p = parsed({{"HOROVOD_HIERARCHICAL_ALLREDUCE", "0"}});
  EXPECT_EQ(p.getString("HORA_HIER_ALLREDUCE"), "auto");
  EXPECT_FALSE(p.isSet("HORA_HIER_ALLREDUCE"));
  ASSERT_NE(use(p, "HOROVOD_HIERARCHICAL_ALLREDUCE"), nullptr);
  EXPECT_EQ(use(p, "HOROVOD_HIERARCHICAL_ALLREDUCE")->outcome, Outcome::kNoEffect);
  EXPECT_EQ(parsed({{"HOROVOD_HIERARCHICAL_ALLREDUCE", "2"}}).getString("HORA_HIER_ALLREDUCE"),
            "hier");
  EXPECT_FALSE(Params::fromMap({{"HOROVOD_HIERARCHICAL_ALLREDUCE", "yes"}}).isOk());
}

TEST(HorovodAliasTest, StallTimesAndDisableTogether) {
  // Disable turns the check off; the times still land in their parameters
  // (unused while HORA_STALL_CHECK=0), as Horovod keeps them.
  Params p = parsed({{"HOROVOD_STALL_CHECK_DISABLE", "1"},
                     {"HOROVOD_STALL_CHECK_TIME_SECONDS", "5"},
                     {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "50"}});
  EXPECT_FALSE(p.getBool("HORA_STALL_CHECK"));
  EXPECT_DOUBLE_EQ(p.getFloat("HORA_STALL_WARNING_TIME_S"), 5);
  EXPECT_DOUBLE_EQ(p.getFloat("HORA_STALL_SHUTDOWN_TIME_S"), 50);
  EXPECT_EQ(p.horovodUses().size(), 3u);
}

TEST(HorovodAliasTest, EveryIgnoredVariableIsReportedNeverSilent) {
  size_t ignored = 0;
  for (const auto& a : horovodAliases()) {
    if (a.horaName) continue;
    ++ignored;
    SCOPED_TRACE(a.horovodName);
    Params p = parsed({{a.horovodName, "1"}});
    ASSERT_EQ(p.horovodUses().size(), 1u);
    EXPECT_EQ(p.horovodUses()[0].outcome, Outcome::kIgnored);
    EXPECT_EQ(p.horovodUses()[0].detail, a.note);
    const std::string line = p.horovodSummary();
    EXPECT_NE(line.find(std::string(a.horovodName) + "=1 IGNORED (" + a.note + ")"),
              std::string::npos)
        << line;
  }
  // The ones the issue names, at least.
  EXPECT_GE(ignored, 10u);
  for (const char* name : {"HOROVOD_HIERARCHICAL_ALLGATHER", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES",
                           "HOROVOD_TORUS_ALLREDUCE", "HOROVOD_LOG_HIDE_TIME"}) {
    Params p = parsed({{name, "1"}});
    ASSERT_NE(use(p, name), nullptr) << name;
    EXPECT_EQ(use(p, name)->outcome, Outcome::kIgnored) << name;
  }
}

TEST(HorovodAliasTest, OneLineForAllOfThem) {
  Params p = parsed({{"HOROVOD_CYCLE_TIME", "2"},
                     {"HOROVOD_AUTOTUNE", "1"},
                     {"HORA_CACHE_CAPACITY", "1"},
                     {"HOROVOD_CACHE_CAPACITY", "5"}});
  const std::string line = p.horovodSummary();
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_EQ(line.rfind("Horovod variables: ", 0), 0u) << line;
  for (const char* part :
       {"HOROVOD_CYCLE_TIME=2 -> HORA_CYCLE_TIME_MS=2", "HOROVOD_AUTOTUNE=1 -> HORA_AUTOTUNE=1",
        "HOROVOD_CACHE_CAPACITY=5 not used"})
    EXPECT_NE(line.find(part), std::string::npos) << part << " in " << line;
  EXPECT_EQ(parsed({}).horovodSummary(), "");
  EXPECT_TRUE(parsed({}).horovodUses().empty());
}

TEST(HorovodAliasTest, ReadFromTheEnvironmentToo) {
  setenv("HOROVOD_FUSION_THRESHOLD", "4096", 1);
  setenv("HOROVOD_HIERARCHICAL_ALLREDUCE", "1", 1);
  auto r = Params::fromEnvironment();
  unsetenv("HOROVOD_FUSION_THRESHOLD");
  unsetenv("HOROVOD_HIERARCHICAL_ALLREDUCE");
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  if (!std::getenv("HORA_FUSION_THRESHOLD_BYTES"))
    EXPECT_EQ(r.value().getInt("HORA_FUSION_THRESHOLD_BYTES"), 4096);
  ASSERT_NE(use(r.value(), "HOROVOD_HIERARCHICAL_ALLREDUCE"), nullptr);
}

TEST(HorovodAliasTest, DocsListTheAliases) {
  const std::string md = Params::dumpMarkdown();
  EXPECT_NE(md.find("| `HORA_FUSION_THRESHOLD_BYTES` | int | `134217728` | "), std::string::npos);
  EXPECT_NE(md.find("| `HOROVOD_FUSION_THRESHOLD` |"), std::string::npos);
  for (const auto& a : horovodAliases())
    EXPECT_NE(md.find(std::string("| `") + a.horovodName + "` | "), std::string::npos)
        << a.horovodName;
}

}  // namespace
}  // namespace hora
