"""Point-to-point send and receive for hora.torch (docs/p2p.md).

Horovod never had them; the API follows torch.distributed's where it can:

* ``send(tensor, dst, tag=0)`` / ``recv(tensor=None, src=..., tag=0)`` block;
  ``isend`` / ``irecv`` return an integer handle for ``poll()`` and
  ``synchronize()`` (``synchronize`` of an ``irecv`` returns the tensor).
* ``batch_isend_irecv([P2POp(isend, t, peer, tag), P2POp(irecv, t, peer,
  tag), ...])`` posts them all at once (one handle): what pipeline schedules
  use to exchange with both neighbours without deadlocking.
* ``dst``/``src``/``peer`` are GLOBAL ranks, also with ``process_set=`` (as
  ``root_rank`` is in horovod.torch); the set must contain them.
* A receive matches the first message from its peer with its tag that no
  earlier receive took. ``recv(None, src)`` takes any shape and dtype and
  returns a new tensor. A dtype or element-count mismatch fails both sides
  with HoraMismatchError; nothing is written into the receive buffer.
* CUDA tensors are staged through host memory here by default, which works
  whatever the GPU layout. With ``HORA_TORCH_P2P_CUDA=direct`` they go to
  libhora as CUDA tensors and move through the GPU plugin (NCCL send/recv,
  docs/p2p.md "GPU tensors"): every rank must then have its own GPU, both
  sides of a message must be CUDA tensors, and ``recv(None, src)`` of a
  CUDA message is refused (the allocator cannot be told it is one).
  Autograd does not flow through send/recv (pipeline schedules move
  activations and gradients explicitly, see hora.torch.parallel).
"""
import os

import torch

from .. import basics
from .mpi_ops import _TORCH_FROM_DL, _Allocator, _check_set, _ref

__all__ = ["send", "recv", "isend", "irecv", "P2POp", "batch_isend_irecv"]


def _peer_in_set(peer, process_set, what):
    ps = _check_set(process_set)
    peer = int(peer)
    if ps.ranks is None:
        return peer
    if peer not in ps.ranks:
        raise ValueError("hora.torch: %s peer %d is not a member of process set %s (members, global ranks: %s); "
                         "peers are global ranks, as root_rank is in horovod.torch"
                         % (what, peer, ps.process_set_id, ps.ranks))
    return ps.ranks.index(peer)


def _direct_cuda():
    return os.environ.get("HORA_TORCH_P2P_CUDA", "staged") == "direct"


def _host(tensor):
    """The tensor hora reads or writes: itself on the CPU (or, HORA_TORCH_P2P_CUDA=direct, on
    the GPU), a contiguous host copy otherwise."""
    if tensor.device.type == "cpu" or (tensor.is_cuda and _direct_cuda()):
        return tensor if tensor.is_contiguous() else tensor.contiguous()
    return tensor.detach().to("cpu").contiguous()


class _RecvOutput(_Allocator):
    """The buffer of a receive without one: allocated by torch when hora knows the message's shape."""
    __slots__ = ()

    def _make(self, dims, dl_dtype):
        dt = _TORCH_FROM_DL.get((dl_dtype.code, dl_dtype.bits))
        if dt is None:
            raise TypeError("hora.torch: received an unsupported dtype (code %d, bits %d)"
                            % (dl_dtype.code, dl_dtype.bits))
        return torch.empty(dims, dtype=dt)


def isend(tensor, dst, tag=0, process_set=basics.global_process_set):
    """Starts sending ``tensor`` to global rank ``dst``; returns a handle.
    Do not modify ``tensor`` until ``synchronize(handle)`` returned."""
    peer = _peer_in_set(dst, process_set, "isend")
    host = _host(tensor)
    p = basics.submit_send(_ref(host), peer, tag, _check_set(process_set), keep=(tensor,))
    return basics.register(p)


def irecv(tensor=None, src=None, tag=0, process_set=basics.global_process_set):
    """Starts receiving from global rank ``src`` into ``tensor`` (None: a new
    tensor of the sender's shape and dtype); ``synchronize(handle)`` returns it."""
    if src is None:
        raise ValueError("hora.torch: irecv needs src (receives from any rank are not supported)")
    peer = _peer_in_set(src, process_set, "irecv")
    ps = _check_set(process_set)
    if tensor is None:
        out = _RecvOutput()
        p = basics.submit_recv(None, peer, tag, ps, finish=out.result, keep=(out,), alloc=out)
        p.cause = out.cause
        return basics.register(p)
    host = _host(tensor)
    if host is tensor:
        finish = lambda _: tensor  # noqa: E731
    else:
        def finish(_):
            with torch.no_grad():
                tensor.copy_(host)
            return tensor
    p = basics.submit_recv(_ref(host), peer, tag, ps, finish=finish, keep=(tensor, host))
    return basics.register(p)


def send(tensor, dst, tag=0, process_set=basics.global_process_set):
    """Sends ``tensor`` to global rank ``dst`` and returns once the receiver accepted it."""
    basics.synchronize(isend(tensor, dst, tag, process_set))


def recv(tensor=None, src=None, tag=0, process_set=basics.global_process_set):
    """Receives from global rank ``src``; returns the tensor (``tensor`` itself when given)."""
    return basics.synchronize(irecv(tensor, src, tag, process_set))


class P2POp:
    """One operation for batch_isend_irecv: ``P2POp(hvd.isend, tensor, peer, tag=0)`` or
    ``P2POp(hvd.irecv, tensor, peer, tag=0)`` (receives need their tensor here)."""
    __slots__ = ("op", "tensor", "peer", "tag")

    def __init__(self, op, tensor, peer, tag=0):
        if op not in (isend, irecv):
            raise ValueError("hora.torch: P2POp's op must be hora.torch.isend or hora.torch.irecv, got %r" % (op,))
        if not isinstance(tensor, torch.Tensor):
            raise TypeError("hora.torch: P2POp needs a tensor (receives in a batch need their buffer)")
        self.op, self.tensor, self.peer, self.tag = op, tensor, int(peer), int(tag)


def batch_isend_irecv(ops, process_set=basics.global_process_set):
    """Posts every operation at once; returns one handle (``synchronize`` returns
    the list of tensors, receives filled in)."""
    ops = list(ops)
    if not ops:
        raise ValueError("hora.torch: batch_isend_irecv needs at least one P2POp")
    ps = _check_set(process_set)
    posted, copies = [], []
    for o in ops:
        peer = _peer_in_set(o.peer, process_set, "batch_isend_irecv")
        host = _host(o.tensor)
        if o.op is irecv and host is not o.tensor:
            copies.append((o.tensor, host))
        posted.append((o.op is isend, _ref(host), peer, o.tag))

    def finish(_):
        with torch.no_grad():
            for dst, host in copies:
                dst.copy_(host)
        return [o.tensor for o in ops]
    p = basics.submit_p2p_batch(posted, ps, finish=finish, keep=(ops, copies))
    return basics.register(p)
