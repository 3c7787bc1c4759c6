#include "options.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "elastic.h"

namespace horarun {

namespace {

const char kUsage[] =
    "usage: horarun -np N [options] COMMAND [ARGS...]\n"
    "       horarun [-np N] --min-np N --max-np M --host-discovery-script S COMMAND...\n"
    "\n"
    "Starts N ranks of COMMAND with the HORA_* environment contract, hosts the\n"
    "job's rendezvous store, prefixes output with ranks, and ends the job when\n"
    "any rank fails (elastic mode: replaces failed workers, adds discovered ones).\n"
    "Flags taking a value also accept --flag=value.\n"
    "\n"
    "hosts:\n"
    "  -np, --num-proc N            number of ranks (required)\n"
    "  -H, --hosts h1:s1,h2:s2      hosts and slots, filled in order (default localhost:N)\n"
    "  --hostfile FILE              lines 'host slots=N'\n"
    "  -p, --ssh-port PORT          ssh port for remote hosts\n"
    "  -i, --ssh-identity-file F    ssh identity file\n"
    "  --ssh-command 'CMD'          remote shell; '{host}' is replaced by the host, else the\n"
    "                               host is appended (env HORARUN_SSH_COMMAND; default ssh)\n"
    "  --network-interface IF       bind the store to IF's IPv4 address (default: the address\n"
    "                               that routes to the hosts; loopback for local jobs)\n"
    "  --start-timeout S            seconds for checks and for ranks to rendezvous (30)\n"
    "  --check                      check hosts, store reachability and versions; with a\n"
    "                               COMMAND, run it only when every check passes\n"
    "output and failures:\n"
    "  --output-filename DIR        also write DIR/rank.<r>/{stdout,stderr}\n"
    "  --grace-seconds S            SIGTERM to SIGKILL delay when stopping ranks (5)\n"
    "  -x, --env NAME[=VALUE]       export NAME to every rank (also to remote ones)\n"
    "  --verbose                    say what horarun does\n"
    "elastic mode (docs/elastic.md; any of these turns it on):\n"
    "  --min-np N                   fewest workers the job runs with (default: -np, else 1)\n"
    "  --max-np M                   most workers (default: unbounded)\n"
    "  --host-discovery-script S    prints 'host' or 'host:slots' lines; run every second\n"
    "  --host-discovery-file F      the same lines in a file, re-read every second\n"
    "  --slots N                    slots of a bare 'host' line (1)\n"
    "  --elastic-timeout S          longest time below --min-np before the job fails (600)\n"
    "  --reset-limit N              most re-formations of hvd.elastic.run (default: none)\n"
    "  --blacklist-cooldown-range LO HI\n"
    "                               a host whose worker failed gets none for a random\n"
    "                               LO..HI s, doubling per failure (default 1 600)\n"
    "  --elastic                    elastic on the -H/--hostfile hosts (no discovery)\n"
    "tuning (set the ranks' HORA_* parameters, docs/params.md):\n"
    "  --fusion-threshold-mb MB     HORA_FUSION_THRESHOLD_BYTES = MB * 1048576\n"
    "  --cycle-time-ms MS           HORA_CYCLE_TIME_MS\n"
    "  --cache-capacity N           HORA_CACHE_CAPACITY\n"
    "  --log-level LEVEL            HORA_LOG_LEVEL (trace, debug, info, warning, error)\n"
    "  --stall-check-warning-time-seconds S   HORA_STALL_WARNING_TIME_S\n"
    "  --stall-check-shutdown-time-seconds S  HORA_STALL_SHUTDOWN_TIME_S (0 = never)\n"
    "  --no-stall-check             no stall warnings and no stall shutdown (HORA_STALL_CHECK=0)\n"
    "  --hierarchical-allreduce     HORA_HIER_ALLREDUCE=hier (auto already picks it)\n"
    "  --no-hierarchical-allreduce  HORA_HIER_ALLREDUCE=flat (one Gloo ring across hosts)\n"
    "  --peer-timeout-seconds S     HORA_PEER_TIMEOUT_S\n"
    "  --gloo-timeout-seconds S     the same (horovodrun's name)\n"
    "  -v, --version                print versions\n"
    "horovodrun's other flags (docs/launching.md, \"horovodrun -> horarun\"):\n"
    "  --network-interfaces IF      one interface: --network-interface IF\n"
    "  --tcp                        NCCL_IB_DISABLE=1 for the ranks\n"
    "  -cb, --check-build           print versions and what hora is built with\n"
    "  --gloo, --disable-cache, --mpi-threads-disable, --log-without-timestamp,\n"
    "  --no-hierarchical-allgather, --no-torus-allreduce,\n"
    "  --num-nccl-streams 1         accepted with a note: hora already behaves so\n"
    "  --timeline-filename FILE     HORA_TIMELINE (one Chrome trace of every rank)\n"
    "  --timeline-mark-cycles       HORA_TIMELINE_MARK_CYCLES=1\n"
    "  --autotune                   HORA_AUTOTUNE=1 (on by default; HORA_AUTOTUNE=0 turns it off)\n"
    "  --autotune-log-file FILE     HORA_AUTOTUNE_LOG (a CSV of every tried setting)\n"
    "  --autotune-warmup-samples N, --autotune-steps-per-sample N,\n"
    "  --autotune-bayes-opt-max-samples N, --autotune-gaussian-process-noise X\n"
    "                               accepted with a note: hora's tuner has no such knobs\n"
    "  --hierarchical-allgather, --mpi, --mpi-args, ...\n"
    "                               refused: \"not supported by hora: ...\"\n";

// Decimal only: strtod alone would also take "nan", "inf" and hex floats,
// which the ranks then refuse (or, for inf, accept) at start-up.
bool isNumber(const std::string& s, bool allowFraction) {
  if (s.empty()) return false;
  const char* allowed = allowFraction ? "0123456789.eE+-" : "0123456789+-";
  if (s.find_first_not_of(allowed) != std::string::npos) return false;
  char* end = nullptr;
  if (allowFraction) {
    const double v = std::strtod(s.c_str(), &end);
    if (!std::isfinite(v)) return false;
  } else {
    std::strtoll(s.c_str(), &end, 10);
  }
  return end && *end == '\0';
}

// The shortest text that reads back as exactly `d` ("1000000", "3.5"): the
// ranks parse integers strictly, so 1e+06 would fail every one of them.
std::string formatNumber(double d) {
  char buf[64];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, d);
    if (std::strtod(buf, nullptr) == d && !std::strchr(buf, 'e')) return buf;
  }
  std::snprintf(buf, sizeof(buf), "%.17g", d);
  return buf;
}

