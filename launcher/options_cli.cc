#include "options_cli.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <vector>

namespace horarun {
namespace cli {

namespace {

// A usage error found by a flag's callback; parseFlags turns it into *error.
struct UsageError {
  std::string message;
};

[[noreturn]] void fail(std::string message) { throw UsageError{std::move(message)}; }

double number(const std::string& flag, const std::string& text, const Range& r) {
  double d = 0;
  std::string error;
  if (!parseNumber(flag, text, r, &d, &error)) fail(error);
  return d;
}

int integer(const std::string& flag, const std::string& text, const Range& r) {
  return static_cast<int>(number(flag, text, r));  // r.hi fits an int
}

// horovodrun's single-dash long spellings (Python's argparse takes them; CLI11
// takes one letter after a single dash) and the --long names they are read as,
// before the COMMAND only (docs/launching.md).
struct SingleDash {
  const char* spelling;
  const char* name;
};
constexpr SingleDash kSingleDash[] = {
    {"-np", "--num-proc"},
    {"-cb", "--check-build"},
    {"-hostfile", "--hostfile"},
    {"-prefix-timestamp", "--prefix-output-with-timestamp"},
};

const char kUsageHead[] =
    "usage: horarun -np N [options] COMMAND [ARGS...]\n"
    "       horarun [-np N] --min-np N --max-np M --host-discovery-script S COMMAND...\n"
    "\n"
    "Starts N ranks of COMMAND with the HORA_* environment contract, hosts the\n"
    "job's rendezvous store, prefixes output with ranks, and ends the job when\n"
    "any rank fails (elastic mode: replaces failed workers, adds discovered ones).\n"
    "Flags taking a value also accept --flag=value (-np=4, --blacklist-cooldown-range=LO,HI).\n"
    "The COMMAND and everything after it (or after --) are the job's: horarun reads none of it.\n"
    "\n";

const char kFooter[] =
    "horovodrun's single-dash spellings -np, -cb, -hostfile and -prefix-timestamp are read\n"
    "as their --long names. Every horovodrun flag is listed: the same, mapped, accepted with\n"
    "a note, or refused naming why (docs/launching.md, \"horovodrun -> horarun\").";

// The help's width: flags and their values, then descriptions wrapped to the rest.
constexpr size_t kHelpFlagColumn = 34, kHelpWidth = 90;

// CLI11's help layout with every spelling of a flag ("-np, --num-proc N"),
// descriptions wrapped, one blank line between groups and hora's usage lines
// on top.
class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter() { column_width(kHelpFlagColumn); }
  std::string make_usage(const CLI::App*, std::string) const override { return kUsageHead; }
  std::string make_description(const CLI::App*) const override { return {}; }
  std::string make_group(std::string group, bool positional,
                         std::vector<const CLI::Option*> opts) const override {
    std::string out = group + ":\n";
    for (const CLI::Option* opt : opts) out += make_option(opt, positional);
    return out;
  }
  std::string make_option_desc(const CLI::Option* opt) const override {
    // Words on lines of at most kHelpWidth - kHelpFlagColumn characters.
    std::string out, line, word;
    std::istringstream words(opt->get_description());
    while (words >> word) {
      if (!line.empty() && line.size() + 1 + word.size() > kHelpWidth - kHelpFlagColumn) {
        out += line + "\n";
        line.clear();
      }
      line += (line.empty() ? "" : " ") + word;
    }
    return out + line;
  }
  std::string make_option_name(const CLI::Option* opt, bool) const override {
    std::string out;
    auto add = [&out](const std::string& name) { out += (out.empty() ? "" : ", ") + name; };
    for (const SingleDash& s : kSingleDash)
      if (opt->get_name() == s.name) add(s.spelling);
    for (const std::string& s : opt->get_snames()) add("-" + s);
    for (const std::string& l : opt->get_lnames()) add("--" + l);
    return out;
  }
};

using Values = CLI::results_t;
// What a flag does with its values; `flag` is the spelling the user typed.
using Apply = std::function<void(const std::string& flag, const Values& values)>;

}  // namespace

// horarun's flags as one CLI11 App, built once, filling the Options of each
// parse (CLI11 clears an App's results when it parses again).
class CommandLine {
 public:
  CommandLine();
  CommandLine(const CommandLine&) = delete;
  CommandLine& operator=(const CommandLine&) = delete;

