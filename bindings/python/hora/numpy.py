"""Collectives on any CPU array that speaks DLPack (NumPy, PyTorch, JAX, CuPy host...),
with NumPy arrays as results.

Inputs are taken through ``obj.__dlpack__()`` (NumPy arrays whose DLPack export
refuses, such as bool or read-only arrays, through their buffer). In-place
variants (``allreduce_``, ``broadcast_``) write into the object's own memory,
so they need a writable producer (NumPy, PyTorch). Results whose size is known
only after negotiation come from hora's library-owned buffer and are copied
into a new NumPy array.

    import hora.numpy as hn
    hn.init()
    total = hn.allreduce(np.arange(4.0), op=hn.Sum)
"""
import ctypes

import numpy as np

from . import _dlpack
from . import basics
from .basics import (Adasum, Average, Max, Min, Product, ProcessSet, Sum, add_process_set, barrier,  # noqa: F401
                     global_process_set, init, is_initialized, join, local_rank, local_size, cross_rank,
                     cross_size, poll, rank, remove_process_set, shutdown, size, synchronize)
from .exceptions import HoraError, HorovodInternalError  # noqa: F401

_DL_TO_NP = {
    (_dlpack.kDLInt, 8): np.int8, (_dlpack.kDLInt, 16): np.int16, (_dlpack.kDLInt, 32): np.int32,
    (_dlpack.kDLInt, 64): np.int64, (_dlpack.kDLUInt, 8): np.uint8, (_dlpack.kDLFloat, 16): np.float16,
    (_dlpack.kDLFloat, 32): np.float32, (_dlpack.kDLFloat, 64): np.float64, (_dlpack.kDLBool, 8): np.bool_,
}


def _np_dtype(dl):
    key = (dl.dtype.code, dl.dtype.bits)
    if key not in _DL_TO_NP:
        raise TypeError("hora.numpy: DLPack dtype (code %d, bits %d) has no NumPy equivalent" % key)
    return _DL_TO_NP[key]


def to_ref(obj):
    """A TensorRef for a NumPy array or any object with __dlpack__ (kept alive by the ref)."""
    if isinstance(obj, np.ndarray):
        arr = obj
        if not arr.flags["C_CONTIGUOUS"]:
            raise ValueError("hora.numpy: array is not C-contiguous; pass numpy.ascontiguousarray(x)")
        if arr.dtype != np.bool_ and arr.flags["WRITEABLE"] and hasattr(arr, "__dlpack__"):
            try:
                return _dlpack.from_capsule(arr.__dlpack__(), keep=arr)
            except (BufferError, TypeError, RuntimeError):
                pass
        return _dlpack.from_numpy_buffer(arr)
    if hasattr(obj, "__dlpack__"):
        return _dlpack.from_capsule(obj.__dlpack__(), keep=obj)
    if isinstance(obj, (list, tuple, int, float)):
        return _dlpack.from_numpy_buffer(np.ascontiguousarray(obj))
    raise TypeError("hora.numpy: %s has no __dlpack__ and is not a NumPy array" % type(obj).__name__)


def _empty_like_ref(ref):
    return np.empty(ref.shape, dtype=_np_dtype(ref.dl))


def _copy_out(dl):
    arr = np.empty(_dlpack.shape_of(dl), dtype=_np_dtype(dl))
    n = _dlpack.nbytes(dl)
    if n:
        ctypes.memmove(arr.ctypes.data, _dlpack.data_address(dl), n)
    return arr


def _op(op, average=None):
    if op is None:
        return Sum if average is False else Average
    return op


# ---- allreduce ----
def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set):
    ref = to_ref(tensor)
    out = _empty_like_ref(ref)
    oref = _dlpack.from_numpy_buffer(out)
    p = basics.submit_allreduce(ref, oref, name, _op(op, average), prescale_factor, postscale_factor, process_set,
                                finish=lambda _: out)
    return basics.register(p)


