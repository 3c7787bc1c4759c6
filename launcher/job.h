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
// Single-threaded: everything here runs on the thread that calls run().
// Does not know about hosts, the store or the network: it gets ready
// LaunchSpecs.
#pragma once

#include <signal.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "hosts.h"
#include "output.h"
#include "spawn.h"

namespace horarun {

struct WorkerPlan {
  Slot slot;
  LaunchSpec spec;
  std::string stdoutFile, stderrFile;  // --output-filename copies ("" = none)
};

class Job {
 public:
  Job(std::vector<WorkerPlan> plans, double graceS, bool verbose);
  // Starts every worker and runs until the job is over; returns horarun's
  // exit status.
  int run();

 private:
  struct Worker {
    WorkerPlan plan;
    SpawnedProcess proc;
    bool running = false;
    int waitStatus = 0;
    bool stopRequested = false;  // we sent SIGTERM/SIGKILL
    std::chrono::steady_clock::time_point exitedAt;
    std::unique_ptr<OutputStream> out, err;
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

  boost::asio::io_context io_;
  boost::asio::signal_set signals_;
  boost::asio::steady_timer graceTimer_;
  boost::asio::steady_timer drainTimer_;
  boost::asio::steady_timer attributionTimer_;
  std::vector<int> candidates_;  // failed workers in reap order, during the window
  bool attributing_ = false;
  std::vector<Worker> workers_;
  double graceS_;
  bool verbose_;
  std::chrono::steady_clock::time_point start_;
  int firstFailure_ = -1;  // index into workers_
  int interruptedBy_ = 0;  // signal number
  bool tearingDown_ = false;
  bool drainArmed_ = false;
  std::string spawnError_;
};

}  // namespace horarun
