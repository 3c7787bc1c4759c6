/* hora GPU plugin ABI, version 1.
 *
 * What libhora needs from a GPU runtime, as a table of C function pointers
 * that a separate shared object provides. libhora opens the plugin with
 * dlopen when the first GPU tensor (or a GPU-enabled config) appears, so
 * libhora itself links neither CUDA nor NCCL and a CPU-only machine never
 * needs them. Implementations: ops/cuda (CUDA runtime + NCCL + hora's fusion
 * kernels, libhora_cuda.so) and tests/gpu/mock (host memory posing as device
 * memory, so the runtime's GPU paths are tested on machines without a GPU).
 *
 * Who calls what, on which thread:
 *  - hora_gpu_plugin_get: libhora's loader, once per runtime, any thread.
 *  - everything else: a process set's executor thread (one per set), except
 *    comm_abort and last_error, which may come from any thread, and
 *    device_free, which may come from any thread that frees a request owning
 *    a library-allocated output. Point-to-point (ops/p2p/p2p_gpu.h) makes its
 *    calls from its own GPU thread and helper threads, on communicators and
 *    streams of its own; device_alloc may also come from a framework thread
 *    (a receive without a buffer). Functions taking a device make it current
 *    on the calling thread first; device_alloc and device_free restore the
 *    caller's current device (that thread may be a framework's).
 *
 * Conventions: every function returns 0 on success and nonzero on failure;
 * after a failure last_error() describes it on the calling thread (library
 * call, its error string, the arguments that matter) until that thread's next
 * plugin call. No function throws, aborts or exits. Pointers to device memory
 * are plain addresses (unified virtual addressing): memcpy_async copies in
 * any direction. dtype codes are HORA_GPU_DTYPE_* (the values of
 * hora::DataType in core/types.h), reduce op codes HORA_GPU_OP_* (those of
 * hora::ReduceOp; average never arrives: libhora turns it into sum plus a
 * postscale).
 */
#ifndef HORA_GPU_PLUGIN_H_
#define HORA_GPU_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HORA_GPU_PLUGIN_ABI_VERSION 1u
/* The symbol libhora looks up in the plugin. */
#define HORA_GPU_PLUGIN_ENTRY "hora_gpu_plugin_get"

enum {
  HORA_GPU_DTYPE_UINT8 = 0,
  HORA_GPU_DTYPE_INT8 = 1,
  HORA_GPU_DTYPE_INT16 = 2,
  HORA_GPU_DTYPE_INT32 = 3,
  HORA_GPU_DTYPE_INT64 = 4,
  HORA_GPU_DTYPE_FLOAT16 = 5,
  HORA_GPU_DTYPE_BFLOAT16 = 6,
  HORA_GPU_DTYPE_FLOAT32 = 7,
  HORA_GPU_DTYPE_FLOAT64 = 8,
  HORA_GPU_DTYPE_BOOL = 9
};
enum { HORA_GPU_OP_SUM = 0, HORA_GPU_OP_MIN = 2, HORA_GPU_OP_MAX = 3, HORA_GPU_OP_PRODUCT = 4 };

typedef struct hora_gpu_stream_s* hora_gpu_stream_t; /* a device stream */
typedef struct hora_gpu_event_s* hora_gpu_event_t;   /* a device event */
typedef struct hora_gpu_comm_s* hora_gpu_comm_t;     /* a communicator (NCCL) */

/* One tensor piece of a batched copy: dst[i] = src[i] * scale for
 * i < count elements of `dtype`. dst and src are equal (scaling in place)
 * or do not overlap. Arithmetic as hora's CPU scaleCopy (core/reduce.h). */
typedef struct hora_gpu_copy_s {
  void* dst;
  const void* src;
  size_t count;
} hora_gpu_copy_t;

/* One send or receive of a point-to-point group (p2p_group): `bytes` bytes
 * from `data` to communicator rank `peer`, or from `peer` into `data`. `peer`
 * may be the caller's own rank when the matching operation is in the same
 * group (NCCL pairs them; the plugin's test uses it on one GPU). */
enum { HORA_GPU_P2P_SEND = 0, HORA_GPU_P2P_RECV = 1 };
typedef struct hora_gpu_p2p_op_s {
  int32_t kind; /* HORA_GPU_P2P_SEND or HORA_GPU_P2P_RECV */
  int32_t peer; /* rank within the communicator */
  void* data;   /* device memory; read (send) or written (recv) */
  size_t bytes;
} hora_gpu_p2p_op_t;

