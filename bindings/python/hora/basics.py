"""The framework-agnostic core of the Python binding: one runtime per process,
process sets, and requests (handles) over DLPack tensors.

Framework modules (``hora.numpy``, ``hora.torch``) turn their tensors into
``_dlpack.TensorRef``s, call the ``submit_*`` functions here, and register
a ``finish`` function that builds their result once the request succeeded.

Lifetime rule (hora.h): inputs and outputs are read and written on hora's
threads after the call returns, so every ``Pending`` keeps the TensorRefs
(and through them the framework tensors) alive until its request completed;
only then is the request freed.

Threads: any thread may submit and wait. ``hora_last_error_message`` is
thread-local, so every failing call is turned into an exception on the same
thread right after it returns (``_lib.check``).
"""
import atexit
import ctypes
import itertools
import os
import threading

from . import _dlpack
from . import _lib
from .exceptions import HoraInvalidArgumentError, HoraNotInitializedError, HoraNotSupportedError

Sum = _lib.OP_SUM
Average = _lib.OP_AVERAGE
Min = _lib.OP_MIN
Max = _lib.OP_MAX
Product = _lib.OP_PRODUCT
Adasum = 100  # accepted as a name for Horovod compatibility; not implemented by hora

_OP_NAMES = {Sum: "Sum", Average: "Average", Min: "Min", Max: "Max", Product: "Product", Adasum: "Adasum"}

_state_lock = threading.RLock()
_runtime = None          # ctypes.c_void_p of hora_runtime_t, or None
_homogeneous = None      # is_homogeneous(), found at init (every rank's local size)
_atexit_registered = False
_process_sets = {}       # id -> ProcessSet (user-added)
_next_set_id = itertools.count(1)


class ProcessSet:
    """A subset of ranks with its own coordinator; collectives take ``process_set=``.

    Create with ``add_process_set(ranks)`` (or pass to ``init(process_sets=...)``)
    on every rank, in the same order. ``rank()`` is the rank within the set.
    Broadcast roots: hora.torch takes a GLOBAL rank that must be a member (as
    horovod.torch does) and translates it; hora.numpy, ``submit_broadcast``
    and the C ABI take the rank within the set.
    """

    def __init__(self, ranks):
        self.ranks = None if ranks is None else sorted(int(r) for r in ranks)
        self.process_set_id = None
        self._handle = None  # c_void_p for hora_process_set_t; None = global (NULL in options)

    def _is_global(self):
        return self.ranks is None

    def included(self):
        if self._is_global():
            return True
        return _rank() in self.ranks

    def size(self):
        if self._is_global():
            return size()
        return len(self.ranks)

    def rank(self):
        """This process's rank within the set, or -1 if it is not a member."""
        if self._is_global():
            return rank()
        if self._handle is None:
            return -1
        out = ctypes.c_int32()
        _lib.check(_lib.library().hora_process_set_rank(self._handle, ctypes.byref(out)))
        return out.value

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        # A set names one communicator of the running job, not a value: copies
        # of a module that keeps one (copy.deepcopy(model), hora.torch.parallel's
        # layers) must use the same set. Its ctypes handle could not be copied anyway.
        return self

    def __repr__(self):
        if self._is_global():
            return "ProcessSet(global)"
        return "ProcessSet(process_set_id=%s, ranks=%s)" % (self.process_set_id, self.ranks)


global_process_set = ProcessSet(None)
global_process_set.process_set_id = 0


def _require_runtime():
    rt = _runtime
    if rt is None:
        raise HoraNotInitializedError("hora has not been initialized; use hora.init() (hvd.init()).", 3)
    return rt


