"""horovod.torch's collective functions over libhora, tensors passed by DLPack.

Every ``*_async*`` function returns an integer handle for ``poll()`` and
``synchronize()``; the tensors involved stay referenced by the handle until
the operation completed. Trailing-underscore variants work in place.
``allreduce``, ``grouped_allreduce``, ``allgather``, ``grouped_allgather``,
``broadcast``, ``alltoall``, ``reducescatter`` and ``grouped_reducescatter``
are differentiable (torch.autograd), with horovod.torch's gradients (each
backward below says which).

``root_rank`` (broadcast and everything built on it) is a GLOBAL rank, as in
horovod.torch, also with ``process_set=``: it must be a member of the set and
is translated here to its rank within the set, which is what libhora's C ABI
(``hora_options_t.root``) and hora.numpy take.

Tensors must be contiguous and of a dtype hora supports (uint8, int8,
int16, int32, int64, float16, bfloat16, float32, float64, bool). CPU tensors
work with every function; CUDA tensors with every collective (and so
DistributedOptimizer and broadcast_parameters), through libhora's GPU plugin:
hora's stream waits for an event recorded on the tensor's current stream at
submission, so no synchronization is needed before the call. torch 1.13's
DLPack export refuses bool, so bool tensors are exported as uint8 and marked
bool for hora.
"""
import torch
from torch.utils.dlpack import to_dlpack

from .. import _alloc
from .. import _dlpack
from .. import basics
from ..basics import (Adasum, Average, Max, Min, Product, Sum, global_process_set, poll,  # noqa: F401
                      synchronize)
from ..exceptions import HoraInvalidArgumentError
from .compression import Compression

_TORCH_FROM_DL = {
    (_dlpack.kDLInt, 8): torch.int8, (_dlpack.kDLInt, 16): torch.int16, (_dlpack.kDLInt, 32): torch.int32,
    (_dlpack.kDLInt, 64): torch.int64, (_dlpack.kDLUInt, 8): torch.uint8, (_dlpack.kDLFloat, 16): torch.float16,
    (_dlpack.kDLFloat, 32): torch.float32, (_dlpack.kDLFloat, 64): torch.float64,
    (_dlpack.kDLBfloat, 16): torch.bfloat16, (_dlpack.kDLBool, 8): torch.bool,
}


def _ref(tensor):
    """TensorRef for a torch tensor (kept alive by the ref)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("hora.torch: expected a torch.Tensor, got %s" % type(tensor).__name__)
    if not tensor.is_contiguous():
        raise HoraInvalidArgumentError("hora.torch: tensor is not contiguous; call .contiguous() first", 1)
    t = tensor.detach()
    if t.dtype == torch.bool:
        ref = _dlpack.from_capsule(to_dlpack(t.view(torch.uint8)), keep=tensor, dtype_code=_dlpack.kDLBool)
    else:
        ref = _dlpack.from_capsule(to_dlpack(t), keep=tensor)
    # torch checked the layout; its strides for empty tensors need not be the
    # compact ones hora's check expects, so describe the tensor as compact.
    ref.dl.strides = None
    if t.is_cuda:
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(t.device))
        ref.ready_event = ev  # kept alive by the handle with the ref
    return ref


# Output memory allocated when hora asks (options.alloc); shared with hora.jax.
_Allocator = _alloc.Allocator


class _Output(_Allocator):
    """The result tensor of a collective whose output shape is known only after
    negotiation (allgather, alltoall, reducescatter): allocated by torch on the
    input's device when hora asks, so the result is written once, in place, on
    CPU and GPU alike."""
    __slots__ = ("like", "stream", "event")

    def __init__(self, like):
        self.like = like
        # CUDA: allocate on the caller's current stream (captured here, on the
        # framework thread), as a tensor created by the caller would be, so
        # that the caching allocator keeps the block until that stream's later
        # work is done. The block itself may have been freed on that stream
        # after submission while kernels queued there still read it: the event
        # recorded after the allocation (options.alloc_event) makes hora's
        # stream wait for them before it writes. Recorded once here so that
        # torch creates the cudaEvent_t whose handle goes into the options.
        self.stream = torch.cuda.current_stream(like.device) if like.is_cuda else None
        self.event = None
        if self.stream is not None:
            self.event = torch.cuda.Event()
            self.event.record(self.stream)
        super().__init__()

    def _make(self, dims, _dl_dtype):
        if self.stream is not None:
            with torch.cuda.stream(self.stream):
                t = torch.empty(dims, dtype=self.like.dtype, device=self.like.device)
            self.event.record(self.stream)
            return t
        return torch.empty(dims, dtype=self.like.dtype, device=self.like.device)


def handle_average_backwards_compatibility(op, average):
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        return op
    if average is not None:
        return Average if average else Sum
    return Average


def _check_set(process_set):
    if process_set is None:
        return global_process_set
    return process_set


def _root_in_set(root_rank, process_set, what="broadcast"):
    """The set rank of global rank ``root_rank``: horovod.torch takes a global
    root, the C ABI a set rank. A root outside the set is refused here, on the
    calling rank, before anything is submitted (Horovod refuses it at enqueue)."""
    ps = _check_set(process_set)
    root = int(root_rank)
    if ps.ranks is None:  # the global set: set rank == global rank (the core checks the range)
        return root
    if root not in ps.ranks:
        raise ValueError("hora.torch: %s root_rank %d is not a member of process set %s (members, global "
                         "ranks: %s). root_rank is a global rank, as in horovod.torch; pass one of the members."
                         % (what, root, ps.process_set_id, ps.ranks))
    return ps.ranks.index(root)


# ---------------------------------------------------------------- allreduce
def _horovod_average(op, tensors, postscale_factor, process_set):
    """Horovod's Average divides by the set's size, also when ranks have joined
    (their zeros count); the C ABI's divides by the ranks that contributed.
    Floating-point averages are therefore sent as Sum scaled by 1/size, which is
    the same arithmetic as Horovod's and costs nothing more."""
    if op != Average or not all(t.is_floating_point() or t.is_complex() for t in tensors):
        return op, postscale_factor
    return Sum, postscale_factor / _check_set(process_set).size()


