// Unit tests for horarun's command line (launcher/options.h): every flag of usageText(), values,
// errors, the command after the options, the tuning flags' HORA_* parameters (checked against
// the runtime's own parameter validation) and the remote shell template.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/params.h"
#include "launcher/options.h"

namespace horarun {
namespace {

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

struct Parsed {
  bool ok = false;
  Options opt;
  std::string error;
  // opt.env as a map, for lookups.
  std::map<std::string, std::string> env() const {
    return std::map<std::string, std::string>(opt.env.begin(), opt.env.end());
  }
};

// The environment variables parseOptions reads are cleared for each test (and restored).
class OptionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : kReadVars) {
      const char* v = std::getenv(name);
      if (v) saved_[name] = v;
      unsetenv(name);
    }
  }
  void TearDown() override {
    for (const char* name : kReadVars) {
      auto it = saved_.find(name);
      if (it != saved_.end())
        setenv(name, it->second.c_str(), 1);
      else
        unsetenv(name);
    }
    unsetenv("HORARUN_OPTIONS_TEST_VAR");
  }

  // parseOptions on {"horarun", args...}.
  static Parsed parse(std::vector<std::string> args) {
    args.insert(args.begin(), "horarun");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(&a[0]);
    argv.push_back(nullptr);
    Parsed p;
    p.ok = parseOptions(static_cast<int>(args.size()), argv.data(), &p.opt, &p.error);
    return p;
  }
  static Parsed parseOk(const std::vector<std::string>& args) {
    Parsed p = parse(args);
    EXPECT_TRUE(p.ok) << p.error;
    return p;
  }
  static std::string parseError(const std::vector<std::string>& args) {
    Parsed p = parse(args);
    EXPECT_FALSE(p.ok) << "accepted";
    return p.error;
  }

  static constexpr const char* kReadVars[] = {"HORARUN_SSH_COMMAND", "HORARUN_START_TIMEOUT_S"};
  std::map<std::string, std::string> saved_;
};

using Env = std::vector<std::pair<std::string, std::string>>;

TEST_F(OptionsTest, MinimalCommandLineAndDefaults) {
  Parsed p = parseOk({"-np", "4", "python", "train.py"});
  const Options& o = p.opt;
  EXPECT_EQ(o.np, 4);
  EXPECT_EQ(o.command, (std::vector<std::string>{"python", "train.py"}));
  EXPECT_EQ(o.hosts, "");
  EXPECT_EQ(o.hostfile, "");
  EXPECT_EQ(o.sshPort, 0);
  EXPECT_EQ(o.sshIdentityFile, "");
  EXPECT_EQ(o.sshCommand, "");
  EXPECT_EQ(o.networkInterface, "");
  EXPECT_EQ(o.outputDir, "");
  EXPECT_DOUBLE_EQ(o.startTimeoutS, 30);
  EXPECT_DOUBLE_EQ(o.graceS, 5);
  EXPECT_FALSE(o.check);
  EXPECT_FALSE(o.verbose);
  EXPECT_FALSE(o.version);
  EXPECT_FALSE(o.help);
  // The ranks always get the start timeout.
  EXPECT_EQ(o.env, (Env{{"HORA_START_TIMEOUT_S", "30"}}));
}

TEST_F(OptionsTest, ShortAndLongFormsAreTheSame) {
  Parsed s = parseOk({"-np", "3", "-H", "a:1,b:2", "-p", "2222", "-i", "/k", "-x", "A=1", "cmd"});
  Parsed l = parseOk({"--num-proc", "3", "--hosts", "a:1,b:2", "--ssh-port", "2222",
                      "--ssh-identity-file", "/k", "--env", "A=1", "cmd"});
  for (const Parsed* p : {&s, &l}) {
    EXPECT_EQ(p->opt.np, 3);
    EXPECT_EQ(p->opt.hosts, "a:1,b:2");
    EXPECT_EQ(p->opt.sshPort, 2222);
    EXPECT_EQ(p->opt.sshIdentityFile, "/k");
    EXPECT_EQ(p->env().at("A"), "1");
    EXPECT_EQ(p->opt.command, (std::vector<std::string>{"cmd"}));
  }
  EXPECT_EQ(parseOk({"-np", "1", "--hostfile", "/h", "c"}).opt.hostfile, "/h");
  EXPECT_EQ(parseOk({"-np", "1", "-hostfile", "/h", "c"}).opt.hostfile, "/h");
}

TEST_F(OptionsTest, ValueFlags) {
  Parsed p = parseOk({"-np", "2", "--ssh-command", "docker exec {host}", "--network-interface",
                      "eth1", "--output-filename", "/tmp/out", "--start-timeout", "2.5",
                      "--grace-seconds", "0.5", "--verbose", "cmd", "arg"});
  EXPECT_EQ(p.opt.sshCommand, "docker exec {host}");
  EXPECT_EQ(p.opt.networkInterface, "eth1");
  EXPECT_EQ(p.opt.outputDir, "/tmp/out");
  EXPECT_DOUBLE_EQ(p.opt.startTimeoutS, 2.5);
  EXPECT_DOUBLE_EQ(p.opt.graceS, 0.5);
  EXPECT_TRUE(p.opt.verbose);
  EXPECT_EQ(p.env().at("HORA_START_TIMEOUT_S"), "2.5");
  EXPECT_DOUBLE_EQ(parseOk({"-np", "1", "--grace-seconds", "0", "c"}).opt.graceS, 0);
}

TEST_F(OptionsTest, HelpAndVersionNeedNothingElse) {
  EXPECT_TRUE(parseOk({"-h"}).opt.help);
  EXPECT_TRUE(parseOk({"--help"}).opt.help);
  EXPECT_TRUE(parseOk({"-v"}).opt.version);
  EXPECT_TRUE(parseOk({"--version"}).opt.version);
  // Nor are other options checked then.
  EXPECT_TRUE(parseOk({"-H", "a", "--hostfile", "f", "--help"}).opt.help);
}

TEST_F(OptionsTest, CheckNeedsNoCommandButNeedsNp) {
  Parsed p = parseOk({"-np", "2", "--check"});
  EXPECT_TRUE(p.opt.check);
  EXPECT_TRUE(p.opt.command.empty());
  Parsed q = parseOk({"-np", "2", "--check", "python", "x.py"});
  EXPECT_EQ(q.opt.command, (std::vector<std::string>{"python", "x.py"}));
  EXPECT_EQ(parseError({"--check"}), "-np N (N >= 1) is required");
}

TEST_F(OptionsTest, CommandStartsAtTheFirstNonOption) {
  Parsed p = parseOk({"-np", "2", "python", "-np", "3", "--bogus", "-x", "--", "-H"});
  EXPECT_EQ(p.opt.np, 2);
  EXPECT_EQ(p.opt.command,
            (std::vector<std::string>{"python", "-np", "3", "--bogus", "-x", "--", "-H"}));
  EXPECT_EQ(p.opt.hosts, "");
}

TEST_F(OptionsTest, DoubleDashEndsTheOptions) {
  Parsed p = parseOk({"-np", "2", "--", "-weird-program", "--flag"});
  EXPECT_EQ(p.opt.command, (std::vector<std::string>{"-weird-program", "--flag"}));
  EXPECT_EQ(parseOk({"-np", "2", "--", "--"}).opt.command, (std::vector<std::string>{"--"}));
  EXPECT_EQ(parseError({"-np", "2", "--"}), "no command given");
}

TEST_F(OptionsTest, AnEmptyArgumentStartsTheCommand) {
  // Documents today's behaviour: "" is taken as the program (exec then fails).
  Parsed p = parseOk({"-np", "2", "", "python"});
  EXPECT_EQ(p.opt.command, (std::vector<std::string>{"", "python"}));
}

