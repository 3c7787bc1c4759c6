#include "core/params.h"

#include <cctype>
#include <cerrno>
#include <cmath>
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
       "Global rank of this process (-1: from OMPI_/PMI_/SLURM_ variables, then torchrun's RANK "
       "(first under torchrun itself); else 0). docs/install.md lists the launchers."},
      {"HORA_SIZE", ParamType::kInt, "-1",
       "Number of ranks in the job (-1: from the MPI/Slurm environment or torchrun's WORLD_SIZE, "
       "else 1; hora_init fails if launcher variables describe a larger job)."},
      {"HORA_LOCAL_RANK", ParamType::kInt, "-1",
       "Rank among the processes on this host (-1: derived)."},
      {"HORA_LOCAL_SIZE", ParamType::kInt, "-1", "Number of processes on this host (-1: derived)."},
      {"HORA_CROSS_RANK", ParamType::kInt, "-1", "Index of this host among hosts (-1: derived)."},
      {"HORA_CROSS_SIZE", ParamType::kInt, "-1", "Number of hosts (-1: derived)."},
      {"HORA_STORE_ADDR", ParamType::kString, "",
       "Host or IP of the rendezvous store. Unset with size>1: torchrun's MASTER_ADDR, else error. "
       "Rank 0 hosts the store there unless HORA_STORE_EXTERNAL=1."},
      {"HORA_STORE_PORT", ParamType::kInt, "29500",
       "TCP port of the rendezvous store. Unset, with the store at MASTER_ADDR: MASTER_PORT+1 "
       "(torchrun's own store holds MASTER_PORT)."},
      {"HORA_STORE_EXTERNAL", ParamType::kBool, "0",
       "1: a launcher already serves the store; rank 0 does not host one."},
      {"HORA_SECRET", ParamType::kString, "",
       "Per-job secret authenticating store clients (HMAC-SHA256 challenge). Prefer "
       "HORA_SECRET_FILE."},
      {"HORA_SECRET_FILE", ParamType::kString, "",
       "File holding the per-job secret (should be mode 0600)."},
      {"HORA_HOSTNAME", ParamType::kString, "",
       "Address other ranks use to reach this one (default: 127.0.0.1 when the store is on "
       "loopback; else this host's IPv4 address on the route to the store, or, when there is none, "
       "this host's name)."},
      {"HORA_CYCLE_TIME_MS", ParamType::kFloat, "1",
       "Longest time the coordinator waits to gather more ready tensors into one fused batch once "
       "work is pending; the thread is woken by new work, never sleeps a fixed cycle."},
      {"HORA_FUSION_THRESHOLD_BYTES", ParamType::kInt, "134217728",
       "Largest fused batch in bytes (0 disables fusion)."},
      {"HORA_AUTOTUNE", ParamType::kBool, "1",
       "Online autotune (docs/performance.md): set rank 0 of each process set of two or more "
       "ranks tunes the fusion threshold, cycle time, shm chunk and cut-overs from the measured "
       "step time and every rank applies its values at the same point. Parameters set "
       "explicitly stay fixed, unless HORA_AUTOTUNE=1 is set explicitly too: then they are "
       "only where it starts. 0: the configured values stay."},
      {"HORA_AUTOTUNE_LOG", ParamType::kString, "",
       "CSV file of every autotune window (values tried, cost, event), written by set rank 0; "
       "sets other than the global one write <file>.<set name>."},
      {"HORA_AUTOTUNE_SEED", ParamType::kInt, "0",
       "Seed of the autotune search order (the same seed and step times give the same trials)."},
      {"HORA_CACHE_CAPACITY", ParamType::kInt, "1024",
       "Response-cache entries (0 disables the cache). Must be the same on every rank (checked "
       "at start)."},
      {"HORA_STALL_WARNING_TIME_S", ParamType::kFloat, "60",
       "Seconds a tensor may wait for missing ranks before a warning names it and them."},
      {"HORA_STALL_SHUTDOWN_TIME_S", ParamType::kFloat, "300",
       "Seconds after which such a tensor fails on every rank with that report (0 = never)."},
      {"HORA_STALL_CHECK", ParamType::kBool, "1",
       "0: no stall warnings and no stall shutdown (HORA_STALL_*_TIME_S are not used); "
       "horovodrun's --no-stall-check."},
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
       "(checked at start). Set to ring or bcube, it also keeps a set across hosts on Gloo "
       "(instead of HORA_HIER_CROSS's tcp ring; the hierarchy's cross stage excepted).",
       "auto|ring|bcube"},
      {"HORA_GLOO_IFACE", ParamType::kString, "",
       "Network interface for Gloo's data plane (default: by HORA_HOSTNAME)."},
      {"HORA_SHM", ParamType::kBool, "1",
       "Collectives through shared memory (/dev/shm) when every rank of a process set runs on "
       "one host; 0 keeps everything on Gloo. Compared at set-up: if the ranks differ, the set "
       "stays "
       "on "
       "Gloo and the reason is logged."},
      {"HORA_SHM_CHUNK_BYTES", ParamType::kInt, "1048576",
       "Pipeline chunk of the shared-memory allreduce, broadcast and allgather (a multiple of "
       "64). Each rank's segment holds two slots, which reducescatter and alltoall use whole: "
       "of this size when set (autotune then leaves the chunk alone unless HORA_AUTOTUNE=1 is set "
       "too), of 4 MiB when unset, so that autotune can try chunks from 256 KiB up to 4 MiB. "
       "Unset, the chunk is 256 KiB when every rank on the host has a CPU of its own (the "
       "ranks' affinity masks together hold as many CPUs as the set has ranks) and this default "
       "when the ranks outnumber the CPUs. Across hosts it is also the chunk of the hierarchical "
       "allreduce (HORA_HIER_ALLREDUCE), whose slots are of one chunk, set or not."},
      {"HORA_RUN_ON_CONTROL_MAX_BYTES", ParamType::kInt, "1048576",
       "Allreduces of host tensors up to this many bytes (a fused group in all) run on the "
       "process set's control thread instead of its executor when the executor is idle, one "
       "thread hand-off less. Only for sets on the shared-memory data plane (one host) that "
       "negotiate through shared memory. A framework thread blocked in hora_wait also runs a "
       "larger allreduce the executor has not picked up when it is all its rank has pending "
       "and its timeout leaves time for it at 1 GB/s. 0 hands every group to the executor."},
      {"HORA_PACK_AHEAD", ParamType::kBool, "1",
       "When an allreduce of a host tensor is the only tensor pending, its first chunk is packed "
       "into shared memory around its negotiation: while it is negotiated where the ranks have "
       "a CPU each, before its request is sent where they outnumber the CPUs. Once every rank "
       "agreed, the chunk is published at once instead of packed then, and a peer that finds "
       "it packed (under the allreduce's signature) reads it without waiting for this rank. "
       "Only for sets on the shared-memory data plane (one host); never waits for a peer; 0 "
       "packs when the allreduce runs."},
      {"HORA_CALLER_DRIVES", ParamType::kBool, "1",
       "A framework thread that submits a collective sends its request itself, and one that "
       "waits for a collective does the control thread's work while no other thread does, "
       "instead of handing each step to the set's control thread: no thread hand-off on a "
       "small collective's path. On one host (negotiation through shared memory) the waiter "
       "reads the negotiation and runs a small allreduce, or a lone one of any size; across "
       "hosts (negotiation over TCP) it reads the sockets while the control thread sleeps. In "
       "a process set of one rank the submitting thread negotiates by itself. 0 leaves all of "
       "it to the control thread."},
      {"HORA_INLINE_MAX_BYTES", ParamType::kInt, "-1",
       "Collectives of host tensors whose result is up to this size travel inside the "
       "negotiation: each rank's request carries its tensor (a broadcast's only from the root), "
       "the coordinator combines them (reduces an allreduce or reducescatter, concatenates an "
       "allgather or alltoall) and its response carries the result, so the tensor needs one "
       "round trip to the coordinator and no data plane. The result is the tensor for an "
       "allreduce, reducescatter or broadcast, and every rank's tensor for an allgather or "
       "alltoall (a rank sends its own when the set's size times it fits). -1: "
       "262144 divided by the set's size (65536 where allreduce runs on a tcp ring: data plane "
       "tcp-ring+gloo, or hier with tcp-ring across), within 256..4096 for a set on the "
       "shared-memory data "
       "plane (one host) and within 256..65536 otherwise (across hosts, or HORA_SHM=0); 0 turns "
       "it off (this rank sends no tensor; it still takes a result others sent everything for, "
       "e.g. a broadcast's); at most 65536. With -1, collectives other than allreduce get a "
       "quarter of it off shared memory (across hosts, or HORA_SHM=0), where the response "
       "repeats to every rank a result the data plane sends each rank a part of. Ranks need not "
       "agree (a tensor some "
       "rank sent without its data goes through the data plane)."},
      {"HORA_SHM_MIN_BYTES", ParamType::kInt, "0",
       "Allreduce payloads smaller than this go through Gloo even when shared memory is on."},
      {"HORA_SHM_NEGOTIATION", ParamType::kBool, "1",
       "Negotiate through shared memory (request bits, cache hits, response lists) when every rank "
       "of a process set runs on one host; the TCP control plane stays for heartbeats, lost peers "
       "and aborts. 0 negotiates over TCP. Compared at set-up: if the ranks differ, the set "
       "negotiates over TCP and the reason is logged."},
      {"HORA_SPIN_US", ParamType::kInt, "100",
       "Microseconds the control thread, the executor and a thread in hora_wait poll for the next "
       "hand-off before they sleep (0 = sleep at once). When the ranks' threads outnumber the "
       "cores each poll gives the core away (sched_yield). Where a set's ranks share one CPU mask "
       "and outnumber its CPUs evenly (4 on 2), a wait for a peer in the shared-memory data plane "
       "also yields for this long before it sleeps. The executor polls GPU work for 1 ms before "
       "it sleeps, unless this is 0."},
      {"HORA_WAIT_SPIN_US", ParamType::kInt, "2000",
       "Microseconds a framework thread blocked in hora_wait on a collective of a set with "
       "peers (negotiating through shared memory or over TCP) keeps polling after the last "
       "progress, doing the set's control work meanwhile, before it sleeps; only while the host's "
       "ranks fit its "
       "cores, or no other rank's mask holds this rank's CPUs (a launcher's core per rank; "
       "otherwise HORA_SPIN_US). About one scheduler time slice: a peer rank that "
       "another busy process pushed off its core comes back within one, and a waiter that "
       "slept would then wait a slice for its own core. Never below HORA_SPIN_US; "
       "HORA_SPIN_US=0 turns it off too."},
      {"HORA_SHM_WAIT_SPIN_US", ParamType::kInt, "1000",
       "Microseconds a wait for a peer in the shared-memory data plane polls before it sleeps: "
       "without giving the CPU away where this rank's own CPU mask holds as many CPUs as the set "
       "has ranks on the host, and giving it to the rank's own threads between looks where no "
       "other rank's mask in the set holds any of its CPUs (a launcher's core per rank); each "
       "such wait may spend up to this much CPU time. A peer further "
       "behind than a few microseconds was usually pushed off its CPU by another busy process "
       "and comes back within about a time slice: beside two busy loops a 4 MiB allreduce at 2 "
       "ranks took 2-7 ms with a 22 us poll and about 0.6 ms with 0.5 ms or more "
       "(bench/results/2026-11-28-peer-spin.md). Never below HORA_SPIN_US; HORA_SPIN_US=0 turns "
       "it off too. The hierarchical allreduce's host stage does not poll this long (its waits "
       "follow the network)."},
      {"HORA_BIND_EXECUTOR", ParamType::kBool, "1",
       "Bind the executor thread of the global process set (where its collectives copy and "
       "reduce) to one CPU of the process's affinity mask, picked by local rank: mask[local_rank "
       "mod its size], or the next one that no other hora runtime on the host holds "
       "(HORA_CPU_CLAIM_DIR); unbound when every one is held. Skipped when the mask holds one "
       "CPU (a launcher bound the process) or the host runs one rank. 0: the thread runs "
       "wherever the scheduler puts it."},
      {"HORA_SHM_CLAIM_LINES", ParamType::kBool, "1",
       "Where the ranks' CPU masks together hold a CPU per rank on the host (compared at "
       "set-up), a rank that has read part of a peer's shared-memory slot that no other rank "
       "reads stores each of its cache lines back unchanged, so that the owner's next write "
       "takes each line over in one transfer instead of first invalidating the reader's copy. "
       "On an AMD EPYC VM copying 64 KiB into a slot the peer had read took 7-31 us against "
       "1.6-4.6 us, and 2-rank allreduces from 64 KiB to 4 MiB took 7-62% less time "
       "(bench/results/2026-11-28-claim-lines.md). Where ranks share CPUs it is not done (a "
       "pure extra pass there), counting the set's ranks on other hosts that share this "
       "machine's kernel (emulated or container hosts). 0: never."},
      {"HORA_HOME_CALLER", ParamType::kBool, "1",
       "Where a process set's ranks on a host share one CPU mask and outnumber its CPUs evenly "
       "(4 ranks on 2 CPUs, not 3; compared at set-up): a framework thread entering hora_wait on "
       "another CPU than its rank's (mask[local_rank mod its size], the executor's pick) is moved "
       "there and keeps its mask (a placement, not a binding; at most once per 10 ms per process "
       "set). Polling ranks never sleep, so a placement with three ranks on one CPU and one on the "
       "other lasted 30-150 ms before the scheduler undid it. 0: the scheduler alone places the "
       "thread."},
      {"HORA_CPU_CLAIM_DIR", ParamType::kString, "/dev/shm",
       "Directory where the runtimes on a host claim their executors' CPUs "
       "(HORA_BIND_EXECUTOR), through a lock file per CPU (hora-cpu-<cpu>.lock, left in place), "
       "so that two jobs on one host do not bind to the same CPUs. Jobs in separate containers "
       "see each other only through a directory they share. Empty: no claims, CPUs by local "
       "rank alone."},
      {"HORA_HIER_ALLREDUCE", ParamType::kString, "auto",
       "Allreduce of a process set that spans several hosts with several ranks on each: auto and "
       "hier reduce inside each host through shared memory, allreduce across hosts "
       "(HORA_HIER_CROSS) "
       "(every local rank owns a slice, exchanged with the same local rank of the other hosts) "
       "and gather back through shared memory; flat keeps the one Gloo ring over all ranks. "
       "Needs the same number of ranks on every host and HORA_SHM=1 (else flat, logged). "
       "Compared at start: must be the same on every rank.",
       "auto|hier|flat"},
      {"HORA_HIER_CROSS", ParamType::kString, "tcp",
       "The hierarchical allreduce's cross-host stage: tcp, a ring over hora's own sockets that "
       "the waiting thread drives (it polls for HORA_SPIN_US, then sleeps in poll), or gloo, a "
       "Gloo allreduce (each wait is a wake-up of Gloo's device thread, then of the waiting "
       "thread). Also every other collective of a set across hosts (up to 8 ranks, measured "
       "up to 4; not under HORA_HIER_ALLREDUCE=flat or a set HORA_GLOO_ALGORITHM, which keep "
       "Gloo): tcp runs reducescatter, allgather, broadcast, barrier and alltoall (over a mesh "
       "beside the ring) on such a ring over all ranks in set order, and the allreduce too "
       "where the set stays flat (one rank per host, hosts with different numbers of ranks, "
       "HORA_SHM=0). Both bind to HORA_GLOO_IFACE's address when it is set. "
       "Compared at start: must be the same on every rank (else the hierarchy and the flat ring "
       "fall back to Gloo, logged).",
       "tcp|gloo"},
      {"HORA_HIER_COLLECTIVE_MIN_BYTES", ParamType::kInt, "1048576",
       "With the hierarchy (HORA_HIER_ALLREDUCE), allgather and reducescatter payloads (bytes, "
       "over all ranks) from which they run hierarchically too: across hosts with the ranks of "
       "one local index, inside each host through shared memory, so each host's link carries "
       "(H-1)/H of the payload once; smaller ones run on the ring over all ranks. Compared at "
       "start: must be the same on every rank."},
      {"HORA_HIER_OVERLAP", ParamType::kBool, "1",
       "Hierarchical allreduce: 1 lets each shared-memory chunk cross hosts while the next chunk "
       "is reduced inside the host, and runs hierarchical allgathers and reducescatters in "
       "pieces of 512 KiB per local rank (up to 8), each crossing hosts beside the local stage of "
       "the next; 0 runs the stages one after the other."},
      {"HORA_HOST_ID", ParamType::kString, "",
       "Test-only: the identity that tells which ranks share a host (shared memory, hierarchy, "
       "point-to-point). Empty: the host name and kernel boot id; 'address': this rank's "
       "HORA_HOSTNAME (tests as threads give ranks different loopback addresses to emulate "
       "hosts); anything else: that literal value (tests as processes)."},
      {"HORA_P2P_RING_BYTES", ParamType::kInt, "1048576",
       "Point-to-point (send/recv) ring per sending peer in each rank's shared-memory inbox (a "
       "power of two, at least 4096); created on a set's first send or receive."},
      {"HORA_P2P_EAGER_BYTES", ParamType::kInt, "65536",
       "Point-to-point messages up to this size travel with their header and are buffered by "
       "the receiver if it has not posted the receive yet; larger ones wait for it."},
      {"HORA_P2P_FAST_BYTES", ParamType::kInt, "32",
       "Point-to-point messages up to this size (at most 32) between ranks of one host go "
       "through the fast box, one cache line each way, instead of the ring; 0 turns it off."},
      {"HORA_P2P_TRANSPORT", ParamType::kString, "auto",
       "Point-to-point between two ranks: auto (a shared-memory inbox when they share a host, else "
       "a TCP connection), shm (shared memory only: ranks on different hosts cannot exchange) or "
       "tcp (always TCP, also on one host).",
       "auto|shm|tcp"},
      {"HORA_P2P_SPIN_US", ParamType::kInt, "50",
       "Microseconds a thread waiting on a send or receive polls before it sleeps (latency "
       "against CPU use)."},
      {"HORA_GPU_PLUGIN", ParamType::kString, "",
       "Path of the GPU plugin (libhora_cuda.so); empty: next to libhora, then the build tree, "
       "then the loader's search path. Loaded only when a GPU tensor appears."},
      {"HORA_GPU_BACKEND", ParamType::kString, "auto",
       "GPU tensors: auto (the NCCL communicator where NCCL has the dtype and every rank of the "
       "process set has its own GPU, checked once per set; else staging through host memory and "
       "the CPU data plane), nccl (the communicator without the sharing check), or gloo (always "
       "staging). Must be the same on every rank (checked at start).",
       "auto|nccl|gloo"},
      {"HORA_GPU_PIPELINE", ParamType::kBool, "1",
       "GPU collectives through the communicator (NCCL) are launched one after another on the "
       "process set's stream; the executor completes each when its event fires, while it "
       "launches the next (as NCCL streams work). 0 waits for each before starting the next."},
      {"HORA_LOG_LEVEL", ParamType::kString, "warning",
       "trace, debug, info, warning, error or off.", "trace|debug|info|warning|error|off"},
      {"HORA_TELEMETRY", ParamType::kBool, "1",
       "0 turns metrics, the straggler ranking, the flight recorder and the timeline off (for "
       "measuring what they cost: bench/observability_overhead.sh)."},
      {"HORA_FLIGHT_RECORDER_ENTRIES", ParamType::kInt, "1024",
       "Collectives each rank keeps in its flight recorder (a fixed ring, always on; 0 turns it "
       "off). Dumped on a failure, a stall warning and SIGUSR1."},
      {"HORA_FLIGHT_RECORDER_DIR", ParamType::kString, "",
       "Where flight recorder dumps and hang reports go (default: /tmp/hora-<uid>; horarun sets "
       "one folder per job)."},
      {"HORA_FLIGHT_RECORDER_SIGUSR1", ParamType::kBool, "1",
       "Dump every process set's flight recorder on SIGUSR1 (installed only when the process "
       "has no SIGUSR1 handler of its own)."},
      {"HORA_METRICS_INTERVAL_S", ParamType::kFloat, "0",
       "Seconds between one-line metrics summaries in the log (and rewrites of the Prometheus "
       "file); 0 = never."},
      {"HORA_METRICS_PROMETHEUS_DIR", ParamType::kString, "",
       "Folder for hora-<set>-rank<R>.prom (Prometheus text format, for a node exporter's "
       "textfile collector), rewritten every HORA_METRICS_INTERVAL_S (10 s if that is 0)."},
      {"HORA_TIMELINE", ParamType::kString, "",
       "Record a timeline (Chrome trace JSON: Perfetto, chrome://tracing) of every rank into this "
       "file from the start (hora_timeline_start / hvd.start_timeline at run time)."},
      {"HORA_TIMELINE_MARK_CYCLES", ParamType::kBool, "0",
       "Mark every negotiation cycle (response list applied) in the timeline."},
      {"HORA_TIMELINE_MAX_MB", ParamType::kInt, "1024",
       "Megabytes of timeline each rank writes at most; later events are dropped with a note."},
      {"HORA_TIMELINE_BUFFER_EVENTS", ParamType::kInt, "65536",
       "Timeline events a rank buffers between writes (every 100 ms); more are dropped with a "
       "note."},
      {"HORA_STRAGGLER_WINDOW", ParamType::kInt, "256",
       "Tensors the straggler ranking looks back over (who submitted last, and how long the "
       "others waited)."},
  };
  return kRegistry;
}