def init(comm=None, process_sets=None):
    """Starts hora in this process: identity and store from the HORA_* environment
    (README), rendezvous with every rank. Idempotent. ``process_sets``: a list of
    ``ProcessSet`` or rank lists to create right away (every rank passes the same)."""
    global _runtime, _atexit_registered
    if comm is not None:
        raise NotImplementedError("hora.init(comm=...) is not supported: start every process of the job "
                                  "with the HORA_* environment (or horarun) instead")
    with _state_lock:
        if _runtime is None:
            lib = _lib.library()
            major, minor, _ = _lib.version()
            handle = ctypes.c_void_p()
            _lib.check(lib.hora_init_versioned(None, ctypes.byref(handle), major, minor), "hora_init")
            _runtime = handle
            try:
                _find_homogeneous()
            except BaseException:
                _runtime = None
                _lib.library().hora_shutdown(handle)
                raise
            if not _atexit_registered:
                atexit.register(shutdown)
                _atexit_registered = True
    if process_sets and process_sets != "dynamic":
        for ps in process_sets:
            add_process_set(ps)


def shutdown():
    """Stops hora: pending requests fail with HoraShutDownError. Safe to call twice."""
    global _runtime
    with _state_lock:
        rt = _runtime
        if rt is None:
            return
        _runtime = None
        for ps in list(_process_sets.values()):
            ps._handle = None
            ps.process_set_id = None
        _process_sets.clear()
        _lib.check(_lib.library().hora_shutdown(rt), "hora_shutdown")


def is_initialized():
    return _runtime is not None


def _identity(fn_name):
    rt = _require_runtime()
    out = ctypes.c_int32()
    _lib.check(getattr(_lib.library(), fn_name)(rt, ctypes.byref(out)), fn_name)
    return out.value


def _rank():
    return _identity("hora_rank")


def rank():
    return _identity("hora_rank")


def size():
    return _identity("hora_size")


def local_rank():
    return _identity("hora_local_rank")


def local_size():
    return _identity("hora_local_size")


def cross_rank():
    return _identity("hora_cross_rank")


def cross_size():
    return _identity("hora_cross_size")


def _elastic_call(fn_name, what):
    """The libhora function ``fn_name``, or a clear error if this libhora predates it."""
    lib = _lib.library()
    if not hasattr(lib, fn_name):
        raise HoraNotSupportedError(
            "hora: %s needs %s, which the loaded libhora (%s) does not export: it is older than "
            "this Python package. Rebuild libhora from this source tree or point HORA_LIBRARY at a "
            "newer one." % (what, fn_name, _lib.library_path()), 10)
    return getattr(lib, fn_name)


def epoch():
    """The membership epoch of this process's runtime (docs/elastic.md): 0 for the
    first runtime of an elastic job, +1 at every re-formation; without elastic
    mode, the count of this rank's earlier init() calls in the job's store."""
    rt = _require_runtime()
    out = ctypes.c_int64()
    _lib.check(_elastic_call("hora_epoch", "hora.epoch()")(rt, ctypes.byref(out)), "hora_epoch")
    return out.value


def _membership_pending():
    """True when a worker waits to join the next epoch (elastic mode). A local
    answer: ranks may see the arrival at different moments, so callers ask on one
    rank and broadcast it (``State.check_host_updates`` does)."""
    rt = _require_runtime()
    out = ctypes.c_int32()
    _lib.check(_elastic_call("hora_membership_pending", "state.check_host_updates()")(rt, ctypes.byref(out)),
               "hora_membership_pending")
    return bool(out.value)


def _membership_supported():
    """False when the loaded libhora has no elastic calls (no epoch can form, so
    no worker can ever wait to join)."""
    return _lib.has_symbol("hora_membership_pending")


