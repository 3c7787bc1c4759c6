// extern "C" entry points: argument checks, handle validation, conversion of
// DLPack tensors into TensorEntries, and the catch-all that keeps exceptions
// from crossing the ABI. Runs on the calling (framework) thread.
#include <atomic>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "c_api_internal.h"
#include "hora/hora.h"
#include "request_state.h"
#include "runtime.h"

using hora::Code;
using hora::Status;
using hora::capi::checkAllreduceArgs;
using hora::capi::checkDevice;
using hora::capi::checkShapedInput;
using hora::capi::checkTensor;
using hora::capi::clearError;
using hora::capi::fail;
using hora::capi::guarded;
using hora::capi::setError;
using hora::capi::TensorInfo;

namespace {
constexpr uint32_t kRuntimeMagic = 0x68727430;  // "hrt0"
constexpr uint32_t kSetMagic = 0x68707330;      // "hps0"
constexpr uint32_t kDeadMagic = 0xdeadbeef;
// Names starting with this prefix are hora's own (join); user names may not use it.
constexpr char kReservedPrefix[] = "__hora";
const std::string kJoinName = std::string(kReservedPrefix) + ".join";
// Barrier and join carry no tensor.
const hora::capi::TensorInfo kNoTensor{hora::DataType::kUint8, {}, nullptr, 0, {}};
}  // namespace

// Handles stay allocated after shutdown/destroy (marked dead), so a late call
// with them gets a clear error instead of a use-after-free. Each is a few
// dozen bytes per runtime or set.
// The caller's hora_config_t with its strings copied, so hora_reform can
// start the next runtime with the same configuration.
struct OwnedConfig {
  hora_config_t c;
  std::string strings[5];
  explicit OwnedConfig(const hora_config_t& from) : c(from) {
    const char** fields[] = {&c.store_addr, &c.secret, &c.hostname, &c.log_level, &c.worker_id};
    for (int i = 0; i < 5; ++i)
      if (*fields[i]) strings[i] = *fields[i], *fields[i] = strings[i].c_str();
  }
  OwnedConfig(const OwnedConfig&) = delete;
};

struct hora_runtime_s {
  std::atomic<uint32_t> magic{kRuntimeMagic};
  std::shared_mutex mu;  // shared: calls using the runtime; exclusive: shutdown
  std::unique_ptr<hora::Runtime> rt;
  hora_process_set_s* global = nullptr;
  std::unique_ptr<OwnedConfig> config;
};

struct hora_process_set_s {
  std::atomic<uint32_t> magic{kSetMagic};
  hora_runtime_s* owner = nullptr;
  std::weak_ptr<hora::ProcessSet> set;
};

