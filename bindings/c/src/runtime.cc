#include "runtime.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "core/cpu_affinity.h"
#include "core/host_identity.h"
#include "core/memory_store.h"
#include "dump_signal.h"

namespace hora {

namespace {

int envInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  return (*end == '\0') ? static_cast<int>(x) : fallback;
}

// A value and the variable it came from ("" when none: the default applies).
struct Picked {
  int value = -1;
  std::string from;
};

// First of: explicit config, HORA_* parameter, launcher variables in order.
Picked pick(int configured, const Params& p, const char* horaName,
            const std::vector<const char*>& others) {
  if (configured >= 0) return {configured, "hora_config_t"};
  int64_t v = p.getInt(horaName);
  if (v >= 0) return {static_cast<int>(v), horaName};
  for (const char* o : others) {
    int x = envInt(o, -1);
    if (x >= 0) return {x, o};
  }
  return {};
}

// The launcher variables hora reads or checks, named in identity errors.
constexpr const char* kLauncherVars[] = {"OMPI_COMM_WORLD_RANK",
                                         "OMPI_COMM_WORLD_SIZE",
                                         "OMPI_COMM_WORLD_LOCAL_SIZE",
                                         "PMI_RANK",
                                         "PMI_SIZE",
                                         "PMIX_RANK",
                                         "MPI_LOCALNRANKS",
                                         "SLURM_PROCID",
                                         "SLURM_NTASKS",
                                         "RANK",
                                         "WORLD_SIZE",
                                         "LOCAL_RANK",
                                         "LOCAL_WORLD_SIZE",
                                         "GROUP_RANK",
                                         "GROUP_WORLD_SIZE",
                                         "JOB_COMPLETION_INDEX"};

// "NAME=value, ..." for the launcher variables set in this environment.
std::string launcherVarsSeen() {
  std::string out;
  for (const char* v : kLauncherVars) {
    const char* x = std::getenv(v);
    if (!x) continue;
    if (!out.empty()) out += ", ";
    out += std::string(v) + "=" + x;
  }
  return out.empty() ? "none" : out;
}

// True when some launcher variable says this process is one of several: a
// rank above 0, or a (local) world size above 1.
bool environmentSaysMultiProcess() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "RANK",
                        "LOCAL_RANK", "GROUP_RANK", "JOB_COMPLETION_INDEX"})
    if (envInt(v, -1) > 0) return true;
  // PMIx and Kubernetes' indexed Jobs give a rank but no world size: even
  // index 0 is most likely one of several (a job of one sets HORA_SIZE=1).
  for (const char* v : {"PMIX_RANK", "JOB_COMPLETION_INDEX"})
    if (envInt(v, -1) == 0) return true;
  for (const char* v :
       {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_SIZE", "MPI_LOCALNRANKS",
        "SLURM_NTASKS", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE"})
    if (envInt(v, -1) > 1) return true;
  return false;
}

std::string hostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

bool isLoopback(const std::string& a) {
  return a == "localhost" || a.rfind("127.", 0) == 0 || a == "::1";
}

// This host's IPv4 address on the route to `target` (the store): the address
// its peers most likely reach it by, where the host name may not resolve
// (Kubernetes pods, containers). "" when there is none or it is loopback.
// A UDP connect() only picks the route: no packet is sent.
std::string addressTowards(const std::string& target) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(target.c_str(), "9", &hints, &res) != 0 || res == nullptr) return "";
  std::string out;
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    sockaddr_in self{};
    socklen_t len = sizeof(self);
    char buf[INET_ADDRSTRLEN] = {0};
    if (::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len) == 0 &&
        inet_ntop(AF_INET, &self.sin_addr, buf, sizeof(buf)) != nullptr && !isLoopback(buf))
      out = buf;
    ::close(fd);
  }
  freeaddrinfo(res);
  return out;
}

}  // namespace

