// horarun's flags as a CLI11 App (launcher/options_cli.cc), and the number
// rules it shares with options.cc. Internal to horarun's parsing (options.h is
// the interface); it keeps CLI11's header out of options.h.
//
// How a command line is read (docs/launching.md, "How horarun reads its
// command line"):
//  1. A normalisation pass walks argv[1..] up to the COMMAND: it spells
//     horovodrun's single-dash long flags (-np, -cb, -hostfile,
//     -prefix-timestamp; CLI11 takes only one letter after a single dash) as
//     their --long names, finds where the COMMAND starts (the first argument
//     that is not a flag or a flag's value, or the one after "--"), refuses
//     unknown and refused flags, splits "--flag=value" (and argparse's
//     "-np=4"), and hands CLI11 each flag as its long name followed by its
//     values, so a value that looks like a flag stays a value.
//  2. CLI11 parses that: every flag's values reach its callback, in command-line
//     order, which checks them (hora's strict decimal ranges) and sets Options.
//  3. The COMMAND and everything after it are the job's, never parsed.
// Errors name the spelling the user typed (-np or --num-proc).
//
// One thread at a time per CommandLine (horarun: the main thread); no
// process-wide state.
#pragma once

#include <memory>
#include <string>

#include "options.h"

namespace horarun {
namespace cli {

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

// Reads `text` as a decimal number within `r` (no "nan", "inf" or hex floats);
// false with *error naming `what` (the flag or variable), the text and what is
// allowed: "-np expects an integer from 1 to 1048576, got '0'".
bool parseNumber(const std::string& what, const std::string& text, const Range& r, double* out,
                 std::string* error);
// The shortest text that reads back as exactly `d` ("1000000", "3.5"): the
// ranks parse integers strictly, so 1e+06 would fail every one of them.
std::string formatNumber(double d);
// Sets NAME=VALUE in o->env, replacing an earlier NAME in its place.
void addEnv(Options* o, const std::string& name, const std::string& value);

// horarun's flags as a CLI11 App: building it is most of a parse's cost
// (about 0.5 ms), so a caller parsing many command lines keeps one.
// (CommandLine and its deleter are declared in options.h, for OptionParser.)
using CommandLinePtr = std::unique_ptr<CommandLine, CommandLineDeleter>;
// Null with *error if CLI11 refuses the flags' definitions (a bug, not usage).
CommandLinePtr makeCommandLine(std::string* error);

// Steps 1-3 above: fills *o from the flags and the COMMAND (no checks across
// flags: options.cc does those); *startTimeoutGiven: whether --start-timeout
// was. False with *error (one line, user input not yet escaped) on an
// unknown, refused or malformed flag or value. Throws nothing: CLI11's
// exceptions and hora's own become *error.
bool parseFlags(CommandLine* commandLine, int argc, char** argv, Options* o,
                bool* startTimeoutGiven, std::string* error);

// `horarun --help`: the usage lines and every flag in its group, formatted by
// CLI11.
std::string helpText();

}  // namespace cli
}  // namespace horarun
