// horarun: hora's job launcher (main). Wires the pieces together on the main
// thread, in order:
//   1. options (options.h), hosts and rank assignment (hosts.h);
//   2. where the rendezvous store must listen (netif.h), a fresh job secret,
//      and the store itself through the C ABI (hora_store_server_start);
//   3. optional --check (check.h);
//   4. one LaunchSpec per rank with the HORA_* environment contract (README),
//      then the Job (job.h) runs them and decides the exit status; in elastic
//      mode the Job asks for each worker's LaunchSpec as it starts it (planFor)
//      and publishes the hora/el/ keys through hora_store_server_set;
//   5. the store is stopped.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "check.h"
#include "hora/hora.h"
#include "hosts.h"
#include "job.h"
#include "netif.h"
#include "options.h"
#include "spawn.h"

extern char** environ;

namespace horarun {
namespace {

int usageError(const std::string& msg) {
  std::fprintf(stderr, "horarun: %s\n(horarun --help shows the usage)\n", oneLine(msg).c_str());
  return 2;
}

bool makeSecret(std::string* out, std::string* error) {
  unsigned char bytes[32];
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  bool ok = fd >= 0 && read(fd, bytes, sizeof(bytes)) == static_cast<ssize_t>(sizeof(bytes));
  if (fd >= 0) close(fd);
  if (!ok) {
    *error = std::string("cannot read /dev/urandom: ") + std::strerror(errno);
    return false;
  }
  static const char* hex = "0123456789abcdef";
  out->clear();
  for (unsigned char b : bytes) out->push_back(hex[b >> 4]), out->push_back(hex[b & 15]);
  return true;
}

bool makeDir(const std::string& path, std::string* error) {
  std::string cur;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!cur.empty() && mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
        *error = "cannot create '" + cur + "': " + std::strerror(errno);
        return false;
      }
    }
    if (i < path.size()) cur.push_back(path[i]);
  }
  return true;
}

// The job's folder for flight recorder dumps and hang reports
// (docs/observability.md): HORA_FLIGHT_RECORDER_DIR when the user set one
// (-x or horarun's environment; "" = keep hora's default), else a new folder
// per job, so a failed job's dumps are in one place horarun can name.
std::string dumpDirFor(const EnvList& env, bool* chosen) {
  *chosen = false;
  for (auto it = env.rbegin(); it != env.rend(); ++it)
    if (it->first == "HORA_FLIGHT_RECORDER_DIR") return it->second;
  if (const char* d = std::getenv("HORA_FLIGHT_RECORDER_DIR")) return d;
  const char* tmp = std::getenv("TMPDIR");
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
  *chosen = true;
  return std::string(tmp && *tmp ? tmp : "/tmp") + "/hora-" + std::to_string(::getuid()) + "/job-" +
         stamp + "-" + std::to_string(::getpid());
}

// After a failed job: where its dumps are (on this host; a remote rank's are
// in the same folder on its host).
void reportDumps(const std::string& dir, bool chosen, int status) {
  std::vector<std::string> files;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n.rfind("hora-", 0) == 0 && n.size() > 4 && n.compare(n.size() - 4, 4, ".txt") == 0)
        files.push_back(n);
    }
    closedir(d);
  }
  std::sort(files.begin(), files.end());
  if (status != 0 && !files.empty()) {
    std::string list;
    for (size_t i = 0; i < files.size() && i < 8; ++i) list += "\n  " + files[i];
    if (files.size() > 8) list += "\n  ... " + std::to_string(files.size() - 8) + " more";
    std::fprintf(stderr,
                 "horarun: flight recorder dumps and hang reports of this job are in %s "
                 "(remote ranks': the same folder on their hosts):%s\n",
                 dir.c_str(), list.c_str());
  } else if (chosen && files.empty()) {
    ::rmdir(dir.c_str());  // nothing to look at: leave no empty folder behind
  }
}