  // The normalisation pass, then CLI11's parse, into *o. False with *error on
  // a flag the pass refuses; a bad value throws UsageError from its callback.
  bool parse(int argc, char** argv, Options* o, std::string* error);
  bool startTimeoutGiven() const { return startTimeoutGiven_; }
  std::string help() const { return app_.help(); }

 private:
  // A flag with `arity` values (0, 1 or 2) in the current group. `names` as
  // CLI11 takes them ("-p,--ssh-port"); `valueText` names the values in the help.
  CLI::Option* add(const std::string& names, int arity, const char* valueText,
                   const std::string& doc, Apply apply);
  CLI::Option* value(const std::string& names, const char* valueText, const std::string& doc,
                     std::function<void(const std::string& flag, const std::string& v)> apply) {
    return add(names, 1, valueText, doc,
               [apply](const std::string& flag, const Values& v) { apply(flag, v.at(0)); });
  }
  CLI::Option* flag(const std::string& names, const std::string& doc,
                    std::function<void(const std::string& flag)> apply) {
    return add(names, 0, nullptr, doc,
               [apply](const std::string& flag, const Values&) { apply(flag); });
  }
  // The spelling of `opt`'s next occurrence, as the normalisation pass saw it.
  std::string spelling(const CLI::Option* opt);

  void addHostFlags();
  void addOutputFlags();
  void addElasticFlags();
  void addTuningFlags();
  void addHorovodrunFlags();