// What a numeric flag accepts. Every flag has an upper bound, so that no value
// overflows where it is used: an int (ranks, slots, ports), or a duration
// converted to nanoseconds (1e9 s is about 31 years; 1e18 ns fits in int64).
struct Range {
  double lo, hi;
  bool fraction;  // else whole numbers only
  const char* unit = nullptr;
};

constexpr double kMaxSeconds = 1e9;
constexpr Range kRanks{1, kMaxNp, false};
constexpr Range kSeconds{0, kMaxSeconds, true, "seconds"};
// Timeouts where 0 makes no sense: at least a millisecond, the unit the ranks
// count them in (a smaller one would reach them as 0).
constexpr Range kTimeoutSeconds{0.001, kMaxSeconds, true, "seconds"};

// "an integer from 1 to 1048576", "a number of seconds from 0.001 to 1000000000".
std::string describe(const Range& r) {
  return std::string(r.fraction ? "a number" : "an integer") +
         (r.unit ? std::string(" of ") + r.unit : std::string()) + " from " + formatNumber(r.lo) +
         " to " + formatNumber(r.hi);
}

// Reads `text` as a number within `r`; false with *error naming `what` (the
// flag or variable), the text and what is allowed.
bool parseNumber(const std::string& what, const std::string& text, const Range& r, double* out,
                 std::string* error) {
  if (isNumber(text, r.fraction)) {
    const double v = std::strtod(text.c_str(), nullptr);
    if (v >= r.lo && v <= r.hi) {
      *out = v;
      return true;
    }
  }
  *error = what + " expects " + describe(r) + ", got '" + text + "'";
  return false;
}