namespace {

bool horovodBool(const std::string& in, bool* out) {
  // Horovod reads its flags with strtol: any non-zero integer is true.
  if (in == "true" || in == "false") {
    *out = in == "true";
    return true;
  }
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(in.c_str(), &end, 10);
  if (in.empty() || errno != 0 || *end != '\0') return false;
  *out = v != 0;
  return true;
}

bool asBool(const std::string& in, std::string* out, std::string* error) {
  bool b = false;
  if (!horovodBool(in, &b)) {
    *error = "is not an integer (Horovod reads 0 as off, any other integer as on)";
    return false;
  }
  *out = b ? "1" : "0";
  return true;
}

// HOROVOD_STALL_CHECK_DISABLE=1 -> HORA_STALL_CHECK=0; =0 asks for nothing.
bool stallDisable(const std::string& in, std::string* out, std::string* error) {
  bool b = false;
  if (!horovodBool(in, &b)) {
    *error = "is not an integer (1 disables the stall check)";
    return false;
  }
  *out = b ? "0" : "";
  return true;
}

// HOROVOD_HIERARCHICAL_ALLREDUCE=1 -> HORA_HIER_ALLREDUCE=hier; =0 asks for
// nothing: Horovod's 0 is its default, and hora's default (auto) already
// keeps one flat ring where the hierarchy does not apply.
bool hierAllreduce(const std::string& in, std::string* out, std::string* error) {
  bool b = false;
  if (!horovodBool(in, &b)) {
    *error = "is not an integer (1 asks for the hierarchical allreduce)";
    return false;
  }
  *out = b ? "hier" : "";
  return true;
}

// Horovod's levels are hora's, plus fatal (hora's nearest: error).
bool logLevel(const std::string& in, std::string* out, std::string*) {
  std::string v;
  for (char c : in) v += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  *out = v == "fatal" ? "error" : v;
  return true;
}

}  // namespace