  CLI::App app_{"", "horarun"};
  Options* o_ = nullptr;  // this parse's
  bool startTimeoutGiven_ = false;
  std::string group_;
  std::map<const CLI::Option*, std::deque<std::string>> spellings_;  // this parse's
  std::map<const CLI::Option*, std::string> refused_;  // horovodrun flag -> why hora refuses it
  std::map<const CLI::Option*, std::string> needs_;    // what a missing value message says
};

CommandLine::CommandLine() {
  app_.set_help_flag();  // -h/--help is a flag of ours: it sets Options::help
  app_.formatter(std::make_shared<HelpFormatter>());
  app_.footer(kFooter);
  addHostFlags();
  addOutputFlags();
  addElasticFlags();
  addTuningFlags();
  addHorovodrunFlags();
}

CLI::Option* CommandLine::add(const std::string& names, int arity, const char* valueText,
                              const std::string& doc, Apply apply) {
  auto self = std::make_shared<const CLI::Option*>(nullptr);
  CLI::Option* opt = app_.add_option(
      names,
      [this, self, apply](const Values& values) {
        apply(spelling(*self), values);
        return true;
      },
      doc);
  *self = opt;
  // Each occurrence's callback runs as it is parsed: flags act in command-line
  // order (a later setting of a parameter wins, -x included).
  opt->trigger_on_parse()->group(group_);
  if (arity == 0) {
    opt->expected(0);
  } else {
    // type_size: CLI11 takes all of a flag's values as they come, even one
    // that looks like a flag.
    opt->type_size(arity)->expected(1);
    opt->option_text(valueText);
    needs_[opt] = "a value";
  }
  return opt;
}

std::string CommandLine::spelling(const CLI::Option* opt) {
  auto& queue = spellings_[opt];
  if (queue.empty()) return opt->get_name();  // not reached: parse() queues every occurrence
  std::string s = std::move(queue.front());
  queue.pop_front();
  return s;
}

bool CommandLine::parse(int argc, char** argv, Options* o, std::string* error) {
  o_ = o;
  startTimeoutGiven_ = false;
  spellings_.clear();
  std::vector<std::string> flags;  // for CLI11: each flag's --long name, then its values
  int i = 1;
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.empty() || arg[0] != '-') break;  // the COMMAND starts here
    // "--flag=value", and "-flag=value" as horovodrun's argparse takes it.
    const size_t eq = arg.find('=');
    const bool hasInline = eq != std::string::npos;
    const std::string spelled = arg.substr(0, eq);
    const std::string inlineValue = hasInline ? arg.substr(eq + 1) : std::string();
    std::string name = spelled;
    for (const SingleDash& s : kSingleDash)
      if (spelled == s.spelling) name = s.name;
    CLI::Option* opt = app_.get_option_no_throw(name);
    if (!opt) {
      *error = "unknown option '" + arg + "' (horarun --help lists them)";
      return false;
    }
    if (refused_.count(opt)) {
      *error = "not supported by hora: " + spelled + " (" + refused_[opt] + ")";
      return false;
    }
    const int arity = opt->get_items_expected_max();
    Values values;
    if (arity == 0 && hasInline) {
      *error = spelled + " takes no value (got '" + arg + "')";
      return false;
    } else if (arity == 1 && hasInline) {
      values.push_back(inlineValue);
    } else if (hasInline) {  // two values: "--flag=A,B"
      const size_t comma = inlineValue.find(',');
      if (comma == std::string::npos) {
        std::string both = opt->get_option_text();
        std::replace(both.begin(), both.end(), ' ', ',');
        *error = spelled + "=" + both + " expects two numbers separated by a comma, got '" +
                 inlineValue + "'";
        return false;
      }
      values = {inlineValue.substr(0, comma), inlineValue.substr(comma + 1)};
    } else if (argc - 1 - i < arity) {
      *error = spelled + " needs " + needs_[opt];
      return false;
    } else {
      for (int k = 0; k < arity; ++k) values.push_back(argv[++i]);
    }
    flags.push_back(opt->get_name());
    flags.insert(flags.end(), values.begin(), values.end());
    spellings_[opt].push_back(spelled);
  }
  for (; i < argc; ++i) o_->command.push_back(argv[i]);
  std::reverse(flags.begin(), flags.end());  // CLI11 takes them last first
  app_.parse(flags);
  return true;
}

void CommandLine::addHostFlags() {
  group_ = "hosts";
  value("--num-proc", "N", "number of ranks (required; elastic mode: the starting count)",
        [this](const std::string& f, const std::string& v) { o_->np = integer(f, v, kRanks); });
  value("-H,--hosts", "h1:s1,h2:s2", "hosts and slots, filled in order (default localhost:N)",
        [this](const std::string&, const std::string& v) { o_->hosts = v; });
  value("--hostfile", "FILE", "lines 'host slots=N'",
        [this](const std::string&, const std::string& v) { o_->hostfile = v; });
  value("-p,--ssh-port", "PORT", "ssh port for remote hosts",
        [this](const std::string& f, const std::string& v) {
          o_->sshPort = integer(f, v, {1, 65535, false});
        });
  value("-i,--ssh-identity-file", "F", "ssh identity file",
        [this](const std::string&, const std::string& v) { o_->sshIdentityFile = v; });
  value("--ssh-command", "'CMD'",
        "remote shell; '{host}' is replaced by the host, else the "
        "host is appended (env HORARUN_SSH_COMMAND; default ssh)",
        [this](const std::string&, const std::string& v) { o_->sshCommand = v; });
  value("--network-interface", "IF",
        "bind the store to IF's IPv4 address (default: the address "
        "that routes to the hosts; loopback for local jobs)",
        [this](const std::string&, const std::string& v) { o_->networkInterface = v; });
  value("--start-timeout", "S",
        "seconds for checks and for ranks to rendezvous (30; env HORARUN_START_TIMEOUT_S)",
        [this](const std::string& f, const std::string& v) {
          o_->startTimeoutS = number(f, v, kTimeoutSeconds);
          startTimeoutGiven_ = true;
        });
  flag("--check",
       "check hosts, store reachability and versions; with a "
       "COMMAND, run it only when every check passes",
       [this](const std::string&) { o_->check = true; });
}

