// The Job's elastic mode (job.h describes the policy; docs/elastic.md the store keys).
// Everything here runs on the Asio loop's thread, like the rest of the Job.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>

#include "job.h"

namespace horarun {

namespace {

void say(const std::string& line) { writeAll(2, "horarun: " + line + "\n"); }

std::string secondsText(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", std::round(s * 10) / 10);
  return buf;
}

std::string hostsText(const std::vector<HostSpec>& hosts) {
  if (hosts.empty()) return "no hosts";
  std::string out;
  for (const auto& h : hosts)
    out += (out.empty() ? "" : ",") + h.name + ":" + std::to_string(h.slots);
  return out;
}

// "1 worker", "3 workers".
std::string workers(int n) { return std::to_string(n) + (n == 1 ? " worker" : " workers"); }

// What hora/el/dead/<id> holds: "exit 1" / "signal 9" (docs/elastic.md).
std::string deathText(int st) {
  return WIFSIGNALED(st) ? "signal " + std::to_string(WTERMSIG(st))
                         : "exit " + std::to_string(WEXITSTATUS(st));
}

template <class D>
std::chrono::steady_clock::duration toDuration(D seconds) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(seconds));
}

}  // namespace

double Job::nowS() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

std::vector<std::string> Job::blockedHosts() const {
  std::vector<std::string> out;
  const double now = nowS();
  for (const auto& h : discovered_)
    if (blacklist_->blocked(h.name, now)) out.push_back(h.name);
  return out;
}

void Job::elasticStart() {
  const ElasticSetup& e = *elastic_;
  blacklist_ = std::make_unique<Blacklist>(e.cooldownLowS, e.cooldownHighS, std::random_device{}());
  discovery_ = std::make_unique<Discovery>(io_, e.source, e.discoveryTimeoutS);
  e.publish("min_np", std::to_string(e.minNp));
  e.publish("max_np", std::to_string(e.maxNp));
  e.publish("live", "0");
  poll();
}

void Job::schedulePoll() {
  if (tearingDown_ || finishing_) return;
  pollTimer_.expires_after(toDuration(elastic_->pollS));
  pollTimer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) poll();
  });
}

void Job::poll() {
  if (tearingDown_ || finishing_ || discovery_->running()) return;
  discovery_->run([this](const DiscoveryResult& r) { onDiscovered(r); });
}

void Job::onDiscovered(const DiscoveryResult& r) {
  if (tearingDown_ || finishing_) return;
  const ElasticSetup& e = *elastic_;
  const auto now = std::chrono::steady_clock::now();
  if (!r.ok) {
    // At start there is nothing to fall back on: fail at once. Later, a script that fails
    // now and then (its cluster manager did not answer) must not end a long training run:
    // keep the last hosts, and give up only after the elastic timeout of failures.
    if (!everDiscovered_) return elasticFail(r.error);
    if (!discoveryFailing_) {
      discoveryFailing_ = true;
      discoveryFailingSince_ = now;
      say("warning: " + r.error + "; keeping the last hosts (" + hostsText(discovered_) +
          "); the job fails if discovery keeps failing for " + secondsText(e.timeoutS) +
          " (--elastic-timeout)");
    } else if (std::chrono::duration<double>(now - discoveryFailingSince_).count() > e.timeoutS) {
      return elasticFail(r.error + " (failing for more than " + secondsText(e.timeoutS) +
                         ", --elastic-timeout)");
    }
    return schedulePoll();
  }
  if (discoveryFailing_) say(discovery_->describe() + " works again");
  discoveryFailing_ = false;
  if (verbose_ && (!everDiscovered_ || hostsText(r.hosts) != hostsText(discovered_)))
    say(discovery_->describe() + " offers " + hostsText(r.hosts));
  everDiscovered_ = true;
  discovered_ = r.hosts;
  if (!firstBatchStarted_) {
    startFirstBatch();
  } else {
    shrinkToDiscovered();
    grow();
  }
  if (tearingDown_) return;
  checkMinNp();
  schedulePoll();
}

