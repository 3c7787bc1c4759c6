"""Megatron-style tensor parallelism over a hora process set.

A weight matrix is split across the ranks of a tensor-parallel group ("TP
group", usually ``Grid.tp_group``); each rank stores and updates only its
shard, and four conjugate collectives keep forward and backward exact:

  copy_to_region       identity forward, SUM allreduce backward
  reduce_from_region   SUM allreduce forward, identity backward
  scatter_to_region    keep this rank's block of the last dim forward, allgather backward
  gather_from_region   allgather along the last dim forward, keep this rank's block backward

Layers (shapes for a group of n ranks):

  ColumnParallelLinear(in, out)   weight rows split: shard (out/n, in), bias (out/n);
                                  output gathered to (.., out) or left split (.., out/n)
  RowParallelLinear(in, out)      weight columns split: shard (out, in/n), bias full (out)
                                  added once after the SUM of the partial products
  VocabParallelEmbedding(V, d)    rows split: shard (V/n, d); ids outside the shard
                                  give zeros, and the SUM over the group completes it
  vocab_parallel_cross_entropy    cross entropy of logits split along the vocabulary
                                  (e.g. a ColumnParallelLinear LM head with
                                  gather_output=False) without gathering them

A Column layer with ``gather_output=False`` feeding a Row layer with
``input_is_parallel=True`` is the Megatron MLP: one allreduce forward and one
backward for the pair.

Initialisation: a layer's default parameters are the matching slices of the
full layer that torch.nn would initialise from the same random state
(nn.Linear's kaiming-uniform and bias bounds, nn.Embedding's N(0, 1)), so
seed the ranks of a TP group identically. To start from an existing
unsharded layer, use ``from_full(module, group)`` or
``load_full_weight(weight, bias)``; ``shard_slice`` says which slice a rank holds.

Every rank of the group must run the same forward and backward (same input on
every rank of the group; the collectives are unnamed and matched in call
order). Activations of any floating dtype work, also under autocast (bf16,
float16): the collectives run in the activation's dtype.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._comm import (all_reduce, all_reduce_max, copy_to_region, gather_from_region, group_rank, group_size,
                    reduce_from_region, scatter_to_region)

__all__ = ["copy_to_region", "reduce_from_region", "scatter_to_region", "gather_from_region",
           "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding", "vocab_parallel_cross_entropy"]


def _divide(total, n, what):
    if total % n:
        raise ValueError("hora.torch.parallel: %s = %d is not divisible by the tensor-parallel group size %d"
                         % (what, total, n))
    return total // n


def _linear_init(out_features, in_features, bias, dtype, device):
    """A full weight and bias initialised exactly as torch.nn.Linear does (same
    random draws in the same order)."""
    w = torch.empty(out_features, in_features, dtype=dtype, device=device)
    nn.init.kaiming_uniform_(w, a=math.sqrt(5))
    b = None
    if bias:
        b = torch.empty(out_features, dtype=dtype, device=device)
        bound = 1 / math.sqrt(in_features) if in_features > 0 else 0
        nn.init.uniform_(b, -bound, bound)
    return w, b


class ColumnParallelLinear(nn.Module):
    """``y = x A^T + b`` with A's rows (the output features) split over ``group``.

    Input: the full ``(.., in_features)`` on every rank of the group. Output:
    ``(.., out_features)`` on every rank if ``gather_output`` (one allgather),
    else this rank's ``(.., out_features / n)`` block (no communication
    forward; the input's gradient is summed over the group backward).
    """

    def __init__(self, in_features, out_features, bias=True, gather_output=True, group=None, dtype=None,
                 device=None):
        super().__init__()
        self.group = group
        self.in_features, self.out_features = in_features, out_features
        self.gather_output = gather_output
        n, r = group_size(group), group_rank(group)
        self.out_per_rank = _divide(out_features, n, "out_features")
        self.shard_slice = slice(r * self.out_per_rank, (r + 1) * self.out_per_rank)
        self.weight = nn.Parameter(torch.empty(self.out_per_rank, in_features, dtype=dtype, device=device))
        if bias:
            self.bias = nn.Parameter(torch.empty(self.out_per_rank, dtype=dtype, device=device))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        """This rank's slice of an nn.Linear(in, out) initialised from the current random state."""
        w, b = _linear_init(self.out_features, self.in_features, self.bias is not None, self.weight.dtype,
                            self.weight.device)
        self.load_full_weight(w, b)

    @torch.no_grad()
    def load_full_weight(self, weight, bias=None):
        """Copies this rank's rows of a full ``(out, in)`` weight (and ``(out,)`` bias)."""
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError("hora.torch.parallel: full weight of shape %s, expected (%d, %d)"
                             % (tuple(weight.shape), self.out_features, self.in_features))
        self.weight.copy_(weight[self.shard_slice])
        if self.bias is not None and bias is not None:
            self.bias.copy_(bias[self.shard_slice])

    @classmethod
    def from_full(cls, linear, group=None, gather_output=True):
        """A ColumnParallelLinear holding this rank's shard of ``linear`` (an nn.Linear)."""
        m = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, gather_output=gather_output,
                group=group, dtype=linear.weight.dtype, device=linear.weight.device)
        m.load_full_weight(linear.weight, linear.bias)
        return m

    def forward(self, x):
        x = copy_to_region(x, self.group)
        y = F.linear(x, self.weight, self.bias)
        if self.gather_output:
            y = gather_from_region(y, self.group)
        return y

    def extra_repr(self):
        return "in_features=%d, out_features=%d (%d on this rank), bias=%s, gather_output=%s" % (
            self.in_features, self.out_features, self.out_per_rank, self.bias is not None, self.gather_output)


