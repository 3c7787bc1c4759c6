// Fuzz target: the settings agreement's payload (controllers/settings_agreement.h),
// the name=value lines the coordinator of a process set publishes in the
// store, decoded by every other member in diffSettings. Any payload gives a
// difference report (one line, "" when equal) and never a crash; the report is
// empty exactly when the payload, read as documented (lines split at the first
// '=', lines without one ignored, the last of a repeated name wins), holds this
// member's settings.
#include <string>
#include <vector>

#include "controllers/settings_agreement.h"
#include "tests/fuzz/fuzz_target.h"

using namespace hora;  // NOLINT(build/namespaces): a test program

namespace {

// What a member shares (bindings/c/src/process_set.cc's sharedSettings).
const SharedSettings& mine() {
  static const SharedSettings kMine = {{"HORA_VERSION", "0.3.0"},
                                       {"HORA_CACHE_CAPACITY", "1024"},
                                       {"HORA_GLOO_ALGORITHM", "ring"},
                                       {"HORA_GPU_BACKEND", "auto"},
                                       {"HORA_SHM", "1"},
                                       {"HORA_FUSION_THRESHOLD_BYTES", "134217728"}};
  return kMine;
}

// The payload as documented, independently of settings_agreement.cc.
SharedSettings read(const std::string& text) {
  SharedSettings out;
  size_t at = 0;
  while (at < text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    const std::string line = text.substr(at, nl - at);
    at = nl + 1;
    const size_t eq = line.find('=');
    if (eq != std::string::npos) out.emplace_back(line.substr(0, eq), line.substr(eq + 1));
  }
  return out;
}

}  // namespace

std::vector<std::string> horaFuzzSeeds() {
  SharedSettings other = mine();
  other[2].second = "bcube";
  other.emplace_back("HORA_NEWER_SETTING", "x=y");
  return {encodeSettings(mine()), encodeSettings(other), encodeSettings({}),
          "HORA_SHM=0\nno equals sign\n=\nHORA_SHM=1\r\n", encodeSettings(mine()) + "HORA_SHM=1"};
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string payload(reinterpret_cast<const char*>(data), size);
  const std::string diff = diffSettings(mine(), 3, payload, 0);
  HORA_FUZZ_CHECK(diff.find('\n') == std::string::npos);
  // The same comparison from the other side: the payload's settings against
  // this member's encoding. Equal is equal either way.
  const std::string back = diffSettings(read(payload), 0, encodeSettings(mine()), 3);
  HORA_FUZZ_CHECK(diff.empty() == back.empty());
  // A member always agrees with its own encoding.
  HORA_FUZZ_CHECK(diffSettings(read(payload), 1, encodeSettings(read(payload)), 0).empty());
  return 0;
}