void Job::startFirstBatch() {
  const ElasticSetup& e = *elastic_;
  const int usable = usableSlots(discovered_, blockedHosts());
  if (usable < e.minNp) {
    if (nowS() > e.timeoutS)
      return elasticFail(discovery_->describe() + " offered " + std::to_string(usable) +
                         " slots (" + hostsText(discovered_) + "), fewer than --min-np " +
                         std::to_string(e.minNp) + ", for " + secondsText(e.timeoutS) +
                         " (--elastic-timeout); give it more hosts or lower --min-np");
    if (!waitingNoted_)
      say("waiting for " + discovery_->describe() + " to offer --min-np " +
          std::to_string(e.minNp) + " slots (it offers " + std::to_string(usable) + ": " +
          hostsText(discovered_) + "); giving up after " + secondsText(e.timeoutS));
    waitingNoted_ = true;
    return;
  }
  const int n = std::min(e.startNp > 0 ? e.startNp : e.maxNp, usable);
  std::vector<Slot> slots;
  std::string error;
  if (!assignSlots(discovered_, n, &slots, &error))
    return elasticFail("cannot place " + std::to_string(n) + " workers on " +
                       hostsText(discovered_) + ": " + error);
  firstBatchStarted_ = true;
  for (const auto& s : slots) {
    const std::string id = "w" + std::to_string(nextWorkerId_);
    if (!startElasticWorker(s.host, &s, &error))
      return elasticFail("cannot start worker " + id + " (rank " + std::to_string(s.rank) +
                         ") on " + s.host + ": " + error);
  }
  say("elastic job: started " + workers(n) + " on " + hostsText(discovered_) + " (--min-np " +
      std::to_string(e.minNp) + ", --max-np " +
      (e.maxNp == kUnboundedNp ? std::string("unbounded") : std::to_string(e.maxNp)) + ")");
}

void Job::grow() {
  std::map<std::string, int> onHost;
  for (const auto& w : workers_)
    if (w.running) ++onHost[w.plan.slot.host];
  const auto blocked = blockedHosts();
  const auto hosts = planSpawns(discovered_, onHost, blocked, elastic_->maxNp);
  for (const auto& host : hosts) {
    std::string error;
    const std::string id = "w" + std::to_string(nextWorkerId_);
    if (!startElasticWorker(host, nullptr, &error)) {
      // One bad host must not stop the others: blacklist it like a failed worker.
      blacklist_->fail(host, nowS());
      say("warning: cannot start newcomer " + id + " on " + host + ": " + error +
          "; no new workers there for a while");
      continue;
    }
    say("started newcomer " + id + " on " + host + " (" + workers(runningCount()) +
        " running; discovery offers " + std::to_string(usableSlots(discovered_, blocked)) +
        " usable slots)");
  }
}

bool Job::startElasticWorker(const std::string& host, const Slot* slot, std::string* error) {
  const ElasticSetup& e = *elastic_;
  Worker w;
  w.id = "w" + std::to_string(nextWorkerId_++);  // never reused, even when the start fails
  w.newcomer = slot == nullptr;
  if (!e.makeWorker(host, slot, w.id, &w.plan, error)) return false;
  w.plan.slot.host = host;
  // live counts the worker before it exists: a formation that reads live right after the
  // fork must wait for this worker, never close without it.
  e.publish("live", std::to_string(runningCount() + 1));
  if (!startWorker(w, error)) {
    e.publish("live", std::to_string(runningCount()));
    return false;
  }
  lastSpawnAt_ = std::chrono::steady_clock::now();
  workers_.push_back(std::move(w));
  return true;
}

void Job::elasticExited(Worker& w) {
  const ElasticSetup& e = *elastic_;
  const int st = w.waitStatus;
  const bool bad = WIFSIGNALED(st) || WEXITSTATUS(st) != 0;
  const int live = runningCount();
  // Publish before anything else: survivors re-forming an epoch read these.
  if (bad) e.publish("dead/" + w.id, deathText(st));
  e.publish("live", std::to_string(live));
  if (verbose_) say(who(w) + " " + describeExit(w));
  if (tearingDown_) return;
  if (!bad) {
    if (!finishing_) {
      finishing_ = true;
      finishingAt_ = w.exitedAt;
      stopElastic();
      say(who(w) + " on " + w.plan.slot.host +
          " exited with code 0: training is over, no new workers; waiting for " +
          (live ? "the other " + workers(live) : std::string("nothing")));
    }
    stopNeverAdmitted();
    return;
  }
  if (finishing_) stopNeverAdmitted();
  if (w.stopRequested) return;
  std::string note;
  if (!finishing_) {
    blacklist_->fail(w.plan.slot.host, nowS());
    const double until = blacklist_->until(w.plan.slot.host);
    const double left = until - nowS();
    if (until < 0)
      note = "; " + w.plan.slot.host + " gets no new workers (blacklisted for good)";
    else if (left >= 0.05)
      note = "; " + w.plan.slot.host + " gets no new workers for " + secondsText(left) +
             " (blacklist cool-down)";
  }
  if (live > 0)
    say(who(w) + " (host " + w.plan.slot.host + ", pid " + std::to_string(w.proc.pid) + ") " +
        describeExit(w) + "; " + workers(live) + " go on" + note);
  checkMinNp();
}