TEST_F(OptionsTest, MissingCommandOrNp) {
  EXPECT_EQ(parseError({"-np", "2"}), "no command given");
  EXPECT_EQ(parseError({}), "no command given");
  EXPECT_EQ(parseError({"python"}), "-np N (N >= 1) is required");
}

// Was a bug: -np 99999999999 was cast to int (undefined; in practice a negative or wrapped
// count), and -np 0 said "-np N is required" as if it were missing.
TEST_F(OptionsTest, NpMustBeAnIntegerInRange) {
  for (const char* bad : {"0", "-1", "-3", "99999999999", "1048577", "99999999999999999999999",
                          "four", "1.5", "", "2x", "0x10", "1e3", "nan", " 2", "2 "}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(parseError({"-np", bad, "python"}),
              "-np expects an integer from 1 to 1048576, got '" + std::string(bad) + "'");
  }
  EXPECT_EQ(parseError({"--num-proc", "x", "python"}),
            "--num-proc expects an integer from 1 to 1048576, got 'x'");
  EXPECT_EQ(parseOk({"-np", "1048576", "python"}).opt.np, 1 << 20);
  EXPECT_EQ(parseOk({"-np", "+2", "python"}).opt.np, 2);
  EXPECT_EQ(parseOk({"-np", "007", "python"}).opt.np, 7);
}

// Was a bug: any non-negative port was taken (99999 reached ssh; 0 meant "ssh's default").
TEST_F(OptionsTest, SshPortMustBeAPort) {
  for (const char* bad : {"ssh", "-22", "0", "65536", "99999", "22.5"}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(parseError({"-np", "1", "-p", bad, "c"}),
              "-p expects an integer from 1 to 65535, got '" + std::string(bad) + "'");
  }
  EXPECT_EQ(parseOk({"-np", "1", "-p", "65535", "c"}).opt.sshPort, 65535);
  EXPECT_EQ(parseOk({"-np", "1", "--ssh-port=1", "c"}).opt.sshPort, 1);
}

// Every numeric flag: the bounds themselves are accepted, just outside them is refused with a
// message naming the flag, the value and what is allowed; huge and malformed values the same.
TEST_F(OptionsTest, EveryNumericFlagChecksItsRange) {
  struct Case {
    const char* flag;
    const char* lo;                  // smallest accepted
    const char* hi;                  // largest accepted
    const char* below;               // refused
    const char* above;               // refused
    const char* allowed;             // in the message
    std::vector<std::string> extra;  // what else the flag needs
  };
  const std::vector<std::string> elastic = {"--max-np", "1048576"};
  // clang-format off
  const Case cases[] = {
      {"-np", "1", "1048576", "0", "1048577", "an integer from 1 to 1048576", {}},
      {"--min-np", "1", "1048576", "0", "1048577", "an integer from 1 to 1048576", elastic},
      {"--max-np", "1", "1048576", "0", "1048577", "an integer from 1 to 1048576", {}},
      {"-p", "1", "65535", "0", "65536", "an integer from 1 to 65535", {}},
      {"--slots", "1", "65536", "0", "65537", "an integer from 1 to 65536", elastic},
      {"--reset-limit", "0", "1000000000", "-1", "1000000001", "an integer from 0 to 1000000000",
       elastic},
      {"--cache-capacity", "0", "2147483647", "-1", "2147483648",
       "an integer from 0 to 2147483647", {}},
      {"--fusion-threshold-mb", "0", "8796093022207", "-0.5", "8796093022208",
       "a number of MiB from 0 to 8796093022207", {}},
      {"--cycle-time-ms", "0", "1e9", "-1", "1000000000.5", "a number of ms from 0 to 1000000000",
       {}},
      {"--stall-check-warning-time-seconds", "0", "1e9", "-1", "1e10",
       "a number of seconds from 0 to 1000000000", {}},
      {"--stall-check-shutdown-time-seconds", "0", "1e9", "-1", "1e10",
       "a number of seconds from 0 to 1000000000", {}},
      {"--peer-timeout-seconds", "0.001", "1e9", "0", "1e10",
       "a number of seconds from 0.001 to 1000000000", {}},
      {"--gloo-timeout-seconds", "0.001", "1e9", "0", "1e10",
       "a number of seconds from 0.001 to 1000000000", {}},
      {"--start-timeout", "0.001", "1e9", "0", "1e10",
       "a number of seconds from 0.001 to 1000000000", {}},
      {"--grace-seconds", "0", "1e9", "-1", "1e10", "a number of seconds from 0 to 1000000000",
       {}},
      {"--elastic-timeout", "0.001", "1e9", "0", "1e10",
       "a number of seconds from 0.001 to 1000000000", elastic},
  };
  // clang-format on
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flag);
    auto line = [&](const std::string& v) {
      std::vector<std::string> args = c.extra;
      if (std::string(c.flag) != "-np" && c.extra.empty()) args.insert(args.end(), {"-np", "1"});
      args.insert(args.end(), {c.flag, v, "c"});
      return args;
    };
    parseOk(line(c.lo));
    parseOk(line(c.hi));
    for (const std::string& v :
         {std::string(c.below), std::string(c.above), std::string("99999999999999999999999"),
          std::string("-99999999999"), std::string("1e400"), std::string("2x"), std::string("")}) {
      SCOPED_TRACE(v);
      EXPECT_EQ(parseError(line(v)),
                std::string(c.flag) + " expects " + c.allowed + ", got '" + v + "'");
    }
  }
}

TEST_F(OptionsTest, EveryValueFlagAtTheEndNeedsAValue) {
  // clang-format off
  const char* const kValueFlags[] = {
      "-np", "--num-proc", "-H", "--hosts", "--hostfile", "-hostfile", "-p", "--ssh-port", "-i",
      "--ssh-identity-file", "--ssh-command", "--network-interface", "--start-timeout",
      "--output-filename", "--grace-seconds", "-x", "--env", "--fusion-threshold-mb",
      "--cycle-time-ms", "--cache-capacity", "--log-level", "--stall-check-warning-time-seconds",
      "--stall-check-shutdown-time-seconds", "--peer-timeout-seconds", "--min-np", "--max-np",
      "--host-discovery-script", "--host-discovery-file", "--slots", "--elastic-timeout",
      "--reset-limit"};
  // clang-format on
  for (const char* flag : kValueFlags) {
    SCOPED_TRACE(flag);
    EXPECT_EQ(parseError({"-np", "2", flag}), std::string(flag) + " needs a value");
  }
  EXPECT_EQ(parseError({"-np", "2", "--timeline-filename"}), "--timeline-filename needs a value");
}

TEST_F(OptionsTest, AValueMayLookLikeAFlag) {
  // The next argument is the value, whatever it looks like.
  EXPECT_EQ(parseOk({"-np", "1", "-H", "-np", "c"}).opt.hosts, "-np");
  EXPECT_EQ(parseOk({"-np", "1", "--output-filename", "--", "c"}).opt.outputDir, "--");
  EXPECT_EQ(parseError({"-np", "-H", "a", "c"}),
            "-np expects an integer from 1 to 1048576, got '-H'");
}

TEST_F(OptionsTest, UnknownFlagsAreRefused) {
  // Only horovodrun's own single-dash spellings are read as long names (-num-proc, --cb are not
  // flags), and a value is never glued to a flag (-p22, -Ha).
  for (const char* flag : {"--bogus", "-n", "-", "---np", "--np", "--np=2", "-X", "-num-proc",
                           "-hosts", "--cb", "-p22", "-Ha", "-np2"}) {
    SCOPED_TRACE(flag);
    EXPECT_EQ(parseError({flag, "2", "python"}),
              "unknown option '" + std::string(flag) + "' (horarun --help lists them)");
  }
}

