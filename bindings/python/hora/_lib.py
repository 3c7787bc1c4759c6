"""Loads libhora and declares its C ABI (bindings/c/include/hora/hora.h) for ctypes.

Nothing here knows about frameworks: tensors cross as DLPack ``DLTensor``
structs (see ``_dlpack.py``). Where the library is looked for, first match wins:

1. ``HORA_LIBRARY``: a path to ``libhora.so`` (or the directory holding it);
2. the copy a wheel carries (``hora/lib/libhora.so.0``, scripts/build_wheel.sh;
   its GPU plugin and bundled dependencies sit beside it);
3. the build tree this package sits in: ``<repo>/build/bindings/c/libhora.so``;
4. the install prefix of this package (``pip install`` put it in
   ``<prefix>/lib/python3.X/site-packages``: ``<prefix>/lib``) and of this
   interpreter (``sys.prefix``, ``sys.base_prefix``), in ``lib`` and Debian's
   ``lib/<multiarch>``: where ``cmake --install --prefix <prefix>`` puts libhora;
5. the system: ``ctypes.util.find_library("hora")``, then ``libhora.so.0``.

ctypes.CDLL releases the GIL for the duration of every call, so a thread
blocked in ``hora_wait`` does not stop other Python threads.
"""
import ctypes
import ctypes.util
import os
import sys
import sysconfig
import threading

from . import _dlpack
from .exceptions import error_from_status

# Status codes (hora.h; append-only ABI values).
SUCCESS = 0
ERR_INVALID_ARGUMENT = 1
ERR_INVALID_USAGE = 2
ERR_NOT_INITIALIZED = 3
ERR_SHUT_DOWN = 4
ERR_SYSTEM = 5
ERR_BACKEND = 6
ERR_REMOTE = 7
ERR_TIMEOUT = 8
IN_PROGRESS = 9
ERR_NOT_SUPPORTED = 10
ERR_MISMATCH = 11
ERR_AUTH = 12
ERR_PROTOCOL = 13
ERR_INTERNAL = 14
ERR_MEMBERSHIP = 15

# hora_metrics_format_t (hora.h).
METRICS_JSON = 0
METRICS_PROMETHEUS = 1
METRICS_FLIGHT_RECORDER = 2

# Reduce ops (hora.h).
OP_SUM = 0
OP_AVERAGE = 1
OP_MIN = 2
OP_MAX = 3
OP_PRODUCT = 4

_c_p = ctypes.c_void_p
_DLTensorP = ctypes.POINTER(_dlpack.DLTensor)

CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)
ALLOC = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int64),
                         _dlpack.DLDataType, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p))


class Options(ctypes.Structure):
    """hora_options_t; fill with lib.hora_options_init first."""
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("process_set", _c_p),
        ("name", ctypes.c_char_p),
        ("op", ctypes.c_int32),
        ("prescale", ctypes.c_double),
        ("postscale", ctypes.c_double),
        ("root", ctypes.c_int32),
        ("callback", CALLBACK),
        ("callback_user", _c_p),
        ("alloc", ALLOC),
        ("alloc_user", _c_p),
        ("ready_event", _c_p),  # GPU tensors: cudaEvent_t the collective waits for
        ("alloc_event", _c_p),  # GPU outputs from alloc: cudaEvent_t recorded by alloc
    ]


class Config(ctypes.Structure):
    """hora_config_t; fill with lib.hora_config_init first."""
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("rank", ctypes.c_int32),
        ("size", ctypes.c_int32),
        ("local_rank", ctypes.c_int32),
        ("local_size", ctypes.c_int32),
        ("cross_rank", ctypes.c_int32),
        ("cross_size", ctypes.c_int32),
        ("store_addr", ctypes.c_char_p),
        ("store_port", ctypes.c_int32),
        ("store_external", ctypes.c_int32),
        ("secret", ctypes.c_char_p),
        ("hostname", ctypes.c_char_p),
        ("cycle_time_ms", ctypes.c_double),
        ("fusion_threshold_bytes", ctypes.c_int64),
        ("cache_capacity", ctypes.c_int32),
        ("stall_warning_time_s", ctypes.c_double),
        ("stall_shutdown_time_s", ctypes.c_double),
        ("peer_timeout_s", ctypes.c_double),
        ("start_timeout_s", ctypes.c_double),
        ("log_level", ctypes.c_char_p),
    ]


class P2pOp(ctypes.Structure):
    """hora_p2p_op_t."""
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("kind", ctypes.c_int32),
        ("peer", ctypes.c_int32),
        ("tag", ctypes.c_int64),
        ("tensor", _DLTensorP),
    ]


P2P_SEND = 0
P2P_RECV = 1