Status Runtime::resolveIdentity(const hora_config_t& c) {
  // Launchers nest innermost-first: mpirun inside a Slurm allocation sets both
  // OMPI_ and SLURM_ variables, and the OMPI_ ones describe this process. So
  // do torchrun's workers under srun (torchrun marks them with
  // TORCHELASTIC_RUN_ID); without that mark (Kubeflow's PyTorchJob, a script
  // that sets RANK/WORLD_SIZE) torchrun's names are the last fallback.
  const char* runId = std::getenv("TORCHELASTIC_RUN_ID");
  const bool underTorchrun = runId && *runId;
  auto order = [&](std::initializer_list<const char*> launchers, const char* torchrunName) {
    std::vector<const char*> names;
    if (underTorchrun) names.push_back(torchrunName);
    names.insert(names.end(), launchers.begin(), launchers.end());
    if (!underTorchrun) names.push_back(torchrunName);
    return names;
  };
  auto pickFrom = [&](int configured, const char* horaName, const std::vector<const char*>& names) {
    return pick(configured, params_, horaName, names);
  };
  // PMIx (PRRTE's prterun, Open MPI 5) and Kubernetes' indexed Jobs give
  // only a rank; their world size comes from HORA_SIZE or WORLD_SIZE (the
  // manifests in examples/k8s set it). A completion index is the last
  // resort: torchrun inside an indexed Job numbers its workers in RANK.
  std::vector<const char*> rankNames =
      order({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}, "RANK");
  rankNames.push_back("JOB_COMPLETION_INDEX");
  const Picked rank = pickFrom(c.rank, "HORA_RANK", rankNames);
  const Picked size =
      pickFrom(c.size, "HORA_SIZE",
               order({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}, "WORLD_SIZE"));
  if (size.from.empty() && environmentSaysMultiProcess())
    return invalidArgument(
        "hora_init found no world size but the environment describes a job of several processes "
        "(launcher variables seen: " +
        launcherVarsSeen() +
        "); refusing to run as a job of one. Set HORA_RANK and HORA_SIZE (or the launcher's "
        "RANK/WORLD_SIZE pair; under PMIx or a Kubernetes indexed Job, which give only a rank, "
        "HORA_SIZE or WORLD_SIZE), or start the job with horarun");
  if (rank.from.empty() && size.value > 1)
    return invalidArgument(
        "hora_init found a world size of " + std::to_string(size.value) + " (from " + size.from +
        ") but no rank for this process (launcher variables seen: " + launcherVarsSeen() +
        "); set HORA_RANK (or the launcher's matching rank variable)");
  id_.rank = rank.from.empty() ? 0 : rank.value;
  id_.size = size.from.empty() ? 1 : size.value;
  if (id_.size < 1 || id_.rank >= id_.size)
    return invalidArgument(
        "rank " + std::to_string(id_.rank) +
        (rank.from.empty() ? std::string() : " (from " + rank.from + ")") +
        " is out of range for size " + std::to_string(id_.size) +
        (size.from.empty() ? std::string(" (default)") : " (from " + size.from + ")") +
        "; check HORA_RANK/HORA_SIZE or the config (launcher variables seen: " +
        launcherVarsSeen() + ")");
  id_.localRank = pickFrom(c.local_rank, "HORA_LOCAL_RANK",
                           order({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"},
                                 "LOCAL_RANK"))
                      .value;
  id_.localSize =
      pickFrom(c.local_size, "HORA_LOCAL_SIZE",
               order({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}, "LOCAL_WORLD_SIZE"))
          .value;
  // torchrun's node index and node count; derived from host names otherwise.
  id_.crossRank =
      pickFrom(c.cross_rank, "HORA_CROSS_RANK",
               underTorchrun ? std::vector<const char*>{"GROUP_RANK"} : std::vector<const char*>{})
          .value;
  id_.crossSize = pickFrom(c.cross_size, "HORA_CROSS_SIZE",
                           underTorchrun ? std::vector<const char*>{"GROUP_WORLD_SIZE"}
                                         : std::vector<const char*>{})
                      .value;
  return Status::ok();
}

void Runtime::resolveStore(const hora_config_t& c) {
  const Params& p = params_;
  storeAddr_ = c.store_addr ? c.store_addr : p.getString("HORA_STORE_ADDR");
  storeFrom_ = c.store_addr ? "hora_config_t" : "HORA_STORE_ADDR";
  storePort_ = c.store_port > 0 ? c.store_port : static_cast<int>(p.getInt("HORA_STORE_PORT"));
  const char* master = std::getenv("MASTER_ADDR");
  if (!storeAddr_.empty() || id_.size <= 1 || !master || !*master) return;
  // torchrun / PyTorchJob: rank 0 hosts hora's store on the master's host. Not
  // on MASTER_PORT itself: torchrun's own TCPStore listens there.
  storeAddr_ = master;
  storeFrom_ = "MASTER_ADDR";
  const int masterPort = envInt("MASTER_PORT", -1);
  if (c.store_port <= 0 && !p.isSet("HORA_STORE_PORT") && masterPort > 0 &&
      masterPort + kTorchrunStorePortOffset <= 65535)
    storePort_ = masterPort + kTorchrunStorePortOffset;
}

Status Runtime::joinFailed(const Status& why, int rank) const {
  Status s = why.withContext("waiting for rank " + std::to_string(rank) + " to join the job");
  // A rank with the wrong secret fails with its own clear error; the rank
  // hosting the store would only see a timeout without this.
  const std::string refused = server_ ? server_->authRefusals() : std::string();
  return refused.empty() ? s : Status(s.code(), s.message() + "; " + refused);
}

Result<std::string> Runtime::waitForMember(const std::string& key, int rank,
                                           std::chrono::milliseconds timeout) {
  const bool known = elastic_ && elStore_ && rank < static_cast<int>(setOpts_.workerIds.size());
  if (!known) return store_->get(key, timeout);
  // Elastic: a member that died after the epoch was formed (its launcher
  // reports it) fails the start-up at once, so the survivors re-form again
  // instead of waiting out the start timeout.
  const std::string& worker = setOpts_.workerIds[rank];
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const auto slice = std::min<std::chrono::milliseconds>(
        std::chrono::milliseconds(200),
        std::max(std::chrono::milliseconds(1),
                 std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now())));
    auto v = store_->get(key, slice);
    if (v.isOk() || v.status().code() != Code::kTimeout || Clock::now() >= deadline) return v;
    auto dead = elStore_->check("dead/" + worker);
    if (dead.isOk() && dead.value())
      return membershipError("worker " + worker + " (rank " + std::to_string(rank) + " of epoch " +
                             std::to_string(epoch_) +
                             ") was lost before the epoch started; re-form again");
  }
}