const std::vector<HorovodAlias>& horovodAliases() {
  static const std::vector<HorovodAlias> kAliases = {
      {"HOROVOD_RANK", "HORA_RANK", nullptr, "same meaning"},
      {"HOROVOD_SIZE", "HORA_SIZE", nullptr, "same meaning"},
      {"HOROVOD_LOCAL_RANK", "HORA_LOCAL_RANK", nullptr, "same meaning"},
      {"HOROVOD_LOCAL_SIZE", "HORA_LOCAL_SIZE", nullptr, "same meaning"},
      {"HOROVOD_CROSS_RANK", "HORA_CROSS_RANK", nullptr, "same meaning"},
      {"HOROVOD_CROSS_SIZE", "HORA_CROSS_SIZE", nullptr, "same meaning"},
      {"HOROVOD_HOSTNAME", "HORA_HOSTNAME", nullptr,
       "the name other ranks reach this one by (horovodrun sets the -H host)"},
      {"HOROVOD_FUSION_THRESHOLD", "HORA_FUSION_THRESHOLD_BYTES", nullptr, "bytes in both"},
      {"HOROVOD_CYCLE_TIME", "HORA_CYCLE_TIME_MS", nullptr, "milliseconds in both"},
      {"HOROVOD_CACHE_CAPACITY", "HORA_CACHE_CAPACITY", nullptr, "entries in both"},
      {"HOROVOD_STALL_CHECK_DISABLE", "HORA_STALL_CHECK", stallDisable,
       "1 sets HORA_STALL_CHECK=0; 0 changes nothing"},
      {"HOROVOD_STALL_CHECK_TIME_SECONDS", "HORA_STALL_WARNING_TIME_S", nullptr, "seconds in both"},
      {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "HORA_STALL_SHUTDOWN_TIME_S", nullptr,
       "seconds in both, 0 = never (Horovod's default; hora's is 300)"},
      {"HOROVOD_LOG_LEVEL", "HORA_LOG_LEVEL", logLevel,
       "case-insensitive; fatal becomes error (hora has no fatal level)"},
      {"HOROVOD_GLOO_TIMEOUT_SECONDS", "HORA_PEER_TIMEOUT_S", nullptr,
       "seconds; hora's peer timeout bounds each data-plane wait and declares a silent peer lost"},
      {"HOROVOD_GLOO_IFACE", "HORA_GLOO_IFACE", nullptr, "same meaning"},
      {"HOROVOD_START_TIMEOUT", "HORA_START_TIMEOUT_S", nullptr,
       "seconds (Horovod's launcher reads it; hora's ranks do)"},
      {"HOROVOD_ELASTIC", "HORA_ELASTIC", asBool, "elastic mode; needs horarun's store"},
      {"HOROVOD_ELASTIC_TIMEOUT", "HORA_ELASTIC_TIMEOUT_S", nullptr, "seconds in both"},
      {"HOROVOD_TIMELINE", "HORA_TIMELINE", nullptr,
       "a file path in both; hora's trace holds every rank's events"},
      {"HOROVOD_TIMELINE_MARK_CYCLES", "HORA_TIMELINE_MARK_CYCLES", nullptr, "0/1 in both"},
      {"HOROVOD_AUTOTUNE", "HORA_AUTOTUNE", asBool,
       "0/1 in both; hora's autotune is on by default (docs/performance.md)"},
      {"HOROVOD_AUTOTUNE_LOG", "HORA_AUTOTUNE_LOG", nullptr,
       "a CSV file in both (hora's columns: window, search, event, values, cost)"},
      {"HOROVOD_AUTOTUNE_WARMUP_SAMPLES", nullptr, nullptr,
       "hora's tuner discards one step per search and needs no setting"},
      {"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", nullptr, nullptr,
       "hora's tuner measures one training step per sample, found from the tensor names"},
      {"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", nullptr, nullptr,
       "hora's tuner is a coordinate search, not Bayesian optimisation"},
      {"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", nullptr, nullptr,
       "hora's tuner is a coordinate search, not Bayesian optimisation"},
      {"HOROVOD_HIERARCHICAL_ALLREDUCE", "HORA_HIER_ALLREDUCE", hierAllreduce,
       "1 sets HORA_HIER_ALLREDUCE=hier (shared memory inside each host, TCP across; CPU "
       "tensors); 0 changes nothing (hora's auto is hierarchical only where a set spans hosts "
       "with several ranks on each)"},
      {"HOROVOD_HIERARCHICAL_ALLGATHER", nullptr, nullptr,
       "hora has no hierarchical allgather (one host: shared memory; else Gloo)"},
      {"HOROVOD_TORUS_ALLREDUCE", nullptr, nullptr, "hora has no torus allreduce"},
      {"HOROVOD_LOG_HIDE_TIME", nullptr, nullptr, "hora's log lines always carry the time"},
      {"HOROVOD_NUM_NCCL_STREAMS", nullptr, nullptr, "hora uses one NCCL stream per process set"},
      {"HOROVOD_THREAD_AFFINITY", nullptr, nullptr, "hora does not pin its threads"},
      {"HOROVOD_DISABLE_GROUP_FUSION", nullptr, nullptr,
       "hora fuses each group with other ready tensors"},
      {"HOROVOD_BATCH_D2D_MEMCOPIES", nullptr, nullptr, "no such switch in hora"},
      {"HOROVOD_ENABLE_ASYNC_COMPLETION", nullptr, nullptr,
       "hora completes GPU requests by events in any case"},
      {"HOROVOD_DISABLE_NVTX_RANGES", nullptr, nullptr, "hora emits no NVTX ranges"},
      {"HOROVOD_ENABLE_XLA_OPS", nullptr, nullptr, "TensorFlow only"},
      {"HOROVOD_DYNAMIC_PROCESS_SETS", nullptr, nullptr,
       "hora's process sets can always be added and removed after init"},
      {"HOROVOD_ADASUM_MPI_CHUNK_SIZE", nullptr, nullptr, "hora has no Adasum"},
      {"HOROVOD_MPI_THREADS_DISABLE", nullptr, nullptr, "hora uses no MPI"},
      {"HOROVOD_CCL_CACHE", nullptr, nullptr, "hora uses no oneCCL"},
      {"HOROVOD_CONTROLLER", nullptr, nullptr,
       "hora always uses its own TCP control plane (like Horovod's gloo)"},
      {"HOROVOD_CPU_OPERATIONS", nullptr, nullptr,
       "hora's CPU data plane is Gloo, or shared memory on one host"},
      {"HOROVOD_GLOO_RENDEZVOUS_ADDR", nullptr, nullptr,
       "horovodrun's HTTP rendezvous is not a hora store: start with horarun, or set "
       "HORA_STORE_ADDR"},
      {"HOROVOD_GLOO_RENDEZVOUS_PORT", nullptr, nullptr,
       "horovodrun's HTTP rendezvous is not a hora store (see HORA_STORE_PORT)"},
  };
  return kAliases;
}