void CommandLine::addOutputFlags() {
  group_ = "output and failures";
  value("--output-filename", "DIR", "also write DIR/rank.<r>/{stdout,stderr}",
        [this](const std::string&, const std::string& v) { o_->outputDir = v; });
  value(
      "--grace-seconds", "S", "SIGTERM to SIGKILL delay when stopping ranks (5)",
      [this](const std::string& f, const std::string& v) { o_->graceS = number(f, v, kSeconds); });
  value("-x,--env", "NAME[=VALUE]",
        "export NAME to every rank (also to remote ones); NAME alone "
        "exports horarun's own value; repeat for more",
        [this](const std::string& f, const std::string& v) {
          // NAME=VALUE (VALUE may be empty), or NAME: its value here.
          const auto eq = v.find('=');
          const std::string name = v.substr(0, eq);
          if (!isEnvName(name))
            fail(f + " '" + v + "': " +
                 (name.empty() ? std::string("the variable name is empty")
                               : "'" + name + "' is not a variable name") +
                 " (expected NAME=VALUE or NAME; a name is letters, digits and '_', not starting "
                 "with a digit)");
          if (eq != std::string::npos) return addEnv(o_, name, v.substr(eq + 1));
          const char* current = std::getenv(name.c_str());
          if (!current) fail("-x " + v + ": not set in horarun's environment (use -x NAME=VALUE)");
          addEnv(o_, name, current);
        });
  flag("--verbose", "say what horarun does", [this](const std::string&) { o_->verbose = true; });
  flag("-v,--version", "print versions", [this](const std::string&) { o_->version = true; });
  flag("-h,--help", "print this help", [this](const std::string&) { o_->help = true; });
}

void CommandLine::addElasticFlags() {
  group_ = "elastic mode (docs/elastic.md; any of these turns it on)";
  value("--min-np,--min-num-proc", "N", "fewest workers the job runs with (default: -np, else 1)",
        [this](const std::string& f, const std::string& v) {
          o_->minNp = integer(f, v, kRanks);
          o_->elastic = true;
        });
  value("--max-np,--max-num-proc", "M", "most workers (default: unbounded)",
        [this](const std::string& f, const std::string& v) {
          o_->maxNp = integer(f, v, kRanks);
          o_->elastic = true;
        });
  value("--host-discovery-script", "S", "prints 'host' or 'host:slots' lines; run every second",
        [this](const std::string&, const std::string& v) {
          o_->discoveryScript = v;
          o_->elastic = true;
        });
  value("--host-discovery-file", "F", "the same lines in a file, re-read every second",
        [this](const std::string&, const std::string& v) {
          o_->discoveryFile = v;
          o_->elastic = true;
        });
  // 65536: the most a discovery line may give a host (elastic.h).
  value("--slots,--slots-per-host", "N", "slots of a bare 'host' line (1)",
        [this](const std::string& f, const std::string& v) {
          o_->slotsPerHost = integer(f, v, {1, 65536, false});
        });
  value("--elastic-timeout", "S", "longest time below --min-np before the job fails (600)",
        [this](const std::string& f, const std::string& v) {
          o_->elasticTimeoutS = number(f, v, kTimeoutSeconds);
        });
  value("--reset-limit", "N", "most re-formations of hvd.elastic.run (default: none)",
        [this](const std::string& f, const std::string& v) {
          o_->resetLimit = integer(f, v, {0, 1e9, false});
        });
  CLI::Option* cooldown = add(
      "--blacklist-cooldown-range", 2, "LO HI",
      "a host whose worker failed gets none for a random "
      "LO..HI s, doubling per failure (default 1 600)",
      [this](const std::string& f, const Values& v) {
        double lo = 0, hi = 0;
        std::string error;
        if (!parseNumber(f + " LO", v.at(0), kSeconds, &lo, &error) ||
            !parseNumber(f + " HI", v.at(1), kSeconds, &hi, &error))
          fail(error);
        if (hi < lo)
          fail(f + " expects seconds LO HI with 0 <= LO <= HI, got '" + v[0] + "' '" + v[1] + "'");
        o_->cooldownLowS = lo, o_->cooldownHighS = hi;
      });
  needs_[cooldown] = "two values: LO HI (seconds)";
  flag("--elastic", "elastic on the -H/--hostfile hosts (no discovery)",
       [this](const std::string&) { o_->elastic = true; });
}

