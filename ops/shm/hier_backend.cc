#include "ops/shm/hier_backend.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "core/cpu_affinity.h"
#include "core/host_identity.h"
#include "core/reduce.h"

namespace hora {
namespace {

std::string describe(size_t count, DataType dtype, ReduceOp op) {
  return std::string("hierarchical allreduce(count=") + std::to_string(count) +
         ", dtype=" + dataTypeName(dtype) + ", op=" + reduceOpName(op) + ")";
}

// The local ShmBackend's fallback: the hierarchy runs only allreduceCross on
// it, which never delegates; anything else reaching here is a bug.
class NoBackend : public Backend {
 public:
  NoBackend(int rank, int size) : rank_(rank), size_(size) {}
  std::string name() const override { return "none"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status allreduce(void*, size_t, DataType, ReduceOp) override { return no("allreduce"); }
  Status allgatherv(const void*, void*, const std::vector<size_t>&, DataType) override {
    return no("allgatherv");
  }
  Status broadcast(void*, size_t, DataType, int) override { return no("broadcast"); }
  Status alltoallv(const void*, const std::vector<int64_t>&, void*, const std::vector<int64_t>&,
                   DataType) override {
    return no("alltoallv");
  }
  Status reducescatter(void*, const std::vector<size_t>&, DataType, ReduceOp) override {
    return no("reducescatter");
  }
  Status barrier() override { return no("barrier"); }
  void abort() noexcept override {}

 private:
  static Status no(const char* what) {
    return internalError(std::string("hierarchical allreduce: the host-local stage has no ") +
                         what);
  }
  int rank_, size_;
};

}  // namespace

bool parseHierMode(const std::string& text, HierMode* out) {
  if (text == "auto" || text.empty()) {
    *out = HierMode::kAuto;
  } else if (text == "hier") {
    *out = HierMode::kHier;
  } else if (text == "flat") {
    *out = HierMode::kFlat;
  } else {
    return false;
  }
  return true;
}

HostLayout layoutHosts(const std::vector<std::string>& hostIds, int rank) {
  HostLayout l;
  std::map<std::string, int> index;
  std::vector<int> counts;
  std::vector<int> hostOf(hostIds.size());
  for (size_t r = 0; r < hostIds.size(); ++r) {
    auto it = index.find(hostIds[r]);
    if (it == index.end()) {
      it = index.emplace(hostIds[r], static_cast<int>(counts.size())).first;
      counts.push_back(0);
    }
    hostOf[r] = it->second;
    ++counts[it->second];
  }
  l.hosts = static_cast<int>(counts.size());
  l.perHost = counts.empty() ? 0 : counts[0];
  for (int c : counts)
    if (c != l.perHost) l.perHost = 0;
  if (rank >= 0 && static_cast<size_t>(rank) < hostIds.size()) {
    l.hostIndex = hostOf[rank];
    for (size_t r = 0; r < hostIds.size(); ++r) {
      if (hostOf[r] != l.hostIndex) continue;
      if (static_cast<int>(r) == rank) l.localRank = static_cast<int>(l.local.size());
      l.local.push_back(static_cast<int>(r));
    }
  }
  return l;
}

bool wantsHierarchy(const HostLayout& layout, HierMode mode, std::string* whyNot) {
  whyNot->clear();
  if (mode == HierMode::kFlat) {
    *whyNot = "HORA_HIER_ALLREDUCE=flat";
  } else if (layout.hosts < 2) {
    *whyNot = "every rank runs on one host";
  } else if (layout.perHost == 0) {
    *whyNot = "the hosts run different numbers of ranks";
  } else if (layout.perHost == 1) {
    *whyNot = "one rank per host: the flat ring is already hierarchical";
  }
  return whyNot->empty();
}

HierBackend::HierBackend(std::unique_ptr<ShmBackend> local, std::unique_ptr<Backend> cross,
                         std::unique_ptr<Backend> flat, int rank, int size, int hosts, bool overlap,
                         std::vector<std::vector<int>> at, size_t collectiveMinBytes,
                         size_t collectivePieceBytes)
    : local_(std::move(local)),
      cross_(std::move(cross)),
      flat_(std::move(flat)),
      rank_(rank),
      size_(size),
      hosts_(hosts),
      overlap_(overlap),
      at_(std::move(at)),
      collectiveMinBytes_(collectiveMinBytes),
      collectivePieceBytes_(std::max<size_t>(collectivePieceBytes, 1)) {
  for (size_t h = 0; h < at_.size(); ++h)
    for (size_t l = 0; l < at_[h].size(); ++l)
      if (at_[h][l] == rank_) {
        myHost_ = static_cast<int>(h);
        myLocal_ = static_cast<int>(l);
      }
  crossThread_ = std::thread([this] { crossLoop(); });
  // Named as the executor is: `top -H` and profilers tell its TCP work apart.
  nameThread(crossThread_.native_handle(), "hora-cross");
}

HierBackend::~HierBackend() {
  {
    std::lock_guard<std::mutex> lock(crossMu_);
    crossStop_ = true;
  }
  crossCv_.notify_all();
  crossThread_.join();
}

void HierBackend::crossLoop() {
  std::unique_lock<std::mutex> lock(crossMu_);
  for (;;) {
    // The oldest job not yet run (jobs run in the order started).
    auto next = std::find_if(crossJobs_.begin(), crossJobs_.end(),
                             [](const CrossJob& j) { return !j.done; });
    if (next == crossJobs_.end()) {
      if (crossStop_) return;
      crossCv_.wait(lock);
      continue;
    }
    // A deque keeps its elements in place on push_back (crossStart), and
    // crossWait pops only jobs that are done: `job` stays valid.
    CrossJob* job = &*next;
    std::function<Status()> run = std::move(job->run);  // moved: no allocation under the lock
    const CrossJob what = *job;
    lock.unlock();
    Status s;
    // An exception must not leave this thread (it would end the process):
    // it fails the job, and with it the collective.
    try {
      s = run ? run() : cross_->allreduce(what.part, what.count, what.dtype, what.op);
    } catch (const std::bad_alloc&) {
      s = Status(Code::kSystemError, "the hierarchy's cross stage: out of memory");
    } catch (const std::exception& e) {
      s = internalError(std::string("the hierarchy's cross stage: ") + e.what());
    }
    lock.lock();
    job->status = std::move(s);
    job->done = true;
    crossCv_.notify_all();
  }
}

void HierBackend::crossStart(void* part, size_t count, DataType dtype, ReduceOp op) {
  {
    std::lock_guard<std::mutex> lock(crossMu_);
    CrossJob job;
    job.part = part;
    job.count = count;
    job.dtype = dtype;
    job.op = op;
    crossJobs_.push_back(std::move(job));
  }
  crossCv_.notify_all();
}

void HierBackend::crossStartJob(std::function<Status()> run) {
  {
    std::lock_guard<std::mutex> lock(crossMu_);
    CrossJob job;
    job.run = std::move(run);
    crossJobs_.push_back(std::move(job));
  }
  crossCv_.notify_all();
}

void HierBackend::crossDrain() {
  while (true) {
    {
      std::lock_guard<std::mutex> lock(crossMu_);
      if (crossJobs_.empty()) return;
    }
    (void)crossWait();
  }
}

size_t HierBackend::collectivePieces(size_t bytes) const {
  if (!overlap_ || at_.empty()) return 1;
  const size_t perLocal = bytes / at_[0].size();
  return std::clamp<size_t>((perLocal + collectivePieceBytes_ - 1) / collectivePieceBytes_, 1, 8);
}

Status HierBackend::crossWait() {
  std::unique_lock<std::mutex> lock(crossMu_);
  if (crossJobs_.empty()) return internalError("hierarchical allreduce: no exchange to wait for");
  crossCv_.wait(lock, [this] { return crossJobs_.front().done; });
  Status s = std::move(crossJobs_.front().status);
  crossJobs_.pop_front();
  return s;
}

std::string HierBackend::name() const {
  return "hier(" + std::to_string(hosts_) + " hosts x " + std::to_string(local_->size()) +
         " ranks: shm, " + cross_->name() + " across; " + flat_->name() + " for the rest)";
}

Status HierBackend::checkUsable(const std::string& what) const {
  std::lock_guard<std::mutex> lock(brokenMu_);
  if (!broken_.isOk())
    return Status(broken_.code(),
                  what + ": backend unusable after an earlier failure: " + broken_.message());
  return Status::ok();
}

Status HierBackend::fail(Status s) {
  {
    std::lock_guard<std::mutex> lock(brokenMu_);
    if (broken_.isOk()) broken_ = s;
  }
  // The ranks no longer agree on what was exchanged: no stage may start a
  // collective that the others will never join, nor wait for one that left.
  abort();
  return s;
}

Status HierBackend::delegate(const std::string& what, const std::function<Status()>& call) {
  HORA_RETURN_IF_ERROR(checkUsable(what));
  Status s = call();
  if (!s.isOk() && s.code() != Code::kInvalidArgument) return fail(s);
  return s;
}

void HierBackend::abort() noexcept {
  local_->abort();
  cross_->abort();
  flat_->abort();
}

Status HierBackend::allreduceGather(void* staging, size_t count, DataType dtype, ReduceOp op,
                                    const PackFn& pack, const UnpackFn& unpack) {
  return allreduceGatherCombine(staging, count, dtype, op, pack, unpack, CombineFn());
}

Status HierBackend::allreduceGatherCombine(void* staging, size_t count, DataType dtype, ReduceOp op,
                                           const PackFn& pack, const UnpackFn& unpack,
                                           const CombineFn& combine) {
  (void)staging;  // the shared-memory slots are the staging
  const std::string what = describe(count, dtype, op);
  HORA_RETURN_IF_ERROR(checkUsable(what));
  if (reduceFunction(dtype, op) == nullptr || !reduceOpSupported(op, dtype))
    return invalidArgument(what + ": unsupported dtype/op");
  if (count == 0) return Status::ok();
  ShmBackend::CrossStage cross;
  cross.start = [&](void* part, size_t n) { crossStart(part, n, dtype, op); };
  cross.wait = [&] { return crossWait(); };
  Status s = local_->allreduceCross(count, dtype, op, pack, unpack, cross, overlap_, combine);
  if (s.isOk()) return s;
  s = fail(s);   // aborts the cross communicator: an exchange still running ends at once
  crossDrain();  // their failures are a consequence of `s`
  return s;
}

Status HierBackend::allreduce(void* data, size_t count, DataType dtype, ReduceOp op) {
  const std::string what = describe(count, dtype, op);
  if (data == nullptr && count > 0) return invalidArgument(what + ": null buffer");
  const size_t es = dataTypeSize(dtype);
  auto* bytes = static_cast<uint8_t*>(data);
  return allreduceGather(
      data, count, dtype, op,
      [&](size_t lo, size_t hi, void* dst) { copyBytes(dst, bytes + lo * es, (hi - lo) * es); },
      [&](size_t lo, size_t hi, const void* src) {
        copyBytes(bytes + lo * es, src, (hi - lo) * es);
      });
}

Status HierBackend::broadcast(void* data, size_t count, DataType dtype, int root) {
  return delegate("hier broadcast", [&] { return flat_->broadcast(data, count, dtype, root); });
}

Status HierBackend::alltoallv(const void* in, const std::vector<int64_t>& send, void* out,
                              const std::vector<int64_t>& recv, DataType dtype) {
  return delegate("hier alltoallv", [&] { return flat_->alltoallv(in, send, out, recv, dtype); });
}

Status HierBackend::barrier() {
  return delegate("hier barrier", [&] { return flat_->barrier(); });
}

// ------------------------------------------------------------ set-up

Result<std::unique_ptr<Backend>> createHierBackend(std::shared_ptr<Store> store, int rank, int size,
                                                   const HierBackendOptions& opts,
                                                   std::unique_ptr<Backend> flat,
                                                   const ConnectFn& connect, HierOutcome* outcome,
                                                   std::string* whyNot) {
  *outcome = HierOutcome::kFlat;
  whyNot->clear();
  if (size <= 1) {
    *outcome = HierOutcome::kOneHost;
    return flat;
  }
  const auto timeout = opts.shm.startTimeout;
  // Round 1: every rank's host and settings. The mode, HORA_SHM, the chunk
  // size and the overlap are compared so that all ranks decide alike (a rank
  // that would not take part in the local stage cannot leave its host waiting
  // for it), every host cuts its chunks into the same parts (the cross stage
  // pairs part k of chunk c on every host), and the ranks of a host wait for
  // each other's chunks in the same order (a rank without overlap would wait
  // for a part that its peer publishes only after this rank's next chunk).
  const std::string hostId = opts.shm.hostId.empty() ? hostIdentity() : opts.shm.hostId;
  const std::string mode = opts.mode == HierMode::kFlat   ? "flat"
                           : opts.mode == HierMode::kHier ? "hier"
                                                          : "auto";
  // The chunk: the cross stage cuts whole slots, which are of one chunk
  // (round 2), and the per-host set-up compares them only among the ranks
  // of one host.
  const std::string mine = mode + (opts.shm.enabled ? " shm " : " noshm ") +
                           std::to_string(opts.shm.chunkBytes) +
                           (opts.overlap ? " overlap/" : " serial/") + opts.cross + "/" +
                           std::to_string(opts.collectiveMinBytes) + "/" +
                           std::to_string(opts.collectivePieceBytes) + " " + hostId;
  auto all =
      exchangeValues(*store, "host", rank, allRanks(size), mine, timeout, "hierarchy set-up");
  if (!all.isOk()) return all.status();
  // "<mode> <shm|noshm> <chunk bytes> <overlap|serial>/<cross>/<collective min>/<piece>
  // <host id>": the settings are the first four words, the host id (may contain
  // spaces) the rest.
  auto settingsEnd = [](const std::string& v) {
    size_t end = 0;
    for (int w = 0; w < 4 && end != std::string::npos; ++w) end = v.find(' ', end + (w > 0));
    return end == std::string::npos ? v.size() : end;
  };
  auto settings = [&](const std::string& v) { return v.substr(0, settingsEnd(v)); };
  std::vector<std::string> hosts(size);
  int differs = -1;
  for (int r = 0; r < size; ++r) {
    const std::string& v = all.value()[r];
    if (differs < 0 && settings(v) != settings(mine)) differs = r;
    hosts[r] = v.substr(std::min(v.size(), settingsEnd(v) + 1));
  }
  const HostLayout layout = layoutHosts(hosts, rank);
  if (layout.hosts == 1) {
    *outcome = HierOutcome::kOneHost;
    *whyNot = "every rank runs on one host";
    return flat;
  }
  if (differs >= 0) {
    *whyNot =
        "HORA_HIER_ALLREDUCE / HORA_SHM / HORA_SHM_CHUNK_BYTES / HORA_HIER_OVERLAP / "
        "HORA_HIER_CROSS / HORA_HIER_COLLECTIVE_MIN_BYTES differ "
        "between ranks " +
        std::to_string(rank) + " and " + std::to_string(differs) + " (\"" + settings(mine) +
        "\" vs \"" + settings(all.value()[differs]) + "\"); every rank must use the same values";
    return flat;
  }
  if (!opts.shm.enabled) {
    *whyNot = "HORA_SHM=0";
    return flat;
  }
  if (!wantsHierarchy(layout, opts.mode, whyNot)) return flat;

  // Round 2: shared memory among this host's ranks.
  std::string noShm;
  ShmBackendOptions localOpts = opts.shm;
  localOpts.hostId = hostId;
  // Every host's local stage cuts alike, whatever its CPUs.
  localOpts.chunkBytesWhenRanksFit = 0;
  // Slots of one chunk: the chunk is the pipeline's unit here (pack, reduce,
  // cross, gather) and autotune does not move it, so the larger slot a set
  // on one host keeps for autotune's trials would only make the chunks
  // larger. At 10 Gbit/s, 2 hosts x 2 ranks, 64 MiB: 1 MiB chunks took
  // 0.71-0.87 of the time of 4 MiB ones
  // (bench/results/2026-11-29-hier-kernel-mates.md).
  localOpts.slotBytes = 0;
  // Its waits for peers' parts follow the cross-host stage, which polling
  // cannot speed up: sleep after the short spin, as before peerSpin.
  localOpts.peerSpin = std::chrono::microseconds(0);
  localOpts.rankNames = layout.local;  // errors name set ranks, not local indices
  // Every size of the hierarchy's local stages runs on shared memory (the
  // local backend has no fallback).
  localOpts.minBytes = 0;
  auto local = createShmBackend(
      std::make_shared<PrefixStore>(store, "local" + std::to_string(layout.hostIndex)),
      layout.localRank, layout.perHost, localOpts,
      std::unique_ptr<Backend>(new NoBackend(layout.localRank, layout.perHost)), &noShm);
  if (!local.isOk()) return local.status().withContext("hierarchical allreduce: local stage");
  std::unique_ptr<Backend> localBackend = local.take();
  auto* shm = dynamic_cast<ShmBackend*>(localBackend.get());
  // Round 3: did every host get shared memory? Otherwise all stay flat.
  const std::string ok = shm != nullptr ? "ok" : "no " + noShm;
  auto agreed =
      exchangeValues(*store, "local-ok", rank, allRanks(size), ok, timeout, "hierarchy set-up");
  if (!agreed.isOk()) return agreed.status();
  for (int r = 0; r < size; ++r) {
    if (agreed.value()[r] != "ok") {
      *whyNot = "rank " + std::to_string(r) + " has no shared memory with its host's ranks (" +
                agreed.value()[r].substr(std::min<size_t>(3, agreed.value()[r].size())) + ")";
      return flat;
    }
  }
  // Round 4: this rank's cross communicator: the ranks of its local index.
  auto cross =
      connect(std::make_shared<PrefixStore>(store, "cross" + std::to_string(layout.localRank)),
              layout.hostIndex, layout.hosts);
  if (!cross.isOk()) return cross.status().withContext("hierarchical allreduce: across hosts");
  if (opts.wrapFlat) {
    auto wrapped = opts.wrapFlat(std::move(flat));
    if (!wrapped.isOk()) return wrapped.status().withContext("hierarchy: the other collectives");
    flat = wrapped.take();
  }
  localBackend.release();
  *outcome = HierOutcome::kHierarchical;
  // Every rank's place: at[host][local] = set rank (all hosts alike).
  std::vector<std::vector<int>> at(layout.hosts, std::vector<int>(layout.perHost, -1));
  for (int r = 0; r < size; ++r) {
    const HostLayout of = layoutHosts(hosts, r);
    at[of.hostIndex][of.localRank] = r;
  }
  return std::unique_ptr<Backend>(new HierBackend(
      std::unique_ptr<ShmBackend>(shm), cross.take(), std::move(flat), rank, size, layout.hosts,
      opts.overlap, std::move(at), opts.collectiveMinBytes, opts.collectivePieceBytes));
}

}  // namespace hora