// horovodrun's single-dash long spellings (-np, -cb, -hostfile, -prefix-timestamp; CLI11 takes
// one letter after a single dash) are read as their --long names before the COMMAND, in every
// form argparse takes them: "-np 2" and "-np=2".
TEST_F(OptionsTest, HorovodrunsSingleDashSpellingsAreItsLongFlags) {
  EXPECT_EQ(parseOk({"-np", "2", "c"}).opt.np, 2);
  EXPECT_EQ(parseOk({"-np=3", "c"}).opt.np, 3);
  EXPECT_EQ(parseOk({"-np", "1", "-hostfile=/h", "c"}).opt.hostfile, "/h");
  EXPECT_TRUE(parseOk({"-cb"}).opt.checkBuild);
  EXPECT_EQ(parseError({"-np", "2", "-cb=1", "c"}), "-cb takes no value (got '-cb=1')");
  EXPECT_EQ(parseError({"-np=0", "c"}), "-np expects an integer from 1 to 1048576, got '0'");
  EXPECT_EQ(
      parseError({"-np", "2", "-prefix-timestamp", "c"}),
      "not supported by hora: -prefix-timestamp (horarun prefixes output with the rank only)");
  // One-letter flags take "=value" too (as argparse does).
  Parsed p = parseOk({"-np", "1", "-p=22", "-H=a:1", "-x=A=1", "-i=/k", "c"});
  EXPECT_EQ(p.opt.sshPort, 22);
  EXPECT_EQ(p.opt.hosts, "a:1");
  EXPECT_EQ(p.env().at("A"), "1");
  EXPECT_EQ(p.opt.sshIdentityFile, "/k");
  EXPECT_EQ(parseError({"-np", "1", "-x=", "c"}),
            "-x '': the variable name is empty (expected NAME=VALUE or NAME; a name is letters, "
            "digits and '_', not starting with a digit)");
}

TEST_F(OptionsTest, SingleDashSpellingsAfterTheCommandOrAsValuesAreLeftAlone) {
  Parsed p = parseOk({"-np", "2", "python", "-np", "3", "-cb", "-hostfile", "f", "-np=4"});
  EXPECT_EQ(p.opt.np, 2);
  EXPECT_FALSE(p.opt.checkBuild);
  EXPECT_EQ(p.opt.hostfile, "");
  EXPECT_EQ(p.opt.command,
            (std::vector<std::string>{"python", "-np", "3", "-cb", "-hostfile", "f", "-np=4"}));
  EXPECT_EQ(parseOk({"-np", "2", "--", "-cb", "-np"}).opt.command,
            (std::vector<std::string>{"-cb", "-np"}));
  // A flag's value, whatever it looks like.
  Parsed q = parseOk({"-np", "1", "--output-filename", "-cb", "-H", "-hostfile", "c"});
  EXPECT_EQ(q.opt.outputDir, "-cb");
  EXPECT_EQ(q.opt.hosts, "-hostfile");
  EXPECT_FALSE(q.opt.checkBuild);
  EXPECT_EQ(q.opt.command, (std::vector<std::string>{"c"}));
  EXPECT_EQ(parseError({"--blacklist-cooldown-range", "-0", "-np", "--max-np", "2", "c"}),
            "--blacklist-cooldown-range HI expects a number of seconds from 0 to 1000000000, got "
            "'-np'");
}

// A flag spelled two ways, given twice: each message names the spelling of the bad occurrence.
TEST_F(OptionsTest, ErrorsNameTheSpellingOfTheBadOccurrence) {
  EXPECT_EQ(parseError({"-np", "5", "--num-proc", "0", "c"}),
            "--num-proc expects an integer from 1 to 1048576, got '0'");
  EXPECT_EQ(parseError({"--num-proc", "5", "-np", "0", "c"}),
            "-np expects an integer from 1 to 1048576, got '0'");
  EXPECT_EQ(parseError({"-np", "1", "-p", "22", "--ssh-port=0", "c"}),
            "--ssh-port expects an integer from 1 to 65535, got '0'");
  EXPECT_EQ(parseError({"-np", "1", "--slots-per-host", "2", "--slots", "0", "--max-np", "2", "c"}),
            "--slots expects an integer from 1 to 65536, got '0'");
  EXPECT_EQ(parseError({"-np", "1", "--env", "A=1", "-x", "1A", "c"}).substr(0, 21),
            "-x '1A': '1A' is not ");
  // The last occurrence wins.
  EXPECT_EQ(parseOk({"-np", "5", "--num-proc", "3", "c"}).opt.np, 3);
}

// Was a bug (found by tests/fuzz/fuzz_options.cc): arguments are echoed in errors, and one
// holding a newline or an escape sequence split the message or reached the terminal raw.
TEST_F(OptionsTest, ErrorsStayOnOneLine) {
  EXPECT_EQ(parseError({"-np", "1", "--bo\ngus", "c"}),
            "unknown option '--bo\\ngus' (horarun --help lists them)");
  EXPECT_EQ(parseError({"-np", "2\x1b[31m", "c"}),
            "-np expects an integer from 1 to 1048576, got '2\\x1b[31m'");
  EXPECT_EQ(oneLine("a\tb\x7f\xc3\xa9"), "a\\x09b\\x7f\xc3\xa9");  // UTF-8 kept
}

TEST_F(OptionsTest, HostsAndHostfileAreExclusive) {
  EXPECT_EQ(parseError({"-np", "2", "-H", "a:2", "--hostfile", "f", "c"}),
            "give either -H or --hostfile, not both");
}

TEST_F(OptionsTest, StartTimeoutMustBePositive) {
  const std::string allowed = "expects a number of seconds from 0.001 to 1000000000, got ";
  EXPECT_EQ(parseError({"-np", "1", "--start-timeout", "0", "c"}),
            "--start-timeout " + allowed + "'0'");
  EXPECT_EQ(parseError({"-np", "1", "--start-timeout", "-1", "c"}),
            "--start-timeout " + allowed + "'-1'");
  // Less than the millisecond the ranks count in would reach them as 0.
  EXPECT_EQ(parseError({"-np", "1", "--start-timeout", "0.0005", "c"}),
            "--start-timeout " + allowed + "'0.0005'");
  EXPECT_EQ(parseOk({"-np", "1", "--start-timeout", "0.001", "c"}).env().at("HORA_START_TIMEOUT_S"),
            "0.001");
  EXPECT_EQ(parseError({"-np", "1", "--start-timeout", "soon", "c"}),
            "--start-timeout " + allowed + "'soon'");
  EXPECT_EQ(parseError({"-np", "1", "--grace-seconds", "-1", "c"}),
            "--grace-seconds expects a number of seconds from 0 to 1000000000, got '-1'");
}

TEST_F(OptionsTest, EnvironmentDefaultsAndTheirOverrides) {
  setenv("HORARUN_SSH_COMMAND", "rsh -l me", 1);
  setenv("HORARUN_START_TIMEOUT_S", "12", 1);
  Parsed p = parseOk({"-np", "1", "c"});
  EXPECT_EQ(p.opt.sshCommand, "rsh -l me");
  EXPECT_DOUBLE_EQ(p.opt.startTimeoutS, 12);
  EXPECT_EQ(p.env().at("HORA_START_TIMEOUT_S"), "12");
  Parsed q = parseOk({"-np", "1", "--ssh-command", "ssh -q", "--start-timeout", "7", "c"});
  EXPECT_EQ(q.opt.sshCommand, "ssh -q");
  EXPECT_DOUBLE_EQ(q.opt.startTimeoutS, 7);
}

// Was a bug: HORARUN_START_TIMEOUT_S was read with atof, so "abc" became 0 (and the error named
// --start-timeout, which was not given) and "inf" an infinite timeout.
TEST_F(OptionsTest, StartTimeoutFromTheEnvironmentIsCheckedToo) {
  for (const char* bad : {"abc", "0", "-5", "inf", "nan", "1e10", ""}) {
    SCOPED_TRACE(bad);
    setenv("HORARUN_START_TIMEOUT_S", bad, 1);
    EXPECT_EQ(parseError({"-np", "1", "c"}),
              "HORARUN_START_TIMEOUT_S (horarun's environment) expects a number of seconds from "
              "0.001 to 1000000000, got '" +
                  std::string(bad) + "'");
    // --start-timeout replaces it, bad or not.
    EXPECT_DOUBLE_EQ(parseOk({"-np", "1", "--start-timeout", "4", "c"}).opt.startTimeoutS, 4);
  }
  // Help and version need nothing else.
  EXPECT_TRUE(parseOk({"--help"}).opt.help);
}