class RowParallelLinear(nn.Module):
    """``y = x A^T + b`` with A's columns (the input features) split over ``group``.

    Input: this rank's ``(.., in_features / n)`` block if ``input_is_parallel``
    (e.g. the output of a ColumnParallelLinear with ``gather_output=False``),
    else the full ``(.., in_features)``, of which each rank takes its block.
    Output: the full ``(.., out_features)`` on every rank, after one SUM
    allreduce of the partial products; the bias (replicated, full size) is added
    after the sum, once.
    """

    def __init__(self, in_features, out_features, bias=True, input_is_parallel=False, group=None, dtype=None,
                 device=None):
        super().__init__()
        self.group = group
        self.in_features, self.out_features = in_features, out_features
        self.input_is_parallel = input_is_parallel
        n, r = group_size(group), group_rank(group)
        self.in_per_rank = _divide(in_features, n, "in_features")
        self.shard_slice = slice(r * self.in_per_rank, (r + 1) * self.in_per_rank)
        self.weight = nn.Parameter(torch.empty(out_features, self.in_per_rank, dtype=dtype, device=device))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype, device=device))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        """This rank's columns of an nn.Linear(in, out) initialised from the current
        random state (the bias whole)."""
        w, b = _linear_init(self.out_features, self.in_features, self.bias is not None, self.weight.dtype,
                            self.weight.device)
        self.load_full_weight(w, b)

    @torch.no_grad()
    def load_full_weight(self, weight, bias=None):
        """Copies this rank's columns of a full ``(out, in)`` weight, and the whole bias."""
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError("hora.torch.parallel: full weight of shape %s, expected (%d, %d)"
                             % (tuple(weight.shape), self.out_features, self.in_features))
        self.weight.copy_(weight[:, self.shard_slice])
        if self.bias is not None and bias is not None:
            self.bias.copy_(bias)

    @classmethod
    def from_full(cls, linear, group=None, input_is_parallel=False):
        """A RowParallelLinear holding this rank's shard of ``linear`` (an nn.Linear)."""
        m = cls(linear.in_features, linear.out_features, bias=linear.bias is not None,
                input_is_parallel=input_is_parallel, group=group, dtype=linear.weight.dtype,
                device=linear.weight.device)
        m.load_full_weight(linear.weight, linear.bias)
        return m

    def forward(self, x):
        if not self.input_is_parallel:
            x = scatter_to_region(x, self.group)
        y = reduce_from_region(F.linear(x, self.weight), self.group)
        if self.bias is not None:
            # in the product's dtype, as nn.Linear's fused bias under autocast
            y = y + self.bias.to(y.dtype)
        return y

    def extra_repr(self):
        return "in_features=%d (%d on this rank), out_features=%d, bias=%s, input_is_parallel=%s" % (
            self.in_features, self.in_per_rank, self.out_features, self.bias is not None, self.input_is_parallel)


