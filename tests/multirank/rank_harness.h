// Multi-rank test harness: N ranks of one job as threads in this process
// (each with its own hora runtime) or as forked child processes, all on
// loopback with rank 0 hosting the rendezvous store on a free port.
//
// Thread mode is possible because libhora has no process-wide state. Process
// mode is for realism and failure injection (a rank killed, stopped or
// exiting early). Both enforce a deadline: a hang fails the test instead of
// blocking CI.
#pragma once

#include <hora/hora.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tests/common/free_port.h"

namespace htest {

// freePort(): a free TCP port on 127.0.0.1 for a rendezvous store
// (tests/common/free_port.h).

// Fills a config for `rank` of `size` on loopback at `port`, with short
// timeouts suitable for tests.
hora_config_t testConfig(int rank, int size, int port);

// Runs body(rank, runtime) on `size` threads. Each thread initializes its
// runtime with testConfig() adjusted by `tweak`, runs the body, then shuts
// down. Fails the current test (and returns) if a thread does not finish
// within `deadlineS`; gtest EXPECT_* may be used in the body.
void runThreads(int size, const std::function<void(int rank, hora_runtime_t rt)>& body,
                const std::function<void(hora_config_t&)>& tweak = nullptr, double deadlineS = 120);

struct ProcessResult {
  int exitCode = -1;  // -1 if killed by a signal
  int signal = 0;
  std::string output;  // stdout+stderr of the child
};

// Forks `size` children; each sets HORA_* variables for its rank and runs
// body(rank), whose return value is the exit code. Children still running
// after `deadlineS` are killed (SIGKILL) and reported with signal 9 and a
// note in output. `hooks` runs in the parent with the pids once all are
// started (for killing/stopping a chosen rank); may be null.
std::vector<ProcessResult> runProcesses(
    int size, const std::function<int(int rank)>& body, double deadlineS = 120,
    const std::function<void(const std::vector<int>& pids)>& hooks = nullptr,
    const std::vector<std::pair<std::string, std::string>>& env = {});

// A store server (hora_store_server_*) in a process of its own, for tests
// that fork ranks (runProcesses) against an external store. Why not in this
// process: its serving thread would be running when runProcesses forks, and
// a child can inherit a lock that thread holds at that moment and block on
// it for good (seen once under ctest -j2: a rank of
// Elastic.ShrinkFourToThreeToTwoWithKillNine silent in start-up for 120 s,
// past its 30 s start timeout). Construct it before this process starts any
// thread. set() returns once the server holds the value.
class ForkedStoreServer {
 public:
  explicit ForkedStoreServer(const std::string& secret);
  ~ForkedStoreServer();
  ForkedStoreServer(const ForkedStoreServer&) = delete;
  ForkedStoreServer& operator=(const ForkedStoreServer&) = delete;
  // 0 when the server did not start (the test has failed then).
  int port() const { return port_; }
  bool set(const std::string& key, const std::string& value);

 private:
  int pid_ = -1;
  int toServer_ = -1, fromServer_ = -1;
  int port_ = 0;
};

// Small DLTensor helpers.
DLTensor makeTensor(void* data, DLDataType dt, std::vector<int64_t>* shape);
// Allreduce of every dtype, op and count (0, 1, 7, 1001) as tensors of
// `device` (their bytes always host memory: kDLCUDA for the mock GPU plugin),
// all submitted before any is waited for, checked exactly (sweep_support.cc).
void allreduceSweep(int rank, int size, hora_runtime_t rt, DLDeviceType device, int deviceId = 0);
// The collectives with negotiated output sizes, inputs described as memory of
// `device`:`deviceId`, results checked exactly, library-owned outputs checked
// to be reported on that device (sweep_support.cc): allgather of every dtype
// with uneven first dimensions (rank 0 contributes none), alltoall with
// uneven splits, reducescatter of several dtypes, ops, scale factors and
// first dimensions (1, 7, 10, 1001).
void allgatherSweep(int rank, int size, hora_runtime_t rt, DLDeviceType device, int deviceId);
void alltoallCheck(int rank, int size, hora_runtime_t rt, DLDeviceType device, int deviceId);
void reducescatterSweep(int rank, int size, hora_runtime_t rt, DLDeviceType device, int deviceId);
DLDataType dlType(uint8_t code, uint8_t bits);

// Waits for a request, frees it and returns its status; the last error
// message is copied to *message when given.
hora_status_t waitAndFree(hora_request_t req, double timeoutS = 60, std::string* message = nullptr);
// The message of the last waitAndFree on this thread (hora_request_free
// clears hora_last_error_message, so it is kept here).
const std::string& lastMessage();
// The global set's metrics as hora_metrics_snapshot writes them in `format`
// (JSON by default); "" when the call fails.
std::string metrics(hora_runtime_t rt, int32_t format = HORA_METRICS_JSON);
// The number after "key": in a metrics JSON (the first such key); -1 when
// there is none.
double metricValue(const std::string& json, const std::string& key);
inline long metricCount(const std::string& json, const std::string& key) {
  return static_cast<long>(metricValue(json, key));
}

// A directory under /tmp for one test, removed with what it holds (plain
// files only) when it goes.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Start-up marks between forked ranks and a hook that strikes one of them
// (SIGKILL, SIGSTOP): each child calls markReady(rank) once it is past
// start-up (after its first collective), and the hook waits for every
// rank's mark before it strikes, so that a start-up slowed by a loaded
// machine never takes the strike (a fixed sleep could: the survivors then
// fail hora_init instead of the collective under test). The directory
// reaches the children through runProcesses' environment (env()).
class ReadyMarks {
 public:
  std::pair<std::string, std::string> env() const { return {"HTEST_READY_DIR", dir_.path()}; }
  // Until `n` ranks marked; false after `timeoutMs` (the test then fails on
  // the children's own output).
  bool waitFor(int n, int timeoutMs = 30000) const;

 private:
  TempDir dir_;
};
// In a child: marks `rank` ready (nothing without HTEST_READY_DIR).
void markReady(int rank);

}  // namespace htest

// In child processes: print and exit with code 1 when a condition fails.
#define CHILD_CHECK(cond, ...)                                                               \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "CHILD_CHECK failed at %s:%d: %s | ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                     \
      std::fprintf(stderr, "\n");                                                            \
      std::fflush(stderr);                                                                   \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)
