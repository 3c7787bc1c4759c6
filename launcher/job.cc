#include "job.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <regex>
#include <sstream>

namespace horarun {

namespace {

std::string signalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

void say(const std::string& line) { writeAll(2, "horarun: " + line + "\n"); }

}  // namespace

Job::Job(std::vector<WorkerPlan> plans, double graceS, bool verbose,
         std::unique_ptr<ElasticSetup> elastic)
    : signals_(io_),
      graceTimer_(io_),
      drainTimer_(io_),
      attributionTimer_(io_),
      graceS_(graceS),
      verbose_(verbose),
      stopWatchTimer_(io_),
      stoppedTimeoutS_(stoppedTimeoutFromEnv()),
      elastic_(std::move(elastic)),
      pollTimer_(io_),
      belowMinTimer_(io_) {
  for (auto& p : plans) {
    Worker w;
    w.plan = std::move(p);
    workers_.push_back(std::move(w));
  }
}

Job::~Job() = default;

std::string Job::who(const Worker& w) const {
  return elastic_ ? "worker " + w.id : "rank " + std::to_string(w.plan.slot.rank);
}

int Job::runningCount() const {
  int n = 0;
  for (const auto& w : workers_) n += w.running;
  return n;
}

bool Job::startWorker(Worker& w, std::string* error) {
  if (!spawnProcess(w.plan.spec, &w.proc, error)) return false;
  w.running = true;
  if (verbose_)
    say(who(w) + " started on " + w.plan.slot.host + " (pid " + std::to_string(w.proc.pid) + ")");
  const std::string label = elastic_ ? w.id : std::to_string(w.plan.slot.rank);
  auto eof = [this] { maybeFinish(); };
  w.out = std::make_unique<OutputStream>(io_, w.proc.outFd, label, false, w.plan.stdoutFile, eof);
  w.err = std::make_unique<OutputStream>(io_, w.proc.errFd, label, true, w.plan.stderrFile, eof);
  w.out->start();
  w.err->start();
  return true;
}

int Job::run() {
  start_ = std::chrono::steady_clock::now();
  // Signals first, so no SIGCHLD from a fast worker is missed.
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) signals_.add(s);
  waitSignals();
  if (elastic_) {
    elasticStart();
  } else {
    for (auto& w : workers_) {
      std::string error;
      if (!startWorker(w, &error)) {
        spawnError_ = "cannot start rank " + std::to_string(w.plan.slot.rank) + " on " +
                      w.plan.slot.host + ": " + error;
        say(spawnError_);
        beginTeardown();
        break;
      }
    }
  }
  reap();  // anything that died before the handler was armed
  maybeFinish();
  watchStopped();
  io_.run();

  if (elastic_ && elasticError_.empty() && !interruptedBy_) chooseFinalFailure();
  printReport();
  if (!elasticError_.empty()) return 1;
  if (!spawnError_.empty() && firstFailure_ < 0) return 1;
  if (firstFailure_ >= 0) {
    // A silent rank was killed by horarun itself: the status that tells is
    // that of the rank that noticed it.
    int st = workers_[silentNoticedBy_ >= 0 ? silentNoticedBy_ : firstFailure_].waitStatus;
    return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
  }
  if (interruptedBy_) return 128 + interruptedBy_;
  return 0;
}

void Job::waitSignals() {
  signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    onSignal(sig);
    waitSignals();
  });
}

void Job::onSignal(int sig) {
  if (sig == SIGCHLD) {
    reap();
    return;
  }
  if (interruptedBy_ || tearingDown_) {
    if (interruptedBy_) {
      say("second " + signalName(sig) + ": killing every rank now");
      killAll(SIGKILL);
      return;
    }
  }
  if (!interruptedBy_) interruptedBy_ = sig;
  int live = 0;
  for (const auto& w : workers_) live += w.running;
  say("got " + signalName(sig) + ": stopping " + std::to_string(live) +
      (elastic_ ? " workers" : " ranks") + " (SIGTERM, SIGKILL after " +
      std::to_string(static_cast<int>(graceS_ + 0.5)) + " s)");
  beginTeardown();
  maybeFinish();  // nothing running (elastic mode still waiting for hosts): over now
}

