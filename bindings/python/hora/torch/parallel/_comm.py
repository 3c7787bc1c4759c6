"""Collectives over one process set along one tensor dimension, and the
autograd functions that tensor and context parallelism are built from.

Why not hora.torch's own differentiable collectives: their backward rules are
horovod.torch's, chosen for data parallelism (``allgather``'s gradient is the
*average* of the ranks' gradients, ``reducescatter``'s is scaled by the set
size for Sum). Model parallelism needs the exact derivative of the sum of the
ranks' losses, and gathers along any dimension, so the functions here call the
non-differentiable ``*_async`` primitives and define their own backward.

Every function takes ``group``: a ``hora.torch.ProcessSet`` that this rank is
a member of (``None`` = the global set). A group of one rank is an identity
everywhere and costs no request. All collectives are SUM reductions. Requests
are unnamed: hora names them in call order per process set and collective, so
every rank of a group must call these functions in the same order (autograd
does that when every rank runs the same model).
"""
import torch

from ..mpi_ops import Max, Sum, allgather_async, allreduce_async, global_process_set, reducescatter_async, synchronize


def _group(group):
    return global_process_set if group is None else group


def group_size(group):
    """Number of ranks in ``group`` (None = the global set)."""
    return _group(group).size()


def group_rank(group):
    """This rank's rank within ``group`` (None = the global set); -1 if it is not a member."""
    return _group(group).rank()


def _check_member(group):
    g = _group(group)
    if g.rank() < 0:
        raise ValueError("hora.torch.parallel: this rank is not a member of %r" % (g,))
    return g


# ------------------------------------------------------------- plain (no autograd)
def all_reduce(tensor, group, op=Sum, name=None):
    """A new tensor: ``op`` (Sum by default) of ``tensor`` over the ranks of ``group``."""
    g = _check_member(group)
    if g.size() == 1:
        return tensor
    return synchronize(allreduce_async(tensor.contiguous(), name=name, op=op, process_set=g))


def all_gather(tensor, dim, group, name=None):
    """Concatenates every rank's ``tensor`` along ``dim`` (same shape on every rank)."""
    g = _check_member(group)
    if g.size() == 1:
        return tensor
    dim = dim % tensor.dim()
    # hora gathers along dim 0: move ``dim`` to the front and back again.
    front = tensor.movedim(dim, 0).contiguous()
    out = synchronize(allgather_async(front, name=name, process_set=g))
    return out.movedim(0, dim)


def reduce_scatter(tensor, dim, group, name=None):
    """Sums ``tensor`` over the ranks and keeps this rank's equal block along ``dim``
    (``tensor.shape[dim]`` must be divisible by the group size)."""
    g = _check_member(group)
    n = g.size()
    if n == 1:
        return tensor
    dim = dim % tensor.dim()
    if tensor.shape[dim] % n:
        raise ValueError("hora.torch.parallel: reduce_scatter of %d elements along dim %d over %d ranks: "
                         "not divisible" % (tensor.shape[dim], dim, n))
    front = tensor.movedim(dim, 0).contiguous()
    out = synchronize(reducescatter_async(front, name=name, op=Sum, process_set=g))
    return out.movedim(0, dim)


def split(tensor, dim, group):
    """This rank's equal block of ``tensor`` along ``dim`` (no communication)."""
    g = _check_member(group)
    n = g.size()
    if n == 1:
        return tensor
    size = tensor.shape[dim]
    if size % n:
        raise ValueError("hora.torch.parallel: cannot split %d elements of dim %d into %d equal parts"
                         % (size, dim, n))
    chunk = size // n
    return tensor.narrow(dim, g.rank() * chunk, chunk).contiguous()


def all_reduce_max(tensor, group):
    """Elementwise maximum over the ranks of ``group`` (no gradient)."""
    return all_reduce(tensor, group, op=Max)


# ------------------------------------------------------------- autograd functions
class _CopyToRegion(torch.autograd.Function):
    """Identity forward; backward sums the gradient over the group (the input was
    used by every rank's shard of the computation)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad, ctx.group), None


class _ReduceFromRegion(torch.autograd.Function):
    """Sum over the group forward; identity backward (every rank holds the same sum)."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _ScatterToRegion(torch.autograd.Function):
    """Keeps this rank's block along ``dim`` forward; backward gathers the blocks'
    gradients (the whole input was replicated, each rank used one block)."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return split(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return all_gather(grad, ctx.dim, ctx.group), None, None


class _GatherFromRegion(torch.autograd.Function):
    """Concatenates the ranks' blocks along ``dim`` forward; backward keeps this
    rank's block of the gradient. Correct when the gathered result is used the
    same way on every rank (replicated computation downstream), so that every
    rank holds the same gradient of it; see _GatherSumGrad otherwise."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return all_gather(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return split(grad, ctx.dim, ctx.group), None, None


class _GatherSumGrad(torch.autograd.Function):
    """Concatenates the ranks' blocks along ``dim`` forward; backward sums the
    gradient over the ranks and keeps this rank's block (a reduce-scatter).
    This is the exact derivative when every rank uses the gathered tensor
    differently (context parallelism: each rank's queries read all keys)."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return all_gather(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter(grad, ctx.dim, ctx.group), None, None


def copy_to_region(x, group):
    """Megatron's copy-to-model-parallel-region: identity forward, SUM allreduce backward."""
    if group_size(group) == 1:
        return x
    return _CopyToRegion.apply(x, group)


def reduce_from_region(x, group):
    """Megatron's reduce-from-model-parallel-region: SUM allreduce forward, identity backward."""
    if group_size(group) == 1:
        return x
    return _ReduceFromRegion.apply(x, group)


def scatter_to_region(x, group, dim=-1):
    """Megatron's scatter-to-model-parallel-region: this rank's equal block along
    ``dim`` (last by default) forward, allgather backward."""
    if group_size(group) == 1:
        return x
    return _ScatterToRegion.apply(x, dim, group)


def gather_from_region(x, group, dim=-1):
    """Megatron's gather-from-model-parallel-region: allgather along ``dim`` (last
    by default) forward, this rank's block of the gradient backward."""
    if group_size(group) == 1:
        return x
    return _GatherFromRegion.apply(x, dim, group)


def gather_sum_grad(x, group, dim):
    """Allgather along ``dim`` whose backward is a SUM reduce-scatter (see _GatherSumGrad)."""
    if group_size(group) == 1:
        return x
    return _GatherSumGrad.apply(x, dim, group)