namespace {

// Dead handles stay allocated so a late call with one gets a clear status
// instead of a use-after-free. This registry keeps them reachable (so leak
// checkers see intent, not a leak); it grows by one small struct per runtime
// or process set a process creates. The C layer is the only place allowed
// process-wide state; nothing below the ABI uses it.
std::mutex& graveyardMu() {
  static std::mutex mu;
  return mu;
}
std::vector<void*>& graveyard() {
  // Never destroyed: a static vector would be torn down at exit, before leak
  // checkers scan, and its handles would look leaked.
  static auto* g = new std::vector<void*>();
  return *g;
}
void bury(void* handle) {
  std::lock_guard<std::mutex> lk(graveyardMu());
  graveyard().push_back(handle);
}

// Validates a runtime handle; on success holds its shared lock.
struct RuntimeRef {
  std::shared_lock<std::shared_mutex> lock;
  hora::Runtime* rt = nullptr;
};

hora_status_t acquire(hora_runtime_t h, const char* fn, RuntimeRef* out) {
  if (!h)
    return fail(Code::kNotInitialized, std::string(fn) + ": runtime is NULL: call hora_init first");
  if (h->magic == kDeadMagic)
    return fail(Code::kShutDown,
                std::string(fn) +
                    ": this runtime was shut down (hora_shutdown); start a new one with hora_init");
  if (h->magic != kRuntimeMagic)
    return fail(Code::kInvalidArgument,
                std::string(fn) + ": not a hora runtime handle (corrupt or foreign pointer)");
  out->lock = std::shared_lock<std::shared_mutex>(h->mu);
  if (!h->rt) return fail(Code::kShutDown, std::string(fn) + ": this runtime was shut down");
  out->rt = h->rt.get();
  return HORA_SUCCESS;
}

hora_status_t resolveSet(hora_runtime_t h, hora_process_set_t ps, const char* fn,
                         std::shared_ptr<hora::ProcessSet>* out) {
  if (!ps) {
    *out = h->rt->globalSet();
    return HORA_SUCCESS;
  }
  if (ps->magic == kDeadMagic)
    return fail(Code::kInvalidUsage, std::string(fn) + ": this process set was destroyed");
  if (ps->magic != kSetMagic)
    return fail(Code::kInvalidArgument, std::string(fn) + ": not a hora process set handle");
  if (ps->owner != h)
    return fail(Code::kInvalidArgument,
                std::string(fn) + ": the process set belongs to another runtime");
  *out = ps->set.lock();
  if (!*out) return fail(Code::kShutDown, std::string(fn) + ": the process set is shut down");
  return HORA_SUCCESS;
}

// How many bytes of a caller's versioned struct to take: up to the end of the
// last field that lies whole inside its struct_size. A struct_size that ends
// inside a field (corrupt, or written by hand) must not tear a pointer into a
// mix of the caller's bytes and the default's (fuzz_capi found a torn name
// pointer dereferenced): such a field keeps its default.
template <size_t N>
size_t wholeFieldBytes(size_t structSize, const size_t (&fieldEnds)[N]) {
  size_t n = 0;
  for (size_t end : fieldEnds)
    if (end <= structSize) n = std::max(n, end);
  return n;
}
#define HORA_FIELD_END(T, f) (offsetof(T, f) + sizeof(T::f))

hora_options_t readOptions(const hora_options_t* o) {
  static constexpr size_t kEnds[] = {
      HORA_FIELD_END(hora_options_t, struct_size),   HORA_FIELD_END(hora_options_t, process_set),
      HORA_FIELD_END(hora_options_t, name),          HORA_FIELD_END(hora_options_t, op),
      HORA_FIELD_END(hora_options_t, prescale),      HORA_FIELD_END(hora_options_t, postscale),
      HORA_FIELD_END(hora_options_t, root),          HORA_FIELD_END(hora_options_t, callback),
      HORA_FIELD_END(hora_options_t, callback_user), HORA_FIELD_END(hora_options_t, alloc),
      HORA_FIELD_END(hora_options_t, alloc_user),    HORA_FIELD_END(hora_options_t, ready_event),
      HORA_FIELD_END(hora_options_t, alloc_event)};
  // A field added to hora_options_t must be added above, or its bytes would never be read.
  static_assert(sizeof(hora_options_t) - HORA_FIELD_END(hora_options_t, alloc_event) <
                    alignof(hora_options_t),
                "kEnds must list hora_options_t's last field");
  hora_options_t r;
  hora_options_init(&r);
  if (o && o->struct_size > 0) std::memcpy(&r, o, wholeFieldBytes(o->struct_size, kEnds));
  r.struct_size = sizeof(r);
  return r;
}

// What every collective entry point needs before it looks at its tensors:
// a live runtime (held for the call), the caller's options, the process set
// and the tensor name (given, or generated in call order).
struct CallContext {
  RuntimeRef ref;
  hora_options_t o;
  std::shared_ptr<hora::ProcessSet> set;
  std::string name;
  // "<kind> "<name>" on rank <r>", the start of every message about the call.
  std::string where(const char* kind) const {
    return std::string(kind) + " \"" + name + "\" on rank " +
           std::to_string(set->globalRank(set->rank()));
  }
};

hora_status_t beginCall(const char* fn, hora_runtime_t h, const hora_options_t* options,
                        hora::CollectiveKind kind, CallContext* c) {
  if (hora_status_t s = acquire(h, fn, &c->ref)) return s;
  c->o = readOptions(options);
  if (kind == hora::CollectiveKind::kJoin) {
    if (c->o.process_set && c->o.process_set != h->global)
      return fail(Code::kNotSupported,
                  std::string(fn) + ": join is supported on the global process set only");
    c->set = h->rt->globalSet();
    c->name = kJoinName;
    return HORA_SUCCESS;
  }
  if (hora_status_t s = resolveSet(h, c->o.process_set, fn, &c->set)) return s;
  if (c->o.name && std::strncmp(c->o.name, kReservedPrefix, sizeof(kReservedPrefix) - 1) == 0)
    return fail(
        Code::kInvalidArgument,
        std::string(fn) + ": tensor names starting with \"__hora\" are reserved for hora itself");
  c->name = c->o.name ? c->o.name : c->set->autoName(kind);
  return HORA_SUCCESS;
}

// The prologue the eight collective entry points share: the catch-all that
// keeps exceptions from crossing the ABI, the request out-parameter, and the
// call context; `body(context)` checks the tensors and submits.
template <typename Body>
hora_status_t collectiveCall(const char* fn, hora_runtime_t h, const hora_options_t* options,
                             hora::CollectiveKind kind, hora_request_t* request, Body&& body) {
  return guarded(fn, [&]() -> hora_status_t {
    if (!request) return fail(Code::kInvalidArgument, std::string(fn) + ": request is NULL");
    *request = nullptr;
    CallContext c;
    if (hora_status_t s = beginCall(fn, h, options, kind, &c)) return s;
    return body(c);
  });
}

std::shared_ptr<hora::TensorEntry> makeEntry(hora::CollectiveKind kind, const std::string& name,
                                             const TensorInfo& info, const hora_options_t& o) {
  auto e = std::make_shared<hora::TensorEntry>();
  e->request.kind = kind;
  e->request.dtype = info.dtype;
  e->request.op = static_cast<hora::ReduceOp>(o.op);
  e->request.root = o.root;
  e->request.prescale = o.prescale;
  e->request.postscale = o.postscale;
  e->request.name = name;
  e->request.shape = info.shape;
  e->request.device = info.device;
  e->in = info.data;
  e->readyEvent = o.ready_event;
  return e;
}

// The request of `entries.size()` tensors; `input` (if any) gives the dtype
// echoed into an output allocated after negotiation. Enqueues the entries and
// hands out the request handle.
hora_status_t submit(const CallContext& c, std::vector<std::shared_ptr<hora::TensorEntry>> entries,
                     const DLTensor* input, hora_request_t* request) {
  auto st = std::make_shared<hora::RequestState>();
  st->remaining = static_cast<int>(entries.size());
  st->callback = c.o.callback;
  st->callbackUser = c.o.callback_user;
  st->alloc = c.o.alloc;
  st->allocUser = c.o.alloc_user;
  st->allocEvent = c.o.alloc_event;
  if (input) st->dlType = input->dtype;
  st->waitSpin = c.set->spin();
  if (c.set->callerDrives()) st->driveSet = c.set;
  if (c.set->homesCaller()) st->homeSet = c.set;
  auto* h = new hora_request_s();
  h->state = st;
  st->handle = h;
  for (auto& e : entries) e->sink = st;
  Status s = c.set->enqueue(std::move(entries));
  if (!s.isOk()) {
    delete h;
    return setError(s);
  }
  *request = h;
  return HORA_SUCCESS;
}

// The options of a collective that neither reduces nor scales.
void plainOptions(hora_options_t* o) {
  o->op = HORA_OP_SUM;
  o->prescale = o->postscale = 1.0;
}

// The prologue of the point-to-point entry points: the catch-all, the
// request out-parameter, a live runtime and the process set.
hora_status_t p2pCall(const char* fn, hora_runtime_t h, const hora_options_t* options,
                      const hora::capi::P2pArg* ops, size_t n, hora_request_t* request) {
  return guarded(fn, [&]() -> hora_status_t {
    if (!request) return fail(Code::kInvalidArgument, std::string(fn) + ": request is NULL");
    *request = nullptr;
    RuntimeRef ref;
    if (hora_status_t s = acquire(h, fn, &ref)) return s;
    hora_options_t o = readOptions(options);
    // The global set needs no reference of its own while `ref` holds the
    // runtime (two atomic operations less on a path of a microsecond).
    if (!o.process_set)
      return hora::capi::submitP2p(fn, *h->rt->globalSetPtr(), o, ops, n, request);
    std::shared_ptr<hora::ProcessSet> set;
    if (hora_status_t s = resolveSet(h, o.process_set, fn, &set)) return s;
    return hora::capi::submitP2p(fn, *set, o, ops, n, request);
  });
}

}  // namespace