// ---- -x ----

TEST_F(OptionsTest, ExportNameEqualsValue) {
  Parsed p = parseOk({"-np", "1", "-x", "A=1", "-x", "B=", "-x", "C=x=y", "--env", "D=a b", "c"});
  EXPECT_EQ(
      p.opt.env,
      (Env{{"A", "1"}, {"B", ""}, {"C", "x=y"}, {"D", "a b"}, {"HORA_START_TIMEOUT_S", "30"}}));
}

TEST_F(OptionsTest, ExportNameCopiesHorarunsEnvironment) {
  setenv("HORARUN_OPTIONS_TEST_VAR", "from horarun", 1);
  Parsed p = parseOk({"-np", "1", "-x", "HORARUN_OPTIONS_TEST_VAR", "c"});
  EXPECT_EQ(p.env().at("HORARUN_OPTIONS_TEST_VAR"), "from horarun");
  unsetenv("HORARUN_OPTIONS_TEST_VAR");
  EXPECT_EQ(parseError({"-np", "1", "-x", "HORARUN_OPTIONS_TEST_VAR", "c"}),
            "-x HORARUN_OPTIONS_TEST_VAR: not set in horarun's environment (use -x NAME=VALUE)");
}

TEST_F(OptionsTest, ExportingANameAgainReplacesItInPlace) {
  Parsed p = parseOk({"-np", "1", "-x", "A=1", "-x", "B=2", "-x", "A=3", "c"});
  EXPECT_EQ(p.opt.env, (Env{{"A", "3"}, {"B", "2"}, {"HORA_START_TIMEOUT_S", "30"}}));
}

// Was a bug: "-x =VALUE" exported a variable with an empty name, "--env=" asked for the
// variable "" ("-x : not set"), and any name was taken, though remote workers get
// `export NAME=...` lines (a name with a space broke them, one with ';' ran a command).
TEST_F(OptionsTest, ExportNeedsAVariableName) {
  const std::string rule =
      " (expected NAME=VALUE or NAME; a name is letters, digits and '_', not starting with a "
      "digit)";
  EXPECT_EQ(parseError({"-np", "1", "-x", "=oops", "c"}),
            "-x '=oops': the variable name is empty" + rule);
  EXPECT_EQ(parseError({"-np", "1", "-x", "=", "c"}), "-x '=': the variable name is empty" + rule);
  EXPECT_EQ(parseError({"-np", "1", "-x", "", "c"}), "-x '': the variable name is empty" + rule);
  EXPECT_EQ(parseError({"-np", "1", "--env=", "c"}), "--env '': the variable name is empty" + rule);
  for (const char* bad : {"A B=1", "1A=2", "A;touch x=1", "A-B=1", "$A=1", "A\nB=1", "É=1"}) {
    SCOPED_TRACE(bad);
    const std::string v = bad;
    EXPECT_EQ(parseError({"-np", "1", "--env", v, "c"}),
              oneLine("--env '" + v + "': '" + v.substr(0, v.find('=')) +
                      "' is not a variable name" + rule));
  }
  // NAME= exports an empty value; a missing operand names the flag.
  EXPECT_EQ(parseOk({"-np", "1", "-x", "_A1=", "c"}).env().at("_A1"), "");
  EXPECT_EQ(parseError({"-np", "1", "-x"}), "-x needs a value");
  EXPECT_TRUE(isEnvName("PATH") && isEnvName("_") && isEnvName("a_1"));
  EXPECT_FALSE(isEnvName("") || isEnvName("9") || isEnvName("A.B"));
}

// ---- tuning flags ----

TEST_F(OptionsTest, TuningFlagsSetTheirParameters) {
  Parsed p = parseOk(
      {"-np", "1", "--fusion-threshold-mb", "64", "--cycle-time-ms", "3.5", "--cache-capacity",
       "2048", "--log-level", "debug", "--stall-check-warning-time-seconds", "30",
       "--stall-check-shutdown-time-seconds", "600", "--peer-timeout-seconds", "10", "c"});
  EXPECT_EQ(p.opt.env, (Env{{"HORA_FUSION_THRESHOLD_BYTES", "67108864"},
                            {"HORA_CYCLE_TIME_MS", "3.5"},
                            {"HORA_CACHE_CAPACITY", "2048"},
                            {"HORA_LOG_LEVEL", "debug"},
                            {"HORA_STALL_WARNING_TIME_S", "30"},
                            {"HORA_STALL_SHUTDOWN_TIME_S", "600"},
                            {"HORA_PEER_TIMEOUT_S", "10"},
                            {"HORA_START_TIMEOUT_S", "30"}}));
  // What horarun hands the ranks, the runtime accepts and reads back.
  auto params = hora::Params::fromMap(p.env());
  ASSERT_TRUE(params.isOk()) << params.status().toString();
  EXPECT_EQ(params.value().getInt("HORA_FUSION_THRESHOLD_BYTES"), 64 << 20);
  EXPECT_DOUBLE_EQ(params.value().getFloat("HORA_CYCLE_TIME_MS"), 3.5);
  EXPECT_EQ(params.value().getInt("HORA_CACHE_CAPACITY"), 2048);
  EXPECT_DOUBLE_EQ(params.value().getFloat("HORA_PEER_TIMEOUT_S"), 10);
  EXPECT_DOUBLE_EQ(params.value().getFloat("HORA_START_TIMEOUT_S"), 30);
}

TEST_F(OptionsTest, FusionThresholdIsMegabytesTurnedIntoWholeBytes) {
  EXPECT_EQ(parseOk({"-np", "1", "--fusion-threshold-mb", "0.5", "c"})
                .env()
                .at("HORA_FUSION_THRESHOLD_BYTES"),
            "524288");
  EXPECT_EQ(parseOk({"-np", "1", "--fusion-threshold-mb", "0", "c"})
                .env()
                .at("HORA_FUSION_THRESHOLD_BYTES"),
            "0");
  EXPECT_EQ(parseOk({"-np", "1", "--fusion-threshold-mb", "1e-6", "c"})
                .env()
                .at("HORA_FUSION_THRESHOLD_BYTES"),
            "1");  // 1.048576 bytes, truncated
}

TEST_F(OptionsTest, NoStallCheckTurnsTheStallCheckOff) {
  // As horovodrun's HOROVOD_STALL_CHECK_DISABLE=1: no warnings and no shutdown,
  // whatever the stall times say (in any order).
  EXPECT_EQ(parseOk({"-np", "1", "--no-stall-check", "c"}).env().at("HORA_STALL_CHECK"), "0");
  Parsed p =
      parseOk({"-np", "1", "--no-stall-check", "--stall-check-shutdown-time-seconds", "9", "c"});
  EXPECT_EQ(p.env().at("HORA_STALL_CHECK"), "0");
  EXPECT_EQ(p.env().at("HORA_STALL_SHUTDOWN_TIME_S"), "9");
  auto params = hora::Params::fromMap(p.env());
  ASSERT_TRUE(params.isOk()) << params.status().toString();
  EXPECT_FALSE(params.value().getBool("HORA_STALL_CHECK"));
}

