"""Context parallelism: attention over a sequence split across the ranks of a
context-parallel group ("CP group", usually ``Grid.cp_group``).

Each of the n ranks holds one contiguous, equal chunk of the sequence: rank r
holds global positions ``[r*s, (r+1)*s)`` of the queries, keys and values
(and of every activation before and after attention). Attention is the only
layer that mixes positions, so it is the only one that communicates:

  1. the keys and values of all ranks are gathered (one allgather of K and V
     stacked, along the sequence dimension),
  2. each rank attends its own queries to the full keys and values, with the
     causal mask computed from *global* positions (query i of rank r is at
     r*s + i),
  3. backward, the gradients of the gathered keys and values differ from rank
     to rank (each rank's queries used them differently), so they are summed
     over the group and each rank keeps the block of its own chunk: a SUM
     reduce-scatter. (hora.torch.allgather's own backward is horovod.torch's,
     which averages; that would be wrong by a factor n here.)

The result on each rank is exactly its chunk of the unsplit attention over
the full sequence. This is the all-gather form of context parallelism (memory
for the full K and V on every rank, O(s * n*s) compute per rank); a ring
exchange would overlap communication, at the cost of point-to-point sends.
With a causal mask, contiguous chunks leave the last rank the most work.

Weights of layers applied to a CP-split sequence (projections, MLPs) are
replicated over the CP group and each rank sees part of the tokens, so their
gradients must be summed over the group (over ``Grid.dp_cp_group`` when data
parallelism is combined with it) before the optimizer step.
"""
import math

import torch
import torch.nn as nn

from ._comm import gather_from_region, gather_sum_grad, group_rank, group_size, scatter_to_region

__all__ = ["context_parallel_attention", "ContextParallelSelfAttention", "split_sequence", "gather_sequence",
           "sequence_offset"]


def sequence_offset(local_len, group=None):
    """Global position of this rank's first token when every rank of ``group``
    holds ``local_len`` consecutive tokens (for position embeddings: add
    ``torch.arange(local_len) + sequence_offset(...)``)."""
    return group_rank(group) * local_len


def split_sequence(x, group=None, dim=1):
    """This rank's contiguous chunk of ``x`` (the full sequence, replicated on every
    rank of ``group``) along ``dim``; the length must divide by the group size.
    Backward gathers the chunks' gradients into the full one."""
    return scatter_to_region(x, group, dim=dim)


def gather_sequence(x, group=None, dim=1):
    """The full sequence from every rank's chunk along ``dim``. Backward keeps
    this rank's chunk of the gradient, which is exact when what follows is
    computed identically on every rank (e.g. one loss over the full sequence)."""
    return gather_from_region(x, group, dim=dim)


def _attention(q, k, v, causal, scale, q_offset):
    """Softmax attention of q (.., sq, d) over k, v (.., sk, d[v]); query i sits at
    global position q_offset + i, key j at j. Scores and softmax in float32."""
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    if causal:
        sq, sk = q.shape[-2], k.shape[-2]
        q_pos = torch.arange(sq, device=q.device) + q_offset
        k_pos = torch.arange(sk, device=q.device)
        scores = scores.masked_fill(k_pos.unsqueeze(0) > q_pos.unsqueeze(1), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs.to(v.dtype), v)


def context_parallel_attention(q, k, v, group=None, causal=False, scale=None):
    """Scaled dot-product attention of this rank's chunk of queries over the whole
    sequence's keys and values, the sequence being split over ``group``.

    ``q``, ``k``: ``(.., s, d)``; ``v``: ``(.., s, dv)`` (e.g. batch, heads,
    s, head_dim), this rank's contiguous chunk of s positions, with the same s
    on every rank of the group. Returns ``(.., s, dv)``: this rank's chunk of
    ``softmax(q k^T * scale + mask) v`` computed over the full sequence
    (scale defaults to 1/sqrt(d); causal: query position i sees keys <= i, in
    global positions). Differentiable in q, k and v; under autocast the
    products run in the autocast dtype, the softmax in float32.
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    n = group_size(group)
    s = k.shape[-2]
    if q.shape[-2] != s or v.shape[-2] != s:
        raise ValueError("hora.torch.parallel: q, k and v must hold the same chunk of the sequence (lengths %d, %d, "
                         "%d)" % (q.shape[-2], s, v.shape[-2]))
    if n == 1:
        return _attention(q, k, v, causal, scale, 0)
    if k.shape == v.shape and k.dtype == v.dtype:
        kv = gather_sum_grad(torch.stack([k, v]), group, dim=-2)  # one request for both
        k_full, v_full = kv.unbind(0)
    else:
        k_full = gather_sum_grad(k, group, dim=-2)
        v_full = gather_sum_grad(v, group, dim=-2)
    if k_full.shape[-2] != n * s:
        raise ValueError("hora.torch.parallel: context parallelism needs the same chunk length on every rank; "
                         "this rank holds %d of %d positions over %d ranks" % (s, k_full.shape[-2], n))
    return _attention(q, k_full, v_full, causal, scale, group_rank(group) * s)


class ContextParallelSelfAttention(nn.Module):
    """Multi-head self-attention on this rank's chunk ``(batch, s, embed_dim)`` of
    a sequence split over ``group``, returning the same chunk of the output.

    The q, k, v and output projections (``q_proj``, ``k_proj``, ``v_proj``,
    ``out_proj``, nn.Linear) are ordinary replicated weights; only the
    attention itself communicates (context_parallel_attention). Their
    gradients are each rank's share: sum them over the CP group before the
    optimizer step (see the module docstring).
    """

    def __init__(self, embed_dim, num_heads, group=None, causal=True, bias=True, dtype=None, device=None):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError("hora.torch.parallel: embed_dim %d is not divisible by num_heads %d"
                             % (embed_dim, num_heads))
        self.group, self.causal = group, causal
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        kw = {"bias": bias, "dtype": dtype, "device": device}
        self.q_proj = nn.Linear(embed_dim, embed_dim, **kw)
        self.k_proj = nn.Linear(embed_dim, embed_dim, **kw)
        self.v_proj = nn.Linear(embed_dim, embed_dim, **kw)
        self.out_proj = nn.Linear(embed_dim, embed_dim, **kw)

    def _heads(self, x):
        b, s, _ = x.shape
        return x.reshape(b, s, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x):
        b, s, e = x.shape
        q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
        out = context_parallel_attention(q, k, v, self.group, causal=self.causal)
        return self.out_proj(out.transpose(1, 2).reshape(b, s, e))

    def extra_repr(self):
        return "embed_dim=%d, num_heads=%d, causal=%s" % (self.embed_dim, self.num_heads, self.causal)