void addEnv(Options* o, const std::string& name, const std::string& value) {
  for (auto& kv : o->env)
    if (kv.first == name) {
      kv.second = value;
      return;
    }
  o->env.emplace_back(name, value);
}

// Splits a remote-shell string on whitespace, honouring '...' and "..." quotes.
std::vector<std::string> splitWords(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  bool inWord = false;
  char quote = 0;
  for (char c : text) {
    if (quote) {
      if (c == quote)
        quote = 0;
      else
        cur += c;
    } else if (c == '\'' || c == '"') {
      quote = c;
      inWord = true;
    } else if (c == ' ' || c == '\t' || c == '\n') {
      if (inWord) out.push_back(cur), cur.clear(), inWord = false;
    } else {
      cur += c;
      inWord = true;
    }
  }
  if (inWord) out.push_back(cur);
  return out;
}

// Elastic mode's flags together: defaults, bounds, one source of hosts, a usable script.
bool validateElastic(Options* o, std::string* error) {
  const bool script = !o->discoveryScript.empty(), file = !o->discoveryFile.empty();
  if (script && file) {
    *error = "give either --host-discovery-script or --host-discovery-file, not both";
    return false;
  }
  if ((script || file) && (!o->hosts.empty() || !o->hostfile.empty())) {
    *error = std::string(script ? "--host-discovery-script" : "--host-discovery-file") +
             " replaces -H/--hostfile: give one source of hosts";
    return false;
  }
  if ((script || file) && o->check) {
    *error = "--check checks fixed hosts; it does not work with host discovery";
    return false;
  }
  if (!script && !file && o->hosts.empty() && o->hostfile.empty() && o->np < 1 && o->maxNp < 1) {
    *error = "elastic mode on this machine alone needs -np N or --max-np M (how many workers)";
    return false;
  }
  const int maxNp = o->maxNp > 0 ? o->maxNp : kUnboundedNp;
  if (o->np > maxNp) {
    *error = "-np " + std::to_string(o->np) + " is larger than --max-np " + std::to_string(maxNp);
    return false;
  }
  if (o->minNp == 0) o->minNp = o->np > 0 ? o->np : 1;
  if (o->minNp > maxNp) {
    *error = "--min-np " + std::to_string(o->minNp) + " is larger than --max-np " +
             std::to_string(maxNp);
    return false;
  }
  if (o->np > 0 && (o->np < o->minNp || o->np > maxNp)) {
    *error = "-np " + std::to_string(o->np) + " must lie between --min-np " +
             std::to_string(o->minNp) + " and --max-np " +
             (o->maxNp > 0 ? std::to_string(o->maxNp) : std::string("(unbounded)"));
    return false;
  }
  if (script) {
    struct stat st;
    if (stat(o->discoveryScript.c_str(), &st) != 0) {
      *error = "--host-discovery-script '" + o->discoveryScript + "': " + std::strerror(errno);
      return false;
    }
    if (!S_ISREG(st.st_mode) || access(o->discoveryScript.c_str(), X_OK) != 0) {
      *error = "--host-discovery-script '" + o->discoveryScript +
               "' is not an executable file (chmod +x it, and give it a #! line)";
      return false;
    }
  }
  if (file && access(o->discoveryFile.c_str(), R_OK) != 0) {
    *error = "--host-discovery-file '" + o->discoveryFile + "': " + std::strerror(errno);
    return false;
  }
  addEnv(o, "HORA_ELASTIC_TIMEOUT_S", formatNumber(o->elasticTimeoutS));
  if (o->resetLimit >= 0) addEnv(o, "HORA_ELASTIC_RESET_LIMIT", std::to_string(o->resetLimit));
  return true;
}

}  // namespace

const char* usageText() { return kUsage; }

