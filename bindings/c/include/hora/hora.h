/*
 * hora.h: the C ABI of libhora, the only header hora installs.
 *
 * What it is for: every framework (PyTorch, JAX, NumPy through ctypes, a plain
 * C program) reaches hora through these functions; tensors are described as
 * DLPack DLTensors, so no framework headers or C++ types cross this boundary.
 *
 * Threads: any thread may call any function once a runtime exists. Collective
 * calls enqueue work and return a request handle; hora's background threads
 * negotiate and run it. When every rank of a process set is on one host
 * (HORA_CALLER_DRIVES, on by default), the calling thread does some of that
 * work itself while no hora thread does: a collective call sends its request
 * and may run a small allreduce it completed the agreement of (never one
 * whose completion runs a callback), and hora_wait may run any small
 * allreduce of the set while it waits, and a larger one that is all the
 * rank has pending when its timeout leaves time for it (at 1 GB/s). An
 * allreduce that is all the rank has pending may have the first chunk of
 * its input (up to HORA_SHM_CHUNK_BYTES) copied into shared memory inside
 * the call that submits it (HORA_PACK_AHEAD).
 * Completion callbacks run on a hora
 * thread or inside hora_wait: they must be short and must not call hora_wait
 * or any other blocking hora function.
 *
 * Errors: every function returns a hora_status_t (0 = success). On failure a
 * one-line message naming what failed, where (rank, tensor, op) and what to
 * try is available from hora_last_error_message() on the same thread until
 * that thread's next hora call. A request that fails asynchronously stores its
 * status and message on the request; hora_wait/hora_test copy the message into
 * the calling thread's last-error slot when they report it.
 *
 * Compatibility: C99; enums are int32_t values that are only ever appended;
 * config/options structs begin with struct_size and only grow at the end;
 * hora_init() checks the header version against the library version.
 */
#ifndef HORA_HORA_H_
#define HORA_HORA_H_

#include <dlpack/dlpack.h>
#include <stddef.h>
#include <stdint.h>

#include "hora/version.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(HORA_BUILDING_LIBRARY)
#define HORA_API __attribute__((visibility("default")))
#else
#define HORA_API
#endif

/* ---- status codes (values are ABI: append only) ---- */
typedef int32_t hora_status_t;
#define HORA_SUCCESS 0
#define HORA_ERR_INVALID_ARGUMENT 1 /* bad argument; nothing else was disturbed */
#define HORA_ERR_INVALID_USAGE 2    /* wrong moment: duplicate name in flight, wrong state */
#define HORA_ERR_NOT_INITIALIZED 3
#define HORA_ERR_SHUT_DOWN 4      /* the runtime shut down (or is shutting down) */
#define HORA_ERR_SYSTEM 5         /* an OS call failed (socket, memory) */
#define HORA_ERR_BACKEND 6        /* the data-plane library (Gloo) failed */
#define HORA_ERR_REMOTE 7         /* a peer rank was lost or failed */
#define HORA_ERR_TIMEOUT 8        /* a deadline passed; for hora_wait: still running */
#define HORA_IN_PROGRESS 9        /* not an error: still running */
#define HORA_ERR_NOT_SUPPORTED 10 /* e.g. GPU memory without a GPU backend */
#define HORA_ERR_MISMATCH 11      /* ranks disagree about a tensor (shape, dtype, op...) */
#define HORA_ERR_AUTH 12          /* rendezvous rejected the job secret */
#define HORA_ERR_PROTOCOL 13      /* malformed message on the wire */
#define HORA_ERR_INTERNAL 14      /* a bug in hora: please report it */
#define HORA_ERR_MEMBERSHIP 15    /* elastic mode: a member was lost or joins; restore, re-form */
#define HORA_STATUS_COUNT 16

/* ---- reduction ops ---- */
typedef int32_t hora_reduce_op_t;
#define HORA_OP_SUM 0
#define HORA_OP_AVERAGE 1
#define HORA_OP_MIN 2
#define HORA_OP_MAX 3
#define HORA_OP_PRODUCT 4

/* ---- opaque handles ---- */
typedef struct hora_runtime_s* hora_runtime_t;
typedef struct hora_process_set_s* hora_process_set_t;
typedef struct hora_request_s* hora_request_t;