class VocabParallelEmbedding(nn.Module):
    """An embedding table whose rows (the vocabulary) are split over ``group``.

    Rank r holds ids ``[r*V/n, (r+1)*V/n)``; it looks up the ids it holds,
    writes zeros for the others, and a SUM allreduce gives every rank the full
    ``(.., embedding_dim)`` result. Ids must be the same on every rank of the
    group. Backward needs no communication: each rank's shard receives the
    gradient of the rows it holds.
    """

    def __init__(self, num_embeddings, embedding_dim, group=None, dtype=None, device=None):
        super().__init__()
        self.group = group
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        n, r = group_size(group), group_rank(group)
        self.per_rank = _divide(num_embeddings, n, "num_embeddings")
        self.vocab_start = r * self.per_rank
        self.vocab_end = self.vocab_start + self.per_rank
        self.shard_slice = slice(self.vocab_start, self.vocab_end)
        self.weight = nn.Parameter(torch.empty(self.per_rank, embedding_dim, dtype=dtype, device=device))
        self.reset_parameters()

    def reset_parameters(self):
        """This rank's rows of an nn.Embedding's N(0, 1) table drawn from the current random state."""
        full = torch.empty(self.num_embeddings, self.embedding_dim, dtype=self.weight.dtype,
                           device=self.weight.device)
        nn.init.normal_(full)
        self.load_full_weight(full)

    @torch.no_grad()
    def load_full_weight(self, weight):
        """Copies this rank's rows of a full ``(num_embeddings, embedding_dim)`` table."""
        if tuple(weight.shape) != (self.num_embeddings, self.embedding_dim):
            raise ValueError("hora.torch.parallel: full embedding of shape %s, expected (%d, %d)"
                             % (tuple(weight.shape), self.num_embeddings, self.embedding_dim))
        self.weight.copy_(weight[self.shard_slice])

    @classmethod
    def from_full(cls, embedding, group=None):
        """A VocabParallelEmbedding holding this rank's rows of ``embedding`` (an nn.Embedding)."""
        m = cls(embedding.num_embeddings, embedding.embedding_dim, group=group, dtype=embedding.weight.dtype,
                device=embedding.weight.device)
        m.load_full_weight(embedding.weight)
        return m

    def forward(self, ids):
        if group_size(self.group) == 1:
            return F.embedding(ids, self.weight)
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0)
        return reduce_from_region(out, self.group)

    def extra_repr(self):
        return "%d, %d (rows %d..%d on this rank)" % (self.num_embeddings, self.embedding_dim, self.vocab_start,
                                                       self.vocab_end - 1)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross entropy over logits split along the vocabulary (last dim).

    Forward, in float32 whatever the logits' dtype, per token:
      1. m = MAX allreduce of the local maxima (for stability; its gradient
         cancels, so it is a constant here),
      2. z = logits - m; S = SUM allreduce of sum(exp(z)) and t = SUM allreduce
         of the target's z (only the rank holding the target contributes; both
         sums travel in one request),
      3. loss = log(S) - t.
    Backward: d loss / d z_j = softmax_j - [j == target], for this rank's j,
    times the incoming gradient; no communication.
    """

    @staticmethod
    def forward(ctx, logits, target, group):
        z = logits.float()
        m = all_reduce_max(z.max(dim=-1).values, group)
        z = z - m.unsqueeze(-1)
        vocab = z.shape[-1]
        start = group_rank(group) * vocab
        outside = (target < start) | (target >= start + vocab)
        local = (target - start).masked_fill(outside, 0)
        picked = z.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        e = z.exp()
        sums = all_reduce(torch.stack([e.sum(dim=-1), picked]), group)
        total, target_logit = sums[0], sums[1]
        e.div_(total.unsqueeze(-1))  # now the softmax
        ctx.save_for_backward(e, outside, local)
        ctx.dtype = logits.dtype
        return total.log() - target_logit

    @staticmethod
    def backward(ctx, grad):
        softmax, outside, local = ctx.saved_tensors
        g = softmax.clone()
        g.scatter_add_(-1, local.unsqueeze(-1), (outside.to(g.dtype) - 1).unsqueeze(-1))
        g.mul_(grad.unsqueeze(-1).to(g.dtype))
        return g.to(ctx.dtype), None, None


def vocab_parallel_cross_entropy(logits_shard, target, group=None):
    """Per-token cross-entropy loss (float32, shape of ``target``, no reduction) of
    logits whose last dimension is the vocabulary split over ``group`` in equal
    blocks, rank r holding classes ``[r*V/n, (r+1)*V/n)``. ``target``: class
    indices (int64) in ``[0, V)``, the same on every rank of the group. Equal to
    ``F.cross_entropy(full_logits.flatten(0, -2), target.flatten(), reduction="none")``
    without gathering the logits: two collectives over the group forward (a MAX
    allreduce of the maxima, then one SUM allreduce carrying both the sums of
    exponentials and the target logits) and none backward."""
    if target.dtype not in (torch.int64, torch.int32):
        raise TypeError("hora.torch.parallel: target must hold class indices (int64), got %s" % target.dtype)
    if tuple(target.shape) != tuple(logits_shard.shape[:-1]):
        raise ValueError("hora.torch.parallel: target shape %s does not match logits %s without the last dim"
                         % (tuple(target.shape), tuple(logits_shard.shape)))
    return _VocabParallelCrossEntropy.apply(logits_shard, target.long(), group)