void CommandLine::addTuningFlags() {
  group_ = "tuning (set the ranks' HORA_* parameters, docs/params.md)";
  // Tuning flag -> parameter, with a scale factor (MiB -> bytes) and the range
  // the runtime can use (HORA_CACHE_CAPACITY is read as an int; bytes as int64).
  struct Tuning {
    const char* flag;
    const char* valueText;
    const char* param;
    double scale;
    Range range;
    const char* doc;
  };
  const Tuning kTuning[] = {
      {"--fusion-threshold-mb",
       "MB",
       "HORA_FUSION_THRESHOLD_BYTES",
       1048576.0,
       {0, 8796093022207.0, true, "MiB"},  // below 2^43 MiB = 2^63 bytes
       "HORA_FUSION_THRESHOLD_BYTES = MB * 1048576"},
      {"--cycle-time-ms",
       "MS",
       "HORA_CYCLE_TIME_MS",
       1,
       {0, kMaxSeconds, true, "ms"},
       "HORA_CYCLE_TIME_MS"},
      {"--cache-capacity",
       "N",
       "HORA_CACHE_CAPACITY",
       1,
       {0, 2147483647.0, false},
       "HORA_CACHE_CAPACITY"},
      {"--stall-check-warning-time-seconds", "S", "HORA_STALL_WARNING_TIME_S", 1, kSeconds,
       "HORA_STALL_WARNING_TIME_S"},
      {"--stall-check-shutdown-time-seconds", "S", "HORA_STALL_SHUTDOWN_TIME_S", 1, kSeconds,
       "HORA_STALL_SHUTDOWN_TIME_S (0 = never)"},
      {"--peer-timeout-seconds", "S", "HORA_PEER_TIMEOUT_S", 1, kTimeoutSeconds,
       "HORA_PEER_TIMEOUT_S"},
      {"--gloo-timeout-seconds", "S", "HORA_PEER_TIMEOUT_S", 1, kTimeoutSeconds,
       "the same (horovodrun's name)"},
  };
  for (const Tuning& t : kTuning) {
    const std::string param = t.param;
    const double scale = t.scale;
    const Range range = t.range;
    value(t.flag, t.valueText, t.doc,
          [this, param, scale, range](const std::string& f, const std::string& v) {
            const double d = number(f, v, range);
            addEnv(
                o_, param,
                scale != 1 ? std::to_string(static_cast<long long>(d * scale)) : formatNumber(d));
          });
  }
  value(
      "--log-level", "LEVEL",
      "HORA_LOG_LEVEL: trace, debug, info, warning, error, off; "
      "horovodrun's upper-case names too (FATAL = error)",
      [this](const std::string& f, const std::string& v) {
        std::string level;
        for (char c : v) level += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (level == "fatal") level = "error";  // hora's nearest to FATAL
        const char* const kLevels[] = {"trace", "debug", "info", "warning", "error", "off"};
        if (std::none_of(std::begin(kLevels), std::end(kLevels),
                         [&level](const char* l) { return level == l; }))
          fail(f + " '" + v + "' is not one of trace, debug, info, warning, error, off (or fatal)");
        addEnv(o_, "HORA_LOG_LEVEL", level);
      });
  flag("--no-stall-check", "no stall warnings and no stall shutdown (HORA_STALL_CHECK=0)",
       [this](const std::string&) { addEnv(o_, "HORA_STALL_CHECK", "0"); });
  flag("--stall-check", "HORA_STALL_CHECK=1 (the default; horovodrun's hidden negation)",
       [this](const std::string&) { addEnv(o_, "HORA_STALL_CHECK", "1"); });
  // hora chooses it by itself where it applies (several hosts, several ranks on
  // each); "hier" says so explicitly.
  flag("--hierarchical-allreduce", "HORA_HIER_ALLREDUCE=hier (auto already picks it)",
       [this](const std::string&) { addEnv(o_, "HORA_HIER_ALLREDUCE", "hier"); });
  flag("--no-hierarchical-allreduce", "HORA_HIER_ALLREDUCE=flat (one Gloo ring across hosts)",
       [this](const std::string&) { addEnv(o_, "HORA_HIER_ALLREDUCE", "flat"); });
}