/* ---- configuration ----
 * Zero/NULL/-1 fields mean "take it from the HORA_* environment parameter,
 * else the default" (see docs/params.md). Fill with hora_config_init(). */
typedef struct hora_config {
  uint32_t struct_size; /* sizeof(hora_config_t) of the caller's header */
  int32_t rank;         /* -1: HORA_RANK, or OMPI_/PMI_/SLURM_ variables */
  int32_t size;         /* -1: HORA_SIZE, ... */
  int32_t local_rank;   /* -1: HORA_LOCAL_RANK, else derived */
  int32_t local_size;
  int32_t cross_rank;
  int32_t cross_size;
  const char* store_addr; /* NULL: HORA_STORE_ADDR */
  int32_t store_port;     /* 0: HORA_STORE_PORT */
  int32_t store_external; /* -1: HORA_STORE_EXTERNAL; 1: a launcher hosts the store */
  const char* secret;     /* NULL: HORA_SECRET or HORA_SECRET_FILE */
  const char* hostname;   /* NULL: HORA_HOSTNAME; address peers use to reach this rank */
  /* Tunables; negative means "from environment/default". */
  double cycle_time_ms;
  int64_t fusion_threshold_bytes;
  int32_t cache_capacity;
  double stall_warning_time_s;
  double stall_shutdown_time_s;
  double peer_timeout_s;
  double start_timeout_s;
  const char* log_level; /* NULL: HORA_LOG_LEVEL */
  /* Since 0.3: elastic mode (docs/elastic.md). */
  int32_t elastic;          /* -1: HORA_ELASTIC; 1: lost members -> HORA_ERR_MEMBERSHIP */
  const char* worker_id;    /* NULL: HORA_WORKER_ID; stable id of this process in the job */
  int32_t elastic_newcomer; /* -1: HORA_ELASTIC_NEWCOMER; 1: join the next epoch */
} hora_config_t;

/* Fills the caller's struct with the defaults: `size` is sizeof the caller's
 * hora_config_t, so a library newer than the caller's header never writes
 * past it. Call it through the macro, which passes that size. */
HORA_API void hora_config_init_sized(hora_config_t* config, size_t size);
#define hora_config_init(config) hora_config_init_sized((config), sizeof(*(config)))

/* ---- lifecycle ---- */
HORA_API hora_status_t hora_init_versioned(const hora_config_t* config, hora_runtime_t* out,
                                           int32_t header_major, int32_t header_minor);
/* Starts a runtime: rendezvous with every rank, start the background
 * threads. Blocks until every rank arrived or start_timeout_s passed.
 * config may be NULL (everything from the environment). */
static inline hora_status_t hora_init(const hora_config_t* config, hora_runtime_t* out) {
  return hora_init_versioned(config, out, HORA_VERSION_MAJOR, HORA_VERSION_MINOR);
}
/* Completes every pending request with HORA_ERR_SHUT_DOWN, stops the
 * threads and frees the runtime. Requests stay valid until freed. Safe to
 * call once per runtime; NULL is ignored. */
HORA_API hora_status_t hora_shutdown(hora_runtime_t runtime);

/* ---- membership (docs/elastic.md) ----
 * Every runtime belongs to one membership epoch; keys it publishes are scoped
 * by it, so re-init never reads an earlier runtime's keys. */
HORA_API hora_status_t hora_epoch(hora_runtime_t runtime, int64_t* out);
/* Elastic mode: *out = 1 when a worker waits to join the next epoch. Ask on
 * one rank and broadcast the answer: every rank must re-form together. */
HORA_API hora_status_t hora_membership_pending(hora_runtime_t runtime, int32_t* out);
/* Elastic mode: shuts *runtime down (pending requests fail), forms the next
 * epoch with the other workers that arrive, and replaces *runtime with the
 * new runtime (rank and size may differ). On error *runtime is NULL (the old
 * one is freed) and the message says what to do. */
HORA_API hora_status_t hora_reform(hora_runtime_t* runtime);

HORA_API void hora_get_version(int32_t* major, int32_t* minor, int32_t* patch);
HORA_API const char* hora_status_string(hora_status_t status);
HORA_API const char* hora_last_error_message(void);