TEST_F(OptionsTest, TuningFlagsRefuseBadNumbers) {
  EXPECT_EQ(parseError({"-np", "1", "--cache-capacity", "1.5", "c"}),
            "--cache-capacity expects an integer from 0 to 2147483647, got '1.5'");
  for (const char* flag : {"--fusion-threshold-mb", "--cycle-time-ms", "--cache-capacity",
                           "--stall-check-warning-time-seconds",
                           "--stall-check-shutdown-time-seconds", "--peer-timeout-seconds"}) {
    SCOPED_TRACE(flag);
    EXPECT_TRUE(contains(parseError({"-np", "1", flag, "-1", "c"}), " expects a"));
    EXPECT_TRUE(contains(parseError({"-np", "1", flag, "fast", "c"}), "got 'fast'"));
    EXPECT_TRUE(contains(parseError({"-np", "1", flag, "", "c"}), "got ''"));
  }
}

TEST_F(OptionsTest, TimelineFlagsSetTheParameters) {
  Parsed p =
      parse({"-np", "1", "--timeline-filename", "/tmp/t.json", "--timeline-mark-cycles", "c"});
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_EQ(p.env()["HORA_TIMELINE"], "/tmp/t.json");
  EXPECT_EQ(p.env()["HORA_TIMELINE_MARK_CYCLES"], "1");
  // A relative name is horarun's folder's: the ranks may run elsewhere.
  Parsed rel = parse({"-np", "1", "--timeline-filename", "t.json", "c"});
  ASSERT_TRUE(rel.ok) << rel.error;
  EXPECT_EQ(rel.env()["HORA_TIMELINE"].front(), '/');
  EXPECT_EQ(parseError({"-np", "1", "--timeline-filename", "", "c"}),
            "--timeline-filename: the file name is empty");
}

TEST_F(OptionsTest, LaterSettingsOfAParameterWin) {
  EXPECT_EQ(parseOk({"-np", "1", "--cycle-time-ms", "5", "--cycle-time-ms", "7", "c"}).opt.env,
            (Env{{"HORA_CYCLE_TIME_MS", "7"}, {"HORA_START_TIMEOUT_S", "30"}}));
  EXPECT_EQ(parseOk({"-np", "1", "-x", "HORA_CYCLE_TIME_MS=1", "--cycle-time-ms", "2", "c"})
                .env()
                .at("HORA_CYCLE_TIME_MS"),
            "2");
  EXPECT_EQ(parseOk({"-np", "1", "--cycle-time-ms", "2", "-x", "HORA_CYCLE_TIME_MS=1", "c"})
                .env()
                .at("HORA_CYCLE_TIME_MS"),
            "1");
  // Except the start timeout, which --start-timeout (or its default) always sets last.
  EXPECT_EQ(
      parseOk({"-np", "1", "-x", "HORA_START_TIMEOUT_S=99", "c"}).env().at("HORA_START_TIMEOUT_S"),
      "30");
}

// Was a bug: the tuning values were printed with an ostream's default 6 significant digits, so
// --cache-capacity 1000000 reached the ranks as "1e+06", which the runtime refuses as not an
// integer (every rank failed at start-up), and large times lost digits.
TEST_F(OptionsTest, BigTuningValuesReachTheRanksExactly) {
  Parsed p = parseOk({"-np", "1", "--cache-capacity", "1000000", "--cycle-time-ms", "1234567.25",
                      "--peer-timeout-seconds", "0.1", "c"});
  EXPECT_EQ(p.env().at("HORA_CACHE_CAPACITY"), "1000000");
  EXPECT_EQ(p.env().at("HORA_CYCLE_TIME_MS"), "1234567.25");
  EXPECT_EQ(p.env().at("HORA_PEER_TIMEOUT_S"), "0.1");
  auto params = hora::Params::fromMap(p.env());
  ASSERT_TRUE(params.isOk()) << params.status().message();
  EXPECT_EQ(params.value().getInt("HORA_CACHE_CAPACITY"), 1000000);
  EXPECT_DOUBLE_EQ(params.value().getFloat("HORA_CYCLE_TIME_MS"), 1234567.25);
}

// Was a bug: the number check was strtod's, so "nan", "inf" and hex floats passed as
// non-negative numbers; "nan" then failed every rank at start-up, "inf" did not.
TEST_F(OptionsTest, NanInfAndHexAreNotNumbers) {
  EXPECT_EQ(parseError({"-np", "1", "--peer-timeout-seconds", "nan", "c"}),
            "--peer-timeout-seconds expects a number of seconds from 0.001 to 1000000000, got "
            "'nan'");
  EXPECT_EQ(parseError({"-np", "1", "--cycle-time-ms", "inf", "c"}),
            "--cycle-time-ms expects a number of ms from 0 to 1000000000, got 'inf'");
  EXPECT_EQ(parseError({"-np", "1", "--grace-seconds", "0x1p4", "c"}),
            "--grace-seconds expects a number of seconds from 0 to 1000000000, got '0x1p4'");
  EXPECT_EQ(parseError({"-np", "1", "--start-timeout", "1e999", "c"}),
            "--start-timeout expects a number of seconds from 0.001 to 1000000000, got "
            "'1e999'");
  Parsed q = parseOk({"-np", "1", "--start-timeout", "2.5e1", "c"});
  EXPECT_EQ(q.env().at("HORA_START_TIMEOUT_S"), "25");
}

// ---- usage text ----

// Every flag the usage text lists is one parseOptions knows.
TEST_F(OptionsTest, EveryFlagInTheUsageTextIsRecognized) {
  std::set<std::string> flags;
  std::istringstream lines(usageText());
  std::string line;
  while (std::getline(lines, line)) {
    // Flag lines: two spaces, then "-a, --long ARG   doc" or "--long ARG   doc".
    if (line.rfind("  -", 0) != 0) continue;
    std::istringstream words(line);
    std::string w;
    while (words >> w && w[0] == '-') {
      if (w.back() == ',') w.pop_back();
      flags.insert(w);
    }
  }
  EXPECT_GE(flags.size(), 29u) << "the usage text's format changed?";
  // clang-format off
  const char* const kDocumented[] = {
      "-np", "--num-proc", "-H", "--hosts", "--hostfile", "-p", "--ssh-port", "-i",
      "--ssh-identity-file", "--ssh-command", "--network-interface", "--start-timeout", "--check",
      "--output-filename", "--grace-seconds", "-x", "--env", "--verbose", "--fusion-threshold-mb",
      "--cycle-time-ms", "--cache-capacity", "--log-level", "--stall-check-warning-time-seconds",
      "--stall-check-shutdown-time-seconds", "--no-stall-check", "--peer-timeout-seconds",
      "--timeline-filename", "-v", "--version", "--min-np", "--max-np", "--host-discovery-script",
      "--host-discovery-file", "--slots", "--elastic-timeout", "--blacklist-cooldown-range",
      "--elastic", "--reset-limit"};
  // clang-format on
  for (const char* f : kDocumented)
    EXPECT_EQ(flags.count(f), 1u) << f << " missing from the usage text";
  for (const auto& f : flags) {
    SCOPED_TRACE(f);
    Parsed p = parse({f});
    EXPECT_FALSE(contains(p.error, "unknown option")) << p.error;
  }
}

// One OptionParser for many command lines (the fuzz target keeps one): each parse gives what a
// fresh parseOptions gives, after errors in the normalisation pass or in CLI11's parse too.
TEST_F(OptionsTest, AParserReusedParsesEachCommandLineAfresh) {
  OptionParser parser;
  const std::vector<std::vector<std::string>> lines = {
      {"-np", "5", "--num-proc", "0", "c"},  // a callback's error, mid-parse
      {"--num-proc", "2", "--bogus", "c"},   // the pass's error, --num-proc queued
      {"-np", "0", "c"},                     // names -np, not the queued --num-proc
      {"--num-proc", "3", "-x", "A=1", "--verbose", "--tcp", "c", "d"},
      {"-np", "1", "c"},  // nothing left of the line before
      {"--max-np", "2", "--blacklist-cooldown-range", "2", "1", "c"},
      {"-h"},
  };
  for (const auto& line : lines) {
    SCOPED_TRACE(::testing::PrintToString(line));
    std::vector<std::string> args = line;
    args.insert(args.begin(), "horarun");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(&a[0]);
    Options o;
    std::string error;
    const bool ok = parser.parse(static_cast<int>(args.size()), argv.data(), &o, &error);
    const Parsed fresh = parse(line);
    EXPECT_EQ(ok, fresh.ok);
    EXPECT_EQ(error, fresh.error);
    EXPECT_EQ(o.np, fresh.opt.np);
    EXPECT_EQ(o.env, fresh.opt.env);
    EXPECT_EQ(o.verbose, fresh.opt.verbose);
    EXPECT_EQ(o.help, fresh.opt.help);
    EXPECT_EQ(o.command, fresh.opt.command);
  }
}