void CommandLine::addHorovodrunFlags() {
  group_ = "horovodrun's other flags (docs/launching.md, \"horovodrun -> horarun\")";
  value("--network-interfaces", "IF", "one interface: --network-interface IF",
        [this](const std::string& f, const std::string& v) {
          // horovodrun's plural form: a comma-separated set; hora binds to one interface.
          if (v.empty() || v.find(',') != std::string::npos)
            fail("not supported by hora: " + f + " '" + v +
                 "' (horarun uses one interface: give exactly one, or --network-interface IF)");
          o_->networkInterface = v;
        });
  flag("--tcp", "NCCL_IB_DISABLE=1 for the ranks",  // what horovodrun --tcp sets
       [this](const std::string&) { addEnv(o_, "NCCL_IB_DISABLE", "1"); });
  flag("--check-build", "print versions and what hora is built with",
       [this](const std::string&) { o_->checkBuild = true; });
  // horovodrun flags that ask for what hora does anyway: accepted with a note.
  struct Noted {
    const char* flag;
    const char* note;
  };
  const Noted kNoted[] = {
      {"--gloo", "hora always uses its own TCP controller and Gloo (or shared memory)"},
      {"--disable-cache", "horarun caches no host checks; nothing to disable"},
      {"--mpi-threads-disable", "hora uses no MPI"},
      {"--log-without-timestamp", "hora's log lines keep their time"},
      {"--log-hide-timestamp", "hora's log lines keep their time"},
      {"--log-with-timestamp", "hora's log lines always carry the time"},
      {"--no-hierarchical-allgather", "hora's allgather is never hierarchical"},
      {"--no-torus-allreduce", "hora has no torus allreduce"},
      // Hidden in horovodrun's help (argparse.SUPPRESS), taken all the same.
      {"--no-mpi-threads-disable", "hora uses no MPI"},
      {"--no-log-hide-timestamp", "hora's log lines always carry the time"},
  };
  for (const Noted& n : kNoted) {
    const std::string note = n.note;
    flag(n.flag, "accepted, no effect: " + note, [this, note](const std::string& f) {
      o_->notes.push_back(f + ": accepted, no effect (" + note + ")");
    });
  }
  value("--num-nccl-streams", "1", "accepted with a note (hora uses one); other counts refused",
        [this](const std::string& f, const std::string& v) {
          const double d = number(f, v, {0, 2147483647.0, false});
          if (d != 1)
            fail("not supported by hora: " + f + " " + formatNumber(d) +
                 " (hora uses one NCCL stream per process set; drop the flag)");
          o_->notes.push_back(f + " 1: accepted, no effect (hora uses one NCCL stream)");
        });
  // One trace for the whole job (docs/observability.md); relative to horarun's
  // folder, which remote ranks do not share.
  value("--timeline-filename", "FILE", "HORA_TIMELINE (one Chrome trace of every rank)",
        [this](const std::string& f, std::string v) {
          if (v.empty()) fail(f + ": the file name is empty");
          char cwd[4096];
          if (v[0] != '/' && ::getcwd(cwd, sizeof cwd)) v = std::string(cwd) + "/" + v;
          addEnv(o_, "HORA_TIMELINE", v);
        });
  flag("--timeline-mark-cycles", "HORA_TIMELINE_MARK_CYCLES=1",
       [this](const std::string&) { addEnv(o_, "HORA_TIMELINE_MARK_CYCLES", "1"); });
  flag("--no-timeline-mark-cycles", "HORA_TIMELINE_MARK_CYCLES=0 (the default)",
       [this](const std::string&) { addEnv(o_, "HORA_TIMELINE_MARK_CYCLES", "0"); });
  // On by default in hora; the flag makes it explicit (docs/performance.md).
  flag("--autotune", "HORA_AUTOTUNE=1 (on by default; HORA_AUTOTUNE=0 turns it off)",
       [this](const std::string&) { addEnv(o_, "HORA_AUTOTUNE", "1"); });
  flag("--no-autotune", "HORA_AUTOTUNE=0: no autotuning",
       [this](const std::string&) { addEnv(o_, "HORA_AUTOTUNE", "0"); });
  value("--autotune-log-file", "FILE", "HORA_AUTOTUNE_LOG (a CSV of every tried setting)",
        [this](const std::string& f, const std::string& v) {
          if (v.empty()) fail(f + ": the file name is empty");
          addEnv(o_, "HORA_AUTOTUNE_LOG", v);
        });
  // Knobs of Horovod's Bayesian search; hora's tuner has none of them.
  for (const char* knob : {"--autotune-warmup-samples", "--autotune-steps-per-sample",
                           "--autotune-bayes-opt-max-samples", "--autotune-gaussian-process-noise"})
    value(knob, "N", "accepted with a note: hora's tuner has no such knob",
          [this](const std::string& f, const std::string& v) {
            const double d = number(f, v, {0, 1e9, true});
            o_->notes.push_back(f + " " + formatNumber(d) +
                                ": accepted, no effect (hora's autotuner searches one setting at a "
                                "time, one training step per sample; docs/performance.md)");
          });
  // horovodrun flags hora has no answer for: the normalisation pass refuses
  // them, naming why and what to do (listed here for the help).
  struct Refused {
    const char* flag;
    const char* why;
  };
  const Refused kRefused[] = {
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
  };
  for (const Refused& r : kRefused) {
    CLI::Option* opt = flag(r.flag, std::string("refused: ") + r.why, [](const std::string&) {});
    refused_[opt] = r.why;
  }
}