/* ---- identity ---- */
HORA_API hora_status_t hora_rank(hora_runtime_t runtime, int32_t* out);
HORA_API hora_status_t hora_size(hora_runtime_t runtime, int32_t* out);
HORA_API hora_status_t hora_local_rank(hora_runtime_t runtime, int32_t* out);
HORA_API hora_status_t hora_local_size(hora_runtime_t runtime, int32_t* out);
HORA_API hora_status_t hora_cross_rank(hora_runtime_t runtime, int32_t* out);
HORA_API hora_status_t hora_cross_size(hora_runtime_t runtime, int32_t* out);

/* ---- process sets ----
 * The global set contains every rank. hora_process_set_create is called by
 * every member with the same sorted rank list (non-members need not call
 * it); it blocks until all members joined or start_timeout_s passed. Each
 * set has its own coordinator (its lowest rank) and can be used concurrently
 * with the others. Ranks and roots in collectives are ranks within the set. */
HORA_API hora_status_t hora_global_process_set(hora_runtime_t runtime, hora_process_set_t* out);
HORA_API hora_status_t hora_process_set_create(hora_runtime_t runtime, const int32_t* ranks,
                                               int32_t nranks, hora_process_set_t* out);
HORA_API hora_status_t hora_process_set_destroy(hora_process_set_t set);
HORA_API hora_status_t hora_process_set_rank(hora_process_set_t set, int32_t* out);
HORA_API hora_status_t hora_process_set_size(hora_process_set_t set, int32_t* out);

/* ---- collective options ---- */
/* Called on a hora thread, or inside a hora_wait of the same process set,
 * when a request completes (success or failure); never inside the call that
 * submitted it. */
typedef void (*hora_callback_t)(void* user, hora_request_t request, hora_status_t status);
/* Allocates output memory for results whose size is known only after
 * negotiation (allgather, alltoall, reducescatter). Fill *data with a
 * pointer to nbytes bytes owned by the caller, in the input's memory (CPU
 * memory for a CPU input, device memory on the input's GPU for a GPU input),
 * return 0; non-zero fails the request (this rank still takes part, so its
 * peers are not disturbed). Called on a hora thread (the process set's
 * executor), never inside the call that submitted the request. */
typedef int (*hora_alloc_t)(void* user, int32_t ndim, const int64_t* shape, DLDataType dtype,
                            size_t nbytes, void** data);

typedef struct hora_options {
  uint32_t struct_size;
  hora_process_set_t process_set; /* NULL: the global set */
  /* Must be the same on every rank; NULL: "<op>.noname.<n>" by call order.
   * One name, one request in flight per set, whatever its kind: submitting a
   * name still in flight (not yet agreed by every rank) fails at once with
   * HORA_ERR_INVALID_USAGE and creates no request. (hora.torch prefixes the
   * kind, "allreduce.<name>", as Horovod does.) */
  const char* name;
  hora_reduce_op_t op; /* allreduce / reducescatter; default HORA_OP_SUM */
  double prescale;     /* multiply inputs before reducing (default 1) */
  double postscale;    /* multiply results after reducing (default 1) */
  int32_t root;        /* broadcast root, rank within the set */
  hora_callback_t callback;
  void* callback_user;
  hora_alloc_t alloc; /* NULL: results go to a library-owned buffer (hora_request_output) */
  void* alloc_user;
  /* GPU tensors: a cudaEvent_t (as void*) recorded after the kernels that
   * produce the input; hora's stream waits for it before reading. NULL: the
   * input must be ready when the collective runs (e.g. the producing stream
   * was synchronized before the call). Ignored for CPU tensors. */
  void* ready_event;
  /* GPU outputs allocated through alloc: a cudaEvent_t (as void*) that the
   * alloc callback records, before it returns, on the stream the memory was
   * allocated for; hora's stream waits for it before writing the output. A
   * caching allocator (torch's, CuPy's) may hand out a block whose earlier
   * use on that stream is still queued: without this event hora could write
   * the block while those kernels still read it. NULL: the memory alloc
   * returns may be written at once. Ignored for CPU tensors and for outputs
   * hora allocates itself, and by a library older than the field. */
  void* alloc_event;
} hora_options_t;

/* As hora_config_init_sized, for options; call it through the macro. (The
 * exported functions hora_config_init and hora_options_init, for programs
 * built against headers before 0.5.1, fill the 0.5.0 layout only.) */