def _find_homogeneous():
    """Horovod's is_homogeneous: every host runs the same number of ranks. As
    Horovod's controller does at init, allgather every rank's local size (one
    int32 each; a rank is alone when size is 1)."""
    global _homogeneous
    n = size()
    if n == 1:
        _homogeneous = True
        return
    mine = (ctypes.c_int32 * 1)(local_size())
    dl = _dlpack.DLTensor()
    dl.data = ctypes.addressof(mine)
    dl.device.device_type = _dlpack.kDLCPU
    dl.ndim = 1
    dl.dtype.code = _dlpack.kDLInt
    dl.dtype.bits = 32
    dl.dtype.lanes = 1
    shape = (ctypes.c_int64 * 1)(1)
    dl.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    ref = _dlpack.TensorRef(dl, (mine, shape))

    def finish(pending):
        out = pending.output_dl()
        sizes = ctypes.cast(_dlpack.data_address(out), ctypes.POINTER(ctypes.c_int32))
        return all(sizes[i] == mine[0] for i in range(n))

    _homogeneous = submit_allgather(ref, name="hora.init.local_sizes", finish=finish).wait()


def is_homogeneous():
    """True when every host runs the same number of ranks (Horovod's meaning),
    found at init() from every rank's local size."""
    _require_runtime()
    return bool(_homogeneous)


# Feature probes, as in Horovod run with Gloo (hora has no MPI).
def mpi_threads_supported():
    """Horovod raises ValueError here unless MPI is enabled; hora never uses MPI."""
    raise ValueError("hora does not use MPI (as Horovod run with Gloo): mpi_threads_supported() has "
                     "no answer; check hvd.mpi_enabled() first, which is False")


def mpi_enabled():
    return False


def mpi_built():
    return False


def gloo_enabled():
    """True while initialized: hora's control plane and CPU data plane are its Gloo path."""
    return _runtime is not None


def gloo_built():
    return True


def nccl_built():
    return 0


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    return False


def rocm_built():
    return False