# (name, restype, argtypes); every status-returning function has restype c_int32.
_S = ctypes.c_int32
_PROTOTYPES = [
    ("hora_config_init", None, [ctypes.POINTER(Config)]),
    ("hora_init_versioned", _S, [ctypes.POINTER(Config), ctypes.POINTER(_c_p), ctypes.c_int32, ctypes.c_int32]),
    ("hora_shutdown", _S, [_c_p]),
    ("hora_get_version", None, [ctypes.POINTER(ctypes.c_int32)] * 3),
    ("hora_status_string", ctypes.c_char_p, [ctypes.c_int32]),
    ("hora_last_error_message", ctypes.c_char_p, []),
    ("hora_rank", _S, [_c_p, ctypes.POINTER(ctypes.c_int32)]),
    ("hora_size", _S, [_c_p, ctypes.POINTER(ctypes.c_int32)]),
    ("hora_local_rank", _S, [_c_p, ctypes.POINTER(ctypes.c_int32)]),
    ("hora_local_size", _S, [_c_p, ctypes.POINTER(ctypes.c_int32)]),
    ("hora_cross_rank", _S, [_c_p, ctypes.POINTER(ctypes.c_int32)]),
    ("hora_cross_size", _S, [_c_p, ctypes.POINTER(ctypes.c_int32)]),
    ("hora_global_process_set", _S, [_c_p, ctypes.POINTER(_c_p)]),
    ("hora_process_set_create", _S, [_c_p, ctypes.POINTER(ctypes.c_int32), ctypes.c_int32, ctypes.POINTER(_c_p)]),
    ("hora_process_set_destroy", _S, [_c_p]),
    ("hora_process_set_rank", _S, [_c_p, ctypes.POINTER(ctypes.c_int32)]),
    ("hora_process_set_size", _S, [_c_p, ctypes.POINTER(ctypes.c_int32)]),
    ("hora_options_init", None, [ctypes.POINTER(Options)]),
    ("hora_allreduce_async", _S, [_c_p, _DLTensorP, _DLTensorP, ctypes.POINTER(Options), ctypes.POINTER(_c_p)]),
    ("hora_grouped_allreduce_async", _S, [_c_p, ctypes.c_int32, ctypes.POINTER(_DLTensorP),
                                          ctypes.POINTER(_DLTensorP), ctypes.POINTER(Options),
                                          ctypes.POINTER(_c_p)]),
    ("hora_allgather_async", _S, [_c_p, _DLTensorP, ctypes.POINTER(Options), ctypes.POINTER(_c_p)]),
    ("hora_broadcast_async", _S, [_c_p, _DLTensorP, ctypes.POINTER(Options), ctypes.POINTER(_c_p)]),
    ("hora_alltoall_async", _S, [_c_p, _DLTensorP, ctypes.POINTER(ctypes.c_int64), ctypes.c_int32,
                                 ctypes.POINTER(Options), ctypes.POINTER(_c_p)]),
    ("hora_reducescatter_async", _S, [_c_p, _DLTensorP, ctypes.POINTER(Options), ctypes.POINTER(_c_p)]),
    ("hora_barrier_async", _S, [_c_p, ctypes.POINTER(Options), ctypes.POINTER(_c_p)]),
    ("hora_join_async", _S, [_c_p, ctypes.POINTER(Options), ctypes.POINTER(_c_p)]),
    ("hora_test", _S, [_c_p, ctypes.POINTER(ctypes.c_int32)]),
    ("hora_wait", _S, [_c_p, ctypes.c_double]),
    ("hora_request_output", _S, [_c_p, ctypes.POINTER(_DLTensorP)]),
    ("hora_request_received_splits", _S, [_c_p, ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)),
                                          ctypes.POINTER(ctypes.c_int32)]),
    ("hora_request_join_last_rank", _S, [_c_p, ctypes.POINTER(ctypes.c_int32)]),
    ("hora_request_free", _S, [_c_p]),
]

