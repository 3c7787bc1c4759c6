// Host discovery for elastic mode: runs --host-discovery-script, re-reads
// --host-discovery-file, or hands back the fixed -H/--hostfile hosts, and parses the result
// (parseDiscoveryOutput in elastic.h).
//
// The script runs as a child in its own process group and is read through the Job's Asio
// loop, so a slow or hung script never stalls output forwarding, SIGCHLD or Ctrl-C handling;
// it is killed (SIGKILL to its group) after the timeout. Its exit status is collected here
// with waitpid(pid) on its own pid: the Job reaps only its workers' pids, so the two never
// steal each other's children.
//
// Used by the Job on horarun's main thread (the one running the loop). One run at a time.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hosts.h"

namespace horarun {

struct DiscoverySource {
  enum class Kind { kFixed, kFile, kScript };
  Kind kind = Kind::kFixed;
  std::string path;             // kFile, kScript
  std::vector<HostSpec> fixed;  // kFixed
  int defaultSlots = 1;         // a bare `host` line
};

struct DiscoveryResult {
  bool ok = false;
  std::vector<HostSpec> hosts;
  std::string error;  // one line: what, where (the script or file), what it printed
};

class Discovery {
 public:
  Discovery(boost::asio::io_context& io, DiscoverySource source, double timeoutS);
  ~Discovery();  // kills a script still running
  Discovery(const Discovery&) = delete;
  Discovery& operator=(const Discovery&) = delete;

  // Starts one discovery; `done` runs once, on the loop thread (at once for a file or fixed
  // hosts). Not called again while running().
  void run(std::function<void(DiscoveryResult)> done);
  bool running() const { return pid_ > 0; }
  // Kills a running script; its `done` is not called.
  void stop();
  // "discovery script '/x/y.sh'" / "discovery file 'f'" / "the -H hosts".
  std::string describe() const;

 private:
  void read(boost::asio::posix::stream_descriptor* sd, std::string* into, bool* eof);
  void checkExit();
  void finish(int waitStatus, bool timedOut);

  boost::asio::io_context& io_;
  DiscoverySource source_;
  std::chrono::duration<double> timeout_;
  pid_t pid_ = -1;
  std::unique_ptr<boost::asio::posix::stream_descriptor> out_, err_;
  std::string outText_, errText_;
  bool outEof_ = false, errEof_ = false;
  boost::asio::steady_timer deadline_, exitPoll_;
  std::chrono::steady_clock::time_point started_;
  std::function<void(DiscoveryResult)> done_;
  unsigned generation_ = 0;  // bumped by stop() and finish(): stale handlers return
};

}  // namespace horarun