def add_process_set(process_set):
    """Registers a process set (a ProcessSet or a list of ranks); call it on every
    rank in the same order. Members block until every member arrived."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps._is_global():
        raise ValueError("hora: the global process set always exists")
    rt = _require_runtime()
    if ps.process_set_id is not None:
        raise ValueError("hora: %r was already added" % ps)
    n = size()
    if not ps.ranks or ps.ranks[0] < 0 or ps.ranks[-1] >= n or len(set(ps.ranks)) != len(ps.ranks):
        raise HoraInvalidArgumentError("hora: process set ranks %s must be unique ranks in [0, %d)" % (ps.ranks, n), 1)
    if _rank() in ps.ranks:
        arr = (ctypes.c_int32 * len(ps.ranks))(*ps.ranks)
        handle = ctypes.c_void_p()
        _lib.check(_lib.library().hora_process_set_create(rt, arr, len(ps.ranks), ctypes.byref(handle)),
                   "hora_process_set_create")
        ps._handle = handle
    with _state_lock:
        ps.process_set_id = next(_next_set_id)
        _process_sets[ps.process_set_id] = ps
    return ps


def remove_process_set(process_set):
    """Destroys a process set added with add_process_set (every rank calls it)."""
    ps = process_set
    if ps._is_global():
        raise ValueError("hora: the global process set cannot be removed")
    with _state_lock:
        if ps.process_set_id is None or _process_sets.pop(ps.process_set_id, None) is None:
            return False
        ps.process_set_id = None
        handle, ps._handle = ps._handle, None
    if handle is not None and _runtime is not None:
        _lib.check(_lib.library().hora_process_set_destroy(handle), "hora_process_set_destroy")
    return True


def _set_options(opts, process_set):
    if process_set is None or process_set._is_global():
        opts.process_set = None
        return
    if process_set.process_set_id is None:
        raise ValueError("hora: %r was not added with add_process_set()" % process_set)
    if process_set._handle is None:
        raise ValueError("hora: rank %d is not a member of %r" % (_rank(), process_set))
    opts.process_set = process_set._handle


def _op_name(kind, name):
    # Horovod's naming: "<kind>.<name>"; unnamed ops are named by the core in call order.
    return None if name is None else ("%s.%s" % (kind, name)).encode()


def check_op(op):
    if op == Adasum:
        raise NotImplementedError("hora: the Adasum reduction is not implemented; use Average or Sum")
    if op not in _OP_NAMES:
        raise HoraInvalidArgumentError("hora: unknown reduce op %r" % (op,), 1)
    return op


class Pending:
    """One submitted request, the objects it needs alive, and how to build its result.

    ``finish(pending)`` runs on the waiting thread after success, while the
    request (and its library-owned output) still exists.
    """
    __slots__ = ("request", "keep", "finish", "result", "done", "error", "children", "cause")

    def __init__(self, request, keep, finish=None):
        self.request = request
        self.keep = keep
        self.finish = finish
        self.result = None
        self.done = False
        self.error = None
        self.children = None
        # Optional: returns the Python exception behind a failure (e.g. the
        # output allocator's), chained onto the request's error.
        self.cause = None

    # -- results available inside finish() --
    def output_dl(self):
        out = ctypes.POINTER(_dlpack.DLTensor)()
        _lib.check(_lib.library().hora_request_output(self.request, ctypes.byref(out)), "hora_request_output")
        return out.contents

    def received_splits(self):
        ptr = ctypes.POINTER(ctypes.c_int64)()
        n = ctypes.c_int32()
        _lib.check(_lib.library().hora_request_received_splits(self.request, ctypes.byref(ptr), ctypes.byref(n)),
                   "hora_request_received_splits")
        return [ptr[i] for i in range(n.value)]

    def join_last_rank(self):
        out = ctypes.c_int32()
        _lib.check(_lib.library().hora_request_join_last_rank(self.request, ctypes.byref(out)),
                   "hora_request_join_last_rank")
        return out.value

    # -- completion --
    def test(self):
        """True once finished (success or failure); never raises."""
        if self.done:
            return True
        if self.children is not None:
            return all(c.test() for c in self.children)
        flag = ctypes.c_int32()
        _lib.library().hora_test(self.request, ctypes.byref(flag))
        return bool(flag.value)

    def wait(self):
        """Waits for completion; returns finish()'s result or raises the request's error."""
        if not self.done:
            self._complete()
        if self.error is not None:
            raise self.error
        return self.result

    def _complete(self):
        if self.children is not None:
            results, first_error = [], None
            for c in self.children:
                try:
                    results.append(c.wait())
                except Exception as e:  # wait for every child before reporting
                    first_error = first_error or e
                    results.append(None)
            self.error = first_error
            if first_error is None:
                self.result = self.finish(results) if self.finish else results
            self.done = True
            self.keep = None
            return
        lib = _lib.library()
        req = self.request
        try:
            while True:
                s = lib.hora_wait(req, 1.0)  # slices keep Ctrl-C responsive
                if s != _lib.ERR_TIMEOUT:
                    break
                flag = ctypes.c_int32()
                s = lib.hora_test(req, ctypes.byref(flag))
                if flag.value:
                    break
            _lib.check(s, "hora_wait")
            if self.finish is not None:
                self.result = self.finish(self)
        except BaseException as e:
            if not isinstance(e, Exception):
                raise  # KeyboardInterrupt: leave the request pending
            cause = self.cause() if self.cause is not None else None
            if cause is not None and e.__cause__ is None:
                e.__cause__ = cause
            self.error = e
        self.done = True
        lib.hora_request_free(req)
        self.request = None
        self.keep = None


def group(children, finish=None):
    p = Pending(None, None, finish)
    p.children = children
    return p


def _submit(fn, *args, keep=(), finish=None, what=""):
    req = ctypes.c_void_p()
    _lib.check(fn(*args, ctypes.byref(req)), what)
    return Pending(req, keep, finish)


def _options(process_set, name_bytes, op=Sum, prescale=1.0, postscale=1.0, root=0, ready=None):
    o = _lib.new_options()
    _set_options(o, process_set)
    o.name = name_bytes
    o.op = op
    o.prescale = float(prescale)
    o.postscale = float(postscale)
    o.root = int(root)
    # GPU tensors: the event recorded on the producing stream (CPU: None)
    o.ready_event = ready.cuda_event if ready is not None else None
    return o


def submit_allreduce(inp, out, name=None, op=Average, prescale=1.0, postscale=1.0, process_set=None,
                     finish=None, keep=()):
    rt = _require_runtime()
    nb = _op_name("allreduce", name)
    o = _options(process_set, nb, check_op(op), prescale, postscale, ready=inp.ready_event)
    return _submit(_lib.library().hora_allreduce_async, rt, inp.pointer, out.pointer, ctypes.byref(o),
                   keep=(inp, out, nb, keep), finish=finish, what="hora_allreduce_async")


def submit_grouped_allreduce(inps, outs, name=None, op=Average, prescale=1.0, postscale=1.0, process_set=None,
                             finish=None, keep=()):
    rt = _require_runtime()
    n = len(inps)
    if n == 0:
        raise HoraInvalidArgumentError("hora: grouped_allreduce needs at least one tensor", 1)
    nb = _op_name("grouped_allreduce", name)
    # The inputs were recorded in order on their stream: the last event covers all.
    o = _options(process_set, nb, check_op(op), prescale, postscale, ready=inps[-1].ready_event)
    PT = ctypes.POINTER(_dlpack.DLTensor)
    in_arr = (PT * n)(*[r.pointer for r in inps])
    out_arr = (PT * n)(*[r.pointer for r in outs])
    return _submit(_lib.library().hora_grouped_allreduce_async, rt, n, in_arr, out_arr, ctypes.byref(o),
                   keep=(inps, outs, in_arr, out_arr, nb, keep), finish=finish, what="hora_grouped_allreduce_async")


def _set_alloc(o, alloc):
    # alloc: an _alloc.Allocator placing the result (kept alive by the
    # caller's keep), with, for GPU outputs, an .event (a cudaEvent_t its
    # callback records after allocating: options.alloc_event); None: a
    # library-owned result, read in finish().
    if alloc is None:
        return
    o.alloc = alloc.cfunc
    event = getattr(alloc, "event", None)
    o.alloc_event = event.cuda_event if event is not None else None


def submit_allgather(inp, name=None, process_set=None, finish=None, keep=(), alloc=None):
    rt = _require_runtime()
    nb = _op_name("allgather", name)
    o = _options(process_set, nb, ready=inp.ready_event)
    _set_alloc(o, alloc)
    return _submit(_lib.library().hora_allgather_async, rt, inp.pointer, ctypes.byref(o),
                   keep=(inp, nb, keep, alloc), finish=finish, what="hora_allgather_async")


def submit_broadcast(tensor, root_rank, name=None, process_set=None, finish=None, keep=()):
    rt = _require_runtime()
    nb = _op_name("broadcast", name)
    o = _options(process_set, nb, root=root_rank, ready=tensor.ready_event)
    return _submit(_lib.library().hora_broadcast_async, rt, tensor.pointer, ctypes.byref(o),
                   keep=(tensor, nb, keep), finish=finish, what="hora_broadcast_async")


def submit_alltoall(inp, splits=None, name=None, process_set=None, finish=None, keep=(), alloc=None):
    rt = _require_runtime()
    nb = _op_name("alltoall", name)
    o = _options(process_set, nb, ready=inp.ready_event)
    _set_alloc(o, alloc)
    if splits is None:
        sp, n = None, 0
    else:
        splits = [int(s) for s in splits]
        n = len(splits)
        sp = (ctypes.c_int64 * max(n, 1))(*splits)
    return _submit(_lib.library().hora_alltoall_async, rt, inp.pointer, sp, n, ctypes.byref(o),
                   keep=(inp, sp, nb, keep, alloc), finish=finish, what="hora_alltoall_async")


def submit_reducescatter(inp, name=None, op=Average, prescale=1.0, postscale=1.0, process_set=None,
                         finish=None, keep=(), alloc=None):
    rt = _require_runtime()
    nb = _op_name("reducescatter", name)
    o = _options(process_set, nb, check_op(op), prescale, postscale, ready=inp.ready_event)
    _set_alloc(o, alloc)
    return _submit(_lib.library().hora_reducescatter_async, rt, inp.pointer, ctypes.byref(o),
                   keep=(inp, nb, keep, alloc), finish=finish, what="hora_reducescatter_async")


def submit_barrier(process_set=None, name=None):
    rt = _require_runtime()
    nb = _op_name("barrier", name)
    o = _options(process_set, nb)
    return _submit(_lib.library().hora_barrier_async, rt, ctypes.byref(o), keep=(nb,), what="hora_barrier_async")


def _p2p_options(process_set, alloc=None, ready=None):
    o = _options(process_set, None, ready=ready)
    _set_alloc(o, alloc)
    return o


def _require_p2p():
    if not _lib.has_symbol("hora_send_async"):
        raise HoraNotSupportedError("hora: this libhora (%s) has no point-to-point calls; it predates 0.5"
                        % (_lib.library_path(),))


def submit_send(ref, peer, tag=0, process_set=None, finish=None, keep=()):
    """Sends ``ref`` to set rank ``peer`` (docs/p2p.md)."""
    rt = _require_runtime()
    _require_p2p()
    o = _p2p_options(process_set, ready=ref.ready_event)
    return _submit(_lib.library().hora_send_async, rt, ref.pointer, int(peer), int(tag), ctypes.byref(o),
                   keep=(ref, o, keep), finish=finish, what="hora_send_async")


def submit_recv(ref, peer, tag=0, process_set=None, finish=None, keep=(), alloc=None):
    """Receives into ``ref`` (None: the message decides the shape; the buffer
    comes from ``alloc`` or is library-owned) from set rank ``peer``."""
    rt = _require_runtime()
    _require_p2p()
    o = _p2p_options(process_set, alloc, ready=ref.ready_event if ref is not None else None)
    return _submit(_lib.library().hora_recv_async, rt, ref.pointer if ref is not None else None, int(peer),
                   int(tag), ctypes.byref(o), keep=(ref, o, keep, alloc), finish=finish,
                   what="hora_recv_async")


def submit_p2p_batch(ops, process_set=None, finish=None, keep=()):
    """Posts [(is_send, ref, peer, tag), ...] at once as one request."""
    rt = _require_runtime()
    _require_p2p()
    n = len(ops)
    if n == 0:
        raise HoraInvalidArgumentError("hora: batch_isend_irecv needs at least one operation", 1)
    arr = (_lib.P2pOp * n)()
    for i, (is_send, ref, peer, tag) in enumerate(ops):
        arr[i].struct_size = ctypes.sizeof(_lib.P2pOp)
        arr[i].kind = _lib.P2P_SEND if is_send else _lib.P2P_RECV
        arr[i].peer = int(peer)
        arr[i].tag = int(tag)
        arr[i].tensor = ref.pointer
    # One event for the batch: the last GPU tensor's, recorded after the others on the same stream.
    ready = [ref.ready_event for _, ref, _, _ in ops if ref.ready_event is not None]
    o = _p2p_options(process_set, ready=ready[-1] if ready else None)
    return _submit(_lib.library().hora_p2p_batch_async, rt, n, arr, ctypes.byref(o),
                   keep=(ops, arr, o, keep), finish=finish, what="hora_p2p_batch_async")


def submit_join():
    rt = _require_runtime()
    o = _options(None, None)
    return _submit(_lib.library().hora_join_async, rt, ctypes.byref(o),
                   finish=lambda p: p.join_last_rank(), what="hora_join_async")


# ---- integer handles, as Horovod's poll()/synchronize() take ----
_handles = {}
_handle_lock = threading.Lock()
_handle_ids = itertools.count(1)


def register(pending):
    with _handle_lock:
        h = next(_handle_ids)
        _handles[h] = pending
    return h


def _lookup(handle):
    with _handle_lock:
        p = _handles.get(handle)
    if p is None:
        raise ValueError("hora: unknown or already synchronized handle %r" % (handle,))
    return p


def poll(handle):
    """True if the operation behind ``handle`` has finished (then synchronize() returns at once)."""
    return _lookup(handle).test()


def synchronize(handle):
    """Waits for ``handle``'s operation and returns its result; raises its error."""
    p = _lookup(handle)
    try:
        return p.wait()
    finally:
        with _handle_lock:
            _handles.pop(handle, None)


