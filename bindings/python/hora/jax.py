"""Collectives on JAX arrays, on the CPU or a GPU, handed to libhora by DLPack.

    import jax.numpy as jnp
    import hora.jax as hj
    hj.init()
    total = hj.allreduce(jnp.arange(4.0, device=...), op=hj.Sum)

JAX arrays are immutable, so every function returns a new array on the
input's device:

* ``allreduce`` and ``broadcast`` first copy the input into a new array
  (``jnp.array(x, copy=True)``) and let hora reduce or broadcast into that
  copy in place, through its own DLPack export. No one else holds the copy
  until the call returns, so no JAX computation can see it change.
* ``allgather`` and ``reducescatter`` learn their output's shape only after
  the ranks agreed: hora's allocator callback creates the array then (on a
  hora thread) and hora writes into it.

Ordering with JAX's asynchronous dispatch: an input (and a fresh output) is
made ready (``block_until_ready``) before its memory is handed over, so hora
needs no event from JAX's streams; the functions wait for the result before
they return it. A GPU array goes through libhora's GPU plugin (NCCL, or
staging through host memory when ranks share a GPU: docs/gpu.md).

Rank, size and process sets are ``hora``'s (framework-agnostic) ones; a
``root_rank`` is a rank within ``process_set``, as in ``hora.numpy``.
"""
import jax
import jax.numpy as jnp

from . import _alloc
from . import _dlpack
from . import basics
from .basics import (Adasum, Average, Max, Min, Product, ProcessSet, Sum, add_process_set, barrier,  # noqa: F401
                     global_process_set, init, is_initialized, join, local_rank, local_size, cross_rank,
                     cross_size, rank, remove_process_set, shutdown, size)
from .exceptions import HoraError  # noqa: F401

_DL_TO_JNP = {
    (_dlpack.kDLInt, 8): jnp.int8, (_dlpack.kDLInt, 16): jnp.int16, (_dlpack.kDLInt, 32): jnp.int32,
    (_dlpack.kDLInt, 64): jnp.int64, (_dlpack.kDLUInt, 8): jnp.uint8, (_dlpack.kDLFloat, 16): jnp.float16,
    (_dlpack.kDLFloat, 32): jnp.float32, (_dlpack.kDLFloat, 64): jnp.float64,
    (_dlpack.kDLBfloat, 16): jnp.bfloat16, (_dlpack.kDLBool, 8): jnp.bool_,
}


def _array(x, what):
    if not isinstance(x, jax.Array):
        raise TypeError("hora.jax.%s: expected a jax.Array, got %s" % (what, type(x).__name__))
    if len(x.devices()) != 1:
        raise ValueError("hora.jax.%s: the array is sharded over %d devices; pass one device's array "
                         "(hora runs one process per device)" % (what, len(x.devices())))
    return x


def _ref(x):
    """A TensorRef for a ready, single-device JAX array (kept alive by the ref)."""
    x.block_until_ready()
    return _dlpack.from_capsule(x.__dlpack__(), keep=x)


def _fresh_copy(x):
    y = jnp.array(x, copy=True)
    return y, _ref(y)


class _Output(_alloc.Allocator):
    """The result of a collective whose output shape is known only after the
    ranks agreed (options.alloc, called on a hora thread): a new JAX array on
    the input's device, ready before hora writes into it."""
    __slots__ = ("device", "ref")

    def __init__(self, like):
        self.device = next(iter(like.devices()))
        self.ref = None
        super().__init__()

    def _make(self, dims, dl_dtype):
        key = (dl_dtype.code, dl_dtype.bits)
        if key not in _DL_TO_JNP:
            raise TypeError("hora.jax: DLPack dtype (code %d, bits %d) has no JAX equivalent" % key)
        return jax.device_put(jnp.zeros(tuple(dims), dtype=_DL_TO_JNP[key]), self.device)

    def _address(self, array):
        self.ref = _ref(array)  # the export stays alive with the allocator
        return _dlpack.data_address(self.ref.dl)


def allreduce(x, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
              process_set=global_process_set):
    """The reduction of ``x`` over the set's ranks, as a new array on x's device."""
    x = _array(x, "allreduce")
    y, out = _fresh_copy(x)
    p = basics.submit_allreduce(out, out, name, op, prescale_factor, postscale_factor, process_set,
                                finish=lambda _: y, keep=(x,))
    return basics.synchronize(basics.register(p))


def broadcast(x, root_rank, name=None, process_set=global_process_set):
    """The root's ``x`` on every rank, as a new array on x's device."""
    x = _array(x, "broadcast")
    y, out = _fresh_copy(x)
    p = basics.submit_broadcast(out, root_rank, name, process_set, finish=lambda _: y)
    return basics.synchronize(basics.register(p))


def allgather(x, name=None, process_set=global_process_set):
    """Every rank's ``x`` concatenated along dimension 0 (first dimensions may differ)."""
    x = _array(x, "allgather")
    out = _Output(x)
    p = basics.submit_allgather(_ref(x), name, process_set, finish=out.result, keep=out, alloc=out)
    p.cause = out.cause
    return basics.synchronize(basics.register(p))


def reducescatter(x, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
                  process_set=global_process_set):
    """The reduction of ``x``, of which this rank keeps its rows of dimension 0."""
    x = _array(x, "reducescatter")
    out = _Output(x)
    p = basics.submit_reducescatter(_ref(x), name, op, prescale_factor, postscale_factor, process_set,
                                    finish=out.result, keep=out, alloc=out)
    p.cause = out.cause
    return basics.synchronize(basics.register(p))