Status Runtime::deriveTopology(bool needLocal, bool needCross, const std::string& host) {
  // Every rank publishes its host name; local and cross ranks follow from
  // the sorted list, the same on every rank.
  HORA_RETURN_IF_ERROR(store_->set("host/" + std::to_string(id_.rank), host));
  std::vector<std::string> hosts(id_.size);
  const auto timeout = setOpts_.startTimeout;
  for (int r = 0; r < id_.size; ++r) {
    auto v = waitForMember("host/" + std::to_string(r), r, timeout);
    if (!v.isOk()) return joinFailed(v.status(), r);
    hosts[r] = v.value();
  }
  std::vector<std::string> distinct;
  for (const auto& h : hosts)
    if (std::find(distinct.begin(), distinct.end(), h) == distinct.end()) distinct.push_back(h);
  if (needLocal) {
    id_.localRank = 0;
    id_.localSize = 0;
    for (int r = 0; r < id_.size; ++r)
      if (hosts[r] == host) {
        if (r < id_.rank) ++id_.localRank;
        ++id_.localSize;
      }
  }
  if (needCross) {
    id_.crossSize = static_cast<int>(distinct.size());
    id_.crossRank =
        static_cast<int>(std::find(distinct.begin(), distinct.end(), host) - distinct.begin());
  }
  return Status::ok();
}