// HORA_* and HOROVOD_* variables set in horarun's own environment (HORA_LOG_LEVEL, ...),
// forwarded to remote ranks; local ranks inherit them anyway. The secret and
// the identity are never taken from here.
EnvList inheritedHoraVariables() {
  static const std::set<std::string> kOwn = {
      "HORA_RANK",           "HORA_SIZE",       "HORA_LOCAL_RANK",      "HORA_LOCAL_SIZE",
      "HORA_CROSS_RANK",     "HORA_CROSS_SIZE", "HORA_STORE_ADDR",      "HORA_STORE_PORT",
      "HORA_STORE_EXTERNAL", "HORA_SECRET",     "HORA_SECRET_FILE",     "HORA_HOSTNAME",
      "HORA_ELASTIC",        "HORA_WORKER_ID",  "HORA_ELASTIC_NEWCOMER"};
  EnvList out;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    // Remote workers get `export NAME=...` lines: only shell names travel.
    if (eq == std::string::npos || !isEnvName(kv.substr(0, eq))) continue;
    // Horovod's tuning variables travel too (the ranks honour them, docs/params.md);
    // its identity and rendezvous variables would describe another job.
    if (kv.rfind("HOROVOD_", 0) == 0) {
      static const std::set<std::string> kHorovodOwn = {"HOROVOD_RANK",
                                                        "HOROVOD_SIZE",
                                                        "HOROVOD_LOCAL_RANK",
                                                        "HOROVOD_LOCAL_SIZE",
                                                        "HOROVOD_CROSS_RANK",
                                                        "HOROVOD_CROSS_SIZE",
                                                        "HOROVOD_HOSTNAME",
                                                        "HOROVOD_GLOO_RENDEZVOUS_ADDR",
                                                        "HOROVOD_GLOO_RENDEZVOUS_PORT"};
      if (!kHorovodOwn.count(kv.substr(0, eq)))
        out.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
      continue;
    }
    if (kv.rfind("HORA_", 0) != 0) continue;
    if (kOwn.count(kv.substr(0, eq))) continue;
    out.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return out;
}