namespace {

const ParamSpec* findSpec(const char* name) {
  for (const auto& s : paramRegistry())
    if (std::strcmp(s.name, name) == 0) return &s;
  return nullptr;
}

const HorovodAlias* findAlias(const char* name) {
  for (const auto& a : horovodAliases())
    if (std::strcmp(a.horovodName, name) == 0) return &a;
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
      // Not nan or inf (strtod reads both): every use converts to a duration.
      if (value.empty() || errno != 0 || *end != '\0' || !std::isfinite(v)) return bad("a number");
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
  using Outcome = HorovodUse::Outcome;
  for (const auto& spec : paramRegistry()) {
    const char* v = lookup ? lookup(spec.name) : nullptr;
    std::string value = v ? std::string(v) : std::string(spec.defaultValue);
    if (v) {
      Status s = validate(spec, value);
      if (!s.isOk()) return s;
    }
    bool set = v != nullptr;
    // Horovod's names for this parameter: used only when HORA_* is not set,
    // the first one set wins; every one set is reported.
    std::string setBy = v ? spec.name : "";
    for (const auto& a : horovodAliases()) {
      if (!a.horaName || std::strcmp(a.horaName, spec.name) != 0) continue;
      const char* hv = lookup ? lookup(a.horovodName) : nullptr;
      if (!hv) continue;
      HorovodUse use{a.horovodName, hv, spec.name, Outcome::kOverridden, ""};
      if (!setBy.empty()) {
        use.detail = setBy == spec.name ? setBy + " is set" : setBy + " sets " + spec.name;
        p.horovodUses_.push_back(use);
        continue;
      }
      std::string converted = hv, why;
      if (a.convert && !a.convert(hv, &converted, &why))
        return invalidArgument(std::string(a.horovodName) + "='" + hv + "' " + why +
                               " (hora reads it as " + spec.name + ": " + a.note +
                               "; unset it or set " + spec.name + ")");
      if (converted.empty()) {
        use.outcome = Outcome::kNoEffect;
        use.detail = "nothing to change";
        p.horovodUses_.push_back(use);
        continue;
      }
      Status s = validate(spec, converted);
      if (!s.isOk())
        return invalidArgument(std::string(a.horovodName) + "='" + hv + "', read as " + spec.name +
                               ": " + s.message());
      value = converted;
      set = true;
      setBy = a.horovodName;
      use.outcome = Outcome::kApplied;
      use.detail = converted;
      p.horovodUses_.push_back(use);
    }
    p.values_[spec.name] = spec.choices ? choice(spec, value) : value;
    p.set_[spec.name] = set;
  }
  for (const auto& a : horovodAliases()) {
    if (a.horaName) continue;
    const char* hv = lookup ? lookup(a.horovodName) : nullptr;
    if (hv) p.horovodUses_.push_back({a.horovodName, hv, "", Outcome::kIgnored, a.note});
  }
  return p;
}

std::string Params::horovodSummary() const {
  if (horovodUses_.empty()) return "";
  std::string line = "Horovod variables:";
  const char* sep = " ";
  for (const auto& u : horovodUses_) {
    line += sep;
    sep = "; ";
    line += u.horovodName + "=" + u.value;
    switch (u.outcome) {
      case HorovodUse::Outcome::kApplied:
        line += " -> " + u.horaName + "=" + u.detail;
        break;
      case HorovodUse::Outcome::kOverridden:
        line += " not used (" + u.detail + ")";
        break;
      case HorovodUse::Outcome::kNoEffect:
        line += " (" + u.horaName + ": " + u.detail + ")";
        break;
      case HorovodUse::Outcome::kIgnored:
        line += " IGNORED (" + u.detail + ")";
        break;
    }
  }
  return line + " (docs/params.md)";
}

Result<Params> Params::fromEnvironment() {
  return parse([](const char* name) -> const char* { return std::getenv(name); });
}

Result<Params> Params::fromMap(const std::map<std::string, std::string>& values) {
  for (const auto& kv : values) {
    if (!findSpec(kv.first.c_str()) && !findAlias(kv.first.c_str()))
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
  os << "| name | type | default | meaning | Horovod's name |\n|---|---|---|---|---|\n";
  for (const auto& s : paramRegistry()) {
    const char* t = s.type == ParamType::kInt     ? "int"
                    : s.type == ParamType::kFloat ? "float"
                    : s.type == ParamType::kBool  ? "bool"
                                                  : "string";
    std::string aliases;
    for (const auto& a : horovodAliases())
      if (a.horaName && std::strcmp(a.horaName, s.name) == 0)
        aliases += (aliases.empty() ? "`" : ", `") + std::string(a.horovodName) + "`";
    os << "| `" << s.name << "` | " << t << " | `" << s.defaultValue << "` | " << s.doc << " | "
       << aliases << " |\n";
  }
  os << "\n## Horovod's variables\n\n"
        "hora reads these HOROVOD_* names too. A HORA_* parameter that is set wins over its "
        "Horovod alias; each process logs one line (level warning) naming every HOROVOD_* "
        "variable it found and what became of it. Variables with no hora equivalent are "
        "ignored, and that line says so.\n\n"
        "| Horovod variable | hora | note |\n|---|---|---|\n";
  for (const auto& a : horovodAliases())
    os << "| `" << a.horovodName << "` | "
       << (a.horaName ? "`" + std::string(a.horaName) + "`" : std::string("ignored")) << " | "
       << a.note << " |\n";
  return os.str();
}

}  // namespace hora