extern "C" {

HORA_API hora_status_t hora_init_versioned(const hora_config_t* config, hora_runtime_t* out,
                                           int32_t header_major, int32_t header_minor) {
  return guarded("hora_init", [&]() -> hora_status_t {
    if (!out) return fail(Code::kInvalidArgument, "hora_init: out is NULL");
    *out = nullptr;
    if (header_major != HORA_VERSION_MAJOR || header_minor > HORA_VERSION_MINOR)
      return fail(Code::kInvalidUsage, "hora_init: program built against hora.h " +
                                           std::to_string(header_major) + "." +
                                           std::to_string(header_minor) + " but libhora is " +
                                           std::to_string(HORA_VERSION_MAJOR) + "." +
                                           std::to_string(HORA_VERSION_MINOR) +
                                           ": rebuild against the installed header");
    hora_config_t c;
    hora_config_init(&c);
    if (config) {
      if (config->struct_size == 0 || config->struct_size > sizeof(c))
        return fail(Code::kInvalidArgument, "hora_init: config->struct_size is " +
                                                std::to_string(config->struct_size) +
                                                "; initialize the config with hora_config_init()");
      static constexpr size_t kEnds[] = {HORA_FIELD_END(hora_config_t, struct_size),
                                         HORA_FIELD_END(hora_config_t, rank),
                                         HORA_FIELD_END(hora_config_t, size),
                                         HORA_FIELD_END(hora_config_t, local_rank),
                                         HORA_FIELD_END(hora_config_t, local_size),
                                         HORA_FIELD_END(hora_config_t, cross_rank),
                                         HORA_FIELD_END(hora_config_t, cross_size),
                                         HORA_FIELD_END(hora_config_t, store_addr),
                                         HORA_FIELD_END(hora_config_t, store_port),
                                         HORA_FIELD_END(hora_config_t, store_external),
                                         HORA_FIELD_END(hora_config_t, secret),
                                         HORA_FIELD_END(hora_config_t, hostname),
                                         HORA_FIELD_END(hora_config_t, cycle_time_ms),
                                         HORA_FIELD_END(hora_config_t, fusion_threshold_bytes),
                                         HORA_FIELD_END(hora_config_t, cache_capacity),
                                         HORA_FIELD_END(hora_config_t, stall_warning_time_s),
                                         HORA_FIELD_END(hora_config_t, stall_shutdown_time_s),
                                         HORA_FIELD_END(hora_config_t, peer_timeout_s),
                                         HORA_FIELD_END(hora_config_t, start_timeout_s),
                                         HORA_FIELD_END(hora_config_t, log_level),
                                         HORA_FIELD_END(hora_config_t, elastic),
                                         HORA_FIELD_END(hora_config_t, worker_id),
                                         HORA_FIELD_END(hora_config_t, elastic_newcomer)};
      static_assert(sizeof(hora_config_t) - HORA_FIELD_END(hora_config_t, elastic_newcomer) <
                        alignof(hora_config_t),
                    "kEnds must list hora_config_t's last field");
      std::memcpy(&c, config, wholeFieldBytes(config->struct_size, kEnds));
    }
    auto rt = hora::Runtime::create(c);
    if (!rt.isOk()) return setError(rt.status());
    auto* h = new hora_runtime_s();
    h->rt = rt.take();
    h->config = std::make_unique<OwnedConfig>(c);
    h->global = new hora_process_set_s();
    h->global->owner = h;
    h->global->set = h->rt->globalSet();
    *out = h;
    return HORA_SUCCESS;
  });
}

HORA_API hora_status_t hora_shutdown(hora_runtime_t h) {
  return guarded("hora_shutdown", [&]() -> hora_status_t {
    if (!h) return HORA_SUCCESS;
    if (h->magic == kDeadMagic)
      return fail(Code::kShutDown, "hora_shutdown: runtime already shut down");
    if (h->magic != kRuntimeMagic)
      return fail(Code::kInvalidArgument, "hora_shutdown: not a hora runtime handle");
    std::unique_ptr<hora::Runtime> rt;
    {
      std::unique_lock<std::shared_mutex> lk(h->mu);
      rt = std::move(h->rt);
      h->magic = kDeadMagic;
      h->global->magic = kDeadMagic;
    }
    bury(h);
    bury(h->global);
    if (rt) rt->shutdown();
    return HORA_SUCCESS;
  });
}

HORA_API hora_status_t hora_reform(hora_runtime_t* runtime) {
  return guarded("hora_reform", [&]() -> hora_status_t {
    if (!runtime || !*runtime)
      return fail(Code::kInvalidArgument, "hora_reform: runtime is NULL or points to NULL");
    hora_runtime_t h = *runtime;
    if (h->magic != kRuntimeMagic && h->magic != kDeadMagic)
      return fail(Code::kInvalidArgument, "hora_reform: not a hora runtime handle");
    if (!h->config)
      return fail(Code::kInvalidUsage, "hora_reform: this runtime has no configuration to reuse");
    // The handle is buried by shutdown; the configuration lives on here.
    OwnedConfig config(h->config->c);
    {
      std::shared_lock<std::shared_mutex> lk(h->mu);
      if (h->rt && !h->rt->elastic())
        return fail(Code::kInvalidUsage,
                    "hora_reform: the runtime is not in elastic mode (HORA_ELASTIC=1, or "
                    "horarun --min-np/--max-np); use hora_shutdown and hora_init");
    }
    *runtime = nullptr;
    if (h->magic == kRuntimeMagic) {
      hora_status_t s = hora_shutdown(h);
      if (s != HORA_SUCCESS) return s;
    }
    clearError();
    return hora_init(&config.c, runtime);
  });
}

HORA_API hora_status_t hora_epoch(hora_runtime_t h, int64_t* out) {
  return guarded("hora_epoch", [&]() -> hora_status_t {
    RuntimeRef ref;
    if (hora_status_t s = acquire(h, "hora_epoch", &ref)) return s;
    if (!out) return fail(Code::kInvalidArgument, "hora_epoch: out is NULL");
    *out = ref.rt->epoch();
    return HORA_SUCCESS;
  });
}

HORA_API hora_status_t hora_membership_pending(hora_runtime_t h, int32_t* out) {
  return guarded("hora_membership_pending", [&]() -> hora_status_t {
    RuntimeRef ref;
    if (hora_status_t s = acquire(h, "hora_membership_pending", &ref)) return s;
    if (!out) return fail(Code::kInvalidArgument, "hora_membership_pending: out is NULL");
    auto pending = ref.rt->membershipPending();
    if (!pending.isOk()) return setError(pending.status().withContext("hora_membership_pending"));
    *out = pending.value() ? 1 : 0;
    return HORA_SUCCESS;
  });
}

#define HORA_IDENTITY_GETTER(fn, field)                                                  \
  HORA_API hora_status_t fn(hora_runtime_t h, int32_t* out) {                            \
    return guarded(#fn, [&]() -> hora_status_t {                                         \
      RuntimeRef ref;                                                                    \
      if (hora_status_t s = acquire(h, #fn, &ref)) return s;                             \
      if (!out) return fail(Code::kInvalidArgument, std::string(#fn) + ": out is NULL"); \
      *out = ref.rt->identity().field;                                                   \
      return HORA_SUCCESS;                                                               \
    });                                                                                  \
  }
HORA_IDENTITY_GETTER(hora_rank, rank)
HORA_IDENTITY_GETTER(hora_size, size)
HORA_IDENTITY_GETTER(hora_local_rank, localRank)
HORA_IDENTITY_GETTER(hora_local_size, localSize)
HORA_IDENTITY_GETTER(hora_cross_rank, crossRank)
HORA_IDENTITY_GETTER(hora_cross_size, crossSize)

HORA_API hora_status_t hora_global_process_set(hora_runtime_t h, hora_process_set_t* out) {
  return guarded("hora_global_process_set", [&]() -> hora_status_t {
    RuntimeRef ref;
    if (hora_status_t s = acquire(h, "hora_global_process_set", &ref)) return s;
    if (!out) return fail(Code::kInvalidArgument, "hora_global_process_set: out is NULL");
    *out = h->global;
    return HORA_SUCCESS;
  });
}

HORA_API hora_status_t hora_process_set_create(hora_runtime_t h, const int32_t* ranks, int32_t n,
                                               hora_process_set_t* out) {
  return guarded("hora_process_set_create", [&]() -> hora_status_t {
    RuntimeRef ref;
    if (hora_status_t s = acquire(h, "hora_process_set_create", &ref)) return s;
    if (!out) return fail(Code::kInvalidArgument, "hora_process_set_create: out is NULL");
    *out = nullptr;
    int size = ref.rt->identity().size, me = ref.rt->identity().rank;
    if (!ranks || n <= 0)
      return fail(Code::kInvalidArgument, "hora_process_set_create: ranks is NULL or empty");
    std::vector<int> list(ranks, ranks + n);
    for (int i = 0; i < n; ++i) {
      if (list[i] < 0 || list[i] >= size)
        return fail(Code::kInvalidArgument,
                    "hora_process_set_create: rank " + std::to_string(list[i]) +
                        " is outside the job (size " + std::to_string(size) + ")");
      if (i > 0 && list[i] <= list[i - 1])
        return fail(Code::kInvalidArgument,
                    "hora_process_set_create: ranks must be sorted and unique");
    }
    if (std::find(list.begin(), list.end(), me) == list.end())
      return fail(Code::kInvalidUsage, "hora_process_set_create: rank " + std::to_string(me) +
                                           " is not in the set; only members call this");
    auto set = ref.rt->createSet(list);
    if (!set.isOk()) return setError(set.status());
    auto* ps = new hora_process_set_s();
    ps->owner = h;
    ps->set = set.value();
    *out = ps;
    return HORA_SUCCESS;
  });
}

HORA_API hora_status_t hora_process_set_destroy(hora_process_set_t ps) {
  return guarded("hora_process_set_destroy", [&]() -> hora_status_t {
    if (!ps || ps->magic != kSetMagic)
      return fail(Code::kInvalidArgument,
                  "hora_process_set_destroy: not a live process set handle");
    if (ps->owner->magic ==
        kDeadMagic) {  // the runtime already shut the set down: just release the handle
      ps->magic = kDeadMagic;
      bury(ps);
      return HORA_SUCCESS;
    }
    RuntimeRef ref;
    if (hora_status_t s = acquire(ps->owner, "hora_process_set_destroy", &ref)) return s;
    if (ps == ps->owner->global)
      return fail(Code::kInvalidUsage,
                  "hora_process_set_destroy: the global set ends with hora_shutdown");
    auto set = ps->set.lock();
    ps->magic = kDeadMagic;
    bury(ps);
    if (set) ref.rt->destroySet(set);
    return HORA_SUCCESS;
  });
}

HORA_API hora_status_t hora_process_set_rank(hora_process_set_t ps, int32_t* out) {
  return guarded("hora_process_set_rank", [&]() -> hora_status_t {
    if (!ps || ps->magic != kSetMagic || !out)
      return fail(Code::kInvalidArgument, "hora_process_set_rank: invalid set handle or NULL out");
    auto set = ps->set.lock();
    if (!set) return fail(Code::kShutDown, "hora_process_set_rank: the process set is shut down");
    *out = set->rank();
    return HORA_SUCCESS;
  });
}

HORA_API hora_status_t hora_process_set_size(hora_process_set_t ps, int32_t* out) {
  return guarded("hora_process_set_size", [&]() -> hora_status_t {
    if (!ps || ps->magic != kSetMagic || !out)
      return fail(Code::kInvalidArgument, "hora_process_set_size: invalid set handle or NULL out");
    auto set = ps->set.lock();
    if (!set) return fail(Code::kShutDown, "hora_process_set_size: the process set is shut down");
    *out = set->size();
    return HORA_SUCCESS;
  });
}

HORA_API hora_status_t hora_allreduce_async(hora_runtime_t h, const DLTensor* in, DLTensor* out,
                                            const hora_options_t* options,
                                            hora_request_t* request) {
  return collectiveCall(
      "hora_allreduce_async", h, options, hora::CollectiveKind::kAllreduce, request,
      [&](CallContext& c) -> hora_status_t {
        if (c.name.empty())
          return fail(Code::kInvalidArgument, "hora_allreduce_async: name is empty");
        TensorInfo ti, to;
        if (Status s = checkAllreduceArgs(*c.set, in, out, c.o, c.where("allreduce"), &ti, &to);
            !s.isOk())
          return setError(s);
        auto e = makeEntry(hora::CollectiveKind::kAllreduce, c.name, ti, c.o);
        e->out = to.data;
        return submit(c, {e}, nullptr, request);
      });
}

HORA_API hora_status_t hora_grouped_allreduce_async(hora_runtime_t h, int32_t n,
                                                    const DLTensor* const* in, DLTensor* const* out,
                                                    const hora_options_t* options,
                                                    hora_request_t* request) {
  return collectiveCall(
      "hora_grouped_allreduce_async", h, options, hora::CollectiveKind::kAllreduce, request,
      [&](CallContext& c) -> hora_status_t {
        if (n <= 0 || !in || !out)
          return fail(Code::kInvalidArgument,
                      "hora_grouped_allreduce_async: n must be positive and in/out non-NULL");
        const std::string base = c.name;
        std::vector<std::shared_ptr<hora::TensorEntry>> entries;
        for (int32_t i = 0; i < n; ++i) {
          const std::string name = base + "." + std::to_string(i);
          const std::string where = "grouped allreduce \"" + name + "\" on rank " +
                                    std::to_string(c.set->globalRank(c.set->rank()));
          TensorInfo ti, to;
          if (Status s = checkAllreduceArgs(*c.set, in[i], out[i], c.o, where, &ti, &to); !s.isOk())
            return setError(s);
          auto e = makeEntry(hora::CollectiveKind::kAllreduce, name, ti, c.o);
          e->out = to.data;
          entries.push_back(e);
        }
        return submit(c, entries, nullptr, request);
      });
}

HORA_API hora_status_t hora_allgather_async(hora_runtime_t h, const DLTensor* in,
                                            const hora_options_t* options,
                                            hora_request_t* request) {
  return collectiveCall(
      "hora_allgather_async", h, options, hora::CollectiveKind::kAllgather, request,
      [&](CallContext& c) -> hora_status_t {
        TensorInfo ti;
        if (Status s = checkShapedInput(
                *c.set, hora::CollectiveKind::kAllgather, in, c.where("allgather"),
                "input is a scalar; allgather needs at least one dimension", nullptr, &ti);
            !s.isOk())
          return setError(s);
        plainOptions(&c.o);
        return submit(c, {makeEntry(hora::CollectiveKind::kAllgather, c.name, ti, c.o)}, in,
                      request);
      });
}

HORA_API hora_status_t hora_broadcast_async(hora_runtime_t h, DLTensor* tensor,
                                            const hora_options_t* options,
                                            hora_request_t* request) {
  return collectiveCall("hora_broadcast_async", h, options, hora::CollectiveKind::kBroadcast,
                        request, [&](CallContext& c) -> hora_status_t {
                          const std::string where = c.where("broadcast");
                          TensorInfo ti;
                          Status s = checkTensor(tensor, where + ", tensor", &ti);
                          if (s.isOk() && (c.o.root < 0 || c.o.root >= c.set->size()))
                            s = hora::invalidArgument(where + ": root " + std::to_string(c.o.root) +
                                                      " is outside the process set (size " +
                                                      std::to_string(c.set->size()) + ")");
                          if (s.isOk())
                            s = checkDevice(*c.set, hora::CollectiveKind::kBroadcast, ti, nullptr,
                                            where);
                          if (!s.isOk()) return setError(s);
                          plainOptions(&c.o);
                          auto e = makeEntry(hora::CollectiveKind::kBroadcast, c.name, ti, c.o);
                          e->out = ti.data;
                          return submit(c, {e}, nullptr, request);
                        });
}

HORA_API hora_status_t hora_alltoall_async(hora_runtime_t h, const DLTensor* in,
                                           const int64_t* splits, int32_t nsplits,
                                           const hora_options_t* options, hora_request_t* request) {
  return collectiveCall(
      "hora_alltoall_async", h, options, hora::CollectiveKind::kAlltoall, request,
      [&](CallContext& c) -> hora_status_t {
        const std::string where = c.where("alltoall");
        TensorInfo ti;
        if (Status s = checkShapedInput(*c.set, hora::CollectiveKind::kAlltoall, in, where,
                                        "input needs at least one dimension", nullptr, &ti);
            !s.isOk())
          return setError(s);
        std::vector<int64_t> sp;
        const int n = c.set->size();
        if (splits) {
          if (nsplits != n)
            return fail(Code::kInvalidArgument, where + ": nsplits is " + std::to_string(nsplits) +
                                                    " but the process set has " +
                                                    std::to_string(n) + " ranks");
          sp.assign(splits, splits + n);
          int64_t sum = 0;
          for (int i = 0; i < n; ++i) {
            if (sp[i] < 0)
              return fail(Code::kInvalidArgument, where + ": split " + std::to_string(i) +
                                                      " is negative (" + std::to_string(sp[i]) +
                                                      "); splits count rows sent to each rank");
            if (__builtin_add_overflow(sum, sp[i], &sum))
              return fail(Code::kInvalidArgument,
                          where + ": splits overflow int64 at split " + std::to_string(i) + " (" +
                              std::to_string(sp[i]) + "); they must sum to dimension 0 (" +
                              std::to_string(ti.shape[0]) + ")");
          }
          if (sum != ti.shape[0])
            return fail(Code::kInvalidArgument, where + ": splits sum to " + std::to_string(sum) +
                                                    " but dimension 0 is " +
                                                    std::to_string(ti.shape[0]));
        } else {
          if (ti.shape[0] % n != 0)
            return fail(Code::kInvalidArgument, where + ": dimension 0 (" +
                                                    std::to_string(ti.shape[0]) +
                                                    ") does not divide by the set size " +
                                                    std::to_string(n) + "; pass explicit splits");
          sp.assign(n, ti.shape[0] / n);
        }
        plainOptions(&c.o);
        auto e = makeEntry(hora::CollectiveKind::kAlltoall, c.name, ti, c.o);
        e->request.splits = sp;
        return submit(c, {e}, in, request);
      });
}

HORA_API hora_status_t hora_reducescatter_async(hora_runtime_t h, const DLTensor* in,
                                                const hora_options_t* options,
                                                hora_request_t* request) {
  return collectiveCall(
      "hora_reducescatter_async", h, options, hora::CollectiveKind::kReducescatter, request,
      [&](CallContext& c) -> hora_status_t {
        TensorInfo ti;
        if (Status s = checkShapedInput(*c.set, hora::CollectiveKind::kReducescatter, in,
                                        c.where("reducescatter"),
                                        "input needs at least one dimension", &c.o, &ti);
            !s.isOk())
          return setError(s);
        return submit(c, {makeEntry(hora::CollectiveKind::kReducescatter, c.name, ti, c.o)}, in,
                      request);
      });
}

HORA_API hora_status_t hora_barrier_async(hora_runtime_t h, const hora_options_t* options,
                                          hora_request_t* request) {
  return collectiveCall(
      "hora_barrier_async", h, options, hora::CollectiveKind::kBarrier, request,
      [&](CallContext& c) -> hora_status_t {
        plainOptions(&c.o);
        return submit(c, {makeEntry(hora::CollectiveKind::kBarrier, c.name, kNoTensor, c.o)},
                      nullptr, request);
      });
}

HORA_API hora_status_t hora_join_async(hora_runtime_t h, const hora_options_t* options,
                                       hora_request_t* request) {
  return collectiveCall("hora_join_async", h, options, hora::CollectiveKind::kJoin, request,
                        [&](CallContext& c) -> hora_status_t {
                          plainOptions(&c.o);
                          return submit(
                              c, {makeEntry(hora::CollectiveKind::kJoin, c.name, kNoTensor, c.o)},
                              nullptr, request);
                        });
}

HORA_API hora_status_t hora_send_async(hora_runtime_t h, const DLTensor* tensor, int32_t peer,
                                       int64_t tag, const hora_options_t* options,
                                       hora_request_t* request) {
  const hora::capi::P2pArg op{true, peer, tag, tensor};
  return p2pCall("hora_send_async", h, options, &op, 1, request);
}

HORA_API hora_status_t hora_recv_async(hora_runtime_t h, DLTensor* tensor, int32_t peer,
                                       int64_t tag, const hora_options_t* options,
                                       hora_request_t* request) {
  const hora::capi::P2pArg op{false, peer, tag, tensor};
  return p2pCall("hora_recv_async", h, options, &op, 1, request);
}

HORA_API hora_status_t hora_p2p_batch_async(hora_runtime_t h, int32_t n, const hora_p2p_op_t* ops,
                                            const hora_options_t* options,
                                            hora_request_t* request) {
  return guarded("hora_p2p_batch_async", [&]() -> hora_status_t {
    if (request) *request = nullptr;
    if (n <= 0 || n > (1 << 20) || !ops)
      return fail(Code::kInvalidArgument,
                  "hora_p2p_batch_async: need 1..1048576 operations and a non-NULL ops (got n=" +
                      std::to_string(n) + ")");
    std::vector<hora::capi::P2pArg> args;
    for (int32_t i = 0; i < n; ++i) {
      const hora_p2p_op_t& op = ops[i];
      if (op.struct_size < sizeof(hora_p2p_op_t) ||
          (op.kind != HORA_P2P_SEND && op.kind != HORA_P2P_RECV) || !op.tensor)
        return fail(Code::kInvalidArgument,
                    "hora_p2p_batch_async: ops[" + std::to_string(i) +
                        "] needs struct_size = sizeof(hora_p2p_op_t), kind HORA_P2P_SEND or "
                        "HORA_P2P_RECV and a tensor (got struct_size " +
                        std::to_string(op.struct_size) + ", kind " + std::to_string(op.kind) + ")");
      args.push_back({op.kind == HORA_P2P_SEND, op.peer, op.tag, op.tensor});
    }
    return p2pCall("hora_p2p_batch_async", h, options, args.data(), args.size(), request);
  });
}

HORA_API hora_status_t hora_test(hora_request_t r, int32_t* done) {
  return guarded("hora_test", [&]() -> hora_status_t {
    if (!r || r->magic != hora::kRequestMagic || !done)
      return fail(Code::kInvalidArgument, "hora_test: invalid request handle or NULL done");
    std::lock_guard<std::mutex> lk(r->state->mu);
    *done = r->state->done ? 1 : 0;
    if (!r->state->done) return HORA_SUCCESS;
    return setError(r->state->status);
  });
}

HORA_API hora_status_t hora_wait(hora_request_t r, double timeout_s) {
  return guarded("hora_wait", [&]() -> hora_status_t {
    if (!r || r->magic != hora::kRequestMagic)
      return fail(Code::kInvalidArgument, "hora_wait: invalid request handle");
    if (timeout_s != timeout_s) return fail(Code::kInvalidArgument, "hora_wait: timeout is NaN");
    auto finished = [&] { return r->state->finished.load(std::memory_order_acquire); };
    if (const auto& p2p = r->state->p2p) {
      // A point-to-point request: poll the engine for a moment first; a
      // reply a few microseconds away is worth more than a sleep and a
      // wake-up.
      if (!finished()) p2p->poll(r->state->finished);
    } else if (timeout_s != 0 && !finished()) {
      // A collective about to be waited for: from its rank's CPU where the
      // ranks share the CPUs evenly (HORA_HOME_CALLER).
      if (auto set = r->state->homeSet.lock()) set->homeCaller();
      // Poll for a moment too (the executor completes it on another thread;
      // a sleep and a wake-up cost more than a short poll), doing the set's
      // control work meanwhile (HORA_CALLER_DRIVES).
      if (r->state->waitSpin.enabled()) {
        if (auto set = r->state->driveSet.lock())
          set->driveWhile(finished, timeout_s < 0 || timeout_s > 1e9
                                        ? hora::Clock::time_point::max()
                                        : hora::Clock::now() +
                                              std::chrono::duration_cast<hora::Clock::duration>(
                                                  std::chrono::duration<double>(timeout_s)));
        else
          hora::spinUntil(r->state->waitSpin, finished);
      }
    }
    // Finished: status was written before `finished` (release), so it is
    // read without the lock.
    if (r->state->finished.load(std::memory_order_acquire)) return setError(r->state->status);
    std::unique_lock<std::mutex> lk(r->state->mu);
    auto isDone = [&] { return r->state->done; };
    if (timeout_s < 0 || timeout_s > 1e9) {  // negative or absurdly large: wait forever
      r->state->cv.wait(lk, isDone);
    } else if (!r->state->cv.wait_for(lk,
                                      std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::duration<double>(timeout_s)),
                                      isDone)) {
      return fail(Code::kTimeout, "hora_wait: the request is still running after " +
                                      std::to_string(timeout_s) +
                                      " s (it continues; wait again or check the other ranks)");
    }
    return setError(r->state->status);
  });
}

HORA_API hora_status_t hora_request_output(hora_request_t r, const DLTensor** out) {
  return guarded("hora_request_output", [&]() -> hora_status_t {
    if (!r || r->magic != hora::kRequestMagic || !out)
      return fail(Code::kInvalidArgument,
                  "hora_request_output: invalid request handle or NULL out");
    std::lock_guard<std::mutex> lk(r->state->mu);
    if (!r->state->resultsReady)
      return fail(Code::kInProgress, "hora_request_output: the request has not completed yet");
    if (!r->state->status.isOk()) return setError(r->state->status);
    if (!r->state->hasOutput)
      return fail(Code::kInvalidUsage, "hora_request_output: this request has no output tensor");
    *out = &r->state->outTensor;
    return HORA_SUCCESS;
  });
}

HORA_API hora_status_t hora_request_received_splits(hora_request_t r, const int64_t** splits,
                                                    int32_t* n) {
  return guarded("hora_request_received_splits", [&]() -> hora_status_t {
    if (!r || r->magic != hora::kRequestMagic || !splits || !n)
      return fail(Code::kInvalidArgument,
                  "hora_request_received_splits: invalid request handle or NULL out");
    std::lock_guard<std::mutex> lk(r->state->mu);
    if (!r->state->resultsReady)
      return fail(Code::kInProgress, "hora_request_received_splits: not completed yet");
    if (!r->state->status.isOk()) return setError(r->state->status);
    *splits = r->state->receivedSplits.data();
    *n = static_cast<int32_t>(r->state->receivedSplits.size());
    return HORA_SUCCESS;
  });
}

HORA_API hora_status_t hora_request_join_last_rank(hora_request_t r, int32_t* rank) {
  return guarded("hora_request_join_last_rank", [&]() -> hora_status_t {
    if (!r || r->magic != hora::kRequestMagic || !rank)
      return fail(Code::kInvalidArgument,
                  "hora_request_join_last_rank: invalid request handle or NULL out");
    std::lock_guard<std::mutex> lk(r->state->mu);
    if (!r->state->resultsReady)
      return fail(Code::kInProgress, "hora_request_join_last_rank: not completed yet");
    if (!r->state->status.isOk()) return setError(r->state->status);
    *rank = r->state->lastJoinedRank;
    return HORA_SUCCESS;
  });
}

HORA_API hora_status_t hora_request_free(hora_request_t r) {
  return guarded("hora_request_free", [&]() -> hora_status_t {
    if (!r) return HORA_SUCCESS;
    if (r->magic != hora::kRequestMagic)
      return fail(Code::kInvalidArgument,
                  "hora_request_free: invalid request handle (freed twice?)");
    // The lock keeps a running callback from seeing the handle go; without a
    // callback there is none to wait for.
    if (r->state->callback) {
      std::lock_guard<std::recursive_mutex> lk(r->state->cbMu);
      r->state->handle = nullptr;
    } else {
      r->state->handle = nullptr;
    }
    // The library-owned output is freed with the request, here, even if a
    // hora thread still holds the state for a moment.
    if (!r->state->noOutputs) r->state->releaseOutputsIfDone();
    r->magic = kDeadMagic;
    r->state.reset();
    delete r;
    return HORA_SUCCESS;
  });
}

namespace {

hora_status_t copyOut(const std::string& text, const char* fn, char* buf, size_t bytes,
                      size_t* needed) {
  if (needed) *needed = text.size() + 1;
  if (!buf) {
    if (!needed) return fail(Code::kInvalidArgument, std::string(fn) + ": buf and needed are NULL");
    return HORA_SUCCESS;
  }
  if (bytes < text.size() + 1)
    return fail(Code::kInvalidArgument, std::string(fn) + ": buffer of " + std::to_string(bytes) +
                                            " bytes is too small; " +
                                            std::to_string(text.size() + 1) + " needed");
  std::memcpy(buf, text.c_str(), text.size() + 1);
  return HORA_SUCCESS;
}

}  // namespace

HORA_API hora_status_t hora_metrics_snapshot(hora_runtime_t h, hora_process_set_t ps,
                                             int32_t format, char* buf, size_t bytes,
                                             size_t* needed) {
  const char* fn = "hora_metrics_snapshot";
  return guarded(fn, [&]() -> hora_status_t {
    RuntimeRef ref;
    if (hora_status_t s = acquire(h, fn, &ref)) return s;
    std::shared_ptr<hora::ProcessSet> set;
    if (hora_status_t s = resolveSet(h, ps, fn, &set)) return s;
    const hora::Telemetry& t = set->telemetry();
    std::string text;
    switch (format) {
      case HORA_METRICS_JSON:
        text = hora::metricsJson(t.snapshot());
        break;
      case HORA_METRICS_PROMETHEUS:
        text = hora::metricsPrometheus(t.snapshot());
        break;
      case HORA_METRICS_FLIGHT_RECORDER:
        text = t.flightText("asked for with hora_metrics_snapshot");
        break;
      default:
        return fail(Code::kInvalidArgument, std::string(fn) + ": unknown format " +
                                                std::to_string(format) +
                                                " (HORA_METRICS_JSON, _PROMETHEUS or "
                                                "_FLIGHT_RECORDER)");
    }
    return copyOut(text, fn, buf, bytes, needed);
  });
}

HORA_API hora_status_t hora_flight_recorder_dump(hora_runtime_t h, hora_process_set_t ps,
                                                 const char* reason, char* buf, size_t bytes,
                                                 size_t* needed) {
  const char* fn = "hora_flight_recorder_dump";
  return guarded(fn, [&]() -> hora_status_t {
    RuntimeRef ref;
    if (hora_status_t s = acquire(h, fn, &ref)) return s;
    std::shared_ptr<hora::ProcessSet> set;
    if (hora_status_t s = resolveSet(h, ps, fn, &set)) return s;
    auto path = set->telemetry().dumpFlight(reason ? reason : "asked for by the program");
    if (!path.isOk()) return setError(path.status());
    return copyOut(path.value(), fn, buf, bytes, needed);
  });
}

HORA_API hora_status_t hora_timeline_start(hora_runtime_t h, const char* path,
                                           int32_t mark_cycles) {
  const char* fn = "hora_timeline_start";
  return guarded(fn, [&]() -> hora_status_t {
    RuntimeRef ref;
    if (hora_status_t s = acquire(h, fn, &ref)) return s;
    if (!path || !*path) return fail(Code::kInvalidArgument, std::string(fn) + ": path is empty");
    Status s = ref.rt->timeline().start(path, mark_cycles != 0);
    return s.isOk() ? HORA_SUCCESS : setError(s);
  });
}

HORA_API hora_status_t hora_timeline_stop(hora_runtime_t h) {
  const char* fn = "hora_timeline_stop";
  return guarded(fn, [&]() -> hora_status_t {
    RuntimeRef ref;
    if (hora_status_t s = acquire(h, fn, &ref)) return s;
    if (!ref.rt->timeline().stop())
      return fail(Code::kInvalidUsage, std::string(fn) + ": no timeline is being recorded");
    return HORA_SUCCESS;
  });
}

}  // extern "C"