void CommandLineDeleter::operator()(CommandLine* c) const { delete c; }

CommandLinePtr makeCommandLine(std::string* error) {
  try {
    return CommandLinePtr(new CommandLine);
  } catch (const std::exception& e) {
    // Not expected: CLI11 refuses a malformed or repeated flag name (a bug here).
    *error = std::string("horarun's command line: could not define the flags: ") + e.what();
  }
  return nullptr;
}

bool parseFlags(CommandLine* commandLine, int argc, char** argv, Options* o,
                bool* startTimeoutGiven, std::string* error) {
  try {
    if (!commandLine->parse(argc, argv, o, error)) return false;
    *startTimeoutGiven = commandLine->startTimeoutGiven();
    return true;
  } catch (const UsageError& e) {
    *error = e.message;
  } catch (const CLI::Error& e) {
    // Not expected: the normalisation pass hands CLI11 only flags it knows,
    // each with its values.
    *error = std::string("horarun's command line (CLI11 ") + e.get_name() + "): " + e.what();
  } catch (const std::exception& e) {
    *error = std::string("horarun's command line: ") + e.what();
  } catch (...) {
    *error = "horarun's command line: unexpected error";
  }
  return false;
}

std::string helpText() {
  try {
    return CommandLine().help();
  } catch (const std::exception& e) {
    return std::string("horarun: could not format the help: ") + e.what() + "\n";
  }
}

}  // namespace cli
}  // namespace horarun
