// Runtime: one hora instance (what hora_init returns). It resolves this
// process's identity, hosts or joins the rendezvous store, creates the global
// process set and any sub-sets, and owns them until shutdown.
//
// Created and destroyed on a framework thread; its accessors are thread-safe.
// There is no process-wide state: tests create several Runtimes in one
// process (ranks as threads).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/cpu_affinity.h"
#include "core/logging.h"
#include "core/membership.h"
#include "core/params.h"
#include "core/store.h"
#include "core/tcp_store.h"
#include "core/timeline.h"
#include "hora/hora.h"
#include "process_set.h"

namespace hora {

// Under torchrun's environment (no HORA_STORE_ADDR/PORT), hora's store
// listens on MASTER_PORT + this offset on MASTER_ADDR: MASTER_PORT itself is
// torchrun's (or the user's) TCPStore.
constexpr int kTorchrunStorePortOffset = 1;

struct Identity {
  int rank = 0, size = 1, localRank = 0, localSize = 1, crossRank = 0, crossSize = 1;
};

class Runtime {
 public:
  static Result<std::unique_ptr<Runtime>> create(const hora_config_t& config);
  ~Runtime();

  const Identity& identity() const { return id_; }
  // The membership epoch: in elastic mode the formed epoch (0 for the
  // launcher's first batch), otherwise this rank's count of runtimes in the
  // job's store (1 for the first). Keys live under hora/e<epoch>/.
  int64_t epoch() const { return epoch_; }
  bool elastic() const { return elastic_; }
  // Elastic mode: a worker waits to join the next epoch.
  Result<bool> membershipPending();
  std::shared_ptr<ProcessSet> globalSet() const { return global_; }
  // The same without a reference count: valid while the caller holds the
  // runtime handle's lock (shutdown resets it under the exclusive lock).
  ProcessSet* globalSetPtr() const { return global_.get(); }
  // Collective over the listed members (sorted, unique global ranks).
  Result<std::shared_ptr<ProcessSet>> createSet(const std::vector<int>& ranks);
  void destroySet(const std::shared_ptr<ProcessSet>& set);
  void shutdown();
  const Logger& logger() const { return logger_; }
  Timeline& timeline() { return *timeline_; }

 private:
  Runtime() = default;
  // Rank, size, local and cross ranks: explicit config, then HORA_*, then
  // the launcher's variables (Open MPI, MPICH/PMI, Slurm, torchrun); refuses
  // a world of one when the environment says the job is larger.
  Status resolveIdentity(const hora_config_t& c);
  // The store's address and port: explicit config, HORA_STORE_ADDR/PORT, else
  // torchrun's MASTER_ADDR with MASTER_PORT + kTorchrunStorePortOffset.
  void resolveStore(const hora_config_t& c);
  Status deriveTopology(bool needLocal, bool needCross, const std::string& host);
  // The store's get for a key member `rank` publishes at start-up.
  Result<std::string> waitForMember(const std::string& key, int rank,
                                    std::chrono::milliseconds timeout);
  // The error of a start-up wait for `rank`, with the store's refusals of
  // wrong secrets when this rank hosts it.
  Status joinFailed(const Status& why, int rank) const;
  // Connects to the store (hosting it on rank 0 unless external) and finds
  // this runtime's epoch; in elastic mode forms it, which sets the rank.
  Status joinStore(const hora_config_t& c, const std::string& host);
  Status formElasticEpoch(const hora_config_t& c, const std::string& host);

  Params params_;
  Logger logger_;
  Identity id_;
  SetOptions setOpts_;
  std::unique_ptr<TcpStoreServer> server_;
  std::shared_ptr<Store> store_;    // hora/e<epoch>/
  std::shared_ptr<Store> elStore_;  // hora/el/ (elastic mode)
  int64_t epoch_ = 1;
  bool elastic_ = false;
  std::string workerId_;
  std::string storeAddr_;  // empty: none configured (size 1 uses a memory store)
  int storePort_ = 0;
  std::string storeFrom_;  // where storeAddr_ came from, for error messages
  // The global set's executor CPU, claimed against the host's other runtimes
  // (declared before the sets: released after their executors have stopped).
  CpuClaim cpuClaim_;
  std::shared_ptr<ProcessSet> global_;
  std::shared_ptr<Timeline> timeline_;  // shared with the sets' telemetry
  std::mutex mu_;                       // guards sets_, setCounters_
  std::vector<std::shared_ptr<ProcessSet>> sets_;
  std::map<std::string, int> setCounters_;
};

}  // namespace hora
