// Fuzz target: the parameter registry's parse of HORA_* and HOROVOD_* values
// (core/params.h), what every rank reads from its environment at start-up.
// The input is NAME=VALUE lines; a NAME that is a number k stands for the k-th
// registered name (parameters, then Horovod aliases), so that mutations reach
// every parameter. Any input gives a Params or an error Status; a Params holds
// only values its getters read back as promised: integers that parse whole,
// finite numbers, booleans, choices in lower case from their list.
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/params.h"
#include "tests/fuzz/fuzz_target.h"

using namespace hora;  // NOLINT(build/namespaces): a test program

namespace {

std::vector<std::string> allNames() {
  std::vector<std::string> names;
  for (const auto& s : paramRegistry()) names.push_back(s.name);
  for (const auto& a : horovodAliases()) names.push_back(a.horovodName);
  return names;
}

bool inChoices(const ParamSpec& spec, const std::string& v) {
  const std::string all = std::string("|") + spec.choices + "|";
  return !v.empty() && all.find("|" + v + "|") != std::string::npos;
}

}  // namespace

std::vector<std::string> horaFuzzSeeds() {
  std::vector<std::string> seeds;
  // Each parameter and alias with its default, then with typical and edge values.
  std::string defaults;
  for (const auto& s : paramRegistry())
    defaults += std::string(s.name) + "=" + s.defaultValue + "\n";
  seeds.push_back(defaults);
  seeds.push_back(
      "HORA_RANK=3\nHORA_SIZE=8\nHORA_CYCLE_TIME_MS=2.5\nHORA_FUSION_THRESHOLD_BYTES=0\n"
      "HORA_STALL_CHECK=false\nHORA_LOG_LEVEL=DEBUG\nHORA_GLOO_ALGORITHM=ring\n"
      "HORA_GPU_BACKEND=auto\nHORA_PEER_TIMEOUT_S=1e3\n");
  seeds.push_back(
      "HOROVOD_FUSION_THRESHOLD=67108864\nHOROVOD_CYCLE_TIME=5\nHOROVOD_STALL_CHECK_DISABLE=1\n"
      "HOROVOD_LOG_LEVEL=fatal\nHOROVOD_ELASTIC=2\nHOROVOD_TIMELINE=/tmp/t.json\n"
      "HORA_CACHE_CAPACITY=7\nHOROVOD_CACHE_CAPACITY=9\n");
  seeds.push_back(
      "0=-1\n12=0.5\n13=9223372036854775807\n15=1e308\n18=-0\n27=Bcube\n34=off\n40=true\n");
  seeds.push_back("HORA_SIZE=99999999999999999999\nHORA_CYCLE_TIME_MS=nan\n");
  seeds.push_back("HORA_STALL_WARNING_TIME_S=inf\n");
  return seeds;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<std::string> kNames = allNames();
  const std::string in(reinterpret_cast<const char*>(data), size);
  std::map<std::string, std::string> values;
  size_t at = 0;
  while (at < in.size()) {
    size_t nl = in.find('\n', at);
    if (nl == std::string::npos) nl = in.size();
    const std::string line = in.substr(at, nl - at);
    at = nl + 1;
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string name = line.substr(0, eq);
    if (!name.empty() && name.size() < 6 &&
        name.find_first_not_of("0123456789") == std::string::npos)
      name = kNames[std::strtoul(name.c_str(), nullptr, 10) % kNames.size()];
    values[name] = line.substr(eq + 1);
  }
  // fromMap refuses unknown names; parse() through a lookup ignores them, as
  // the environment's other variables are ignored.
  auto strict = Params::fromMap(values);
  if (!strict.isOk()) HORA_FUZZ_CHECK(!strict.status().message().empty());
  auto p = Params::parse([&](const char* name) -> const char* {
    auto it = values.find(name);
    return it == values.end() ? nullptr : it->second.c_str();
  });
  if (!p.isOk()) {
    HORA_FUZZ_CHECK(p.status().code() == Code::kInvalidArgument);
    return 0;
  }
  const Params& params = p.value();
  for (const auto& spec : paramRegistry()) {
    const std::string& v = params.getString(spec.name);
    switch (spec.type) {
      case ParamType::kInt: {
        char* end = nullptr;
        errno = 0;
        const long long n = std::strtoll(v.c_str(), &end, 10);
        HORA_FUZZ_CHECK(!v.empty() && errno == 0 && *end == '\0');
        HORA_FUZZ_CHECK(params.getInt(spec.name) == n);
        break;
      }
      case ParamType::kFloat:
        HORA_FUZZ_CHECK(std::isfinite(params.getFloat(spec.name)));
        break;
      case ParamType::kBool:
        HORA_FUZZ_CHECK(v == "0" || v == "1" || v == "true" || v == "false");
        break;
      case ParamType::kString:
        if (spec.choices) HORA_FUZZ_CHECK(inChoices(spec, v));
        break;
    }
  }
  (void)params.horovodSummary();
  return 0;
}