bool isEnvName(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  for (char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

std::string oneLine(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

namespace {

bool parse(int argc, char** argv, Options* o, std::string* error);

}  // namespace

bool parseOptions(int argc, char** argv, Options* o, std::string* error) {
  if (parse(argc, argv, o, error)) return true;
  // Arguments are echoed in the message: a newline in one must not split it.
  *error = oneLine(*error);
  return false;
}

namespace {

bool parse(int argc, char** argv, Options* o, std::string* error) {
  if (const char* s = std::getenv("HORARUN_SSH_COMMAND")) o->sshCommand = s;
  // HORARUN_START_TIMEOUT_S is checked after the flags: --start-timeout overrides it.
  const char* startTimeoutEnv = std::getenv("HORARUN_START_TIMEOUT_S");
  bool startTimeoutGiven = false;
  int i = 1;
  // "--flag=value": the value of the flag being parsed, consumed by value().
  std::string inlineValue;
  bool hasInline = false;
  auto value = [&](const std::string& flag, std::string* out) {
    if (hasInline) {
      *out = inlineValue;
      hasInline = false;
      return true;
    }
    if (i + 1 >= argc) {
      *error = flag + " needs a value";
      return false;
    }
    *out = argv[++i];
    return true;
  };
  auto number = [&](const std::string& flag, const Range& r, double* out) {
    std::string v;
    return value(flag, &v) && parseNumber(flag, v, r, out, error);
  };
  auto integer = [&](const std::string& flag, const Range& r, int* out) {
    double d = 0;
    if (!number(flag, r, &d)) return false;
    *out = static_cast<int>(d);  // r.hi fits an int
    return true;
  };
  // Tuning flag -> parameter, with a scale factor (MiB -> bytes) and the range
  // the runtime can use (HORA_CACHE_CAPACITY is read as an int; bytes as int64).
  struct Tuning {
    const char* flag;
    const char* param;
    double scale;
    Range range;
  };
  static const Tuning kTuning[] = {
      {"--fusion-threshold-mb",
       "HORA_FUSION_THRESHOLD_BYTES",
       1048576.0,
       {0, 8796093022207.0, true, "MiB"}},  // below 2^43 MiB = 2^63 bytes
      {"--cycle-time-ms", "HORA_CYCLE_TIME_MS", 1, {0, kMaxSeconds, true, "ms"}},
      {"--cache-capacity", "HORA_CACHE_CAPACITY", 1, {0, 2147483647.0, false}},
      {"--stall-check-warning-time-seconds", "HORA_STALL_WARNING_TIME_S", 1, kSeconds},
      {"--stall-check-shutdown-time-seconds", "HORA_STALL_SHUTDOWN_TIME_S", 1, kSeconds},
      {"--peer-timeout-seconds", "HORA_PEER_TIMEOUT_S", 1, kTimeoutSeconds},
      {"--gloo-timeout-seconds", "HORA_PEER_TIMEOUT_S", 1, kTimeoutSeconds},
  };
  // horovodrun flags hora has no answer for: refused, naming why and what to do.
  struct Refused {
    const char* flag;
    const char* why;
  };
  static const Refused kRefused[] = {
      {"--hierarchical-allgather", "hora's allgather is not hierarchical; drop the flag"},
      {"--torus-allreduce", "hora has no torus allreduce; drop the flag"},
      {"--mpi",
       "horarun starts the ranks itself, without mpirun; drop the flag (or start the job with "
       "mpirun and HORA_STORE_ADDR, docs/launching.md)"},
      {"--jsrun", "horarun does not launch through jsrun"},
      {"--mpi-args", "horarun does not run mpirun"},
      {"--binding-args", "horarun does not run mpirun and binds nothing"},
      {"--thread-affinity", "hora does not pin its threads"},
      {"--config-file", "horarun reads no YAML config; give the flags or HORA_* variables"},
      {"--prefix-output-with-timestamp", "horarun prefixes output with the rank only"},
      {"-prefix-timestamp", "horarun prefixes output with the rank only"},
  };
  // horovodrun flags that ask for what hora does anyway: accepted with a note.
  struct Noted {
    const char* flag;
    const char* note;
  };
  static const Noted kNoted[] = {
      {"--gloo", "hora always uses its own TCP controller and Gloo (or shared memory)"},
      {"--disable-cache", "horarun caches no host checks; nothing to disable"},
      {"--mpi-threads-disable", "hora uses no MPI"},
      {"--log-without-timestamp", "hora's log lines keep their time"},
      {"--log-hide-timestamp", "hora's log lines keep their time"},
      {"--log-with-timestamp", "hora's log lines always carry the time"},
      {"--no-hierarchical-allgather", "hora's allgather is never hierarchical"},
      {"--no-torus-allreduce", "hora has no torus allreduce"},
  };
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a.empty() || a[0] != '-') break;  // the command starts here
    hasInline = false;
    if (a.rfind("--", 0) == 0 && a.find('=') != std::string::npos) {
      inlineValue = a.substr(a.find('=') + 1);
      a = a.substr(0, a.find('='));
      hasInline = true;
    }
    double d = 0;
    std::string v;
    bool handled = false;
    for (const auto& t : kTuning) {
      if (a != t.flag) continue;
      if (!number(a, t.range, &d)) return false;
      addEnv(o, t.param,
             t.scale != 1 ? std::to_string(static_cast<long long>(d * t.scale)) : formatNumber(d));
      handled = true;
    }
    if (handled) continue;
    for (const auto& r : kRefused) {
      if (a != r.flag) continue;
      *error = "not supported by hora: " + a + " (" + r.why + ")";
      return false;
    }
    for (const auto& n : kNoted) {
      if (a != n.flag) continue;
      o->notes.push_back(a + ": accepted, no effect (" + n.note + ")");
      handled = true;
    }
    if (handled) {
      if (hasInline) {
        *error = a + " takes no value (got '" + a + "=" + inlineValue + "')";
        return false;
      }
      continue;
    }
    if (a == "-np" || a == "--num-proc") {
      if (!integer(a, kRanks, &o->np)) return false;
    } else if (a == "-H" || a == "--hosts") {
      if (!value(a, &o->hosts)) return false;
    } else if (a == "--hostfile" || a == "-hostfile") {
      if (!value(a, &o->hostfile)) return false;
    } else if (a == "-p" || a == "--ssh-port") {
      if (!integer(a, {1, 65535, false}, &o->sshPort)) return false;
    } else if (a == "-i" || a == "--ssh-identity-file") {
      if (!value(a, &o->sshIdentityFile)) return false;
    } else if (a == "--ssh-command") {
      if (!value(a, &o->sshCommand)) return false;
    } else if (a == "--network-interface") {
      if (!value(a, &o->networkInterface)) return false;
    } else if (a == "--output-filename") {
      if (!value(a, &o->outputDir)) return false;
    } else if (a == "--start-timeout") {
      if (!number(a, kTimeoutSeconds, &o->startTimeoutS)) return false;
      startTimeoutGiven = true;
    } else if (a == "--grace-seconds") {
      if (!number(a, kSeconds, &o->graceS)) return false;
    } else if (a == "--log-level") {
      // hora's levels, or horovodrun's (TRACE..FATAL; hora's nearest to FATAL is error).
      if (!value(a, &v)) return false;
      std::string level;
      for (char c : v) level += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (level == "fatal") level = "error";
      static const char* const kLevels[] = {"trace", "debug", "info", "warning", "error", "off"};
      bool known = false;
      for (const char* l : kLevels) known = known || level == l;
      if (!known) {
        *error =
            a + " '" + v + "' is not one of trace, debug, info, warning, error, off (or fatal)";
        return false;
      }
      addEnv(o, "HORA_LOG_LEVEL", level);
    } else if (a == "--no-stall-check") {
      addEnv(o, "HORA_STALL_CHECK", "0");
    } else if (a == "--hierarchical-allreduce") {
      // hora chooses it by itself where it applies (several hosts, several
      // ranks on each); "hier" says so explicitly.
      addEnv(o, "HORA_HIER_ALLREDUCE", "hier");
    } else if (a == "--no-hierarchical-allreduce") {
      addEnv(o, "HORA_HIER_ALLREDUCE", "flat");
    } else if (a == "--autotune") {
      // On by default in hora; the flag makes it explicit (docs/performance.md).
      addEnv(o, "HORA_AUTOTUNE", "1");
    } else if (a == "--autotune-log-file") {
      if (!value(a, &v)) return false;
      if (v.empty()) {
        *error = a + ": the file name is empty";
        return false;
      }
      addEnv(o, "HORA_AUTOTUNE_LOG", v);
    } else if (a == "--autotune-warmup-samples" || a == "--autotune-steps-per-sample" ||
               a == "--autotune-bayes-opt-max-samples" ||
               a == "--autotune-gaussian-process-noise") {
      // Knobs of Horovod's Bayesian search; hora's tuner has none of them.
      if (!number(a, {0, 1e9, true}, &d)) return false;
      o->notes.push_back(a + " " + formatNumber(d) +
                         ": accepted, no effect (hora's autotuner searches one setting at a "
                         "time, one training step per sample; docs/performance.md)");
    } else if (a == "--timeline-filename") {
      // One trace for the whole job (docs/observability.md); relative to
      // horarun's folder, which remote ranks do not share.
      if (!value(a, &v)) return false;
      if (v.empty()) {
        *error = a + ": the file name is empty";
        return false;
      }
      char cwd[4096];
      if (v[0] != '/' && ::getcwd(cwd, sizeof cwd)) v = std::string(cwd) + "/" + v;
      addEnv(o, "HORA_TIMELINE", v);
    } else if (a == "--timeline-mark-cycles") {
      addEnv(o, "HORA_TIMELINE_MARK_CYCLES", "1");
    } else if (a == "--network-interfaces") {
      // horovodrun's plural form: a comma-separated set; hora binds to one interface.
      if (!value(a, &v)) return false;
      if (v.empty() || v.find(',') != std::string::npos) {
        *error = "not supported by hora: " + a + " '" + v +
                 "' (horarun uses one interface: give exactly one, or --network-interface IF)";
        return false;
      }
      o->networkInterface = v;
    } else if (a == "--tcp") {
      addEnv(o, "NCCL_IB_DISABLE", "1");  // what horovodrun --tcp sets
    } else if (a == "--num-nccl-streams") {
      if (!number(a, {0, 2147483647.0, false}, &d)) return false;
      if (d != 1) {
        *error = "not supported by hora: " + a + " " + formatNumber(d) +
                 " (hora uses one NCCL stream per process set; drop the flag)";
        return false;
      }
      o->notes.push_back(a + " 1: accepted, no effect (hora uses one NCCL stream)");
    } else if (a == "-cb" || a == "--check-build") {
      o->checkBuild = true;
    } else if (a == "-x" || a == "--env") {
      // NAME=VALUE (VALUE may be empty), or NAME: its value here.
      if (!value(a, &v)) return false;
      const auto eq = v.find('=');
      const std::string name = v.substr(0, eq);
      if (!isEnvName(name)) {
        *error = a + " '" + v + "': " +
                 (name.empty() ? std::string("the variable name is empty")
                               : "'" + name + "' is not a variable name") +
                 " (expected NAME=VALUE or NAME; a name is letters, digits and '_', not starting "
                 "with a digit)";
        return false;
      }
      if (eq == std::string::npos) {
        const char* cur = std::getenv(name.c_str());
        if (!cur) {
          *error = "-x " + v + ": not set in horarun's environment (use -x NAME=VALUE)";
          return false;
        }
        addEnv(o, name, cur);
      } else {
        addEnv(o, name, v.substr(eq + 1));
      }
    } else if (a == "--min-np" || a == "--min-num-proc") {
      if (!integer(a, kRanks, &o->minNp)) return false;
      o->elastic = true;
    } else if (a == "--max-np" || a == "--max-num-proc") {
      if (!integer(a, kRanks, &o->maxNp)) return false;
      o->elastic = true;
    } else if (a == "--host-discovery-script") {
      if (!value(a, &o->discoveryScript)) return false;
      o->elastic = true;
    } else if (a == "--host-discovery-file") {
      if (!value(a, &o->discoveryFile)) return false;
      o->elastic = true;
    } else if (a == "--slots" || a == "--slots-per-host") {
      // 65536: the most a discovery line may give a host (elastic.h).
      if (!integer(a, {1, 65536, false}, &o->slotsPerHost)) return false;
    } else if (a == "--elastic-timeout") {
      if (!number(a, kTimeoutSeconds, &o->elasticTimeoutS)) return false;
    } else if (a == "--reset-limit") {
      if (!integer(a, {0, 1e9, false}, &o->resetLimit)) return false;
    } else if (a == "--blacklist-cooldown-range") {
      // Two values: "LO HI", or "--blacklist-cooldown-range=LO,HI".
      std::string lo, hi;
      if (hasInline) {
        auto comma = inlineValue.find(',');
        if (comma == std::string::npos) {
          *error = a + "=LO,HI expects two numbers separated by a comma, got '" + inlineValue + "'";
          return false;
        }
        lo = inlineValue.substr(0, comma), hi = inlineValue.substr(comma + 1);
        hasInline = false;
      } else if (i + 2 >= argc) {
        *error = a + " needs two values: LO HI (seconds)";
        return false;
      } else {
        lo = argv[++i], hi = argv[++i];
      }
      if (!parseNumber(a + " LO", lo, kSeconds, &o->cooldownLowS, error) ||
          !parseNumber(a + " HI", hi, kSeconds, &o->cooldownHighS, error))
        return false;
      if (o->cooldownHighS < o->cooldownLowS) {
        *error = a + " expects seconds LO HI with 0 <= LO <= HI, got '" + lo + "' '" + hi + "'";
        return false;
      }
    } else if (a == "--elastic") {
      o->elastic = true;
    } else if (a == "--check") {
      o->check = true;
    } else if (a == "--verbose") {
      o->verbose = true;
    } else if (a == "-v" || a == "--version") {
      o->version = true;
    } else if (a == "-h" || a == "--help") {
      o->help = true;
    } else {
      *error = "unknown option '" + std::string(argv[i]) + "' (horarun --help lists them)";
      return false;
    }
    if (hasInline) {
      *error = a + " takes no value (got '" + a + "=" + inlineValue + "')";
      return false;
    }
  }
  for (; i < argc; ++i) o->command.push_back(argv[i]);
  if (o->help || o->version || o->checkBuild) return true;
  if (o->command.empty() && !o->check) {
    *error = "no command given";
    return false;
  }
  if (!o->hosts.empty() && !o->hostfile.empty()) {
    *error = "give either -H or --hostfile, not both";
    return false;
  }
  if (o->elastic) {
    if (!validateElastic(o, error)) return false;
  } else if (o->resetLimit >= 0) {
    *error =
        "--reset-limit applies to elastic jobs: add --min-np/--max-np, a discovery "
        "script or --elastic";
    return false;
  } else if (o->np < 1) {
    *error = "-np N (N >= 1) is required";
    return false;
  }
  if (startTimeoutEnv && !startTimeoutGiven &&
      !parseNumber("HORARUN_START_TIMEOUT_S (horarun's environment)", startTimeoutEnv,
                   kTimeoutSeconds, &o->startTimeoutS, error))
    return false;
  addEnv(o, "HORA_START_TIMEOUT_S", formatNumber(o->startTimeoutS));
  return true;
}

}  // namespace

std::vector<std::string> remoteShellFor(const Options& opt, const std::string& host) {
  std::vector<std::string> words;
  if (!opt.sshCommand.empty()) {
    words = splitWords(opt.sshCommand);
  } else {
    words = {"ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new"};
    if (opt.sshPort > 0) words.insert(words.end(), {"-p", std::to_string(opt.sshPort)});
    if (!opt.sshIdentityFile.empty()) words.insert(words.end(), {"-i", opt.sshIdentityFile});
  }
  bool replaced = false;
  for (auto& w : words) {
    for (size_t p; (p = w.find("{host}")) != std::string::npos;) {
      w.replace(p, 6, host);
      replaced = true;
    }
  }
  if (!replaced) words.push_back(host);
  return words;
}

}  // namespace horarun
