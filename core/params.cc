#include "core/params.h"

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace hora {

const std::vector<ParamSpec>& paramRegistry() {
  // Defaults follow Horovod's where one exists (cycle 1 ms, fusion 128 MiB,
  // cache 1024, stall warning 60 s), except the stall shutdown, which Horovod
  // leaves off (0) and hora turns on: a silent hang costs more than an error.
  static const std::vector<ParamSpec> kRegistry = {
      {"HORA_RANK", ParamType::kInt, "-1",
       "Global rank of this process (-1: from OMPI_/PMI_/SLURM_ variables, else 0)."},
      {"HORA_SIZE", ParamType::kInt, "-1",
       "Number of ranks in the job (-1: from the MPI/Slurm environment, else 1)."},
      {"HORA_LOCAL_RANK", ParamType::kInt, "-1",
       "Rank among the processes on this host (-1: derived)."},
      {"HORA_LOCAL_SIZE", ParamType::kInt, "-1", "Number of processes on this host (-1: derived)."},
      {"HORA_CROSS_RANK", ParamType::kInt, "-1", "Index of this host among hosts (-1: derived)."},
      {"HORA_CROSS_SIZE", ParamType::kInt, "-1", "Number of hosts (-1: derived)."},
      {"HORA_STORE_ADDR", ParamType::kString, "",
       "Host or IP of the rendezvous store. Unset with size>1: error. Rank 0 hosts the store there "
       "unless HORA_STORE_EXTERNAL=1."},
      {"HORA_STORE_PORT", ParamType::kInt, "29500", "TCP port of the rendezvous store."},
      {"HORA_STORE_EXTERNAL", ParamType::kBool, "0",
       "1: a launcher already serves the store; rank 0 does not host one."},
      {"HORA_SECRET", ParamType::kString, "",
       "Per-job secret authenticating store clients (HMAC-SHA256 challenge). Prefer "
       "HORA_SECRET_FILE."},
      {"HORA_SECRET_FILE", ParamType::kString, "",
       "File holding the per-job secret (should be mode 0600)."},
      {"HORA_HOSTNAME", ParamType::kString, "",
       "Address other ranks use to reach this one (default: the store address for local jobs, else "
       "this host's name)."},
      {"HORA_CYCLE_TIME_MS", ParamType::kFloat, "1",
       "Longest time the coordinator waits to gather more ready tensors into one fused batch once "
       "work is pending; the thread is woken by new work, never sleeps a fixed cycle."},
      {"HORA_FUSION_THRESHOLD_BYTES", ParamType::kInt, "134217728",
       "Largest fused batch in bytes (0 disables fusion)."},
      {"HORA_CACHE_CAPACITY", ParamType::kInt, "1024",
       "Response-cache entries (0 disables the cache). Must be the same on every rank (checked "
       "at start)."},
      {"HORA_STALL_WARNING_TIME_S", ParamType::kFloat, "60",
       "Seconds a tensor may wait for missing ranks before a warning names it and them."},
      {"HORA_STALL_SHUTDOWN_TIME_S", ParamType::kFloat, "300",
       "Seconds after which such a tensor fails on every rank with that report (0 = never)."},
      {"HORA_PEER_TIMEOUT_S", ParamType::kFloat, "30",
       "A peer silent this long on the control plane (no heartbeat) is declared lost; also bounds "
       "each data-plane wait."},
      {"HORA_HEARTBEAT_INTERVAL_MS", ParamType::kInt, "1000",
       "Interval of control-plane heartbeats."},
      {"HORA_START_TIMEOUT_S", ParamType::kFloat, "120",
       "Longest wait for all ranks to reach the store and connect at start-up."},
      {"HORA_ELASTIC", ParamType::kBool, "0",
       "1: elastic mode (docs/elastic.md): a lost member fails collectives with "
       "HORA_ERR_MEMBERSHIP and the survivors re-form; needs a launcher-hosted store. horarun "
       "sets it."},
      {"HORA_WORKER_ID", ParamType::kString, "",
       "Elastic mode: this process's id, unique in the job and stable across epochs (horarun "
       "sets it)."},
      {"HORA_ELASTIC_NEWCOMER", ParamType::kBool, "0",
       "Elastic mode: 1 for a worker started after the job began; it joins the next epoch "
       "(horarun sets it)."},
      {"HORA_ELASTIC_TIMEOUT_S", ParamType::kFloat, "600",
       "Elastic mode: longest wait to form an epoch (for the workers to arrive, for the "
       "members list, for a newcomer to be admitted)."},
      {"HORA_ELASTIC_SETTLE_MS", ParamType::kInt, "2000",
       "Elastic mode: the leader closes the new membership this long after the last arrival "
       "when fewer workers arrived than the launcher reports alive."},
      {"HORA_ELASTIC_RESET_LIMIT", ParamType::kInt, "-1",
       "Elastic mode, Python: most re-formations hvd.elastic.run makes before it gives up "
       "(-1 = no limit, as Horovod); its reset_limit argument wins."},
      {"HORA_GLOO_ALGORITHM", ParamType::kString, "auto",
       "Gloo allreduce algorithm: auto (by size), ring or bcube. Must be the same on every rank "
       "(checked at start).",
       "auto|ring|bcube"},
      {"HORA_GLOO_IFACE", ParamType::kString, "",
       "Network interface for Gloo's data plane (default: by HORA_HOSTNAME)."},
      {"HORA_SHM", ParamType::kBool, "1",
       "Allreduce through shared memory (/dev/shm) when every rank of a process set runs on one "
       "host; 0 keeps everything on Gloo. Compared at set-up: if the ranks differ, the set stays "
       "on "
       "Gloo and the reason is logged."},
      {"HORA_SHM_CHUNK_BYTES", ParamType::kInt, "4194304",
       "Pipeline chunk of the shared-memory allreduce; each rank's segment holds two (a multiple "
       "of 64)."},
      {"HORA_SHM_MIN_BYTES", ParamType::kInt, "0",
       "Allreduce payloads smaller than this go through Gloo even when shared memory is on."},
      {"HORA_GPU_PLUGIN", ParamType::kString, "",
       "Path of the GPU plugin (libhora_cuda.so); empty: next to libhora, then the build tree, "
       "then the loader's search path. Loaded only when a GPU tensor appears."},
      {"HORA_GPU_BACKEND", ParamType::kString, "auto",
       "GPU tensors: auto (the NCCL communicator where NCCL has the dtype and every rank of the "
       "process set has its own GPU, checked once per set; else staging through host memory and "
       "the CPU data plane), nccl (the communicator without the sharing check), or gloo (always "
       "staging). Must be the same on every rank (checked at start).",
       "auto|nccl|gloo"},
      {"HORA_LOG_LEVEL", ParamType::kString, "warning",
       "trace, debug, info, warning, error or off.", "trace|debug|info|warning|error|off"},
  };
  return kRegistry;
}

namespace {

const ParamSpec* findSpec(const char* name) {
  for (const auto& s : paramRegistry())
    if (std::strcmp(s.name, name) == 0) return &s;
  return nullptr;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The value among spec.choices (lower-case), or "" when it is none of them.
std::string choice(const ParamSpec& spec, const std::string& value) {
  const std::string v = lower(value);
  std::string all = spec.choices;
  size_t at = 0;
  while (at <= all.size()) {
    size_t bar = all.find('|', at);
    if (bar == std::string::npos) bar = all.size();
    if (all.compare(at, bar - at, v) == 0 && !v.empty()) return v;
    at = bar + 1;
  }
  return "";
}

Status validate(const ParamSpec& spec, const std::string& value) {
  auto bad = [&](const char* expected) {
    return invalidArgument(std::string(spec.name) + "='" + value + "' is not " + expected +
                           " (default " + spec.defaultValue + "; " + spec.doc + ")");
  };
  switch (spec.type) {
    case ParamType::kInt: {
      char* end = nullptr;
      errno = 0;
      std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || errno != 0 || *end != '\0') return bad("an integer");
      break;
    }
    case ParamType::kFloat: {
      char* end = nullptr;
      errno = 0;
      double v = std::strtod(value.c_str(), &end);
      if (value.empty() || errno != 0 || *end != '\0' || v != v) return bad("a number");
      break;
    }
    case ParamType::kBool:
      if (value != "0" && value != "1" && value != "true" && value != "false")
        return bad("a boolean (0/1/true/false)");
      break;
    case ParamType::kString:
      if (spec.choices && choice(spec, value).empty()) {
        std::string list = spec.choices;
        for (char& c : list)
          if (c == '|') c = ',';
        return bad(("one of " + list).c_str());
      }
      break;
  }
  return Status::ok();
}

}  // namespace

Result<Params> Params::parse(const std::function<const char*(const char*)>& lookup) {
  Params p;
  for (const auto& spec : paramRegistry()) {
    const char* v = lookup ? lookup(spec.name) : nullptr;
    std::string value = v ? std::string(v) : std::string(spec.defaultValue);
    if (v) {
      Status s = validate(spec, value);
      if (!s.isOk()) return s;
    }
    p.values_[spec.name] = spec.choices ? choice(spec, value) : value;
    p.set_[spec.name] = v != nullptr;
  }
  return p;
}

Result<Params> Params::fromEnvironment() {
  return parse([](const char* name) -> const char* { return std::getenv(name); });
}

Result<Params> Params::fromMap(const std::map<std::string, std::string>& values) {
  for (const auto& kv : values) {
    if (!findSpec(kv.first.c_str()))
      return invalidArgument("unknown parameter '" + kv.first + "' (see docs/params.md)");
  }
  return parse([&](const char* name) -> const char* {
    auto it = values.find(name);
    return it == values.end() ? nullptr : it->second.c_str();
  });
}

int64_t Params::getInt(const char* name) const {
  auto it = values_.find(name);
  return it == values_.end() ? 0 : std::strtoll(it->second.c_str(), nullptr, 10);
}

double Params::getFloat(const char* name) const {
  auto it = values_.find(name);
  return it == values_.end() ? 0.0 : std::strtod(it->second.c_str(), nullptr);
}

const std::string& Params::getString(const char* name) const {
  static const std::string kEmpty;
  auto it = values_.find(name);
  return it == values_.end() ? kEmpty : it->second;
}

bool Params::getBool(const char* name) const {
  const std::string& v = getString(name);
  return v == "1" || v == "true";
}

bool Params::isSet(const char* name) const {
  auto it = set_.find(name);
  return it != set_.end() && it->second;
}

std::string Params::dumpMarkdown() {
  std::ostringstream os;
  os << "| name | type | default | meaning |\n|---|---|---|---|\n";
  for (const auto& s : paramRegistry()) {
    const char* t = s.type == ParamType::kInt     ? "int"
                    : s.type == ParamType::kFloat ? "float"
                    : s.type == ParamType::kBool  ? "bool"
                                                  : "string";
    os << "| `" << s.name << "` | " << t << " | `" << s.defaultValue << "` | " << s.doc << " |\n";
  }
  return os.str();
}

}  // namespace hora