// `horarun --help` groups the flags as the sections of horovodrun's help do, each with all its
// spellings, on lines of at most 90 characters.
TEST_F(OptionsTest, HelpShowsTheGroups) {
  const std::string help = usageText();
  EXPECT_EQ(help.rfind("usage: horarun -np N [options] COMMAND [ARGS...]\n", 0), 0u) << help;
  size_t at = 0;
  for (const char* group : {"\nhosts:\n", "\noutput and failures:\n", "\nelastic mode (",
                            "\ntuning (", "\nhorovodrun's other flags ("}) {
    SCOPED_TRACE(group);
    const size_t found = help.find(group, at);
    ASSERT_NE(found, std::string::npos) << help;
    at = found;  // in this order
  }
  for (const char* line : {"\n  -np, --num-proc N ", "\n  -H, --hosts h1:s1,h2:s2 ",
                           "\n  -hostfile, --hostfile FILE ", "\n  -cb, --check-build ",
                           "\n  -x, --env NAME[=VALUE] ", "\n  --blacklist-cooldown-range LO HI\n",
                           "\n  -prefix-timestamp, --prefix-output-with-timestamp\n",
                           "\n  -h, --help ", "\n  -v, --version "})
    EXPECT_TRUE(contains(help, line)) << line << " missing in:\n" << help;
  // The flags of a group come after its heading: -cb among horovodrun's other flags.
  EXPECT_GT(help.find("-cb, --check-build"), help.find("\nhorovodrun's other flags ("));
  EXPECT_LT(help.find("-np, --num-proc"), help.find("\noutput and failures:"));
  // Refused flags are listed with why.
  EXPECT_TRUE(contains(help, "refused: horarun starts the ranks itself"));
  std::istringstream lines(help);
  std::string l;
  while (std::getline(lines, l)) EXPECT_LE(l.size(), 90u) << l;
  // Help is a flag like the others: it needs nothing else, in any spelling.
  EXPECT_TRUE(parseOk({"-np", "2", "-h"}).opt.help);
}

// ---- --flag=value ----

TEST_F(OptionsTest, LongFlagsTakeTheirValueAfterAnEqualsSign) {
  Parsed p = parseOk({"--num-proc=3", "--hosts=a:2,b", "--env=A=B=C", "--fusion-threshold-mb=2",
                      "--log-level=debug", "--output-filename=", "c"});
  EXPECT_EQ(p.opt.np, 3);
  EXPECT_EQ(p.opt.hosts, "a:2,b");
  EXPECT_EQ(p.env().at("A"), "B=C");  // split at the first '=' only
  EXPECT_EQ(p.env().at("HORA_FUSION_THRESHOLD_BYTES"), "2097152");
  EXPECT_EQ(p.env().at("HORA_LOG_LEVEL"), "debug");
  EXPECT_EQ(p.opt.outputDir, "");
  EXPECT_EQ(parseError({"--num-proc=x", "c"}),
            "--num-proc expects an integer from 1 to 1048576, got 'x'");
}

TEST_F(OptionsTest, SwitchesRefuseAnEqualsValue) {
  EXPECT_EQ(parseError({"-np", "2", "--verbose=1", "c"}),
            "--verbose takes no value (got '--verbose=1')");
  EXPECT_EQ(parseError({"-np", "2", "--check=yes", "c"}),
            "--check takes no value (got '--check=yes')");
}

// ---- elastic mode ----

class ElasticOptionsTest : public OptionsTest {
 protected:
  void SetUp() override {
    OptionsTest::SetUp();
    char dir[] = "/tmp/horarun-options-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    script_ = dir_ + "/discover.sh";
    std::ofstream(script_) << "#!/bin/sh\necho localhost:2\n";
    chmod(script_.c_str(), 0755);
    plain_ = dir_ + "/hosts";
    std::ofstream(plain_) << "localhost:2\n";
  }
  void TearDown() override {
    std::remove(script_.c_str());
    std::remove(plain_.c_str());
    rmdir(dir_.c_str());
    OptionsTest::TearDown();
  }
  std::string dir_, script_, plain_;
};

TEST_F(ElasticOptionsTest, OffByDefault) {
  Parsed p = parseOk({"-np", "2", "c"});
  EXPECT_FALSE(p.opt.elastic);
  EXPECT_EQ(p.env().count("HORA_ELASTIC_TIMEOUT_S"), 0u);
}

TEST_F(ElasticOptionsTest, EachElasticFlagTurnsItOn) {
  EXPECT_TRUE(parseOk({"--min-np", "2", "--host-discovery-file", plain_, "c"}).opt.elastic);
  EXPECT_TRUE(parseOk({"--max-np", "4", "c"}).opt.elastic);
  EXPECT_TRUE(parseOk({"--host-discovery-script", script_, "c"}).opt.elastic);
  EXPECT_TRUE(parseOk({"--host-discovery-file", plain_, "c"}).opt.elastic);
  EXPECT_TRUE(parseOk({"-np", "2", "--elastic", "c"}).opt.elastic);
}

TEST_F(ElasticOptionsTest, DefaultsFollowHorovodrun) {
  Parsed p = parseOk({"--host-discovery-script", script_, "c"});
  EXPECT_EQ(p.opt.np, 0);     // what discovery offers
  EXPECT_EQ(p.opt.minNp, 1);  // no -np: 1
  EXPECT_EQ(p.opt.maxNp, 0);  // unbounded
  EXPECT_EQ(p.opt.slotsPerHost, 1);
  EXPECT_EQ(p.opt.elasticTimeoutS, 600);
  EXPECT_EQ(p.opt.cooldownLowS, 1);
  EXPECT_EQ(p.opt.cooldownHighS, 600);
  EXPECT_EQ(p.env().at("HORA_ELASTIC_TIMEOUT_S"), "600");
  // min-np defaults to -np when given (horovodrun).
  EXPECT_EQ(parseOk({"-np", "3", "--host-discovery-script", script_, "c"}).opt.minNp, 3);
}

TEST_F(ElasticOptionsTest, ValuesAndTheirEqualsForms) {
  Parsed p =
      parseOk({"-np", "3", "--min-np=2", "--max-np", "5", "--slots=4", "--elastic-timeout=30.5",
               "--blacklist-cooldown-range", "2", "8", "--host-discovery-script=" + script_, "c"});
  EXPECT_EQ(p.opt.np, 3);
  EXPECT_EQ(p.opt.minNp, 2);
  EXPECT_EQ(p.opt.maxNp, 5);
  EXPECT_EQ(p.opt.slotsPerHost, 4);
  EXPECT_EQ(p.opt.discoveryScript, script_);
  EXPECT_EQ(p.opt.cooldownLowS, 2);
  EXPECT_EQ(p.opt.cooldownHighS, 8);
  EXPECT_EQ(p.env().at("HORA_ELASTIC_TIMEOUT_S"), "30.5");
  Parsed q = parseOk({"--blacklist-cooldown-range=0.5,60", "--max-np", "2", "c"});
  EXPECT_EQ(q.opt.cooldownLowS, 0.5);
  EXPECT_EQ(q.opt.cooldownHighS, 60);
  EXPECT_EQ(parseOk({"--slots-per-host", "3", "--max-np", "2", "c"}).opt.slotsPerHost, 3);
}