def barrier(process_set=global_process_set):
    submit_barrier(process_set).wait()


def join(device=-1):
    """Declares this rank out of data (uneven inputs); returns the last rank to join."""
    return submit_join().wait()


def library_info():
    """Path and version of the loaded libhora."""
    return {"path": _lib.library_path(), "version": "%d.%d.%d" % _lib.version(), "pid": os.getpid()}


def _text_call(fn_name, what, *args):
    """Calls a hora_* function that writes text (buf NULL first for the size)."""
    fn = _elastic_call(fn_name, what)
    needed = ctypes.c_size_t(0)
    _lib.check(fn(*args, None, 0, ctypes.byref(needed)), fn_name)
    # Counters move between the two calls, so the text may have grown: retry
    # with the size the library reports (it sets needed even when refusing).
    for _ in range(8):
        size = needed.value + 256
        buf = ctypes.create_string_buffer(size)
        status = fn(*args, buf, size, ctypes.byref(needed))
        if status != _lib.ERR_INVALID_ARGUMENT or needed.value <= size:
            _lib.check(status, fn_name)
            return buf.value.decode("utf-8", "replace")
    _lib.check(status, fn_name)


def _set_handle(process_set):
    if process_set is None or process_set._is_global():
        return None
    if process_set._handle is None:
        raise ValueError("hora: this rank is not in %r" % process_set)
    return process_set._handle


