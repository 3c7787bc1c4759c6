// Job: runs the workers of one horarun job to completion and decides how it
// ended. Owns the Asio loop that horarun's main thread runs: SIGCHLD /
// SIGINT / SIGTERM / SIGHUP through a signal_set, the workers' output
// streams, and the grace and drain timers.
//
// Failure policy (the first failure wins):
//   1. A worker that exits non-zero or is killed by a signal, while the job is
//      not already being torn down, opens a short attribution window
//      (kAttributionWindow). Ranks that fail *because* a peer died usually
//      exit within milliseconds, often before the culprit's exit reaches
//      horarun (a remote shell adds latency). So after the window the first
//      failure is chosen among the failed ranks: starting from the first one
//      reaped, follow hora's own error text ("rank N at ADDR closed its
//      control connection" / "sent nothing on the control plane") to the rank
//      it blames while that rank failed too; else prefer one killed by a
//      signal. horarun then names it (rank, host, pid, exit code or signal)
//      and tears the job down.
//   2. Teardown: every live worker's process group gets SIGTERM (remote ones
//      also see their stdin pipe close, which makes the remote script kill
//      the worker there); survivors get SIGKILL after the grace period.
//   3. SIGINT/SIGTERM/SIGHUP to horarun tears down the same way; a second one
//      sends SIGKILL at once.
//   4. The job is over when every worker was reaped and its output drained
//      (at most 2 s after its exit: a grandchild may keep a pipe open).
//   5. Exit status: the first failure's exit code (128+signal when killed),
//      128+signal when interrupted, 0 when every worker exited 0. A report
//      with the first failure's last stderr lines and how every other rank
//      ended is printed last, after all output was forwarded.
//
// Elastic mode (an ElasticSetup given; docs/elastic.md, docs/launching.md), implemented in
// job_elastic.cc. The differences:
//   - The Job starts the workers itself, after discovery (discovery.h) first offers --min-np
//     usable slots (bounded by the elastic timeout): the first batch with ranks, later ones
//     as newcomers, on hosts with free slots (planSpawns), up to --max-np, polling discovery
//     every second.
//   - It publishes hora/el/live on every spawn (before the fork) and exit (first thing when
//     reaped, after hora/el/dead/<id> for an abnormal exit), so a forming epoch never waits
//     for a worker that is gone nor misses one that is starting.
//   - A worker that fails does not end the job: its host is blacklisted for a cool-down
//     (elastic.h) and the others go on. Running below --min-np for longer than the elastic
//     timeout ends it, as does discovery failing at start (or for longer than the timeout).
//   - A worker that exits 0 means training is over: no new workers from then on.
//   - The job is over when no worker runs. Exit status: 0 when the workers running at that
//     first clean exit (or, with none, since the last start of a worker) all exited 0, else
//     the first of them that failed, reported as in step 5.
//
// Single-threaded: everything here runs on the thread that calls run().
// Does not know about hosts, the store or the network: it gets ready
// LaunchSpecs.
#pragma once

#include <signal.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "discovery.h"
#include "elastic.h"
#include "hosts.h"
#include "output.h"
#include "proc_state.h"
#include "spawn.h"

namespace horarun {

struct WorkerPlan {
  Slot slot;
  LaunchSpec spec;
  std::string stdoutFile, stderrFile;  // --output-filename copies ("" = none)
};

// What the Job needs to run an elastic job; horarun.cc fills it.
struct ElasticSetup {
  int minNp = 1;
  int maxNp = 1;
  int startNp = 0;  // first batch; 0 = what discovery offers, up to maxNp
  double timeoutS = 600;
  double pollS = 1;
  double discoveryTimeoutS = 10;
  double cooldownLowS = 1, cooldownHighS = 600;
  DiscoverySource source;
  // The plan of one worker on `host` with id `id`: `slot` set for the first batch (ranks),
  // null for a newcomer. False with *error (the worker is not started).
  std::function<bool(const std::string& host, const Slot* slot, const std::string& id,
                     WorkerPlan* out, std::string* error)>
      makeWorker;
  // Writes hora/el/<key> = value in the job's store.
  std::function<void(const std::string& key, const std::string& value)> publish;
  // Whether hora/el/<key> exists (a worker's epoch key: it was admitted).
  std::function<bool(const std::string& key)> present;
};

class Job {
 public:
  // plans: the workers (static mode); ignored (empty) in elastic mode.
  Job(std::vector<WorkerPlan> plans, double graceS, bool verbose,
      std::unique_ptr<ElasticSetup> elastic = nullptr);
  ~Job();
  // Starts every worker and runs until the job is over; returns horarun's
  // exit status.
  int run();