HORA_API void hora_options_init_sized(hora_options_t* options, size_t size);
#define hora_options_init(options) hora_options_init_sized((options), sizeof(*(options)))
HORA_API void(hora_config_init)(hora_config_t* config);    /* 0.5.0 layout only */
HORA_API void(hora_options_init)(hora_options_t* options); /* 0.5.0 layout only */

/* ---- collectives (asynchronous) ----
 * Inputs are read and outputs written on hora threads after the call
 * returns: keep them alive and unmodified until the request completes.
 * Tensors must be CPU memory or CUDA device memory (served through the GPU
 * plugin libhora_cuda.so, loaded on first use; outputs are allocated on the
 * input's device), compact row-major (strides NULL or matching), with
 * data + byte_offset aligned to the element size,
 * with a supported dtype: uint8, int8, int16, int32, int64, float16, bfloat16,
 * float32, float64, bool, and a byte size below 2^63 (a shape whose element
 * count or byte size would overflow is HORA_ERR_INVALID_ARGUMENT, refused
 * before any memory is read). On any non-success return no request was
 * created. */

/* out may equal in (in place) and has in's shape and dtype. Same shape and
 * dtype on every rank. */
HORA_API hora_status_t hora_allreduce_async(hora_runtime_t runtime, const DLTensor* in,
                                            DLTensor* out, const hora_options_t* options,
                                            hora_request_t* request);
/* n tensors completed as one request; they are negotiated and fused together.
 * Names are "<options->name>.<i>" (or generated). */
HORA_API hora_status_t hora_grouped_allreduce_async(hora_runtime_t runtime, int32_t n,
                                                    const DLTensor* const* in, DLTensor* const* out,
                                                    const hora_options_t* options,
                                                    hora_request_t* request);
/* Concatenates along dimension 0; the first dimension may differ per rank,
 * the others must agree. Output: library-owned or through options->alloc. */
HORA_API hora_status_t hora_allgather_async(hora_runtime_t runtime, const DLTensor* in,
                                            const hora_options_t* options, hora_request_t* request);
/* In place: the root's tensor is copied into every rank's tensor. */
HORA_API hora_status_t hora_broadcast_async(hora_runtime_t runtime, DLTensor* tensor,
                                            const hora_options_t* options, hora_request_t* request);
/* splits[r] rows (dimension 0) go to rank r; splits NULL = equal split (dim 0
 * must divide by the set size). nsplits must equal the set size. The
 * received splits are available from hora_request_received_splits. */
HORA_API hora_status_t hora_alltoall_async(hora_runtime_t runtime, const DLTensor* in,
                                           const int64_t* splits, int32_t nsplits,
                                           const hora_options_t* options, hora_request_t* request);
/* Reduces across ranks, then rank r keeps rows [start_r, start_r + n_r) of
 * dimension 0, where ranks below (dim0 % size) get one extra row. op: sum or
 * average. Output: library-owned or through options->alloc. */
HORA_API hora_status_t hora_reducescatter_async(hora_runtime_t runtime, const DLTensor* in,
                                                const hora_options_t* options,
                                                hora_request_t* request);
HORA_API hora_status_t hora_barrier_async(hora_runtime_t runtime, const hora_options_t* options,
                                          hora_request_t* request);
/* Declares that this rank has no more data (uneven inputs). Until every rank
 * has joined, the others' collectives run without waiting for it:
 *   allreduce, reducescatter: it contributes the op's identity (sum: zeros);
 *     averages divide by the number of ranks that contributed;
 *   allgather: it contributes zero rows (the others get theirs gathered);
 *   broadcast: goes on if the root has not joined (the joined rank receives
 *     nothing); from a joined root it fails with HORA_ERR_INVALID_USAGE on
 *     every rank that submitted it, naming the tensor and the root;
 *   alltoall: fails with HORA_ERR_INVALID_USAGE on every rank that submitted it.
 * (Horovod 0.28 refuses allgather, reducescatter and broadcast with any joined
 * rank; hora runs them as above.) Completes when all ranks joined; the last
 * rank to join is reported by hora_request_join_last_rank. Global set only;
 * a second join while one is in flight is HORA_ERR_INVALID_USAGE. */
HORA_API hora_status_t hora_join_async(hora_runtime_t runtime, const hora_options_t* options,
                                       hora_request_t* request);

