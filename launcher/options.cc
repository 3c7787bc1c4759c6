// horarun's command line: the environment defaults and the checks across
// flags (this file); the flags themselves are options_cli.cc's, on CLI11.
#include "options.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "elastic.h"
#include "options_cli.h"

namespace horarun {

namespace cli {

namespace {

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

// "an integer from 1 to 1048576", "a number of seconds from 0.001 to 1000000000".
std::string describe(const Range& r) {
  return std::string(r.fraction ? "a number" : "an integer") +
         (r.unit ? std::string(" of ") + r.unit : std::string()) + " from " + formatNumber(r.lo) +
         " to " + formatNumber(r.hi);
}

}  // namespace

std::string formatNumber(double d) {
  char buf[64];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, d);
    if (std::strtod(buf, nullptr) == d && !std::strchr(buf, 'e')) return buf;
  }
  std::snprintf(buf, sizeof(buf), "%.17g", d);
  return buf;
}

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

}  // namespace cli

namespace {

using cli::addEnv;
using cli::formatNumber;

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

// The checks across flags, after every flag was read, and the environment's
// start timeout (which --start-timeout overrides).
bool validate(Options* o, bool startTimeoutGiven, std::string* error) {
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
  const char* startTimeoutEnv = std::getenv("HORARUN_START_TIMEOUT_S");
  if (startTimeoutEnv && !startTimeoutGiven &&
      !cli::parseNumber("HORARUN_START_TIMEOUT_S (horarun's environment)", startTimeoutEnv,
                        cli::kTimeoutSeconds, &o->startTimeoutS, error))
    return false;
  addEnv(o, "HORA_START_TIMEOUT_S", formatNumber(o->startTimeoutS));
  return true;
}

}  // namespace

const char* usageText() {
  // Built once, then never changed.
  static const std::string text = cli::helpText();
  return text.c_str();
}

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

OptionParser::OptionParser() : commandLine_(cli::makeCommandLine(&defineError_)) {}

bool OptionParser::parse(int argc, char** argv, Options* o, std::string* error) {
  if (!commandLine_) {
    *error = defineError_;
    return false;
  }
  if (const char* s = std::getenv("HORARUN_SSH_COMMAND")) o->sshCommand = s;
  bool startTimeoutGiven = false;
  if (!cli::parseFlags(commandLine_.get(), argc, argv, o, &startTimeoutGiven, error) ||
      !validate(o, startTimeoutGiven, error)) {
    // Arguments are echoed in the message: a newline in one must not split it.
    *error = oneLine(*error);
    return false;
  }
  return true;
}

bool parseOptions(int argc, char** argv, Options* o, std::string* error) {
  try {
    return OptionParser().parse(argc, argv, o, error);
  } catch (const std::exception& e) {  // std::bad_alloc
    *error = std::string("horarun's command line: ") + e.what();
    return false;
  }
}

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
