// Starting worker processes: locally with fork/exec, or on a remote host
// through a remote shell (ssh, or any command such as `ip netns exec NS`)
// that runs `bash -s` and reads a small script from its stdin.
//
// Called on horarun's main thread (the one running the Asio loop). The child
// side of fork only calls async-signal-safe functions: everything it needs is
// prepared before fork.
//
// Secrets: the job secret and the rest of the HORA_* identity reach a local
// worker through its environment, and a remote one through the script on
// the remote shell's stdin (it exports them there); nothing secret is ever on
// a command line that `ps` would show.
//
// Remote teardown: the script starts the worker in its own process group and
// watches its stdin; when horarun closes that pipe (or dies, or ssh drops),
// the worker group gets SIGTERM, then SIGKILL after the grace period. SIGTERM
// to the remote shell's local process does the same.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace horarun {

using EnvList = std::vector<std::pair<std::string, std::string>>;

struct LaunchSpec {
  std::vector<std::string> command;
  EnvList env;  // set on top of horarun's own environment (local) / exported (remote)
  // Removed from the worker's environment (an elastic newcomer must not inherit a HORA_RANK
  // that horarun itself was started with).
  std::vector<std::string> unsetEnv;
  bool remote = false;
  std::vector<std::string> remoteShell;  // argv of the remote shell, host included
  std::string cwd;                       // remote: cd here first (best effort)
  double graceS = 5;
};

struct SpawnedProcess {
  pid_t pid = -1;  // also its process group id
  int outFd = -1;  // worker stdout (read end, non-blocking)
  int errFd = -1;  // worker stderr
  int inFd = -1;   // remote only: the script / teardown pipe (write end)
};

// Starts the process. False with *error when fork/exec setup failed; a
// command that cannot be executed shows up as exit code 127 with a message on
// its stderr, like a shell.
bool spawnProcess(const LaunchSpec& spec, SpawnedProcess* out, std::string* error);
// The script a remote shell runs (exposed for tests and --verbose).
std::string remoteScript(const LaunchSpec& spec);
std::string shellQuote(const std::string& s);

// Runs `script` through `remoteShell` + bash -s, collecting stdout+stderr,
// for at most timeoutS seconds (then the process group is killed). Returns
// the exit status as a shell would (128+signal), or -1 on timeout.
int runScript(const std::vector<std::string>& remoteShell, const std::string& script,
              double timeoutS, std::string* output);

}  // namespace horarun