/* ---- point-to-point (docs/p2p.md) ----
 * Between two ranks of one process set (options->process_set; NULL: the
 * global set); `peer` is a rank within that set, never the caller itself.
 * Matching: a receive takes the first message from its peer with its tag
 * that no earlier receive took (MPI's non-overtaking order per sender and
 * tag; no wildcards). Messages with different tags may be received in any
 * order. A send completes once the receiver has matched and accepted it
 * (its data is then delivered or being delivered): a send and a receive
 * whose dtype or element count differ both fail with HORA_ERR_MISMATCH
 * naming both, and no byte lands in the receive buffer. Two ranks that
 * send to each other must post the receives before waiting on the sends
 * (hora_p2p_batch_async does that). CPU tensors; shared memory between
 * ranks of one host, TCP between hosts (HORA_P2P_TRANSPORT). A peer lost, a
 * stall past HORA_STALL_SHUTDOWN_TIME_S or a malformed frame breaks the set
 * as for collectives; HORA_STALL_WARNING_TIME_S logs a stalled send or
 * receive with its peer and tag. options->name, op, scales and root are
 * not used; callback and alloc are. */
HORA_API hora_status_t hora_send_async(hora_runtime_t runtime, const DLTensor* tensor, int32_t peer,
                                       int64_t tag, const hora_options_t* options,
                                       hora_request_t* request);
/* tensor NULL: the message decides the shape and dtype; the buffer comes from
 * options->alloc or is library-owned (hora_request_output). */
HORA_API hora_status_t hora_recv_async(hora_runtime_t runtime, DLTensor* tensor, int32_t peer,
                                       int64_t tag, const hora_options_t* options,
                                       hora_request_t* request);
typedef enum { HORA_P2P_SEND = 0, HORA_P2P_RECV = 1 } hora_p2p_kind_t;
typedef struct hora_p2p_op {
  uint32_t struct_size; /* sizeof(hora_p2p_op_t) */
  int32_t kind;         /* hora_p2p_kind_t */
  int32_t peer;
  int64_t tag;
  DLTensor* tensor; /* never NULL here: receives in a batch have buffers */
} hora_p2p_op_t;
/* Posts n sends and receives at once (all or none), completed as one
 * request: what pipeline schedules exchange between neighbours. */
HORA_API hora_status_t hora_p2p_batch_async(hora_runtime_t runtime, int32_t n,
                                            const hora_p2p_op_t* ops, const hora_options_t* options,
                                            hora_request_t* request);

/* ---- requests ---- */
/* *done = 1 when finished. Returns the request's final status when done
 * (message in hora_last_error_message), HORA_SUCCESS while running. */
HORA_API hora_status_t hora_test(hora_request_t request, int32_t* done);
/* Waits up to timeout_s seconds (negative: forever). HORA_ERR_TIMEOUT if
 * still running (the request is unaffected), else the request's status.
 * Where a host's ranks share one CPU mask and outnumber its CPUs evenly,
 * waiting on a collective may first move the calling thread onto its rank's
 * CPU, keeping its affinity mask (HORA_HOME_CALLER=0 turns that off). */
HORA_API hora_status_t hora_wait(hora_request_t request, double timeout_s);
/* For allgather/alltoall/reducescatter without options->alloc: the result,
 * owned by the request (valid until hora_request_free), in the input's
 * memory (out->device says where: a GPU input gives device memory). */
HORA_API hora_status_t hora_request_output(hora_request_t request, const DLTensor** out);
/* For alltoall: rows received from each rank (nsplits = set size). */
HORA_API hora_status_t hora_request_received_splits(hora_request_t request, const int64_t** splits,
                                                    int32_t* nsplits);
HORA_API hora_status_t hora_request_join_last_rank(hora_request_t request, int32_t* rank);
/* Releases the handle. For a finished request, its library-owned output
 * (hora_request_output) is freed here, on the calling thread (GPU memory
 * through the GPU plugin). A request still running keeps running: hora holds
 * its own reference, but its callback and output are discarded (the output is
 * freed once hora is done with it). */
HORA_API hora_status_t hora_request_free(hora_request_t request);