def allreduce(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
              process_set=global_process_set):
    return synchronize(allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set):
    ref = to_ref(tensor)
    p = basics.submit_allreduce(ref, ref, name, _op(op, average), prescale_factor, postscale_factor, process_set,
                                finish=lambda _: tensor)
    return basics.register(p)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                            process_set=global_process_set):
    refs = [to_ref(t) for t in tensors]
    outs = [_empty_like_ref(r) for r in refs]
    orefs = [_dlpack.from_numpy_buffer(o) for o in outs]
    p = basics.submit_grouped_allreduce(refs, orefs, name, _op(op, average), prescale_factor, postscale_factor,
                                        process_set, finish=lambda _: outs)
    return basics.register(p)


def grouped_allreduce(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set):
    return synchronize(grouped_allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor,
                                               process_set))


# ---- allgather / broadcast / alltoall / reducescatter ----
def allgather_async(tensor, name=None, process_set=global_process_set):
    p = basics.submit_allgather(to_ref(tensor), name, process_set, finish=lambda p: _copy_out(p.output_dl()))
    return basics.register(p)


def allgather(tensor, name=None, process_set=global_process_set):
    return synchronize(allgather_async(tensor, name, process_set))


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    p = basics.submit_broadcast(to_ref(tensor), root_rank, name, process_set, finish=lambda _: tensor)
    return basics.register(p)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    out = np.array(np.from_dlpack(tensor) if not isinstance(tensor, np.ndarray) and hasattr(np, "from_dlpack")
                   else tensor, copy=True, order="C")
    return broadcast_async_(out, root_rank, name, process_set)


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    want_splits = splits is not None
    if want_splits:
        splits = [int(s) for s in np.asarray(splits).reshape(-1)]

    def finish(p):
        out = _copy_out(p.output_dl())
        if want_splits:
            return out, np.asarray(p.received_splits(), dtype=np.int32)
        return out
    p = basics.submit_alltoall(to_ref(tensor), splits, name, process_set, finish=finish)
    return basics.register(p)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    return synchronize(alltoall_async(tensor, splits, name, process_set))


def reducescatter_async(tensor, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,
                        process_set=global_process_set):
    p = basics.submit_reducescatter(to_ref(tensor), name, op, prescale_factor, postscale_factor, process_set,
                                    finish=lambda p: _copy_out(p.output_dl()))
    return basics.register(p)


def reducescatter(tensor, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,
                  process_set=global_process_set):
    return synchronize(reducescatter_async(tensor, name, op, prescale_factor, postscale_factor, process_set))


# ---- point-to-point (docs/p2p.md); peers are ranks within process_set, as roots are here ----
def isend(tensor, dst, tag=0, process_set=global_process_set):
    """Starts sending ``tensor`` to rank ``dst`` of the set; keep it unmodified until synchronize()."""
    p = basics.submit_send(to_ref(tensor), dst, tag, process_set, keep=(tensor,))
    return basics.register(p)


def send(tensor, dst, tag=0, process_set=global_process_set):
    """Sends and returns once the receiver accepted the message."""
    synchronize(isend(tensor, dst, tag, process_set))


def irecv(tensor=None, src=None, tag=0, process_set=global_process_set):
    """Starts receiving from rank ``src`` of the set into ``tensor`` (written in place), or, with
    None, into a new array of the sender's shape and dtype; synchronize() returns it."""
    if src is None:
        raise ValueError("hora.numpy: irecv needs src (receives from any rank are not supported)")
    if tensor is None:
        p = basics.submit_recv(None, src, tag, process_set, finish=lambda p: _copy_out(p.output_dl()))
    else:
        p = basics.submit_recv(to_ref(tensor), src, tag, process_set, finish=lambda _: tensor, keep=(tensor,))
    return basics.register(p)


def recv(tensor=None, src=None, tag=0, process_set=global_process_set):
    return synchronize(irecv(tensor, src, tag, process_set))