int realMain(int argc, char** argv) {
  Options opt;
  std::string error;
  if (!parseOptions(argc, argv, &opt, &error)) return usageError(error);
  if (opt.help) {
    std::fputs(usageText(), stdout);
    return 0;
  }
  if (opt.version || opt.checkBuild) {
    std::printf("%s\n", versionText().c_str());
    // horovodrun --check-build's questions, answered for hora.
    if (opt.checkBuild)
      std::printf(
          "Available frameworks: PyTorch (hora.torch), NumPy (hora.numpy), C (hora.h)\n"
          "Available controllers: hora TCP control plane (like Horovod's Gloo); no MPI\n"
          "Available tensor operations: Gloo, shared memory (one host), NCCL through the GPU "
          "plugin libhora_cuda.so when built\n");
    return 0;
  }
  std::vector<HostSpec> hosts;
  if (!opt.hosts.empty()) {
    if (!parseHostList(opt.hosts, &hosts, &error, &opt.notes)) return usageError(error);
  } else if (!opt.hostfile.empty()) {
    if (!parseHostfile(opt.hostfile, &hosts, &error, &opt.notes)) return usageError(error);
  } else if (!opt.elastic) {
    hosts.push_back({"localhost", opt.np});
  } else if (opt.discoveryScript.empty() && opt.discoveryFile.empty()) {
    hosts.push_back({"localhost", opt.maxNp > 0 ? opt.maxNp : opt.np});  // --elastic alone
  }
  for (const auto& note : opt.notes) std::fprintf(stderr, "horarun: %s\n", note.c_str());
  const bool discovering = !opt.discoveryScript.empty() || !opt.discoveryFile.empty();
  std::vector<Slot> slots;
  if (!opt.elastic) {
    if (!assignSlots(hosts, opt.np, &slots, &error)) return usageError(error);
  } else if (!discovering) {
    // Fixed hosts: every slot may get a worker (up to --max-np) at some point.
    int all = 0;
    for (const auto& h : hosts) all += h.slots;
    if (!assignSlots(hosts, all, &slots, &error)) return usageError(error);
  }

  std::vector<std::string> usedHosts, remoteHosts;
  std::set<std::string> localNames;
  for (const auto& s : slots) {
    if (!usedHosts.empty() && usedHosts.back() == s.host) continue;
    usedHosts.push_back(s.host);
    if (isLocalHost(s.host))
      localNames.insert(s.host);
    else
      remoteHosts.push_back(s.host);
  }

  StorePlan plan;
  if (!planStore(remoteHosts, opt.networkInterface, &plan, &error)) {
    std::fprintf(stderr, "horarun: %s\n", error.c_str());
    return 1;
  }
  if (discovering && opt.networkInterface.empty()) {
    // Hosts are not known yet: listen on every interface (clients still have to pass the
    // HMAC challenge), local workers use loopback, a discovered remote host gets the local
    // address that routes to it (planFor below).
    plan.bindHost = "";
    plan.localAddr = "127.0.0.1";
    plan.description = "every interface (hosts come from discovery)";
  }
  std::string secret;
  if (!makeSecret(&secret, &error)) {
    std::fprintf(stderr, "horarun: %s\n", error.c_str());
    return 1;
  }
  hora_store_server_t store = nullptr;
  if (hora_store_server_start(plan.bindHost.c_str(), 0, secret.c_str(), &store) != HORA_SUCCESS) {
    std::fprintf(stderr, "horarun: cannot host the rendezvous store on %s: %s\n",
                 plan.description.c_str(), hora_last_error_message());
    return 1;
  }
  int32_t port = 0;
  hora_store_server_port(store, &port);
  if (opt.verbose)
    std::fprintf(stderr, "horarun: rendezvous store on port %d, reached at %s\n", port,
                 plan.description.c_str());

  if (opt.check) {
    bool ok = runChecks(opt, usedHosts, plan, port);
    if (!ok || opt.command.empty()) {
      hora_store_server_stop(store);
      return ok ? 0 : 1;
    }
  }

  const std::string outputDir = opt.outputDir;
  const int width = static_cast<int>(std::to_string(std::max(opt.np, 1) - 1).size());
  char cwd[4096] = {0};
  if (!getcwd(cwd, sizeof(cwd) - 1)) cwd[0] = '\0';
  const EnvList inherited = inheritedHoraVariables();
  bool dumpDirChosen = false;
  const std::string dumpDir = dumpDirFor(opt.env, &dumpDirChosen);
  std::set<std::string> remoteNames;
  // The plan of one worker on `host`. slot: its ranks (static mode, and elastic mode's first
  // batch); null for an elastic newcomer, which gets no rank (docs/elastic.md). id: the
  // elastic worker id ("" outside elastic mode).
  auto planFor = [&](const std::string& host, const Slot* slot, const std::string& id,
                     WorkerPlan* w, std::string* err) -> bool {
    if (slot) w->slot = *slot;
    w->slot.host = host;
    LaunchSpec& spec = w->spec;
    spec.command = opt.command;
    spec.graceS = opt.graceS;
    if (discovering && !localNames.count(host) && !remoteNames.count(host))
      (isLocalHost(host) ? localNames : remoteNames).insert(host);  // resolve a name once
    spec.remote = !localNames.count(host);
    std::string storeAddr = plan.localAddr;
    if (spec.remote) {
      auto it = plan.addrForHost.find(host);
      if (it != plan.addrForHost.end()) {
        storeAddr = it->second;
      } else if (!opt.networkInterface.empty()) {
        storeAddr = plan.localAddr;
      } else if (!addressTowards(host, &storeAddr, err)) {
        return false;
      } else {
        plan.addrForHost[host] = storeAddr;
      }
    }
    const std::string hostname = spec.remote ? host : plan.localAddr;
    if (spec.remote) {
      spec.remoteShell = remoteShellFor(opt, host);
      spec.cwd = cwd;
      spec.env = inherited;
    }
    for (const auto& kv : opt.env) spec.env.push_back(kv);
    EnvList identity;
    if (slot) {
      identity = {
          {"HORA_RANK", std::to_string(slot->rank)},
          {"HORA_SIZE", std::to_string(slot->size)},
          {"HORA_LOCAL_RANK", std::to_string(slot->localRank)},
          {"HORA_LOCAL_SIZE", std::to_string(slot->localSize)},
          {"HORA_CROSS_RANK", std::to_string(slot->crossRank)},
          {"HORA_CROSS_SIZE", std::to_string(slot->crossSize)},
      };
    } else {
      spec.unsetEnv = {"HORA_RANK",       "HORA_SIZE",       "HORA_LOCAL_RANK",
                       "HORA_LOCAL_SIZE", "HORA_CROSS_RANK", "HORA_CROSS_SIZE"};
      identity.push_back({"HORA_ELASTIC_NEWCOMER", "1"});
    }
    if (opt.elastic) {
      identity.push_back({"HORA_ELASTIC", "1"});
      identity.push_back({"HORA_WORKER_ID", id});
      if (slot) spec.unsetEnv.push_back("HORA_ELASTIC_NEWCOMER");
    }
    EnvList common = {
        {"HORA_STORE_ADDR", storeAddr}, {"HORA_STORE_PORT", std::to_string(port)},
        {"HORA_STORE_EXTERNAL", "1"},   {"HORA_HOSTNAME", hostname},
        {"HORA_SECRET", secret},        {"HORA_SECRET_FILE", ""},
    };
    if (dumpDirChosen) common.push_back({"HORA_FLIGHT_RECORDER_DIR", dumpDir});
    identity.insert(identity.end(), common.begin(), common.end());
    spec.env.insert(spec.env.end(), identity.begin(), identity.end());
    if (!outputDir.empty()) {
      std::string dir;
      if (opt.elastic) {
        dir = outputDir + "/" + id;  // ranks change in elastic mode; worker ids do not
      } else {
        std::string r = std::to_string(slot->rank);
        dir = outputDir + "/rank." + std::string(width - r.size(), '0') + r;
      }
      if (!makeDir(dir, err)) {
        *err = "--output-filename: " + *err;
        return false;
      }
      w->stdoutFile = dir + "/stdout";
      w->stderrFile = dir + "/stderr";
    }
    return true;
  };

  std::vector<WorkerPlan> plans;
  std::unique_ptr<ElasticSetup> elastic;
  if (opt.elastic) {
    elastic = std::make_unique<ElasticSetup>();
    elastic->minNp = opt.minNp;
    elastic->maxNp = opt.maxNp > 0 ? opt.maxNp : kUnboundedNp;
    elastic->startNp = opt.np;
    elastic->timeoutS = opt.elasticTimeoutS;
    elastic->cooldownLowS = opt.cooldownLowS;
    elastic->cooldownHighS = opt.cooldownHighS;
    // The bound on one run of the discovery script; tests shorten it.
    if (const char* t = std::getenv("HORARUN_DISCOVERY_TIMEOUT_S")) {
      if (std::atof(t) > 0) elastic->discoveryTimeoutS = std::atof(t);
    }
    DiscoverySource& src = elastic->source;
    src.defaultSlots = opt.slotsPerHost;
    if (!opt.discoveryScript.empty()) {
      src.kind = DiscoverySource::Kind::kScript;
      src.path = opt.discoveryScript;
    } else if (!opt.discoveryFile.empty()) {
      src.kind = DiscoverySource::Kind::kFile;
      src.path = opt.discoveryFile;
    } else {
      src.kind = DiscoverySource::Kind::kFixed;
      src.fixed = hosts;
    }
    elastic->makeWorker = planFor;
    elastic->publish = [store](const std::string& key, const std::string& value) {
      const std::string full = "hora/el/" + key;
      if (hora_store_server_set(store, full.c_str(), value.data(), value.size()) != HORA_SUCCESS)
        std::fprintf(stderr, "horarun: warning: cannot publish %s in the store: %s\n", full.c_str(),
                     hora_last_error_message());
    };
    elastic->present = [store](const std::string& key) {
      const std::string full = "hora/el/" + key;
      int32_t present = 0;
      return hora_store_server_check(store, full.c_str(), &present) == HORA_SUCCESS && present;
    };
  } else {
    for (const auto& s : slots) {
      WorkerPlan w;
      if (!planFor(s.host, &s, "", &w, &error)) {
        hora_store_server_stop(store);
        return usageError(error);
      }
      plans.push_back(std::move(w));
    }
  }

  int status;
  {
    Job job(std::move(plans), opt.graceS, opt.verbose, std::move(elastic));
    status = job.run();
  }
  hora_store_server_stop(store);
  if (!dumpDir.empty()) reportDumps(dumpDir, dumpDirChosen, status);
  return status;
}

}  // namespace
}  // namespace horarun

int main(int argc, char** argv) { return horarun::realMain(argc, argv); }