/* ---- observability (docs/observability.md) ----
 * Always on: per process set counters, the straggler ranking (on the set's
 * lowest rank, which sees who submits last) and a flight recorder of the last
 * HORA_FLIGHT_RECORDER_ENTRIES collectives. Text out: buf NULL asks only for
 * *needed (bytes including the NUL; needed may be NULL otherwise); a buf
 * smaller than that fails with HORA_ERR_INVALID_ARGUMENT and sets *needed.
 * Counters move between calls, so the text can grow after a size query:
 * allocate a little more, or call again with the *needed it reports. */
typedef enum {
  HORA_METRICS_JSON = 0,            /* one JSON object */
  HORA_METRICS_PROMETHEUS = 1,      /* Prometheus text exposition format */
  HORA_METRICS_FLIGHT_RECORDER = 2, /* the flight recorder as a text table */
} hora_metrics_format_t;
/* A snapshot of `set`'s metrics (NULL: the global set), from any thread. */
HORA_API hora_status_t hora_metrics_snapshot(hora_runtime_t runtime, hora_process_set_t set,
                                             int32_t format, char* buf, size_t buf_bytes,
                                             size_t* needed);
/* Writes `set`'s flight recorder to HORA_FLIGHT_RECORDER_DIR now (reason is
 * written into it; NULL allowed) and puts the file's path in buf as above. */
HORA_API hora_status_t hora_flight_recorder_dump(hora_runtime_t runtime, hora_process_set_t set,
                                                 const char* reason, char* buf, size_t buf_bytes,
                                                 size_t* needed);

/* Starts recording this rank's timeline into `path` (Chrome trace JSON, for
 * Perfetto or chrome://tracing), as HORA_TIMELINE does at init. Call it on
 * every rank with the same path: rank 0 creates the file, the others append
 * to it (one file for the job on one host or a shared file system).
 * mark_cycles != 0 marks each negotiation cycle. HORA_ERR_INVALID_USAGE if
 * already recording, HORA_ERR_SYSTEM if the file cannot be opened. */
HORA_API hora_status_t hora_timeline_start(hora_runtime_t runtime, const char* path,
                                           int32_t mark_cycles);
/* Writes what is buffered and stops; HORA_ERR_INVALID_USAGE if not recording. */
HORA_API hora_status_t hora_timeline_stop(hora_runtime_t runtime);

/* ---- rendezvous store server (for launchers) ----
 * A launcher (horarun) hosts the job's rendezvous store itself, so no rank
 * has to, and starts the ranks with HORA_STORE_EXTERNAL=1. The server
 * authenticates every client with an HMAC-SHA256 challenge keyed by secret
 * (NULL or "" = unauthenticated, logged); refused clients are logged to
 * stderr with their address (level from HORA_LOG_LEVEL, default warning).
 * The server serves on its own thread until stopped; these functions may be
 * called from any thread, but stop must not race with other calls on the
 * same handle. */
typedef struct hora_store_server_s* hora_store_server_t;
/* Binds bind_host:port (bind_host NULL or "" = every IPv4 interface; port 0 =
 * an ephemeral port, see hora_store_server_port) and starts serving.
 * HORA_ERR_SYSTEM when the address cannot be bound. */
HORA_API hora_status_t hora_store_server_start(const char* bind_host, int32_t port,
                                               const char* secret, hora_store_server_t* out);
/* The bound port (the actual one when started with port 0). */
HORA_API hora_status_t hora_store_server_port(hora_store_server_t server, int32_t* out);
/* Writes key = value (len bytes) / adds delta to the integer at key (missing
 * = 0; *out, if not NULL, gets the new value) in the store from the hosting
 * process, waking clients that wait for the key. A launcher publishes job
 * facts this way (docs/elastic.md: the live worker count, min-np). */
HORA_API hora_status_t hora_store_server_set(hora_store_server_t server, const char* key,
                                             const void* value, size_t len);
HORA_API hora_status_t hora_store_server_add(hora_store_server_t server, const char* key,
                                             int64_t delta, int64_t* out);
/* *out = 1 if key exists in the store, else 0. */
HORA_API hora_status_t hora_store_server_check(hora_store_server_t server, const char* key,
                                               int32_t* out);
/* Closes every connection, joins the server thread and frees the handle.
 * NULL is ignored. */
HORA_API hora_status_t hora_store_server_stop(hora_store_server_t server);

#ifdef __cplusplus
}
#endif

#endif /* HORA_HORA_H_ */
