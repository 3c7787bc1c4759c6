// horarun's command line: the Options it produces, its parser and usage text,
// and the mapping of tuning flags to the runtime's HORA_* parameters (one unit
// system: sizes in MiB on the command line become bytes, times keep their unit
// in the flag's and the parameter's name).
//
// Called once by main() on the main thread; pure logic (reads the environment
// for defaults: HORARUN_SSH_COMMAND, HORARUN_START_TIMEOUT_S). The flags are
// parsed with CLI11 (options_cli.h says how; CLI11 stays out of this header).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace horarun {

// The most ranks horarun starts (-np, --min-np, --max-np): far above any real
// job, and low enough that sums of ranks and slots never overflow an int.
constexpr int kMaxNp = 1 << 20;

struct Options {
  int np = 0;
  std::string hosts;     // -H
  std::string hostfile;  // --hostfile
  int sshPort = 0;       // -p
  std::string sshIdentityFile;
  std::string sshCommand;  // remote shell template; "{host}" is replaced, else host appended
  std::string networkInterface;
  std::string outputDir;      // --output-filename
  double startTimeoutS = 30;  // remote-shell checks and workers' HORA_START_TIMEOUT_S
  double graceS = 5;          // SIGTERM -> SIGKILL
  bool check = false;
  bool verbose = false;
  bool version = false;
  bool help = false;
  bool checkBuild = false;  // -cb, --check-build (horovodrun's): versions and what is built
  // One line each for horovodrun flags accepted with no effect in hora; horarun
  // prints them to stderr before starting (docs/launching.md, "horovodrun -> horarun").
  std::vector<std::string> notes;
  // Extra environment for workers: -x NAME=VALUE, or -x NAME (copied from here).
  std::vector<std::pair<std::string, std::string>> env;
  std::vector<std::string> command;

  // Elastic mode (docs/elastic.md; on with --min-np, --max-np, a discovery script or file, or
  // --elastic). np is then the starting count, 0 = what discovery offers up to maxNp.
  bool elastic = false;
  int minNp = 0;                 // 0 = not given: np if given, else 1
  int maxNp = 0;                 // 0 = unbounded
  std::string discoveryScript;   // --host-discovery-script
  std::string discoveryFile;     // --host-discovery-file (same format, re-read each poll)
  int slotsPerHost = 1;          // --slots: slots of a bare `host` line
  double elasticTimeoutS = 600;  // --elastic-timeout (horovodrun's default)
  int resetLimit = -1;           // --reset-limit: resets hvd.elastic.run makes (-1 = no limit)
  // --blacklist-cooldown-range LO HI. horovodrun's default is a blacklist for good; horarun's
  // is 1..600 s, so a one-host job can replace a killed worker (see docs/launching.md).
  double cooldownLowS = 1, cooldownHighS = 600;
};

// Parses argv. False with *error (a one-line message) on bad usage: an unknown
// flag, a missing value, a number out of its range (the message names the
// flag as typed, the value and what is allowed), an unusable -x, inconsistent
// flags. Throws nothing.
bool parseOptions(int argc, char** argv, Options* out, std::string* error);

namespace cli {
class CommandLine;
struct CommandLineDeleter {
  void operator()(CommandLine* c) const;
};
}  // namespace cli

// parseOptions as an object that keeps its CLI11 App between command lines:
// building that App is most of a parse's cost (about 0.5 ms), which matters to
// a caller parsing thousands (tests/fuzz/fuzz_options.cc). Each parse is
// independent of the ones before. One thread at a time.
class OptionParser {
 public:
  OptionParser();  // throws only std::bad_alloc
  // As parseOptions; *out should be a fresh Options.
  bool parse(int argc, char** argv, Options* out, std::string* error);

 private:
  std::unique_ptr<cli::CommandLine, cli::CommandLineDeleter> commandLine_;
  std::string defineError_;  // why commandLine_ is null (not expected)
};

// `horarun --help`: usage lines and every flag in its group (CLI11's layout).
const char* usageText();
// `text` with control characters escaped (\n, \x1b), for a one-line message
// that echoes user input.
std::string oneLine(const std::string& text);
// Whether `name` can be given to workers as a variable: a shell name
// ([A-Za-z_][A-Za-z0-9_]*), since remote workers get `export NAME=...` lines.
bool isEnvName(const std::string& name);
// The remote shell as argv tokens for one host (template expanded).
std::vector<std::string> remoteShellFor(const Options& opt, const std::string& host);

}  // namespace horarun