void Job::reap() {
  // Each worker's own pid, never waitpid(-1): the discovery script is a child too, and
  // Discovery collects its status itself.
  std::vector<int> failed;
  for (size_t i = 0; i < workers_.size(); ++i) {
    Worker& w = workers_[i];
    if (!w.running) continue;
    int st = 0;
    if (waitpid(w.proc.pid, &st, WNOHANG) != w.proc.pid) continue;
    w.running = false;
    w.waitStatus = st;
    w.exitedAt = std::chrono::steady_clock::now();
    w.exitSeq = ++exitCounter_;
    if (w.proc.inFd >= 0) close(w.proc.inFd), w.proc.inFd = -1;
    if (elastic_) {
      elasticExited(w);  // publishes first, then decides
      continue;
    }
    bool bad = WIFSIGNALED(st) || WEXITSTATUS(st) != 0;
    if (verbose_) say(who(w) + " " + describeExit(w));
    if (bad && !w.stopRequested) failed.push_back(static_cast<int>(i));
  }
  if (firstFailure_ < 0 && !interruptedBy_ && !failed.empty()) {
    candidates_.insert(candidates_.end(), failed.begin(), failed.end());
    if (!attributing_) {
      attributing_ = true;
      attributionTimer_.expires_after(kAttributionWindow);
      attributionTimer_.async_wait([this](const boost::system::error_code& ec) {
        if (!ec) decideFirstFailure();
      });
    }
  }
  maybeFinish();
}

int Job::blamedRank(const Worker& w) const {
  static const std::regex kBlame(
      R"(rank ([0-9]+)( \(rank [0-9]+ of set [^)]*\))?( at [^ ]+)? (closed its control connection|sent nothing on the control plane))");
  const auto& tail = w.err->tail();
  for (auto it = tail.rbegin(); it != tail.rend(); ++it) {
    std::smatch m;
    if (std::regex_search(*it, m, kBlame)) return std::stoi(m[1].str());
  }
  return -1;
}

void Job::decideFirstFailure() {
  attributing_ = false;
  if (firstFailure_ >= 0 || candidates_.empty()) return;
  auto isCandidate = [&](int idx) {
    for (int c : candidates_)
      if (c == idx) return true;
    return false;
  };
  int pick = candidates_.front();
  std::vector<int> visited{pick};
  for (;;) {
    int blamed = blamedRank(workers_[pick]);
    int idx = -1;
    for (size_t i = 0; i < workers_.size(); ++i)
      if (workers_[i].plan.slot.rank == blamed) idx = static_cast<int>(i);
    if (idx >= 0 && workers_[idx].running && !workers_[idx].stopRequested) {
      // The rank the failed ones name is still running: it went silent
      // (SIGSTOP, a hung host) rather than died. It is the cause.
      silentNoticedBy_ = pick;
      pick = idx;
      break;
    }
    if (idx < 0 || !isCandidate(idx) ||
        std::find(visited.begin(), visited.end(), idx) != visited.end())
      break;
    pick = idx;
    visited.push_back(idx);
  }
  if (silentNoticedBy_ < 0 && visited.size() == 1 && !WIFSIGNALED(workers_[pick].waitStatus))
    for (int c : candidates_)
      if (WIFSIGNALED(workers_[c].waitStatus)) {
        pick = c;
        break;
      }
  firstFailure_ = pick;
  const Worker& w = workers_[pick];
  int live = 0;
  for (const auto& x : workers_) live += x.running;
  if (silentNoticedBy_ >= 0) {
    say("rank " + std::to_string(w.plan.slot.rank) + " (host " + w.plan.slot.host + ", pid " +
        std::to_string(w.proc.pid) + ") went silent: it is still running but rank " +
        std::to_string(workers_[silentNoticedBy_].plan.slot.rank) +
        " lost contact with it (stopped? hung?); stopping the " + std::to_string(live) +
        " running ranks");
    beginTeardown();
    maybeFinish();
    return;
  }
  say("rank " + std::to_string(w.plan.slot.rank) + " (host " + w.plan.slot.host + ", pid " +
      std::to_string(w.proc.pid) + ") " + describeExit(w) + " after " +
      std::to_string(std::chrono::duration<double>(w.exitedAt - start_).count()).substr(0, 5) +
      " s; stopping the other " + std::to_string(live) + " running ranks");
  beginTeardown();
  maybeFinish();
}

void Job::beginTeardown() {
  if (tearingDown_) return;
  tearingDown_ = true;
  if (elastic_) stopElastic();
  killAll(SIGTERM);
  graceTimer_.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(graceS_)));
  graceTimer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    int live = 0;
    for (const auto& w : workers_) live += w.running;
    if (live > 0) {
      say(std::to_string(live) + (elastic_ ? " workers" : " ranks") + " still running " +
          std::to_string(graceS_).substr(0, 4) + " s after SIGTERM: sending SIGKILL");
      killAll(SIGKILL);
    }
  });
}