TEST_F(ElasticOptionsTest, BoundsAreChecked) {
  const std::string s = script_;
  EXPECT_EQ(parseError({"--min-np", "0", "c"}),
            "--min-np expects an integer from 1 to 1048576, got '0'");
  EXPECT_EQ(parseError({"--max-np", "0", "c"}),
            "--max-np expects an integer from 1 to 1048576, got '0'");
  EXPECT_EQ(parseError({"--min-np", "3", "--max-np", "2", "--host-discovery-script", s, "c"}),
            "--min-np 3 is larger than --max-np 2");
  EXPECT_EQ(parseError({"-np", "1", "--min-np", "2", "--host-discovery-script", s, "c"}),
            "-np 1 must lie between --min-np 2 and --max-np (unbounded)");
  EXPECT_EQ(parseError({"-np", "5", "--max-np", "4", "--host-discovery-script", s, "c"}),
            "-np 5 is larger than --max-np 4");
  EXPECT_EQ(parseError({"--slots", "0", "--host-discovery-script", s, "c"}),
            "--slots expects an integer from 1 to 65536, got '0'");
  EXPECT_EQ(parseError({"--elastic-timeout", "0", "--host-discovery-script", s, "c"}),
            "--elastic-timeout expects a number of seconds from 0.001 to 1000000000, got '0'");
  EXPECT_TRUE(contains(parseError({"--blacklist-cooldown-range", "5", "2", "--max-np", "2", "c"}),
                       "0 <= LO <= HI"));
  EXPECT_EQ(parseError({"--blacklist-cooldown-range", "1", "1e10", "--max-np", "2", "c"}),
            "--blacklist-cooldown-range HI expects a number of seconds from 0 to 1000000000, got "
            "'1e10'");
  EXPECT_EQ(parseError({"--blacklist-cooldown-range=-1,2", "--max-np", "2", "c"}),
            "--blacklist-cooldown-range LO expects a number of seconds from 0 to 1000000000, got "
            "'-1'");
  EXPECT_EQ(parseError({"--max-np", "2", "--blacklist-cooldown-range", "5"}),
            "--blacklist-cooldown-range needs two values: LO HI (seconds)");
  EXPECT_TRUE(contains(parseError({"--blacklist-cooldown-range=5", "--max-np", "2", "c"}),
                       "separated by a comma"));
  EXPECT_EQ(parseError({"--elastic", "c"}),
            "elastic mode on this machine alone needs -np N or --max-np M (how many workers)");
}

TEST_F(ElasticOptionsTest, OneSourceOfHostsAndAUsableScript) {
  EXPECT_EQ(parseError({"--host-discovery-script", script_, "--host-discovery-file", plain_, "c"}),
            "give either --host-discovery-script or --host-discovery-file, not both");
  EXPECT_TRUE(contains(parseError({"-H", "a:2", "--host-discovery-script", script_, "c"}),
                       "give one source of hosts"));
  EXPECT_TRUE(contains(parseError({"--check", "--host-discovery-file", plain_, "c"}),
                       "--check checks fixed hosts"));
  EXPECT_EQ(parseError({"--host-discovery-script", plain_, "c"}),
            "--host-discovery-script '" + plain_ +
                "' is not an executable file (chmod +x it, and give it a #! line)");
  EXPECT_EQ(parseError({"--host-discovery-script", dir_, "c"}),
            "--host-discovery-script '" + dir_ +
                "' is not an executable file (chmod +x it, and give it a #! line)");
  EXPECT_EQ(parseError({"--host-discovery-script", dir_ + "/none", "c"}),
            "--host-discovery-script '" + dir_ + "/none': No such file or directory");
  EXPECT_EQ(parseError({"--host-discovery-file", dir_ + "/none", "c"}),
            "--host-discovery-file '" + dir_ + "/none': No such file or directory");
  // Fixed hosts with --elastic are fine, --check included.
  EXPECT_TRUE(parseOk({"-np", "2", "--elastic", "-H", "a:2,b:2", "--check", "c"}).opt.elastic);
}

// ---- remote shell ----

TEST_F(OptionsTest, DefaultRemoteShellIsBatchSsh) {
  Options o;
  EXPECT_EQ(remoteShellFor(o, "node1"),
            (std::vector<std::string>{"ssh", "-o", "BatchMode=yes", "-o",
                                      "StrictHostKeyChecking=accept-new", "node1"}));
  o.sshPort = 2222;
  o.sshIdentityFile = "/keys/id";
  EXPECT_EQ(remoteShellFor(o, "node1"),
            (std::vector<std::string>{"ssh", "-o", "BatchMode=yes", "-o",
                                      "StrictHostKeyChecking=accept-new", "-p", "2222", "-i",
                                      "/keys/id", "node1"}));
}

TEST_F(OptionsTest, RemoteShellTemplate) {
  Options o;
  o.sshCommand = "docker exec {host}";
  EXPECT_EQ(remoteShellFor(o, "c1"), (std::vector<std::string>{"docker", "exec", "c1"}));
  o.sshCommand = "ssh me@{host} -o 'ProxyCommand=ssh gw nc {host} 22'";
  EXPECT_EQ(remoteShellFor(o, "n2"),
            (std::vector<std::string>{"ssh", "me@n2", "-o", "ProxyCommand=ssh gw nc n2 22"}));
  // Without {host} the host is appended; a custom command ignores -p and -i.
  o.sshCommand = "  rsh\t-l \"my user\"  ";
  o.sshPort = 2222;
  EXPECT_EQ(remoteShellFor(o, "n3"), (std::vector<std::string>{"rsh", "-l", "my user", "n3"}));
  o.sshCommand = "kubectl exec '' {host} --";
  EXPECT_EQ(remoteShellFor(o, "pod"),
            (std::vector<std::string>{"kubectl", "exec", "", "pod", "--"}));
}

// horovodrun's --reset-limit reaches hvd.elastic.run through the workers'
// environment; outside elastic mode it is an error, never silently ignored.
TEST_F(ElasticOptionsTest, ResetLimitIsPassedToTheWorkers) {
  Parsed p = parseOk({"--max-np", "4", "--reset-limit", "3", "c"});
  EXPECT_EQ(p.opt.resetLimit, 3);
  EXPECT_EQ(p.env().at("HORA_ELASTIC_RESET_LIMIT"), "3");
  EXPECT_EQ(parseOk({"--max-np", "4", "c"}).env().count("HORA_ELASTIC_RESET_LIMIT"), 0u);
  EXPECT_TRUE(contains(parseError({"-np", "2", "--reset-limit", "3", "c"}), "elastic"));
  EXPECT_TRUE(contains(parseError({"--max-np", "2", "--reset-limit", "x", "c"}), "integer"));
}

// ---- horovodrun's flags (docs/launching.md, "horovodrun -> horarun") ----

TEST_F(OptionsTest, HorovodrunFlagsHoraHasNoAnswerForAreRefused) {
  // clang-format off
  const char* const kRefused[] = {
      "--hierarchical-allgather", "--torus-allreduce", "--mpi",
      "--jsrun", "--mpi-args", "--binding-args", "--thread-affinity", "--config-file",
      "--prefix-output-with-timestamp", "-prefix-timestamp"};
  // clang-format on
  for (const char* flag : kRefused) {
    SCOPED_TRACE(flag);
    const std::string e = parseError({"-np", "2", flag, "x", "c"});
    EXPECT_EQ(e.rfind(std::string("not supported by hora: ") + flag + " (", 0), 0u) << e;
    EXPECT_EQ(e.back(), ')') << e;
    // Also in --flag=value form (and -prefix-timestamp=1).
    EXPECT_TRUE(
        contains(parseError({"-np", "2", std::string(flag) + "=1", "c"}), "not supported by hora"));
  }
  EXPECT_TRUE(contains(parseError({"-np", "2", "--mpi", "c"}), "without mpirun"));
}