 private:
  struct Worker {
    WorkerPlan plan;
    std::string id;  // elastic mode: HORA_WORKER_ID
    bool newcomer = false;
    long exitSeq = 0;  // order of exits, from 1
    SpawnedProcess proc;
    bool running = false;
    int waitStatus = 0;
    bool stopRequested = false;  // we sent SIGTERM/SIGKILL
    std::chrono::steady_clock::time_point exitedAt;
    std::unique_ptr<OutputStream> out, err;
    // The stopped-rank watch (job_stopped.cc): since when a process of its
    // group has been stopped, and whether horarun said so.
    bool stopped = false;
    bool stoppedWarned = false;
    std::chrono::steady_clock::time_point stoppedSince;
    std::string stoppedWhat;  // "process 123 (python3)"
  };

  static constexpr std::chrono::milliseconds kAttributionWindow{300};

  void waitSignals();
  void decideFirstFailure();
  int blamedRank(const Worker& w) const;
  void onSignal(int sig);
  void reap();
  void beginTeardown();
  void killAll(int sig);
  void maybeFinish();
  std::string describeExit(const Worker& w) const;
  void printReport() const;
  bool startWorker(Worker& w, std::string* error);
  std::string who(const Worker& w) const;  // "rank 3" / "worker w3"
  int runningCount() const;
  // The stopped-rank watch (job_stopped.cc): once a second, a local worker
  // whose process group has a stopped process is noted; after
  // kStoppedWarnAfter horarun says so, and when every running worker has
  // been stopped for stoppedTimeoutS_ nothing can resume them but the user,
  // so the job ends with that as its failure.
  void watchStopped();
  void checkStopped();

  // Elastic mode (job_elastic.cc).
  void elasticStart();
  void schedulePoll();
  void poll();
  void onDiscovered(const DiscoveryResult& r);
  void startFirstBatch();
  void grow();
  bool startElasticWorker(const std::string& host, const Slot* slot, std::string* error);
  void stopNeverAdmitted();
  void shrinkToDiscovered();
  void elasticExited(Worker& w);
  void checkMinNp();
  void elasticFail(const std::string& message);
  void stopElastic();
  void chooseFinalFailure();
  std::vector<std::string> blockedHosts() const;
  double nowS() const;

  boost::asio::io_context io_;
  boost::asio::signal_set signals_;
  boost::asio::steady_timer graceTimer_;
  boost::asio::steady_timer drainTimer_;
  boost::asio::steady_timer attributionTimer_;
  std::vector<int> candidates_;  // failed workers in reap order, during the window
  bool attributing_ = false;
  // The failed rank that named firstFailure_ as lost while it still ran
  // (a silent rank: stopped or hung), or -1.
  int silentNoticedBy_ = -1;
  std::vector<Worker> workers_;
  double graceS_;
  bool verbose_;
  std::chrono::steady_clock::time_point start_;
  int firstFailure_ = -1;  // index into workers_
  int interruptedBy_ = 0;  // signal number
  bool tearingDown_ = false;
  bool drainArmed_ = false;
  std::string spawnError_;
  long exitCounter_ = 0;
  boost::asio::steady_timer stopWatchTimer_;
  double stoppedTimeoutS_;  // HORARUN_STOPPED_TIMEOUT_S (default 60)
  int stoppedAlone_ = -1;   // the worker horarun ended for staying stopped, or -1

  // Elastic mode; elastic_ null otherwise.
  std::unique_ptr<ElasticSetup> elastic_;
  std::unique_ptr<Discovery> discovery_;
  std::unique_ptr<Blacklist> blacklist_;
  boost::asio::steady_timer pollTimer_;
  boost::asio::steady_timer belowMinTimer_;
  std::vector<HostSpec> discovered_;
  bool everDiscovered_ = false;
  bool firstBatchStarted_ = false;
  bool waitingNoted_ = false;  // said once that we wait for --min-np slots
  bool discoveryFailing_ = false;
  std::chrono::steady_clock::time_point discoveryFailingSince_;
  bool belowMin_ = false;
  bool finishing_ = false;  // a worker exited 0: training is over, no new workers
  std::chrono::steady_clock::time_point finishingAt_, lastSpawnAt_;
  int nextWorkerId_ = 0;
  std::string elasticError_;  // the job was ended by horarun for this reason
};

}  // namespace horarun