def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, process_set):
    inp = _ref(tensor)
    out = inp if output is tensor else _ref(output)
    op, postscale_factor = _horovod_average(op, [tensor], postscale_factor, process_set)
    p = basics.submit_allreduce(inp, out, name, op, prescale_factor, postscale_factor, _check_set(process_set),
                                finish=lambda _: output)
    return basics.register(p)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set):
    """Starts an allreduce into a new tensor; synchronize(handle) returns it."""
    op = handle_average_backwards_compatibility(op, average)
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set):
    """Starts an in-place allreduce; synchronize(handle) returns ``tensor``."""
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor, process_set)


class HoraAllreduce(torch.autograd.Function):
    """Differentiable allreduce: the gradient is the same allreduce of the output's gradient."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.op, ctx.pre, ctx.post, ctx.process_set = op, prescale_factor, postscale_factor, process_set
        return synchronize(allreduce_async(tensor, None, name, op, prescale_factor, postscale_factor, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output.contiguous(), op=ctx.op, prescale_factor=ctx.pre, postscale_factor=ctx.post,
                         process_set=ctx.process_set)
        return grad, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set):
    """Reduces ``tensor`` over the ranks of ``process_set`` (default: average) into a new tensor."""
    op = handle_average_backwards_compatibility(op, average)
    compressed, cctx = compression.compress(tensor)
    summed = HoraAllreduce.apply(compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(summed, cctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    """In-place allreduce; returns ``tensor``."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


def _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor, postscale_factor, process_set):
    inps = [_ref(t) for t in tensors]
    outs = [i if o is t else _ref(o) for i, t, o in zip(inps, tensors, outputs)]
    op, postscale_factor = _horovod_average(op, tensors, postscale_factor, process_set)
    p = basics.submit_grouped_allreduce(inps, outs, name, op, prescale_factor, postscale_factor,
                                        _check_set(process_set), finish=lambda _: list(outputs))
    return basics.register(p)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                            process_set=global_process_set):
    op = handle_average_backwards_compatibility(op, average)
    outputs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    return _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                             process_set=global_process_set):
    op = handle_average_backwards_compatibility(op, average)
    return _grouped_allreduce_async(tensors, tensors, name, op, prescale_factor, postscale_factor, process_set)


class HoraGroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.op, ctx.pre, ctx.post, ctx.process_set = op, prescale_factor, postscale_factor, process_set
        return tuple(synchronize(grouped_allreduce_async(list(tensors), None, name, op, prescale_factor,
                                                         postscale_factor, process_set)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = grouped_allreduce([g.contiguous() for g in grad_outputs], op=ctx.op, prescale_factor=ctx.pre,
                                  postscale_factor=ctx.post, process_set=ctx.process_set)
        return (None, None, None, None, None) + tuple(grads)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set):
    """Allreduces a list of tensors as one request (negotiated and fused together)."""
    op = handle_average_backwards_compatibility(op, average)
    pairs = [compression.compress(t) for t in tensors]
    out = HoraGroupedAllreduce.apply(name, op, prescale_factor, postscale_factor, process_set,
                                     *[c for c, _ in pairs])
    return [compression.decompress(t, c) for t, (_, c) in zip(out, pairs)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                process_set))


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Sparse tensors: allgather of indices and values; returns a callable giving the result."""
    t = tensor.coalesce()
    hi = allgather_async(t.indices().t().contiguous(), name=None if name is None else name + ".indices",
                         process_set=process_set)
    hv = allgather_async(t.values().contiguous(), name=None if name is None else name + ".values",
                         process_set=process_set)

    def result():
        idx = synchronize(hi).t()
        val = synchronize(hv)
        if op == Average:
            val = val / _check_set(process_set).size()
        return torch.sparse_coo_tensor(idx, val, tensor.shape).coalesce()
    return result


# ---------------------------------------------------------------- allgather
def _submit_allgather(tensor, name, process_set):
    out = _Output(tensor)
    p = basics.submit_allgather(_ref(tensor), name, _check_set(process_set), finish=out.result,
                                keep=out, alloc=out)
    p.cause = out.cause
    return p


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating every rank's tensor along dim 0 (first dims may differ)."""
    return basics.register(_submit_allgather(tensor, name, process_set))


def _rows_offset(ps, dims):
    """Row offset of this rank's slice in an allgather whose per-rank first dims are ``dims``."""
    return int(dims[:ps.rank()].sum()) if ps.rank() > 0 else 0


class HoraAllgather(torch.autograd.Function):
    """Differentiable allgather. Gradient (horovod.torch's): the averaged
    allreduce of the output's gradient, sliced to this rank's rows."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.dim = tensor.shape[0]
        ctx.process_set = process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        ps = _check_set(ctx.process_set)
        grad_reduced = allreduce(grad_output.contiguous(), op=Average, process_set=ps)
        dims = synchronize(allgather_async(torch.tensor([ctx.dim], dtype=torch.int64), process_set=ps))
        return grad_reduced.narrow(0, _rows_offset(ps, dims), ctx.dim), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenates every rank's ``tensor`` along dim 0 (first dims may differ)."""
    return HoraAllgather.apply(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    children = []
    for i, t in enumerate(tensors):
        children.append(_submit_allgather(t, None if name is None else "%s.%d" % (name, i), process_set))
    return basics.register(basics.group(children))


class HoraGroupedAllgather(torch.autograd.Function):
    """Differentiable grouped allgather. Gradient (horovod.torch's): one grouped
    averaged allreduce of the outputs' gradients, each sliced to this rank's rows."""

    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.dims = [t.shape[0] for t in tensors]
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        ps = _check_set(ctx.process_set)
        reduced = grouped_allreduce([g.contiguous() for g in grad_outputs], op=Average, process_set=ps)
        dims = synchronize(allgather_async(torch.tensor(ctx.dims, dtype=torch.int64).reshape(1, -1),
                                           process_set=ps))  # row r: rank r's first dims
        grads = [g.narrow(0, _rows_offset(ps, dims[:, i]), d) for i, (g, d) in enumerate(zip(reduced, ctx.dims))]
        return (None, None) + tuple(grads)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgathers each tensor of the list (as one request); returns the list of results."""
    return list(HoraGroupedAllgather.apply(name, process_set, *tensors))


# ---------------------------------------------------------------- broadcast
def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts an in-place broadcast from ``root_rank``, a GLOBAL rank (a member
    of ``process_set``), as in horovod.torch."""
    root = _root_in_set(root_rank, process_set)
    p = basics.submit_broadcast(_ref(tensor), root, name, _check_set(process_set), finish=lambda _: tensor)
    return basics.register(p)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts a broadcast into a new tensor (a copy of ``tensor`` on the root);
    ``root_rank`` is a global rank."""
    return broadcast_async_(tensor.detach().clone(memory_format=torch.contiguous_format), root_rank, name,
                            process_set)


class HoraBroadcast(torch.autograd.Function):
    """Differentiable broadcast. Gradient (horovod.torch's): the averaged
    allreduce of the output's gradient on the root, zero on the other ranks."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output.contiguous(), op=Average, process_set=_check_set(ctx.process_set))
        if basics.rank() != ctx.root_rank:  # root_rank is global
            grad_reduced = grad_reduced * 0
        return grad_reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns the root's ``tensor`` on every rank of ``process_set``; ``root_rank``
    is a global rank (a member of the set)."""
    return HoraBroadcast.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast from global rank ``root_rank``; returns ``tensor``."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ---------------------------------------------------------------- alltoall
def _splits_list(splits):
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        return [int(s) for s in splits.reshape(-1).tolist()]
    return [int(s) for s in splits]


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an alltoall: ``splits[r]`` rows of dim 0 go to rank r (equal split if None).
    synchronize(handle) returns (output, received_splits)."""
    out = _Output(tensor)

    def finish(p):
        return out.tensor, torch.tensor(p.received_splits(), dtype=torch.int32)
    p = basics.submit_alltoall(_ref(tensor), _splits_list(splits), name, _check_set(process_set), finish=finish,
                               keep=out, alloc=out)
    p.cause = out.cause
    return basics.register(p)


class HoraAlltoall(torch.autograd.Function):
    """Differentiable alltoall: the gradient goes back with the received splits."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.received, ctx.process_set = received, process_set
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, grad_splits):
        grad, _ = synchronize(alltoall_async(grad_output.contiguous(), ctx.received, process_set=ctx.process_set))
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Returns the received tensor, plus the received splits when ``splits`` was given."""
    output, received = HoraAlltoall.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received)


# ---------------------------------------------------------------- reducescatter
def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0):
    """Starts a reduce-scatter: reduce over ranks, rank r keeps its block of dim 0
    (ranks below dim0 % size get one extra row). Arguments in horovod.torch's
    order (process_set before the scale factors)."""
    return basics.register(_submit_reducescatter(tensor, name, op, prescale_factor, postscale_factor,
                                                 process_set))