TEST_F(OptionsTest, HorovodrunAutotuneFlagsMapToHorasTuner) {
  Parsed p =
      parseOk({"-np", "2", "--autotune", "--autotune-log-file=/tmp/at.csv",
               "--autotune-warmup-samples", "3", "--autotune-gaussian-process-noise=0.8", "c"});
  EXPECT_EQ(p.env().at("HORA_AUTOTUNE"), "1");
  EXPECT_EQ(p.env().at("HORA_AUTOTUNE_LOG"), "/tmp/at.csv");
  ASSERT_EQ(p.opt.notes.size(), 2u);
  EXPECT_TRUE(contains(p.opt.notes[0], "--autotune-warmup-samples 3: accepted, no effect"));
  EXPECT_TRUE(contains(p.opt.notes[1], "--autotune-gaussian-process-noise 0.8"));
  EXPECT_EQ(p.opt.command, std::vector<std::string>{"c"});  // the values were consumed
  EXPECT_TRUE(contains(parseError({"-np", "2", "--autotune-steps-per-sample", "x", "c"}),
                       "--autotune-steps-per-sample expects a number"));
  EXPECT_TRUE(contains(parseError({"-np", "2", "--autotune-log-file=", "c"}), "empty"));
  EXPECT_TRUE(contains(parseError({"-np", "2", "--autotune=1", "c"}), "takes no value"));
}

TEST_F(OptionsTest, HorovodrunNoOpFlagsAreAcceptedWithANote) {
  // clang-format off
  const char* const kNoted[] = {
      "--gloo", "--disable-cache", "--mpi-threads-disable", "--log-without-timestamp",
      "--log-hide-timestamp", "--log-with-timestamp",
      "--no-hierarchical-allgather", "--no-torus-allreduce", "--no-mpi-threads-disable",
      "--no-log-hide-timestamp"};
  // clang-format on
  for (const char* flag : kNoted) {
    SCOPED_TRACE(flag);
    Parsed p = parseOk({"-np", "2", flag, "python", "t.py"});
    EXPECT_EQ(p.opt.command, (std::vector<std::string>{"python", "t.py"}));
    ASSERT_EQ(p.opt.notes.size(), 1u);
    EXPECT_EQ(p.opt.notes[0].rfind(std::string(flag) + ": accepted, no effect (", 0), 0u)
        << p.opt.notes[0];
    EXPECT_EQ(p.opt.env, (Env{{"HORA_START_TIMEOUT_S", "30"}}));  // nothing else set
    EXPECT_EQ(parseError({"-np", "2", std::string(flag) + "=1", "c"}),
              std::string(flag) + " takes no value (got '" + flag + "=1')");
  }
  EXPECT_TRUE(parseOk({"-np", "2", "c"}).opt.notes.empty());
}

// horovodrun takes negations it hides from its help (argparse.SUPPRESS); so does horarun.
TEST_F(OptionsTest, HorovodrunsHiddenNegationsSetHorasDefaults) {
  Parsed p = parseOk({"-np", "2", "--autotune", "--no-autotune", "--no-stall-check",
                      "--stall-check", "--timeline-mark-cycles", "--no-timeline-mark-cycles", "c"});
  EXPECT_EQ(p.env().at("HORA_AUTOTUNE"), "0");
  EXPECT_EQ(p.env().at("HORA_STALL_CHECK"), "1");
  EXPECT_EQ(p.env().at("HORA_TIMELINE_MARK_CYCLES"), "0");
  EXPECT_TRUE(p.opt.notes.empty());
  auto params = hora::Params::fromMap(p.env());
  ASSERT_TRUE(params.isOk()) << params.status().toString();
  EXPECT_FALSE(params.value().getBool("HORA_AUTOTUNE"));
  EXPECT_TRUE(params.value().getBool("HORA_STALL_CHECK"));
}

TEST_F(OptionsTest, HierarchicalAllreduceFlagsSetTheMode) {
  EXPECT_EQ(parseOk({"-np", "2", "--hierarchical-allreduce", "c"}).opt.env,
            (Env{{"HORA_HIER_ALLREDUCE", "hier"}, {"HORA_START_TIMEOUT_S", "30"}}));
  EXPECT_EQ(parseOk({"-np", "2", "--no-hierarchical-allreduce", "c"}).opt.env,
            (Env{{"HORA_HIER_ALLREDUCE", "flat"}, {"HORA_START_TIMEOUT_S", "30"}}));
  EXPECT_EQ(parseError({"-np", "2", "--hierarchical-allreduce=1", "c"}),
            "--hierarchical-allreduce takes no value (got '--hierarchical-allreduce=1')");
}

TEST_F(OptionsTest, HorovodrunFlagsThatMapToHora) {
  Parsed p = parseOk({"-np", "2", "--gloo-timeout-seconds", "45", "--tcp", "--network-interfaces",
                      "eth1", "--log-level", "FATAL", "c"});
  EXPECT_EQ(p.env().at("HORA_PEER_TIMEOUT_S"), "45");
  EXPECT_EQ(p.env().at("NCCL_IB_DISABLE"), "1");
  EXPECT_EQ(p.opt.networkInterface, "eth1");
  EXPECT_EQ(p.env().at("HORA_LOG_LEVEL"), "error");  // hora's nearest to FATAL
  EXPECT_EQ(parseOk({"-np", "2", "--log-level", "WARNING", "c"}).env().at("HORA_LOG_LEVEL"),
            "warning");
  auto params = hora::Params::fromMap({{"HORA_PEER_TIMEOUT_S", "45"}, {"HORA_LOG_LEVEL", "error"}});
  EXPECT_TRUE(params.isOk());
  // One stream is what hora does; more are refused.
  Parsed one = parseOk({"-np", "2", "--num-nccl-streams", "1", "c"});
  EXPECT_EQ(one.opt.notes.size(), 1u);
  EXPECT_EQ(parseError({"-np", "2", "--num-nccl-streams", "2", "c"}),
            "not supported by hora: --num-nccl-streams 2 (hora uses one NCCL stream per process "
            "set; drop the flag)");
}

TEST_F(OptionsTest, HorovodrunLogLevelsAreCheckedHere) {
  EXPECT_EQ(parseError({"-np", "2", "--log-level", "loud", "c"}),
            "--log-level 'loud' is not one of trace, debug, info, warning, error, off (or fatal)");
}

TEST_F(OptionsTest, NetworkInterfacesTakesOne) {
  EXPECT_TRUE(contains(parseError({"-np", "2", "--network-interfaces", "eth0,eth1", "c"}),
                       "not supported by hora: --network-interfaces 'eth0,eth1'"));
  EXPECT_TRUE(
      contains(parseError({"-np", "2", "--network-interfaces", "", "c"}), "give exactly one"));
}

TEST_F(OptionsTest, CheckBuildNeedsNoCommand) {
  for (const char* flag : {"-cb", "--check-build"}) {
    Parsed p = parseOk({flag});
    EXPECT_TRUE(p.opt.checkBuild);
  }
}

TEST_F(OptionsTest, ATypicalHorovodrunCommandLineRuns) {
  // A horovodrun line from Horovod's docs, with hora's launcher name.
  Parsed p = parseOk({"-np", "4", "-H", "localhost:4", "--gloo", "--fusion-threshold-mb", "32",
                      "--cycle-time-ms", "2", "--no-hierarchical-allreduce", "--log-level", "INFO",
                      "python", "train.py"});
  EXPECT_EQ(p.opt.np, 4);
  EXPECT_EQ(p.env().at("HORA_FUSION_THRESHOLD_BYTES"), "33554432");
  EXPECT_EQ(p.env().at("HORA_LOG_LEVEL"), "info");
  EXPECT_EQ(p.env().at("HORA_HIER_ALLREDUCE"), "flat");
  EXPECT_EQ(p.opt.notes.size(), 1u);  // --gloo
}

}  // namespace
}  // namespace horarun