void Job::killAll(int sig) {
  for (auto& w : workers_) {
    if (!w.running) continue;
    w.stopRequested = true;
    if (w.proc.inFd >= 0) close(w.proc.inFd), w.proc.inFd = -1;
    kill(-w.proc.pid, sig);
    // A stopped process acts on SIGTERM only once continued (SIGKILL acts at once).
    if (sig == SIGTERM) kill(-w.proc.pid, SIGCONT);
  }
}

void Job::maybeFinish() {
  bool anyRunning = false, allDrained = true;
  for (const auto& w : workers_) {
    anyRunning |= w.running;
    if (w.out && !w.out->eof()) allDrained = false;
    if (w.err && !w.err->eof()) allDrained = false;
  }
  if (anyRunning || attributing_) return;
  if (elastic_ && !firstBatchStarted_ && !tearingDown_) return;  // still waiting for hosts
  if (allDrained) {
    signals_.cancel();
    graceTimer_.cancel();
    drainTimer_.cancel();
    io_.stop();
    return;
  }
  if (drainArmed_) return;
  drainArmed_ = true;
  drainTimer_.expires_after(std::chrono::seconds(2));
  drainTimer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    for (auto& w : workers_) {
      if (w.out && !w.out->eof()) w.out->abandon();
      if (w.err && !w.err->eof()) w.err->abandon();
    }
  });
}

std::string Job::describeExit(const Worker& w) const {
  int st = w.waitStatus;
  if (WIFSIGNALED(st)) {
    std::string s = "was killed by " + signalName(WTERMSIG(st));
    if (w.stopRequested) s += " (sent by horarun)";
    return s;
  }
  int code = WEXITSTATUS(st);
  std::string s = "exited with code " + std::to_string(code);
  if (w.plan.spec.remote && code > 128 && code < 160)
    s += " (the remote shell's way of saying it was killed by " + signalName(code - 128) + ")";
  if (code == 127) s += " (command not found or not executable)";
  return s;
}

void Job::printReport() const {
  if (firstFailure_ < 0 && !interruptedBy_ && elasticError_.empty()) return;
  std::ostringstream r;
  if (!elasticError_.empty()) {
    r << "horarun: job FAILED: " << elasticError_ << "\n";
  } else if (firstFailure_ >= 0) {
    const Worker& silent = workers_[firstFailure_];
    if (stoppedAlone_ == firstFailure_)
      r << "horarun: job FAILED. First failure: " << who(silent) << " on host "
        << silent.plan.slot.host << " (pid " << silent.proc.pid << ") stayed stopped ("
        << silent.stoppedWhat << " in state T: SIGSTOP or SIGTSTP) for "
        << static_cast<int>(stoppedTimeoutS_) << " s with no running rank left to need it, so "
        << "horarun ended it (" << describeExit(silent)
        << "); HORARUN_STOPPED_TIMEOUT_S sets how long it waits\n";
    else if (silentNoticedBy_ >= 0)
      r << "horarun: job FAILED. First failure: " << who(silent) << " on host "
        << silent.plan.slot.host << " (pid " << silent.proc.pid
        << ") went silent while still running (stopped, or hung in the kernel or on its host); "
        << who(workers_[silentNoticedBy_]) << " lost contact with it. horarun then ended it ("
        << describeExit(silent) << ")\n";
    else
      r << "horarun: job FAILED. First failure: " << who(silent) << " on host "
        << silent.plan.slot.host << " (pid " << silent.proc.pid << ") " << describeExit(silent)
        << "\n";
    // A silent rank usually wrote nothing about it: show the one that noticed.
    const Worker& w = silentNoticedBy_ >= 0 ? workers_[silentNoticedBy_] : silent;
    const auto* tail = &w.err->tail();
    const char* which = "stderr";
    if (tail->empty()) tail = &w.out->tail(), which = "stdout (its stderr was empty)";
    if (tail->empty()) {
      r << "horarun: " << who(w) << " wrote nothing\n";
    } else {
      r << "horarun: last lines of " << who(w) << "'s " << which << ":\n";
      for (const auto& line : *tail) r << "horarun:   | " << line << "\n";
    }
  } else {
    r << "horarun: job interrupted by " << signalName(interruptedBy_) << "\n";
  }
  if (workers_.empty()) {
    writeAll(2, r.str());
    return;
  }
  r << "horarun: how every " << (elastic_ ? "worker" : "rank") << " ended:";
  for (const auto& w : workers_) {
    r << "\n  " << who(w) << (elastic_ ? " on " + w.plan.slot.host : "") << ": ";
    if (w.running)
      r << "still running?";
    else if (w.proc.pid < 0)
      r << "never started";
    else
      r << describeExit(w);
  }
  r << "\n";
  writeAll(2, r.str());
}

}  // namespace horarun