def _submit_reducescatter(tensor, name, op, prescale_factor, postscale_factor, process_set):
    out = _Output(tensor)
    p = basics.submit_reducescatter(_ref(tensor), name, op, prescale_factor, postscale_factor,
                                    _check_set(process_set), finish=out.result, keep=out, alloc=out)
    p.cause = out.cause
    return p


def _reducescatter_grad_scale(op, prescale_factor, postscale_factor, process_set):
    """horovod.torch's reduce-scatter gradient factor: the output's gradient is
    multiplied by the set size for Sum (not for Average) and by both scale
    factors, then allgathered. (For Sum this is size times the derivative of the
    sum of the ranks' losses; hora keeps Horovod's convention so that scripts
    and tests written for Horovod get the same numbers.)"""
    scale = float(prescale_factor) * float(postscale_factor)
    if op == Sum:
        scale *= _check_set(process_set).size()
    return scale


class HoraReducescatter(torch.autograd.Function):
    """Differentiable reduce-scatter; gradient: see _reducescatter_grad_scale."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.scale = _reducescatter_grad_scale(op, prescale_factor, postscale_factor, process_set)
        ctx.process_set = process_set
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        grad = grad_output.contiguous()
        if ctx.scale != 1:
            grad = grad * ctx.scale
        return allgather(grad, process_set=ctx.process_set), None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduces ``tensor`` over the ranks (default: average); rank r keeps its block of dim 0."""
    compressed, cctx = compression.compress(tensor)
    out = HoraReducescatter.apply(compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, cctx)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    children = []
    for i, t in enumerate(tensors):
        children.append(_submit_reducescatter(t, None if name is None else "%s.%d" % (name, i), op,
                                              prescale_factor, postscale_factor, process_set))
    return basics.register(basics.group(children))


class HoraGroupedReducescatter(torch.autograd.Function):
    """Differentiable grouped reduce-scatter; gradient: each output's gradient
    scaled as in _reducescatter_grad_scale, then one grouped allgather."""

    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.scale = _reducescatter_grad_scale(op, prescale_factor, postscale_factor, process_set)
        ctx.process_set = process_set
        return tuple(synchronize(grouped_reducescatter_async(list(tensors), name, op, process_set,
                                                             prescale_factor, postscale_factor)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = [g.contiguous() * ctx.scale if ctx.scale != 1 else g.contiguous() for g in grad_outputs]
        return (None, None, None, None, None) + tuple(grouped_allgather(grads, process_set=ctx.process_set))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduce-scatters each tensor of the list (as one request); returns the list of results."""
    pairs = [compression.compress(t) for t in tensors]
    out = HoraGroupedReducescatter.apply(name, op, prescale_factor, postscale_factor, process_set,
                                         *[c for c, _ in pairs])
    return [compression.decompress(o, c) for o, (_, c) in zip(out, pairs)]


# ---------------------------------------------------------------- join / barrier
def join(device=-1):
    """Declares this rank out of data; until all joined it contributes zeros to the
    others' allreduces. Returns the last rank to join."""
    return basics.join()


def barrier(process_set=global_process_set):
    basics.barrier(_check_set(process_set))