# Declared in hora.h but possibly absent from an older libhora (elastic calls,
# docs/elastic.md): prototyped when present; ``has_symbol`` says which are.
_OPTIONAL_PROTOTYPES = [
    ("hora_epoch", _S, [_c_p, ctypes.POINTER(ctypes.c_int64)]),
    ("hora_membership_pending", _S, [_c_p, ctypes.POINTER(ctypes.c_int32)]),
    ("hora_reform", _S, [ctypes.POINTER(_c_p)]),
    # Observability (0.4, docs/observability.md).
    ("hora_metrics_snapshot", _S, [_c_p, _c_p, ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t,
                                   ctypes.POINTER(ctypes.c_size_t)]),
    ("hora_timeline_start", _S, [_c_p, ctypes.c_char_p, ctypes.c_int32]),
    ("hora_timeline_stop", _S, [_c_p]),
    # Struct initializers told the caller's size (0.5.1): an older hora_*_init
    # would write a newer library's whole struct past ours.
    ("hora_config_init_sized", None, [ctypes.POINTER(Config), ctypes.c_size_t]),
    ("hora_options_init_sized", None, [ctypes.POINTER(Options), ctypes.c_size_t]),
    # Point-to-point (0.5, docs/p2p.md).
    ("hora_send_async", _S, [_c_p, _DLTensorP, ctypes.c_int32, ctypes.c_int64, ctypes.POINTER(Options),
                             ctypes.POINTER(_c_p)]),
    ("hora_recv_async", _S, [_c_p, _DLTensorP, ctypes.c_int32, ctypes.c_int64, ctypes.POINTER(Options),
                             ctypes.POINTER(_c_p)]),
    ("hora_p2p_batch_async", _S, [_c_p, ctypes.c_int32, ctypes.POINTER(P2pOp), ctypes.POINTER(Options),
                                  ctypes.POINTER(_c_p)]),
    ("hora_flight_recorder_dump", _S, [_c_p, _c_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                                       ctypes.POINTER(ctypes.c_size_t)]),
]

_lock = threading.Lock()
_lib = None
_lib_path = None


def _candidates():
    env = os.environ.get("HORA_LIBRARY")
    if env:
        yield os.path.join(env, "libhora.so") if os.path.isdir(env) else env
        return  # an explicit choice is not second-guessed
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "lib", "libhora.so.0")
    repo = os.path.normpath(os.path.join(here, "..", "..", ".."))
    yield os.path.join(repo, "build", "bindings", "c", "libhora.so")
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    seen = set()
    # <prefix>/lib/python3.X/site-packages/hora -> <prefix>/lib (also Debian's
    # <prefix>/lib/python3/dist-packages/hora).
    for libdir in (os.path.normpath(os.path.join(here, "..", "..", "..")),
                   os.path.join(sys.prefix, "lib"), os.path.join(sys.base_prefix, "lib")):
        for d in (libdir, os.path.join(libdir, multiarch) if multiarch else None):
            if d and d not in seen:
                seen.add(d)
                path = os.path.join(d, "libhora.so.0")
                if os.path.exists(path):
                    yield path
    found = ctypes.util.find_library("hora")
    if found:
        yield found
    yield "libhora.so.0"


def library():
    """The loaded libhora (ctypes.CDLL), loading it on first use."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in _candidates():
            if os.sep in path and not os.path.exists(path):
                tried.append(path + " (missing)")
                continue
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                tried.append("%s (%s)" % (path, e))
                continue
            for name, restype, argtypes in _PROTOTYPES:
                fn = getattr(lib, name)
                fn.restype = restype
                fn.argtypes = argtypes
            for name, restype, argtypes in _OPTIONAL_PROTOTYPES:
                if hasattr(lib, name):
                    fn = getattr(lib, name)
                    fn.restype = restype
                    fn.argtypes = argtypes
            _lib, _lib_path = lib, path
            return lib
        raise ImportError("hora: cannot load libhora; tried: " + "; ".join(tried) +
                          ". Build it (scripts/build.sh), install it (cmake --install build --prefix <prefix>, "
                          "the prefix pip installs into), install a wheel that carries it (scripts/build_wheel.sh), "
                          "or set HORA_LIBRARY=/path/to/libhora.so "
                          "(docs/install.md)")


def has_symbol(name):
    """True if the loaded libhora exports ``name`` (e.g. "hora_epoch")."""
    return hasattr(library(), name)


def library_path():
    library()
    return _lib_path


def last_error():
    msg = library().hora_last_error_message()
    return msg.decode("utf-8", "replace") if msg else ""


def status_name(status):
    s = library().hora_status_string(status)
    return s.decode("utf-8", "replace") if s else "status %d" % status


def check(status, what=None):
    """Raises the exception for a non-success status, with the calling thread's
    last-error message (captured here, right after the failing call)."""
    if status != SUCCESS:
        msg = last_error()
        if not msg:
            msg = "%s failed" % (what or "hora call")
        raise error_from_status(status, msg, status_name(status))


def version():
    major, minor, patch = ctypes.c_int32(), ctypes.c_int32(), ctypes.c_int32()
    library().hora_get_version(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(patch))
    return major.value, minor.value, patch.value


def new_options():
    o = Options()
    lib = library()
    if hasattr(lib, "hora_options_init_sized"):
        lib.hora_options_init_sized(ctypes.byref(o), ctypes.sizeof(o))
    else:  # before 0.5.1: fills its own (older, so not larger) layout
        lib.hora_options_init(ctypes.byref(o))
    return o


def new_config():
    c = Config()
    lib = library()
    if hasattr(lib, "hora_config_init_sized"):
        lib.hora_config_init_sized(ctypes.byref(c), ctypes.sizeof(c))
    else:
        lib.hora_config_init(ctypes.byref(c))
    return c
