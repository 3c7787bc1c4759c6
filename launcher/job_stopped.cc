// Job's watch on stopped workers (job.h, proc_state.h). A rank stopped by a
// signal is noticed by its peers (they fail after HORA_PEER_TIMEOUT_S and the
// job ends through the usual failure path); what nothing notices is a stopped
// rank whose peers have all finished, or every rank stopped: horarun would
// wait for ever. So horarun looks at its local workers' process groups once a
// second, says when one has been stopped for a while, and ends the job when
// every running worker has stayed stopped for HORARUN_STOPPED_TIMEOUT_S.
// Remote workers are not watched (their processes are on other hosts).
#include <algorithm>

#include "job.h"
#include "output.h"

namespace horarun {

namespace {

constexpr auto kStopWatchEvery = std::chrono::seconds(1);
constexpr double kStoppedWarnAfterS = 10;

void say(const std::string& line) { writeAll(2, "horarun: " + line + "\n"); }

}  // namespace

void Job::watchStopped() {
  stopWatchTimer_.expires_after(kStopWatchEvery);
  stopWatchTimer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || tearingDown_) return;
    checkStopped();
    if (!tearingDown_) watchStopped();
  });
}

void Job::checkStopped() {
  const auto now = std::chrono::steady_clock::now();
  int running = 0, stoppedLong = 0, first = -1;
  for (size_t i = 0; i < workers_.size(); ++i) {
    Worker& w = workers_[i];
    if (!w.running) continue;
    ++running;
    if (w.plan.spec.remote) continue;
    const GroupState g = processGroupState(w.proc.pid);
    // A group where something still runs is a rank at work, even if it
    // holds a stopped process (a helper child): never counted as stopped.
    if (!g.stopped || g.active) {
      if (w.stoppedWarned) say(who(w) + " (pid " + std::to_string(w.proc.pid) + ") runs again");
      w.stopped = w.stoppedWarned = false;
      continue;
    }
    if (!w.stopped) {
      w.stopped = true;
      w.stoppedSince = now;
      w.stoppedWhat = "process " + std::to_string(g.stoppedPid) + " (" + g.comm + ")";
    }
    const double forS = std::chrono::duration<double>(now - w.stoppedSince).count();
    if (!w.stoppedWarned && forS >= std::min(kStoppedWarnAfterS, stoppedTimeoutS_)) {
      w.stoppedWarned = true;
      say(who(w) + " on " + w.plan.slot.host + " (pid " + std::to_string(w.proc.pid) +
          "): " + w.stoppedWhat + " has been stopped (SIGSTOP or SIGTSTP) for " +
          std::to_string(static_cast<int>(forS)) + " s; `kill -CONT " +
          std::to_string(g.stoppedPid) + "` resumes it. Its peers fail once they miss it for " +
          "HORA_PEER_TIMEOUT_S; if no running rank is left to miss it, horarun ends the job " +
          "after " + std::to_string(static_cast<int>(stoppedTimeoutS_)) + " s stopped");
    }
    if (forS >= stoppedTimeoutS_) {
      ++stoppedLong;
      if (first < 0) first = static_cast<int>(i);
    }
  }
  // Someone is still running (it will fail on the stopped peer, or finish and
  // leave the stopped ones alone), or a worker is remote and unknown: wait.
  if (running == 0 || stoppedLong < running || tearingDown_) return;
  Worker& w = workers_[first];
  const std::string what = who(w) + " on " + w.plan.slot.host + " (pid " +
                           std::to_string(w.proc.pid) + ") stayed stopped (" + w.stoppedWhat +
                           ") for " + std::to_string(static_cast<int>(stoppedTimeoutS_)) +
                           " s and no running " + (elastic_ ? "worker" : "rank") +
                           " is left that could need it";
  if (elastic_) {
    elasticFail(what);
    return;
  }
  if (firstFailure_ < 0 && !interruptedBy_) {
    firstFailure_ = first;
    stoppedAlone_ = first;
  }
  say(what + "; ending the job");
  beginTeardown();
  maybeFinish();
}

}  // namespace horarun
