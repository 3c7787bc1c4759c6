// Fuzz target: horarun's command line (launcher/options.h) and its -H host
// list (launcher/hosts.h). The input is argv[1..], split on NUL bytes. Any
// argv gives true or false with a one-line error; what it accepts keeps every
// number in its documented range (launcher/README.md), exports only variable
// names a remote shell can take, and hands the ranks HORA_* values the runtime's
// own parameter check accepts.
//
// Not fuzzed here: --hostfile and the discovery script or file (paths the
// parser only stat()s, or that horarun reads later), and the environment
// (HORARUN_* are unset first, so every run depends on the input alone).
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "core/params.h"
#include "launcher/hosts.h"
#include "launcher/options.h"
#include "tests/fuzz/fuzz_target.h"

namespace {

std::string argvText(const std::vector<std::string>& args) {
  std::string out;
  for (size_t i = 0; i < args.size(); ++i) out += (i ? std::string(1, '\0') : "") + args[i];
  return out;
}

bool inRange(double v, double lo, double hi) { return std::isfinite(v) && v >= lo && v <= hi; }

}  // namespace

std::vector<std::string> horaFuzzSeeds() {
  return {
      argvText({"-np", "4", "python", "train.py"}),
      argvText({"-np", "8", "-H", "node1:4,node2:4", "--check", "python", "t.py"}),
      argvText({"--num-proc=3", "--hosts=a:2,b,a:1", "--env=A=B=C", "-x", "B=", "-p", "2222",
                "--start-timeout", "2.5", "--grace-seconds=0.5", "c"}),
      argvText({"-np", "2", "--fusion-threshold-mb", "64", "--cycle-time-ms", "3.5",
                "--cache-capacity", "2048", "--log-level", "FATAL",
                "--stall-check-warning-time-seconds", "30", "--stall-check-shutdown-time-seconds",
                "600", "--peer-timeout-seconds", "10", "--no-stall-check", "c"}),
      argvText({"--min-np", "2", "--max-np", "5", "--slots", "4", "--elastic-timeout", "30",
                "--reset-limit", "3", "--blacklist-cooldown-range", "2", "8", "--elastic", "c"}),
      argvText(
          {"-np", "2", "--elastic", "-H", "a:2,b:2", "--blacklist-cooldown-range=0.5,60", "c"}),
      argvText({"-np", "2", "--gloo", "--tcp", "--network-interfaces", "eth1", "--num-nccl-streams",
                "1", "--gloo-timeout-seconds", "45", "-cb", "--", "-x"}),
      argvText({"-np", "1", "--ssh-command", "ssh me@{host} -o 'ProxyCommand=nc {host} 22'",
                "--output-filename", "/tmp/o", "--verbose", "c"}),
      argvText({"-np", "99999999999", "-x", "=v", "--timeline-filename", "t", "--bogus"}),
      // horovodrun's single-dash spellings and argparse's "=value" forms (launcher/options_cli.cc).
      argvText({"-np=2", "-hostfile", "/h", "-cb", "-p=22", "-x=A=1", "--", "-np", "x"}),
      argvText({"-np", "1", "-H", "-np", "--no-autotune", "--stall-check", "-prefix-timestamp=1"}),
      // Found by this target: an unknown option with a newline split the error message.
      argvText({"-np", "2", "--num\xb6\x81\x11\n)k-nccl-streams", "--", "-x"}),
  };
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool kCleanEnvironment = [] {
    unsetenv("HORARUN_SSH_COMMAND");
    unsetenv("HORARUN_START_TIMEOUT_S");
    return true;
  }();
  (void)kCleanEnvironment;
  std::vector<std::string> args = {"horarun"};
  std::string cur;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(cur);
      cur.clear();
    } else {
      cur += static_cast<char>(data[i]);
    }
  }
  args.push_back(cur);
  bool exports = false;  // -x may set any HORA_* value: the runtime checks those itself
  for (const auto& a : args) exports = exports || a == "-x" || a.rfind("--env", 0) == 0;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(&a[0]);
  argv.push_back(nullptr);

  // One parser for every input, as horarun::OptionParser allows: building its CLI11 App is most
  // of a parse's cost. AParserReusedParsesEachCommandLineAfresh (tests/unit) checks that this
  // gives what parseOptions gives.
  static horarun::OptionParser parser;
  horarun::Options o;
  std::string error;
  const bool ok = parser.parse(static_cast<int>(args.size()), argv.data(), &o, &error);
  if (!ok) {
    HORA_FUZZ_CHECK(!error.empty() && error.find('\n') == std::string::npos);
    return 0;
  }
  if (o.help || o.version || o.checkBuild) return 0;
  HORA_FUZZ_CHECK(o.np >= 0 && o.np <= horarun::kMaxNp);
  HORA_FUZZ_CHECK(o.minNp >= 0 && o.minNp <= horarun::kMaxNp);
  HORA_FUZZ_CHECK(o.maxNp >= 0 && o.maxNp <= horarun::kMaxNp);
  HORA_FUZZ_CHECK(o.elastic || o.np >= 1);
  HORA_FUZZ_CHECK(o.sshPort >= 0 && o.sshPort <= 65535);
  HORA_FUZZ_CHECK(o.slotsPerHost >= 1 && o.slotsPerHost <= 65536);
  HORA_FUZZ_CHECK(inRange(o.startTimeoutS, 0.001, 1e9) && inRange(o.graceS, 0, 1e9));
  HORA_FUZZ_CHECK(inRange(o.elasticTimeoutS, 0.001, 1e9));
  HORA_FUZZ_CHECK(inRange(o.cooldownLowS, 0, 1e9) && inRange(o.cooldownHighS, o.cooldownLowS, 1e9));
  std::map<std::string, std::string> hora;
  for (const auto& kv : o.env) {
    HORA_FUZZ_CHECK(horarun::isEnvName(kv.first));
    if (kv.first.rfind("HORA_", 0) == 0) hora[kv.first] = kv.second;
  }
  if (!exports) {
    auto params = hora::Params::fromMap(hora);
    if (!params.isOk()) std::fprintf(stderr, "%s\n", params.status().toString().c_str());
    HORA_FUZZ_CHECK(params.isOk());
    // Timeouts reach the ranks as at least the millisecond they count in.
    for (const char* t : {"HORA_START_TIMEOUT_S", "HORA_PEER_TIMEOUT_S", "HORA_ELASTIC_TIMEOUT_S"})
      if (hora.count(t)) HORA_FUZZ_CHECK(params.value().getFloat(t) >= 0.001);
  }
  HORA_FUZZ_CHECK(!horarun::remoteShellFor(o, "node1").empty());

  if (!o.hosts.empty()) {
    std::vector<horarun::HostSpec> hosts;
    std::vector<std::string> notes;
    if (horarun::parseHostList(o.hosts, &hosts, &error, &notes)) {
      for (const auto& h : hosts) HORA_FUZZ_CHECK(h.slots >= 1 && h.slots <= 999999);
      // Rank assignment, for jobs small enough to run thousands of times a second.
      if (o.np >= 1 && o.np <= 4096) {
        std::vector<horarun::Slot> slots;
        if (horarun::assignSlots(hosts, o.np, &slots, &error)) {
          HORA_FUZZ_CHECK(static_cast<int>(slots.size()) == o.np);
          for (const auto& s : slots) {
            HORA_FUZZ_CHECK(s.localRank >= 0 && s.localRank < s.localSize);
            HORA_FUZZ_CHECK(s.crossRank >= 0 && s.crossRank < s.crossSize);
          }
        }
      }
    }
  }
  return 0;
}