void Job::shrinkToDiscovered() {
  // Discovery offers fewer slots on a host (or drops it): stop the newest
  // workers there, as horovodrun does. Their dead key goes first, so the
  // others re-form without waiting for them; it is not a failure of theirs.
  std::map<std::string, int> offered;
  for (const auto& h : discovered_) offered[h.name] += h.slots;
  std::map<std::string, int> running;
  for (auto& w : workers_)
    if (w.running && !w.stopRequested) ++running[w.plan.slot.host];
  for (auto it = workers_.rbegin(); it != workers_.rend(); ++it) {
    Worker& w = *it;
    if (!w.running || w.stopRequested) continue;
    const std::string& host = w.plan.slot.host;
    if (running[host] <= offered[host]) continue;
    --running[host];
    elastic_->publish("dead/" + w.id, "removed: host " + host + " no longer offered by discovery");
    say(who(w) + " on " + host + " stopped: " + discovery_->describe() + " now offers " +
        std::to_string(offered[host]) + " slot(s) there");
    w.stopRequested = true;
    if (w.proc.inFd >= 0) close(w.proc.inFd), w.proc.inFd = -1;
    kill(-w.proc.pid, SIGTERM);
  }
}

void Job::stopNeverAdmitted() {
  // Training is over. A newcomer that was started but never admitted to an
  // epoch would wait out its elastic timeout and then fail the job: once
  // only such workers are left, stop them (not a failure: nobody needs them).
  if (!elastic_->present) return;
  std::vector<Worker*> waiting;
  for (auto& w : workers_) {
    if (!w.running) continue;
    if (!w.newcomer || elastic_->present("worker/" + w.id + "/epoch")) return;
    if (!w.stopRequested) waiting.push_back(&w);
  }
  for (Worker* w : waiting) {
    say(who(*w) + " never joined the training (it ended first): stopping it");
    w->stopRequested = true;
    if (w->proc.inFd >= 0) close(w->proc.inFd), w->proc.inFd = -1;
    kill(-w->proc.pid, SIGTERM);
  }
}

void Job::checkMinNp() {
  const ElasticSetup& e = *elastic_;
  if (!firstBatchStarted_ || finishing_ || tearingDown_) return;
  const int live = runningCount();
  if (live >= e.minNp || live == 0) {  // live == 0: the job is over anyway
    if (belowMin_) say("back to " + workers(live) + " (--min-np " + std::to_string(e.minNp) + ")");
    belowMin_ = false;
    belowMinTimer_.cancel();
    return;
  }
  if (belowMin_) return;
  belowMin_ = true;
  say("only " + workers(live) + " running, below --min-np " + std::to_string(e.minNp) +
      "; waiting up to " + secondsText(e.timeoutS) + " (--elastic-timeout) for hosts");
  belowMinTimer_.expires_after(toDuration(e.timeoutS));
  belowMinTimer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || !belowMin_) return;
    const std::string blocked = blacklist_->describe(nowS());
    elasticFail("only " + workers(runningCount()) + " ran, below --min-np " +
                std::to_string(elastic_->minNp) + ", for " + secondsText(elastic_->timeoutS) +
                " (--elastic-timeout): " + discovery_->describe() + " offers " +
                hostsText(discovered_) + (blocked.empty() ? "" : "; blacklisted: " + blocked) +
                ". Add hosts, lower --min-np or widen the timeout");
  });
}

void Job::elasticFail(const std::string& message) {
  if (tearingDown_) return;
  elasticError_ = message;
  // The final report repeats it after the workers' last output; nothing runs yet: say it once.
  if (const int live = runningCount())
    say("stopping the " + workers(live) + " running: " + message);
  beginTeardown();  // stops discovery and the timers too
  maybeFinish();
}

void Job::stopElastic() {
  pollTimer_.cancel();
  belowMinTimer_.cancel();
  belowMin_ = false;
  if (discovery_) discovery_->stop();
}

void Job::chooseFinalFailure() {
  // The workers that were running last: those still running at the first clean exit (the
  // end of training), or without one, since a worker was last started. Failures before that
  // were survived (the others re-formed without them) and do not fail the job.
  const auto cut = finishing_ ? finishingAt_ : lastSpawnAt_;
  for (size_t i = 0; i < workers_.size(); ++i) {
    const Worker& w = workers_[i];
    const bool bad = WIFSIGNALED(w.waitStatus) || WEXITSTATUS(w.waitStatus) != 0;
    if (w.proc.pid < 0 || !bad || w.stopRequested || w.exitedAt < cut) continue;
    if (firstFailure_ < 0 || w.exitSeq < workers_[firstFailure_].exitSeq)
      firstFailure_ = static_cast<int>(i);
  }
}

}  // namespace horarun