typedef struct hora_gpu_plugin_v1_s {
  uint32_t abi_version; /* HORA_GPU_PLUGIN_ABI_VERSION */
  uint32_t struct_size; /* sizeof(hora_gpu_plugin_v1_t) of the plugin */
  const char* name;     /* e.g. "cuda 13.0 + nccl 2.27.3" */

  const char* (*last_error)(void);

  /* ---- devices, streams, events */
  int (*device_count)(int* out);
  /* A non-blocking stream of the highest priority on `device`. */
  int (*stream_create)(int device, hora_gpu_stream_t* out);
  int (*stream_destroy)(hora_gpu_stream_t stream);
  int (*stream_synchronize)(hora_gpu_stream_t stream);
  /* Orders `stream` after a framework's event (a cudaEvent_t passed as
   * void*), so hora's work waits for the framework's producing kernels. */
  int (*stream_wait_external_event)(hora_gpu_stream_t stream, void* external_event);
  /* Events without timing. */
  int (*event_create)(int device, hora_gpu_event_t* out);
  int (*event_destroy)(hora_gpu_event_t event);
  int (*event_record)(hora_gpu_event_t event, hora_gpu_stream_t stream);
  /* *done = 1 once every work recorded before it finished, else 0. */
  int (*event_query)(hora_gpu_event_t event, int* done);

  /* ---- memory */
  int (*device_alloc)(int device, size_t bytes, void** out);
  int (*device_free)(int device, void* ptr);
  /* Page-locked host memory (staging for backends that work on host memory). */
  int (*host_alloc_pinned)(size_t bytes, void** out);
  int (*host_free_pinned)(void* ptr);
  int (*memcpy_async)(void* dst, const void* src, size_t bytes, hora_gpu_stream_t stream);
  /* All `n` copies of one dtype with one scale, in as few kernel launches as
   * possible (the fusion buffer's pack and unpack). scale == 1.0 copies. */
  int (*batched_scale_copy)(int32_t dtype, const hora_gpu_copy_t* copies, size_t n, double scale,
                            hora_gpu_stream_t stream);

  /* ---- communicators (NCCL semantics) */
  size_t unique_id_bytes;
  int (*comm_unique_id)(void* id_out); /* unique_id_bytes bytes */
  /* Collective over the `nranks` callers that pass the same id. Must not
   * block forever: the plugin gives up after timeout_ms with an error. */
  int (*comm_init)(int device, int nranks, int rank, const void* id, int64_t timeout_ms,
                   hora_gpu_comm_t* out);
  int (*comm_destroy)(hora_gpu_comm_t comm);
  /* Any thread; makes pending and later operations on comm fail. */
  int (*comm_abort)(hora_gpu_comm_t comm);
  /* *failed = 1 (and last_error set) once the communicator hit an
   * asynchronous error (ncclCommGetAsyncError). */
  int (*comm_async_error)(hora_gpu_comm_t comm, int* failed);
  int (*allreduce)(const void* in, void* out, size_t count, int32_t dtype, int32_t op,
                   hora_gpu_comm_t comm, hora_gpu_stream_t stream);
  int (*broadcast)(void* data, size_t count, int32_t dtype, int root, hora_gpu_comm_t comm,
                   hora_gpu_stream_t stream);
  /* Rank r contributes counts[r] elements; out holds all, in rank order. */
  int (*allgatherv)(const void* in, void* out, const size_t* counts, int32_t dtype,
                    hora_gpu_comm_t comm, hora_gpu_stream_t stream);
  /* send[r] / recv[r] elements to / from rank r, consecutive regions. */
  int (*alltoallv)(const void* in, const size_t* send, void* out, const size_t* recv, int32_t dtype,
                   hora_gpu_comm_t comm, hora_gpu_stream_t stream);
  /* inout holds sum(counts) elements; this rank's region (offset
   * sum(counts[0..rank))) receives the reduction; other regions are clobbered. */
  int (*reducescatter)(void* inout, const size_t* counts, int32_t dtype, int32_t op,
                       hora_gpu_comm_t comm, hora_gpu_stream_t stream);

  /* ---- appended fields (check struct_size before use) */
  /* A NUL-terminated name of the physical GPU behind `device`, unique on its
   * host whatever CUDA_VISIBLE_DEVICES says (CUDA's PCI bus id), so ranks can
   * tell that they share a GPU, which NCCL refuses. */
  int (*device_pci_bus_id)(int device, char* out, size_t capacity);

  /* Point-to-point (hora_send_async / hora_recv_async of GPU tensors; absent
   * from plugins built before it: check HORA_GPU_PLUGIN_HAS(api, p2p_group)).
   * Enqueues the `n` sends and receives on `stream` as one group
   * (ncclGroupStart, ncclSend/ncclRecv, ncclGroupEnd), so a send and a
   * receive with the same peer in one group never wait for each other.
   * Operations between two ranks in one direction match in the order they
   * were enqueued, across calls; a sender and its receiver name the same byte
   * count. Returns once enqueued; completion is an event recorded on `stream`
   * afterwards, failures also show in comm_async_error. Called by libhora's
   * point-to-point GPU thread (ops/p2p/p2p_gpu.h), on communicators of two
   * ranks that carry nothing else. */
  int (*p2p_group)(const hora_gpu_p2p_op_t* ops, size_t n, hora_gpu_comm_t comm,
                   hora_gpu_stream_t stream);
} hora_gpu_plugin_v1_t;

/* Whether the plugin's table has `field` (appended fields: a plugin built
 * against an older header has a smaller struct_size). */
#define HORA_GPU_PLUGIN_HAS(api, field)                                                     \
  ((api)->struct_size >=                                                                    \
       offsetof(hora_gpu_plugin_v1_t, field) + sizeof(((hora_gpu_plugin_v1_t*)0)->field) && \
   (api)->field != NULL)
/* The smallest table libhora accepts: up to device_pci_bus_id, the last field
 * that every v1 plugin has. */
#define HORA_GPU_PLUGIN_V1_MIN_SIZE \
  (offsetof(hora_gpu_plugin_v1_t, device_pci_bus_id) + sizeof(void (*)(void)))

/* Returns the plugin's table for `abi_version`, or NULL if it does not
 * speak that version. */
typedef const hora_gpu_plugin_v1_t* (*hora_gpu_plugin_get_fn)(uint32_t abi_version);

#ifdef __cplusplus
}
#endif

#endif /* HORA_GPU_PLUGIN_H_ */
