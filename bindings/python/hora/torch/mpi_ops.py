"""horovod.torch's collective functions over libhora, tensors passed by DLPack.

Every ``*_async*`` function returns an integer handle for ``poll()`` and
``synchronize()``; the tensors involved stay referenced by the handle until
the operation completed. Trailing-underscore variants work in place.
``allreduce``, ``grouped_allreduce``, ``allgather``, ``broadcast``,
``alltoall`` and ``reducescatter`` are differentiable (torch.autograd).

Tensors must be contiguous and of a dtype hora supports (uint8, int8,
int16, int32, int64, float16, bfloat16, float32, float64, bool). CPU tensors
work with every function; CUDA tensors with allreduce and broadcast (and so
DistributedOptimizer and broadcast_parameters), through libhora's GPU plugin:
hora's stream waits for an event recorded on the tensor's current stream at
submission, so no synchronization is needed before the call. torch 1.13's
DLPack export refuses bool, so bool tensors are exported as uint8 and marked
bool for hora.
"""

import torch
from torch.utils.dlpack import to_dlpack

from .. import _dlpack
from .. import _lib
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


class _Output:
    """The result tensor of a collective whose output shape is known only after
    negotiation (allgather, alltoall, reducescatter): allocated by torch on the
    input's device when hora asks (options.alloc, called on a hora thread), so
    the result is written once, in place, on CPU and GPU alike."""
    __slots__ = ("like", "stream", "tensor", "error", "cfunc")

    def __init__(self, like):
        self.like = like
        # CUDA: allocate on the caller's current stream (captured here, on the
        # framework thread), as a tensor created by the caller would be; the
        # caching allocator then reuses the block only after that stream's work.
        self.stream = torch.cuda.current_stream(like.device) if like.is_cuda else None
        self.tensor = None
        self.error = None
        self.cfunc = _lib.ALLOC(self._alloc)

    def _alloc(self, _user, ndim, shape, _dtype, _nbytes, data):
        try:
            dims = [shape[i] for i in range(ndim)]
            if self.stream is not None:
                with torch.cuda.stream(self.stream):
                    self.tensor = torch.empty(dims, dtype=self.like.dtype, device=self.like.device)
            else:
                self.tensor = torch.empty(dims, dtype=self.like.dtype, device=self.like.device)
            data[0] = self.tensor.data_ptr() or None
            return 0
        except BaseException as e:  # nothing may propagate into the hora thread
            self.error = e
            return 1

    def cause(self):
        """Why the allocation failed (chained onto the request's error), or None."""
        return self.error

    def result(self, _pending=None):
        return self.tensor


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


# ---------------------------------------------------------------- allreduce
def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, process_set):
    inp = _ref(tensor)
    out = inp if output is tensor else _ref(output)
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
                                keep=out, alloc=out.cfunc)
    p.cause = out.cause
    return p


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating every rank's tensor along dim 0 (first dims may differ)."""
    return basics.register(_submit_allgather(tensor, name, process_set))


class HoraAllgather(torch.autograd.Function):
    """Differentiable allgather: gradient = averaged allreduce of the output's gradient,
    sliced to this rank's rows (as in Horovod)."""

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
        r = ps.rank()
        offset = int(dims[:r].sum()) if r > 0 else 0
        return grad_reduced.narrow(0, offset, ctx.dim), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    return HoraAllgather.apply(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    children = []
    for i, t in enumerate(tensors):
        children.append(_submit_allgather(t, None if name is None else "%s.%d" % (name, i), process_set))
    return basics.register(basics.group(children))


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    return synchronize(grouped_allgather_async(tensors, name, process_set))


# ---------------------------------------------------------------- broadcast
def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts an in-place broadcast from ``root_rank`` (a rank within the set)."""
    p = basics.submit_broadcast(_ref(tensor), root_rank, name, _check_set(process_set), finish=lambda _: tensor)
    return basics.register(p)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts a broadcast into a new tensor (a copy of ``tensor`` on the root)."""
    return broadcast_async_(tensor.detach().clone(memory_format=torch.contiguous_format), root_rank, name,
                            process_set)


class HoraBroadcast(torch.autograd.Function):
    """Differentiable broadcast: gradient = averaged allreduce on the root, zero elsewhere."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        ps = _check_set(ctx.process_set)
        grad_reduced = allreduce(grad_output.contiguous(), op=Average, process_set=ps)
        if ps.rank() != ctx.root_rank:
            grad_reduced = grad_reduced * 0
        return grad_reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    return HoraBroadcast.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
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
                               keep=out, alloc=out.cfunc)
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
def reducescatter_async(tensor, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,
                        process_set=global_process_set):
    """Starts a reduce-scatter: reduce over ranks, rank r keeps its block of dim 0
    (ranks below dim0 % size get one extra row)."""
    return basics.register(_submit_reducescatter(tensor, name, op, prescale_factor, postscale_factor,
                                                 process_set))


def _submit_reducescatter(tensor, name, op, prescale_factor, postscale_factor, process_set):
    out = _Output(tensor)
    p = basics.submit_reducescatter(_ref(tensor), name, op, prescale_factor, postscale_factor,
                                    _check_set(process_set), finish=out.result, keep=out, alloc=out.cfunc)
    p.cause = out.cause
    return p


class HoraReducescatter(torch.autograd.Function):
    """Differentiable reduce-scatter: the gradient is the allgather of the output's gradient."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.op, ctx.scale, ctx.process_set = op, prescale_factor * postscale_factor, process_set
        return synchronize(reducescatter_async(tensor, name, op, prescale_factor, postscale_factor, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = synchronize(allgather_async(grad_output.contiguous(), process_set=ctx.process_set))
        scale = ctx.scale / (_check_set(ctx.process_set).size() if ctx.op == Average else 1)
        if scale != 1:
            grad = grad * scale
        return grad, None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, prescale_factor=1.0,
                  postscale_factor=1.0, process_set=global_process_set):
    compressed, cctx = compression.compress(tensor)
    out = HoraReducescatter.apply(compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, cctx)


def grouped_reducescatter_async(tensors, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,
                                process_set=global_process_set):
    children = []
    for i, t in enumerate(tensors):
        children.append(_submit_reducescatter(t, None if name is None else "%s.%d" % (name, i), op,
                                              prescale_factor, postscale_factor, process_set))
    return basics.register(basics.group(children))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average, prescale_factor=1.0,
                          postscale_factor=1.0, process_set=global_process_set):
    pairs = [compression.compress(t) for t in tensors]
    out = synchronize(grouped_reducescatter_async([c for c, _ in pairs], name, op, prescale_factor,
                                                  postscale_factor, process_set))
    return [compression.decompress(o, c) for o, (_, c) in zip(out, pairs)]


# ---------------------------------------------------------------- join / barrier
def join(device=-1):
    """Declares this rank out of data; until all joined it contributes zeros to the
    others' allreduces. Returns the last rank to join."""
    return basics.join()


def barrier(process_set=global_process_set):
    basics.barrier(_check_set(process_set))
