// Executor: the executor thread of one process set. It pops the groups every
// rank agreed to run (core/group_queue.h), in order, and runs each through one
// path picked by the group's device: CpuPath for host memory, GpuPath for GPU
// memory (ops/gpu). It owns both paths, hence the set's fusion buffers, and
// completes the entries of every group it runs.
//
// It is a thread of its own so that the control thread keeps negotiating,
// sending heartbeats and noticing lost peers while a collective waits on the
// network. Groups run even when the set is broken: they were agreed by every
// rank before the failure (a peer that said goodbye took part in them), and an
// aborted data plane fails them at once with the named cause.
//
// Failures: a collective that fails after every rank agreed to run it leaves
// the set unusable (the ranks no longer agree on what was exchanged), so it
// breaks the set (SetHealth). A data-plane failure only suspects the set
// (exec_context.h): the group, and any later one, is completed with the set's
// final status once the control thread has named the cause, or the grace
// period has passed; the executor never waits for that.
//
// GPU groups through the communicator are pipelined (HORA_GPU_PIPELINE,
// GpuPath::tookLaunch): such a group is left launched on the set's stream and
// completed, in order, once its event fires, while the executor launches
// the groups after it. Any other group first waits for the launched ones and
// completes them, so completion order is launch order throughout.
//
// Placement: the thread is named hora-exec; when the assembly gives it a CPU
// (ExecContext::cpu, the global set under HORA_BIND_EXECUTOR) start() binds
// the thread there before returning (core/cpu_affinity.h says why).
//
// Threads: constructed and started by the process set's assembly; run() on
// its own thread; join() and releaseGpu() from the thread that shuts the set
// down, after closing the queue.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <thread>

#include "core/group_queue.h"
#include "ops/executor/cpu_path.h"
#include "ops/executor/exec_context.h"
#include "ops/gpu/gpu_path.h"

namespace hora {

class Executor {
 public:
  Executor(ExecContext ctx, GroupQueue& queue, GpuPathOptions gpu);
  ~Executor();

  void start();
  // Returns once the queue is closed and the group in hand is done.
  void join();
  // Frees the GPU resources (stream, communicator, buffers); after join().
  void releaseGpu();
  // Runs one group of host tensors on the calling thread instead of the
  // executor's. Only between a successful GroupQueue::tryBeginInline() and
  // endInline(): nothing is queued or running then, so the executor thread
  // sits in pop() and the two never touch the data plane at once (the
  // queue's mutex orders their accesses).
  // `whileWaiting` goes to the backend's wait hook for the call
  // (Backend::setWaitHook). False, running nothing, when the backend would
  // not call it (the group goes to the fallback: Gloo's waits cannot) or the
  // group carries new autotune values (which may change that): the caller
  // then queues the group for the executor.
  bool runHere(AgreedGroup& group, std::function<void()> whileWaiting);
  // Whether runHere would run `group` (asked before taking a queued group).
  bool canRunHere(const AgreedGroup& group) const;
  // Packs the first chunk of a host allreduce still being negotiated into
  // the data plane's memory on the calling thread (CpuPath::prepack), under
  // the same rule as runHere; `stop` as for Backend::prepackAllreduce.
  // Returns whether it packed.
  bool prepareHere(TensorEntry& entry, const std::function<bool()>& stop);
  // Backend::withdrawPrepacked; any thread.
  void withdrawPrepared() noexcept {
    if (ctx_.backend) ctx_.backend->withdrawPrepacked();
  }

 private:
  void run();
  // False when the group was left launched on the GPU (then in launched_).
  bool execute(AgreedGroup& group);
  void complete(AgreedGroup& group, const Status& outputLost);
  void fail(AgreedGroup& group, const Status& why);
  // Completes the launched groups whose GPU work is done, in order, and
  // waits until at most `keepAtMost` are left (0: all done; SIZE_MAX: never
  // waits). Each completed group is finishedLaunched() on the queue. Returns
  // whether any completed.
  bool reapLaunched(size_t keepAtMost);
  // Launched groups at once: the executor waits for the oldest beyond this
  // (a bound on the events and entries held while the GPU runs behind).
  static constexpr size_t kMaxLaunchedGroups = 64;
  struct LaunchedGroup {
    AgreedGroup group;
    Status outputLost;  // this rank's output could not be allocated
    const char* plane;  // the data plane it went through, for telemetry
  };
  // Completes (failure null) or fails a launched group, then finishedLaunched().
  void finishLaunched(LaunchedGroup& launched, const Status* failure);

  const ExecContext ctx_;
  GroupQueue& queue_;
  CpuPath cpu_;
  GpuPath gpu_;
  std::deque<LaunchedGroup> launched_;  // launch order = GpuPath's
  std::thread thread_;
};

}  // namespace hora