Status Runtime::joinStore(const hora_config_t& c, const std::string& host) {
  const Params& p = params_;
  const std::string& storeAddr = storeAddr_;
  const int storePort = storePort_;
  const bool external =
      c.store_external >= 0 ? c.store_external != 0 : p.getBool("HORA_STORE_EXTERNAL");
  std::string secret;
  if (c.secret) {
    secret = c.secret;
  } else if (!p.getString("HORA_SECRET").empty()) {
    secret = p.getString("HORA_SECRET");
  } else if (!p.getString("HORA_SECRET_FILE").empty()) {
    std::ifstream f(p.getString("HORA_SECRET_FILE"));
    if (!f)
      return invalidArgument("cannot read HORA_SECRET_FILE '" + p.getString("HORA_SECRET_FILE") +
                             "'");
    std::getline(f, secret);
  }
  const std::string who = "rank " + std::to_string(id_.rank);
  if (elastic_) {
    workerId_ = c.worker_id ? c.worker_id : p.getString("HORA_WORKER_ID");
    if (workerId_.empty() || workerId_.find_first_of(" \t\n/") != std::string::npos)
      return invalidArgument(
          "elastic mode needs HORA_WORKER_ID (a job-unique id without spaces or '/'; horarun "
          "sets it), got '" +
          workerId_ + "'");
    if (!external || storeAddr.empty())
      return invalidArgument(
          "elastic mode (HORA_ELASTIC=1) needs a rendezvous store that outlives every rank: "
          "start the job with horarun --min-np/--max-np, or host the store outside the ranks "
          "(hora_store_server_start) and set HORA_STORE_ADDR and HORA_STORE_EXTERNAL=1");
  }
  if (id_.size == 1 && storeAddr.empty()) {
    store_ = std::make_shared<MemoryStore>();
    return Status::ok();
  }
  if (storeAddr.empty())
    return invalidArgument(who + " of " + std::to_string(id_.size) +
                           ": HORA_STORE_ADDR is not set; set it (and HORA_STORE_PORT) to the "
                           "address where rank 0 or the launcher serves the rendezvous store (or "
                           "MASTER_ADDR/MASTER_PORT as torchrun does), or start the job with "
                           "horarun");
  const bool hostHere = id_.rank == 0 && !external;
  if (hostHere) {
    auto server = TcpStoreServer::start(storeAddr, storePort, secret, logger_);
    if (!server.isOk())
      return server.status().withContext("rank 0 could not host the rendezvous store at " +
                                         storeAddr + ":" + std::to_string(storePort) + " (from " +
                                         storeFrom_ +
                                         "; port in use by another job? set HORA_STORE_PORT)");
    server_ = server.take();
  }
  const auto deadline = Clock::now() + setOpts_.startTimeout;
  for (;;) {
    auto client =
        TcpStoreClient::connect(storeAddr, storePort, secret, setOpts_.startTimeout, logger_);
    if (!client.isOk()) return client.status().withContext(who);
    auto root = std::make_shared<PrefixStore>(client.take(), "hora");
    if (elastic_) {
      elStore_ = std::make_shared<PrefixStore>(root, "el");
      HORA_RETURN_IF_ERROR(formElasticEpoch(c, host).withContext("worker " + workerId_));
      store_ = std::make_shared<PrefixStore>(root, "e" + std::to_string(epoch_));
      return Status::ok();
    }
    // Each rank counts its runtimes; ranks that initialise in lockstep agree
    // on the count, which scopes every key of this runtime.
    auto n = root->add("inits/" + std::to_string(id_.rank), 1);
    if (!n.isOk()) return n.status().withContext(who + ": joining the rendezvous store");
    epoch_ = n.value();
    // A store rank 0 hosts lives as long as its runtime, so a fresh one has
    // never seen this rank. A higher count means this rank re-initialised
    // faster than rank 0 and reached the previous runtime's store, which is
    // about to close: try again until rank 0's new store answers.
    if (external || hostHere || epoch_ == 1) {
      store_ = std::make_shared<PrefixStore>(root, "e" + std::to_string(epoch_));
      return Status::ok();
    }
    if (Clock::now() >= deadline)
      return timeoutError(who + ": the rendezvous store at " + storeAddr + ":" +
                          std::to_string(storePort) +
                          " still belongs to rank 0's previous runtime after the start timeout; "
                          "call hora_shutdown on every rank before hora_init again");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

Status Runtime::formElasticEpoch(const hora_config_t& c, const std::string& host) {
  Store& el = *elStore_;
  auto last = lastEpochOf(el, workerId_);
  if (!last.isOk()) return last.status();
  const bool newcomer =
      c.elastic_newcomer >= 0 ? c.elastic_newcomer != 0 : params_.getBool("HORA_ELASTIC_NEWCOMER");
  if (last.value() < 0 && !newcomer) {
    // The launcher's first batch: ranks from the environment, epoch 0.
    epoch_ = 0;
    HORA_RETURN_IF_ERROR(recordInitialMember(el, workerId_, id_.rank, id_.size));
    // Every member's id, for messages that name a lost one.
    std::vector<std::string> ids(id_.size);
    for (int r = 0; r < id_.size; ++r) {
      auto v = el.get("r0/rank/" + std::to_string(r), setOpts_.startTimeout);
      if (!v.isOk()) return joinFailed(v.status(), r);
      ids[r] = v.value();
    }
    setOpts_.workerIds = std::move(ids);
    return Status::ok();
  }
  FormRequest req;
  req.workerId = workerId_;
  req.host = host;
  req.lastEpoch = last.value();
  if (req.lastEpoch >= 0) {
    auto members = membersOf(el, req.lastEpoch);
    auto it = std::find(members.begin(), members.end(), workerId_);
    req.lastRank = it == members.end() ? -1 : static_cast<int>(it - members.begin());
  }
  // What every process set compares at set-up, checked here already so that
  // a mismatched newcomer is refused alone. Tickets are space-separated.
  for (const auto& [name, value] : sharedSettings(setOpts_))
    req.settings += (req.settings.empty() ? "" : ",") + name + "=" + value;
  std::replace(req.settings.begin(), req.settings.end(), ' ', '_');
  req.timeout = Seconds(params_.getFloat("HORA_ELASTIC_TIMEOUT_S"));
  req.settle = std::chrono::milliseconds(params_.getInt("HORA_ELASTIC_SETTLE_MS"));
  if (req.timeout.count() <= 0 || req.timeout.count() > 1e9 || req.settle.count() < 0 ||
      req.settle.count() > int64_t{1000000000} * 1000)
    return invalidArgument(
        "HORA_ELASTIC_TIMEOUT_S must be positive and at most 1e9, HORA_ELASTIC_SETTLE_MS "
        "not negative and at most 1e12");
  auto m = formEpoch(el, req, logger_);
  if (!m.isOk()) return m.status();
  setOpts_.workerIds = m.value().workers;
  epoch_ = m.value().epoch;
  id_.rank = m.value().rank;
  id_.size = m.value().size();
  return Status::ok();
}

Result<bool> Runtime::membershipPending() {
  if (!elastic_ || !elStore_) return false;
  return hora::membershipPending(*elStore_, epoch_);
}

Result<std::unique_ptr<Runtime>> Runtime::create(const hora_config_t& c) {
  std::unique_ptr<Runtime> rt(new Runtime());
  auto params = Params::fromEnvironment();
  if (!params.isOk()) return params.status();
  rt->params_ = params.take();
  const Params& p = rt->params_;
  HORA_RETURN_IF_ERROR(rt->resolveIdentity(c));
  rt->resolveStore(c);
  const Identity& id = rt->id_;

  LogLevel level = LogLevel::kWarning;
  std::string levelText = c.log_level ? c.log_level : p.getString("HORA_LOG_LEVEL");
  if (!parseLogLevel(levelText, &level))
    return invalidArgument("log level '" + levelText +
                           "' is not one of trace, debug, info, warning, error, off");
  rt->logger_ = Logger(level, "[hora rank " + std::to_string(id.rank) + "]");
  // The HOROVOD_* variables this process honoured or ignored: one line per
  // process, not one per init (docs/params.md, "Horovod's variables").
  static std::atomic<bool> horovodReported{false};
  const std::string horovodLine = p.horovodSummary();
  if (!horovodLine.empty() && !horovodReported.exchange(true))
    HORA_LOG(rt->logger_, kWarning) << horovodLine;

  // hora_config_t's numbers (negative: unset) win over the HORA_* parameters.
  auto num = [](double configured, double fallback) {
    return configured >= 0 ? configured : fallback;
  };
  const double cycleTimeMs = num(c.cycle_time_ms, p.getFloat("HORA_CYCLE_TIME_MS"));
  // HORA_STALL_CHECK=0 (HOROVOD_STALL_CHECK_DISABLE=1, --no-stall-check):
  // no warning within a lifetime, no shutdown; explicit config fields still win.
  const bool stallCheck = p.getBool("HORA_STALL_CHECK");
  const double stallWarningS =
      num(c.stall_warning_time_s, stallCheck ? p.getFloat("HORA_STALL_WARNING_TIME_S") : 1e9);
  const double stallShutdownS =
      num(c.stall_shutdown_time_s, stallCheck ? p.getFloat("HORA_STALL_SHUTDOWN_TIME_S") : 0);
  const double peerTimeoutS = num(c.peer_timeout_s, p.getFloat("HORA_PEER_TIMEOUT_S"));
  const double startTimeoutS = num(c.start_timeout_s, p.getFloat("HORA_START_TIMEOUT_S"));
  int64_t heartbeatMs = p.getInt("HORA_HEARTBEAT_INTERVAL_MS");
  // Finite but huge values would overflow the durations they become
  // (undefined behaviour); a billion seconds (~31 years) is "never" enough.
  constexpr double kMaxSeconds = 1e9;
  const int64_t cacheRaw =
      c.cache_capacity >= 0 ? c.cache_capacity : p.getInt("HORA_CACHE_CAPACITY");
  if (cycleTimeMs > kMaxSeconds * 1000 || stallWarningS > kMaxSeconds ||
      stallShutdownS > kMaxSeconds || peerTimeoutS > kMaxSeconds || startTimeoutS > kMaxSeconds ||
      heartbeatMs > kMaxSeconds * 1000 || cacheRaw > INT32_MAX || cacheRaw < INT32_MIN)
    return invalidArgument(
        "a time is too large or the cache capacity does not fit: times must be at most 1e9 s "
        "(HORA_CYCLE_TIME_MS " +
        std::to_string(cycleTimeMs) + ", HORA_STALL_WARNING_TIME_S " +
        std::to_string(stallWarningS) + ", HORA_STALL_SHUTDOWN_TIME_S " +
        std::to_string(stallShutdownS) + ", HORA_PEER_TIMEOUT_S " + std::to_string(peerTimeoutS) +
        ", HORA_START_TIMEOUT_S " + std::to_string(startTimeoutS) +
        ", HORA_HEARTBEAT_INTERVAL_MS " + std::to_string(heartbeatMs) +
        ") and HORA_CACHE_CAPACITY at most 2147483647 (got " + std::to_string(cacheRaw) + ")");
  SetOptions& so = rt->setOpts_;
  so.logger = rt->logger_;
  so.fusionThresholdBytes = c.fusion_threshold_bytes >= 0 ? c.fusion_threshold_bytes
                                                          : p.getInt("HORA_FUSION_THRESHOLD_BYTES");
  so.cacheCapacity = static_cast<int>(cacheRaw);
  if (so.cacheCapacity < 0 || so.fusionThresholdBytes < 0 || stallWarningS < 0 ||
      stallShutdownS < 0)
    return invalidArgument(
        "cache capacity, fusion threshold and stall times must not be negative "
        "(check HORA_CACHE_CAPACITY, HORA_FUSION_THRESHOLD_BYTES, "
        "HORA_STALL_*_TIME_S)");
  if (peerTimeoutS <= 0 || startTimeoutS <= 0 || cycleTimeMs < 0 || heartbeatMs <= 0)
    return invalidArgument(
        "peer timeout, start timeout and heartbeat interval must be positive, cycle time "
        "non-negative");
  so.cycleTime = std::chrono::microseconds(static_cast<int64_t>(cycleTimeMs * 1000));
  so.stallWarning = Seconds(stallWarningS);
  so.stallShutdown = Seconds(stallShutdownS);
  so.peerTimeout = toMillis(Seconds(peerTimeoutS));
  so.startTimeout = toMillis(Seconds(startTimeoutS));
  // Heartbeats must come well inside the peer timeout.
  heartbeatMs = std::min<int64_t>(heartbeatMs, std::max<int64_t>(50, so.peerTimeout.count() / 4));
  so.heartbeatInterval = std::chrono::milliseconds(heartbeatMs);
  so.glooIface = p.getString("HORA_GLOO_IFACE");
  if (!so.glooIface.empty()) {
    // Gloo would fail later, inside the data plane's connect, with its own
    // assertion text; name the interfaces that would work instead.
    std::map<std::string, std::string> interfaces;
    // A host whose interfaces cannot be listed cannot tell: let Gloo decide.
    if (ipv4Interfaces(&interfaces) && !interfaces.count(so.glooIface)) {
      std::string have;
      for (const auto& i : interfaces) have += (have.empty() ? "" : ", ") + i.first;
      return invalidArgument("HORA_GLOO_IFACE='" + so.glooIface +
                             "' is not an interface with an IPv4 address on this host (those "
                             "with one: " +
                             (have.empty() ? std::string("none") : have) +
                             "); unset it to use the interface of HORA_HOSTNAME's address");
    }
  }
  // The registry has checked these against their choices.
  if (!parseGlooAlgorithm(p.getString("HORA_GLOO_ALGORITHM"), &so.glooAlgorithm) ||
      !parseGpuBackend(p.getString("HORA_GPU_BACKEND"), &so.gpu.backend))
    return internalError("HORA_GLOO_ALGORITHM or HORA_GPU_BACKEND passed the registry's check");
  so.gpu.pipeline = p.getBool("HORA_GPU_PIPELINE");
  so.shm = p.getBool("HORA_SHM");
  so.shmChunkBytes = p.getInt("HORA_SHM_CHUNK_BYTES");
  // Set: chunk and slot as before 1 MiB became the default chunk (a user's
  // or a test's value keeps its meaning); unset: room for autotune to try
  // chunks up to kShmMinSlotBytes.
  so.shmSlotBytes = p.isSet("HORA_SHM_CHUNK_BYTES")
                        ? so.shmChunkBytes
                        : std::max<int64_t>(so.shmChunkBytes, kShmMinSlotBytes);
  so.shmChunkBytesWhenRanksFit = p.isSet("HORA_SHM_CHUNK_BYTES") ? 0 : kShmChunkBytesWhenRanksFit;
  so.shmMinBytes = p.getInt("HORA_SHM_MIN_BYTES");
  so.inlineMaxBytes = p.getInt("HORA_INLINE_MAX_BYTES");
  if (so.inlineMaxBytes < -1 || so.inlineMaxBytes > static_cast<int64_t>(kMaxInlineBytes))
    return invalidArgument("HORA_INLINE_MAX_BYTES=" + std::to_string(so.inlineMaxBytes) +
                           " is out of range: allreduces travel inside the negotiation up to at "
                           "most " +
                           std::to_string(kMaxInlineBytes) +
                           " bytes (0 turns it off, -1 picks by data plane)");
  const int64_t onControl = p.getInt("HORA_RUN_ON_CONTROL_MAX_BYTES");
  if (onControl < 0 || onControl > (int64_t{1} << 30))
    return invalidArgument("HORA_RUN_ON_CONTROL_MAX_BYTES=" + std::to_string(onControl) +
                           " is out of range: 0 (off) to 1073741824 bytes");
  so.runOnControlMaxBytes = static_cast<size_t>(onControl);
  so.packAhead = p.getBool("HORA_PACK_AHEAD");
  so.callerDrives = p.getBool("HORA_CALLER_DRIVES");
  so.autotune = p.getBool("HORA_AUTOTUNE");
  so.autotuneLog = p.getString("HORA_AUTOTUNE_LOG");
  so.autotuneSeed = static_cast<uint64_t>(p.getInt("HORA_AUTOTUNE_SEED"));
  {
    // What the user set stays as set, unless HORA_AUTOTUNE=1 is explicit
    // too: then it is only where the search starts (docs/performance.md).
    const bool tuneAll = so.autotune && p.isSet("HORA_AUTOTUNE");
    auto pin = [&](TuneDim d, bool set) {
      so.autotunePinned[static_cast<int>(d)] = !tuneAll && set;
    };
    pin(TuneDim::kFusionThreshold,
        c.fusion_threshold_bytes >= 0 || p.isSet("HORA_FUSION_THRESHOLD_BYTES"));
    pin(TuneDim::kCycleTime, c.cycle_time_ms >= 0 || p.isSet("HORA_CYCLE_TIME_MS"));
    pin(TuneDim::kShmChunk, p.isSet("HORA_SHM_CHUNK_BYTES"));
    pin(TuneDim::kShmMinBytes, p.isSet("HORA_SHM_MIN_BYTES"));
    pin(TuneDim::kGlooBcubeMax, p.isSet("HORA_GLOO_ALGORITHM"));
  }
  so.p2pRingBytes = p.getInt("HORA_P2P_RING_BYTES");
  so.p2pEagerBytes = p.getInt("HORA_P2P_EAGER_BYTES");
  so.p2pFastBytes = p.getInt("HORA_P2P_FAST_BYTES");
  if (so.p2pFastBytes < 0 || so.p2pFastBytes > static_cast<int64_t>(kP2pFastDataBytes))
    return invalidArgument("HORA_P2P_FAST_BYTES must be 0.." + std::to_string(kP2pFastDataBytes) +
                           " (got " + std::to_string(so.p2pFastBytes) + ")");
  const int64_t spinUs = p.getInt("HORA_P2P_SPIN_US");
  if (so.p2pRingBytes < 4096 || so.p2pRingBytes > (int64_t(1) << 34) ||
      (so.p2pRingBytes & (so.p2pRingBytes - 1)) != 0 || so.p2pEagerBytes < 0 ||
      so.p2pEagerBytes > so.p2pRingBytes || spinUs < 0 || spinUs > 1000000)
    return invalidArgument(
        "HORA_P2P_RING_BYTES must be a power of two in 4096..2^34, HORA_P2P_EAGER_BYTES 0.."
        "HORA_P2P_RING_BYTES and HORA_P2P_SPIN_US 0..1000000 (got " +
        std::to_string(so.p2pRingBytes) + ", " + std::to_string(so.p2pEagerBytes) + ", " +
        std::to_string(spinUs) + ")");
  so.p2pSpinUs = static_cast<int>(spinUs);
  so.spinUs = p.getInt("HORA_SPIN_US");
  if (so.spinUs < 0 || so.spinUs > 1000000)
    return invalidArgument("HORA_SPIN_US must be 0..1000000 (got " + std::to_string(so.spinUs) +
                           ")");
  so.waitSpinUs = p.getInt("HORA_WAIT_SPIN_US");
  if (so.waitSpinUs < 0 || so.waitSpinUs > 1000000)
    return invalidArgument("HORA_WAIT_SPIN_US must be 0..1000000 (got " +
                           std::to_string(so.waitSpinUs) + ")");
  so.shmWaitSpinUs = p.getInt("HORA_SHM_WAIT_SPIN_US");
  if (so.shmWaitSpinUs < 0 || so.shmWaitSpinUs > 1000000)
    return invalidArgument("HORA_SHM_WAIT_SPIN_US must be 0..1000000 (got " +
                           std::to_string(so.shmWaitSpinUs) + ")");
  so.shmClaimLines = p.getBool("HORA_SHM_CLAIM_LINES");
  const bool bindExecutor = p.getBool("HORA_BIND_EXECUTOR");
  so.shmNegotiation = p.getBool("HORA_SHM_NEGOTIATION");
  so.p2pTransport = p.getString("HORA_P2P_TRANSPORT");  // the registry checked the choice
  so.gpu.plugin = std::make_shared<GpuPlugin>(p.getString("HORA_GPU_PLUGIN"));
  const int64_t flight = p.getInt("HORA_FLIGHT_RECORDER_ENTRIES");
  const int64_t window = p.getInt("HORA_STRAGGLER_WINDOW");
  const double metricsS = p.getFloat("HORA_METRICS_INTERVAL_S");
  if (flight < 0 || flight > (1 << 24) || window < 1 || window > (1 << 24) || metricsS < 0 ||
      metricsS > kMaxSeconds)
    return invalidArgument(
        "HORA_FLIGHT_RECORDER_ENTRIES must be 0..16777216, HORA_STRAGGLER_WINDOW 1..16777216 and "
        "HORA_METRICS_INTERVAL_S 0..1e9 (got " +
        std::to_string(flight) + ", " + std::to_string(window) + ", " + std::to_string(metricsS) +
        ")");
  so.telemetry = p.getBool("HORA_TELEMETRY");
  so.flightEntries = static_cast<size_t>(flight);
  so.stragglerWindow = static_cast<size_t>(window);
  so.dumpDir = p.getString("HORA_FLIGHT_RECORDER_DIR");
  if (so.dumpDir.empty()) so.dumpDir = "/tmp/hora-" + std::to_string(::getuid());
  so.prometheusDir = p.getString("HORA_METRICS_PROMETHEUS_DIR");
  so.metricsInterval = Seconds(metricsS > 0 ? metricsS : so.prometheusDir.empty() ? 0 : 10);
  so.dumpRequests = p.getBool("HORA_FLIGHT_RECORDER_SIGUSR1") ? dumpSignalCounter() : nullptr;

  rt->elastic_ = c.elastic >= 0 ? c.elastic != 0 : p.getBool("HORA_ELASTIC");
  so.elastic = rt->elastic_;
  std::string host = c.hostname ? c.hostname : p.getString("HORA_HOSTNAME");
  const std::string& storeAddr = rt->storeAddr_;
  if (host.empty()) {
    // Local jobs: loopback. Otherwise the address on the route to the store,
    // else the host name (which must then resolve on every peer).
    if (storeAddr.empty() || isLoopback(storeAddr)) {
      host = "127.0.0.1";
    } else {
      host = addressTowards(storeAddr);
      if (host.empty()) host = hostName();
    }
  }
  so.hostname = host;
  so.hierAllreduce = p.getString("HORA_HIER_ALLREDUCE");  // the registry checked the choice
  so.hierOverlap = p.getBool("HORA_HIER_OVERLAP");
  so.hierCollectiveMinBytes = p.getInt("HORA_HIER_COLLECTIVE_MIN_BYTES");
  if (so.hierCollectiveMinBytes < 0)
    return invalidArgument(
        "HORA_HIER_COLLECTIVE_MIN_BYTES=" + std::to_string(so.hierCollectiveMinBytes) +
        " is negative; give a size in bytes (0: every size hierarchical)");
  so.hierCross = p.getString("HORA_HIER_CROSS");  // tcp|gloo, checked by the registry
  so.hostId = hostIdentity(p.getString("HORA_HOST_ID"), host);
  HORA_RETURN_IF_ERROR(rt->joinStore(c, host));
  if (rt->elastic_) rt->logger_ = Logger(level, "[hora rank " + std::to_string(id.rank) + "]");
  so.logger = rt->logger_;

  // After epoch 0 of an elastic job the launcher's local/cross variables
  // describe a membership that no longer exists.
  const bool reformed = rt->elastic_ && rt->epoch_ > 0;
  bool needLocal = reformed || id.localRank < 0 || id.localSize < 0;
  bool needCross = reformed || id.crossRank < 0 || id.crossSize < 0;
  if (id.size > 1 && (needLocal || needCross)) {
    HORA_RETURN_IF_ERROR(
        rt->deriveTopology(needLocal, needCross, host == "127.0.0.1" ? hostName() : host));
  } else {
    if (needLocal) rt->id_.localRank = id.rank, rt->id_.localSize = id.size;
    if (needCross) rt->id_.crossRank = 0, rt->id_.crossSize = 1;
  }

  // The timeline exists from the start (hora_timeline_start may start it
  // later); HORA_TIMELINE starts it now. Observability never fails training:
  // an unwritable path is a warning.
  TimelineOptions tlo;
  tlo.rank = rt->id_.rank;
  tlo.host = host == "127.0.0.1" ? hostName() : host;
  const int64_t tlMb = p.getInt("HORA_TIMELINE_MAX_MB");
  const int64_t tlEvents = p.getInt("HORA_TIMELINE_BUFFER_EVENTS");
  if (tlMb < 1 || tlMb > (int64_t{1} << 30) || tlEvents < 1 || tlEvents > (1 << 26))
    return invalidArgument(
        "HORA_TIMELINE_MAX_MB must be 1..2^30 and HORA_TIMELINE_BUFFER_EVENTS "
        "1..2^26 (got " +
        std::to_string(tlMb) + ", " + std::to_string(tlEvents) + ")");
  tlo.maxBytes = tlMb << 20;
  tlo.bufferEvents = static_cast<size_t>(tlEvents);
  rt->timeline_ = std::make_shared<Timeline>(tlo);
  so.timeline = rt->timeline_;
  if (const std::string& tl = p.getString("HORA_TIMELINE"); !tl.empty()) {
    Status s = rt->timeline_->start(tl, p.getBool("HORA_TIMELINE_MARK_CYCLES"));
    if (!s.isOk())
      HORA_LOG(rt->logger_, kWarning)
          << s.message() << " (HORA_TIMELINE); training goes on without a timeline";
  }

  so.gpu.localRank = rt->id_.localRank;
  so.localSize = rt->id_.localSize;
  std::vector<int> all(id.size);
  for (int r = 0; r < id.size; ++r) all[r] = r;
  // Only the global set's executor is bound: sub-sets (tensor and data
  // parallel groups of a grid) run concurrently and would share its CPU.
  // A proposal: each set applies it only where its shared-memory set-up
  // finds every rank on this mask (ProcessSet::create).
  if (p.getBool("HORA_HOME_CALLER"))
    so.callerHomeCpu = callerHomeCpuFor(rt->id_.localRank, rt->id_.localSize, allowedCpus());
  SetOptions globalOpts = so;
  if (bindExecutor && rt->id_.localSize > 1) {
    rt->cpuClaim_ = CpuClaim::pick(rt->id_.localRank, rt->id_.localSize, allowedCpus(),
                                   p.getString("HORA_CPU_CLAIM_DIR"));
    globalOpts.executorCpu = rt->cpuClaim_.cpu();
    const std::string where = globalOpts.executorCpu >= 0
                                  ? "runs on CPU " + std::to_string(globalOpts.executorCpu) +
                                        " (local rank " + std::to_string(rt->id_.localRank) + ", " +
                                        rt->cpuClaim_.note() + "; HORA_BIND_EXECUTOR=0 unbinds it)"
                                  : "is not bound: " + rt->cpuClaim_.note();
    if (rt->cpuClaim_.warn())
      HORA_LOG(rt->logger_, kWarning)
          << "rank " << id.rank << ": the global set's executor " << where;
    else
      HORA_LOG(rt->logger_, kInfo) << "rank " << id.rank << ": the global set's executor " << where;
  }
  auto g = ProcessSet::create("global", all, id.rank,
                              std::make_shared<PrefixStore>(rt->store_, "set/global"), globalOpts);
  if (!g.isOk()) return g.status().withContext("rank " + std::to_string(id.rank));
  rt->global_ = std::shared_ptr<ProcessSet>(g.take().release());
  rt->sets_.push_back(rt->global_);
  HORA_LOG(rt->logger_, kInfo) << "hora initialized: epoch " << rt->epoch_ << ", rank " << id.rank
                               << "/" << id.size << ", local " << rt->id_.localRank << "/"
                               << rt->id_.localSize << ", host " << host;
  return rt;
}

Result<std::shared_ptr<ProcessSet>> Runtime::createSet(const std::vector<int>& ranks) {
  std::string key;
  for (int r : ranks) key += (key.empty() ? "" : "-") + std::to_string(r);
  int n;
  {
    std::lock_guard<std::mutex> lk(mu_);
    n = setCounters_[key]++;
  }
  std::string name = "[" + key + "]#" + std::to_string(n);
  auto s = ProcessSet::create(
      name, ranks, id_.rank,
      std::make_shared<PrefixStore>(store_, "set/" + key + "/" + std::to_string(n)), setOpts_);
  if (!s.isOk()) return s.status();
  std::shared_ptr<ProcessSet> set(s.take().release());
  std::lock_guard<std::mutex> lk(mu_);
  sets_.push_back(set);
  return set;
}

void Runtime::destroySet(const std::shared_ptr<ProcessSet>& set) {
  set->shutdown("process set " + set->name() + " was destroyed on rank " +
                std::to_string(id_.rank));
  std::lock_guard<std::mutex> lk(mu_);
  sets_.erase(std::remove(sets_.begin(), sets_.end(), set), sets_.end());
}

void Runtime::shutdown() {
  std::vector<std::shared_ptr<ProcessSet>> sets;
  {
    std::lock_guard<std::mutex> lk(mu_);
    sets.swap(sets_);
  }
  // Sub-sets first, the global set last.
  std::reverse(sets.begin(), sets.end());
  for (auto& s : sets)
    s->shutdown("hora_shutdown was called on rank " + std::to_string(id_.rank) +
                " with this request pending");
  global_.reset();
  // Its executor has stopped: the CPU is free for the next runtime (an
  // elastic re-init in this process, or another job).
  cpuClaim_ = CpuClaim();
  if (timeline_) timeline_->stop();
  store_.reset();
  server_.reset();
}

Runtime::~Runtime() { shutdown(); }

}  // namespace hora
