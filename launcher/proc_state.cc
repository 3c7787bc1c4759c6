#include "proc_state.h"

#include <dirent.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace horarun {

namespace {
constexpr double kDefaultStoppedTimeoutS = 60;
}  // namespace

double stoppedTimeoutFromEnv() {
  const char* v = std::getenv("HORARUN_STOPPED_TIMEOUT_S");
  if (!v || !*v) return kDefaultStoppedTimeoutS;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (end && *end == '\0' && std::isfinite(s) && s > 0 && s <= 1e9) return s;
  std::fprintf(stderr,
               "horarun: HORARUN_STOPPED_TIMEOUT_S='%s' is not a number of seconds above 0 and "
               "at most 1e9; using %g\n",
               v, kDefaultStoppedTimeoutS);
  return kDefaultStoppedTimeoutS;
}

bool parseProcStat(const std::string& line, char* state, pid_t* pgrp, std::string* comm) {
  // "pid (comm) S ppid pgrp ...": comm ends at the last ')'.
  const size_t open = line.find('('), close = line.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return false;
  std::istringstream rest(line.substr(close + 1));
  std::string st;
  long ppid = 0, group = 0;
  if (!(rest >> st >> ppid >> group) || st.size() != 1) return false;
  *state = st[0];
  *pgrp = static_cast<pid_t>(group);
  *comm = line.substr(open + 1, close - open - 1);
  return true;
}

GroupState processGroupState(pid_t pgid) {
  GroupState out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (struct dirent* e = ::readdir(d)) {
    if (!std::isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
    std::ifstream f(std::string("/proc/") + e->d_name + "/stat");
    std::string line;
    if (!std::getline(f, line)) continue;  // gone meanwhile
    char state = 0;
    pid_t group = 0;
    std::string comm;
    if (!parseProcStat(line, &state, &group, &comm) || group != pgid) continue;
    out.known = true;
    if (state == 'R' || state == 'D') out.active = true;
    if (state == 'T' && !out.stopped) {
      out.stopped = true;
      out.stoppedPid = static_cast<pid_t>(std::atol(e->d_name));
      out.comm = comm;
    }
  }
  ::closedir(d);
  return out;
}

}  // namespace horarun
