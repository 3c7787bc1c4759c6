#include "spawn.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <sstream>

extern char** environ;

namespace horarun {

namespace {

// argv/envp as owned strings plus the char* arrays exec wants.
struct CArgs {
  std::vector<std::string> store;
  std::vector<char*> ptrs;
  void finish() {
    ptrs.clear();
    for (auto& s : store) ptrs.push_back(const_cast<char*>(s.c_str()));
    ptrs.push_back(nullptr);
  }
};

CArgs mergedEnvironment(const EnvList& extra, const std::vector<std::string>& unset = {}) {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& name : unset) env.erase(name);
  for (const auto& kv : extra) env[kv.first] = kv.second;
  CArgs out;
  for (const auto& kv : env) out.store.push_back(kv.first + "=" + kv.second);
  out.finish();
  return out;
}

bool makePipe(int fds[2], std::string* error) {
  if (pipe2(fds, O_CLOEXEC) != 0) {
    *error = std::string("pipe failed: ") + std::strerror(errno);
    return false;
  }
  return true;
}

// Child side of fork: only async-signal-safe calls from here on.
[[noreturn]] void execChild(const CArgs& argv, const CArgs& envp, int in, int out, int err) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // horarun killed outright: take the worker along
  sigset_t all;
  sigemptyset(&all);
  sigprocmask(SIG_SETMASK, &all, nullptr);
  for (int s : {SIGPIPE, SIGINT, SIGTERM, SIGCHLD, SIGHUP}) signal(s, SIG_DFL);
  dup2(in, 0);
  dup2(out, 1);
  dup2(err, 2);
  execvpe(argv.ptrs[0], argv.ptrs.data(), envp.ptrs.data());
  const char msg[] = "horarun: cannot execute the command: ";
  (void)!write(2, msg, sizeof(msg) - 1);
  const char* why = strerror(errno);
  (void)!write(2, why, strlen(why));
  (void)!write(2, "\n", 1);
  _exit(127);
}

}  // namespace

std::string shellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

std::string remoteScript(const LaunchSpec& spec) {
  std::ostringstream s;
  // One compound command: bash parses all of it before running any of it, so
  // the watcher below reading stdin can never eat script text.
  s << "{\n";
  if (!spec.cwd.empty())
    s << "cd " << shellQuote(spec.cwd) << " 2>/dev/null || echo \"horarun: no directory "
      << shellQuote(spec.cwd) << " on $(hostname); running in $PWD\" >&2\n";
  for (const auto& name : spec.unsetEnv) s << "unset " << name << "\n";
  for (const auto& kv : spec.env)
    s << "export " << kv.first << "=" << shellQuote(kv.second) << "\n";
  s << "set -m\n";  // the worker gets its own process group
  s << "exec 3<&0\n";
  for (const auto& w : spec.command) s << shellQuote(w) << " ";
  s << "</dev/null 3<&- &\n";
  s << "worker=$!\n";
  s << "{ while read -r _; do :; done; kill -TERM -- -$worker 2>/dev/null; sleep " << spec.graceS
    << "; kill -KILL -- -$worker 2>/dev/null; } <&3 >/dev/null 2>&1 &\n";
  s << "watcher=$!\n";
  s << "exec 3<&-\n";
  s << "trap 'kill -TERM -- -$worker 2>/dev/null' TERM INT HUP\n";
  // wait returns early when a trapped signal arrives; the last wait, after
  // the worker is gone, returns its own saved status.
  s << "while kill -0 $worker 2>/dev/null; do wait $worker; done\n";
  s << "wait $worker; rc=$?\n";
  s << "kill -KILL -- -$watcher 2>/dev/null\n";
  s << "exit $rc\n";
  s << "}\n";
  return s.str();
}

bool spawnProcess(const LaunchSpec& spec, SpawnedProcess* out, std::string* error) {
  CArgs argv;
  if (spec.remote) {
    argv.store = spec.remoteShell;
    argv.store.insert(argv.store.end(), {"bash", "-s"});
  } else {
    argv.store = spec.command;
  }
  if (argv.store.empty()) {
    *error = "empty command";
    return false;
  }
  argv.finish();
  CArgs envp = mergedEnvironment(spec.remote ? EnvList{} : spec.env, spec.unsetEnv);
  int in[2] = {-1, -1}, o[2] = {-1, -1}, e[2] = {-1, -1};
  if (spec.remote) {
    if (!makePipe(in, error)) return false;
  } else {
    in[0] = open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  if (!makePipe(o, error) || !makePipe(e, error)) return false;
  pid_t pid = fork();
  if (pid < 0) {
    *error = std::string("fork failed: ") + std::strerror(errno);
    return false;
  }
  if (pid == 0) execChild(argv, envp, in[0], o[1], e[1]);
  setpgid(pid, pid);  // also here, so a kill right after spawn reaches the group
  close(in[0]);
  close(o[1]);
  close(e[1]);
  fcntl(o[0], F_SETFL, O_NONBLOCK);
  fcntl(e[0], F_SETFL, O_NONBLOCK);
  out->pid = pid;
  out->outFd = o[0];
  out->errFd = e[0];
  out->inFd = in[1];
  if (spec.remote) {
    std::string script = remoteScript(spec);
    // Small (a few KiB): fits the pipe buffer, so this never blocks long.
    signal(SIGPIPE, SIG_IGN);
    size_t done = 0;
    while (done < script.size()) {
      ssize_t n = write(in[1], script.data() + done, script.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // the shell died at once; its exit status tells why
      done += static_cast<size_t>(n);
    }
  }
  return true;
}

int runScript(const std::vector<std::string>& remoteShell, const std::string& script,
              double timeoutS, std::string* output) {
  std::string error;
  CArgs argv;
  argv.store = remoteShell;
  argv.store.insert(argv.store.end(), {"bash", "-s"});
  argv.finish();
  CArgs envp = mergedEnvironment({});
  int in[2], o[2];
  if (!makePipe(in, &error) || !makePipe(o, &error)) {
    *output = error;
    return -1;
  }
  pid_t pid = fork();
  if (pid == 0) execChild(argv, envp, in[0], o[1], o[1]);
  close(in[0]);
  close(o[1]);
  signal(SIGPIPE, SIG_IGN);
  (void)!write(in[1], script.data(), script.size());
  close(in[1]);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutS);
  char buf[4096];
  bool timedOut = false;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) {
      timedOut = true;
      break;
    }
    pollfd pfd{o[0], POLLIN, 0};
    int r = poll(&pfd, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    ssize_t n = read(o[0], buf, sizeof(buf));
    if (n <= 0) break;
    output->append(buf, static_cast<size_t>(n));
  }
  close(o[0]);
  if (timedOut) kill(-pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timedOut) return -1;
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

}  // namespace horarun