def metrics(process_set=None, format="dict"):
    """This rank's always-on metrics for a process set (default: the global set).

    ``format``: "dict" (parsed JSON: counts and bytes per collective, time in
    negotiation, queue and data plane, fusion, cache hits, errors, and on the
    set's lowest rank the straggler ranking: ``stragglers`` ordered by how long
    the others waited for each rank), "json", "prometheus" (text exposition
    format) or "flight" (the flight recorder as a table)."""
    import json
    rt = _require_runtime()
    formats = {"dict": _lib.METRICS_JSON, "json": _lib.METRICS_JSON,
               "prometheus": _lib.METRICS_PROMETHEUS, "flight": _lib.METRICS_FLIGHT_RECORDER}
    if format not in formats:
        raise ValueError("hora.metrics: format must be one of %s, not %r" % (sorted(formats), format))
    text = _text_call("hora_metrics_snapshot", "hora.metrics()", rt, _set_handle(process_set), formats[format])
    return json.loads(text) if format == "dict" else text


def dump_flight_recorder(reason=None, process_set=None):
    """Writes this rank's flight recorder (its last HORA_FLIGHT_RECORDER_ENTRIES
    collectives) to HORA_FLIGHT_RECORDER_DIR now; returns the file's path."""
    rt = _require_runtime()
    why = (reason or "hora.dump_flight_recorder()").encode()
    return _text_call("hora_flight_recorder_dump", "hora.dump_flight_recorder()", rt, _set_handle(process_set),
                      why)


def start_timeline(file_path, mark_cycles=False):
    """Starts this rank's timeline into ``file_path`` (docs/observability.md); every rank
    calls it with the same path, rank 0 creates the file and the others append to it."""
    rt = _require_runtime()
    path = os.path.abspath(os.fspath(file_path))
    _lib.check(_elastic_call("hora_timeline_start", "start_timeline()")(rt, path.encode(), 1 if mark_cycles else 0),
               "hora_timeline_start")


def stop_timeline():
    """Flushes and stops the timeline started with start_timeline (or HORA_TIMELINE)."""
    rt = _require_runtime()
    _lib.check(_elastic_call("hora_timeline_stop", "stop_timeline()")(rt), "hora_timeline_stop")
