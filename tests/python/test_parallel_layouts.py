"""hora.torch.parallel (issue 17): the hybrid process grid, Megatron-style tensor
parallelism and context-parallel attention, each against a single-process
reference built in every rank from the same seed.

  grid            coordinates and groups against the layout formula (with tp
                  innermost), set ranks equal to coordinates, groups checked by
                  an allgather of their members' global ranks, and a TP and a
                  DP allreduce in flight at once, submitted in opposite orders
                  on neighbouring ranks (a shared queue would deadlock)
  tensor parallel a Column->Row MLP (both the Megatron pairing and the gather/
                  scatter one) and an embedding + MLP + vocab-parallel LM head
                  trained with SGD for a few steps: every shard equals the
                  matching slice of the reference, to fp32 rounding; also with
                  DP (tp=2 on 4 ranks, batches split, gradients averaged over
                  dp_group), gradient accumulation, bf16 autocast, fp16/bf16
                  collectives, and the cross entropy's stability on huge logits
  context parallel attention over a sequence split across ranks: output and the
                  gradients of q, k, v (and of a self-attention block's input and
                  weights) equal to the unsplit attention, causal and not

Tolerances: fp32 rtol 1e-5 (the partial sums of a split matmul are added in
another order than the reference's); bf16 a few 1e-2. Every comparison also
checks that training moved the weights, so a no-op cannot pass.
"""
import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import hora.torch as hvd
from hora.torch import parallel as P
from harness import RankPool

RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(scope="module")
def pool4():
    pool = RankPool(4, extra_env={"HORA_STALL_SHUTDOWN_TIME_S": 20})
    yield pool
    pool.close()


def _pool(request, size):
    return request.getfixturevalue("pool%d" % size)


def _close(got, want, what, rtol=RTOL, atol=ATOL):
    assert got.shape == want.shape, "%s: shape %s, expected %s" % (what, tuple(got.shape), tuple(want.shape))
    got, want = got.detach().float(), want.detach().float()
    if not torch.allclose(got, want, rtol=rtol, atol=atol):
        err = (got - want).abs().max().item()
        raise AssertionError("%s differs from the reference (max abs error %.3g)\n%s\nexpected\n%s"
                             % (what, err, got, want))


def _moved(before, after, what):
    """Training must have changed the reference, or comparing to it proves nothing."""
    assert (after - before).abs().max().item() > 1e-3, "%s did not move in training" % what


# ====================================================================== grid
def test_layout_formula_and_groups():
    """Pure layout arithmetic (no ranks): tp innermost, groups partition the world."""
    size, tp, pp, cp = 16, 2, 2, 2
    seen = {}
    for r in range(size):
        g = P.layout(size, r, tp=tp, pp=pp, cp=cp)
        assert g.dp_size == 2
        assert r == g.tp_rank + tp * (g.cp_rank + cp * (g.pp_rank + pp * g.dp_rank)), g
        assert g.rank_of(tp=g.tp_rank, cp=g.cp_rank, pp=g.pp_rank, dp=g.dp_rank) == r
        assert g.tp_ranks == [r - g.tp_rank, r - g.tp_rank + 1]  # consecutive ranks share a TP group
        for d in ("tp", "cp", "pp", "dp"):
            ranks = getattr(g, d + "_ranks")
            assert ranks.index(r) == getattr(g, d + "_rank"), (d, g)  # set rank == coordinate
            seen.setdefault(d, set()).add(tuple(ranks))
    for d, groups in seen.items():
        flat = sorted(x for grp in groups for x in grp)
        assert flat == list(range(size)), "%s groups do not partition the world: %s" % (d, groups)
    g = P.layout(8, 5, tp=2, pp=2)  # 8 = tp2 x pp2 x dp2: rank 5 = tp1 pp0 dp1
    assert (g.tp_rank, g.pp_rank, g.dp_rank) == (1, 0, 1)
    assert (g.tp_ranks, g.pp_ranks, g.dp_ranks) == ([4, 5], [5, 7], [1, 5])
    assert g.all_groups("pp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert (g.pp_next_global_rank, g.pp_prev_global_rank, g.is_first_stage, g.is_last_stage) == (7, 7, True, False)
    g = P.layout(8, 2, tp=2, pp=4)  # pipeline neighbours: rank 2 is stage 1 of [0, 2, 4, 6]
    assert (g.pp_ranks, g.pp_rank, g.pp_next_rank, g.pp_prev_rank) == ([0, 2, 4, 6], 1, 2, 0)
    assert (g.pp_next_global_rank, g.pp_prev_global_rank, g.is_first_stage, g.is_last_stage) == (4, 0, False, False)
    g = P.layout(8, 7, tp=2, pp=4)  # the last stage's next wraps around to the first
    assert (g.pp_rank, g.pp_next_global_rank, g.pp_prev_global_rank, g.is_last_stage) == (3, 1, 5, True)
    g = P.layout(8, 5, tp=2, cp=2, order="dp-tp-cp-pp")  # dp innermost now
    assert (g.dp_rank, g.tp_rank, g.cp_rank) == (1, 0, 1) and g.dp_ranks == [4, 5]
    with pytest.raises(ValueError, match=r"world size 6 is not divisible by tp\*pp\*cp = 4\*1\*1 = 4"):
        P.layout(6, 0, tp=4)
    with pytest.raises(ValueError, match="dp=3"):
        P.layout(8, 0, tp=2, dp=3)
    with pytest.raises(ValueError, match="order"):
        P.layout(8, 0, order="tp-pp-dp")


def _b_grid(rank, size, tp, pp, cp, order):
    try:
        P.grid(tp=3, pp=pp, cp=cp)
    except ValueError as e:
        assert "world size %d is not divisible" % size in str(e), e
    else:
        raise AssertionError("grid(tp=3) on %d ranks did not raise" % size)
    g = P.grid(tp=tp, pp=pp, cp=cp) if order is None else P.grid(tp=tp, pp=pp, cp=cp, order=order)
    try:
        dp = size // (tp * pp * cp)
        assert (g.rank, g.size, g.tp_size, g.pp_size, g.cp_size, g.dp_size) == (rank, size, tp, pp, cp, dp), g
        if order is None:  # the default: tp innermost, so consecutive ranks share a TP group
            assert g.order == "tp-cp-pp-dp"
            assert rank == g.tp_rank + tp * (g.cp_rank + cp * (g.pp_rank + pp * g.dp_rank)), g
        for d in ("tp", "pp", "cp", "dp"):
            ps = getattr(g, d + "_group")
            assert ps is not None and ps.size() == getattr(g, d + "_size"), (d, ps)
            assert ps.rank() == getattr(g, d + "_rank"), (d, ps.rank(), g)
            # the set really holds the ranks the grid says (and they agree on it)
            members = hvd.allgather(torch.tensor([rank]), process_set=ps).tolist()
            assert members == getattr(g, d + "_ranks") == ps.ranks, (d, members, g)
            others = hvd.allgather(torch.tensor([[g.tp_rank, g.cp_rank, g.pp_rank, g.dp_rank]]), process_set=ps)
            for k, dd in enumerate(("tp", "cp", "pp", "dp")):  # a group varies only its own coordinate
                col = others[:, k].tolist()
                assert col == (list(range(ps.size())) if dd == d else [col[0]] * ps.size()), (d, dd, col)
        if cp > 1:
            assert sorted(g.dp_cp_group.ranks) == g.group_ranks(("dp", "cp"))
        else:
            assert g.dp_cp_group is g.dp_group
        assert g.pp_ranks[g.pp_next_rank] == g.pp_next_global_rank
        assert g.pp_next_rank == (g.pp_rank + 1) % pp and g.pp_prev_rank == (g.pp_rank - 1) % pp
        assert g.is_first_stage == (g.pp_rank == 0) and g.is_last_stage == (g.pp_rank == pp - 1)
        # A TP and a DP allreduce in flight at once, submitted in opposite orders on
        # neighbouring ranks: each set negotiates on its own, so both complete.
        t = torch.tensor([float(rank + 1)])
        first, second = (g.tp_group, g.dp_group) if rank % 2 == 0 else (g.dp_group, g.tp_group)
        h1 = hvd.allreduce_async(t, op=hvd.Sum, process_set=first, name="grid.concurrent")
        h2 = hvd.allreduce_async(t, op=hvd.Sum, process_set=second, name="grid.concurrent")
        r1, r2 = hvd.synchronize(h2), hvd.synchronize(h1)  # the later one first
        tp_sum, dp_sum = (r2, r1) if rank % 2 == 0 else (r1, r2)
        assert tp_sum.item() == sum(x + 1 for x in g.tp_ranks), (tp_sum, g)
        assert dp_sum.item() == sum(x + 1 for x in g.dp_ranks), (dp_sum, g)
    finally:
        g.destroy()
    assert g.tp_group is None
    hvd.barrier()
    return [g.tp_rank, g.cp_rank, g.pp_rank, g.dp_rank]


@pytest.mark.parametrize("size,tp,pp,cp,order", [
    (2, 2, 1, 1, None), (2, 1, 1, 1, None), (2, 1, 2, 1, None),
    (4, 2, 1, 1, None), (4, 2, 2, 1, None), (4, 2, 1, 2, None), (4, 1, 4, 1, None),
    (4, 2, 1, 1, "dp-tp-cp-pp")])
def test_grid(request, size, tp, pp, cp, order):
    coords = _pool(request, size).run(_b_grid, tp, pp, cp, order)
    # every rank has a distinct place in the grid
    assert len({tuple(c) for c in coords}) == size, coords


# ====================================================================== tensor parallel
def _mlp_reference(seed=0, d_in=8, hidden=16, d_out=6):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(), nn.Linear(hidden, d_out))


class _ParallelMLP(nn.Module):
    """Column -> tanh -> Row over ``group``, from a reference Sequential."""

    def __init__(self, ref, group, variant):
        super().__init__()
        if variant == "megatron":  # no communication between the two layers
            self.col = P.ColumnParallelLinear.from_full(ref[0], group, gather_output=False)
            self.row = P.RowParallelLinear.from_full(ref[2], group, input_is_parallel=True)
        else:  # gather the hidden layer, let the row layer take its block again
            self.col = P.ColumnParallelLinear.from_full(ref[0], group, gather_output=True)
            self.row = P.RowParallelLinear.from_full(ref[2], group, input_is_parallel=False)

    def forward(self, x):
        return self.row(torch.tanh(self.col(x)))


def _check_mlp_shards(par, ref, what, rtol=RTOL, atol=ATOL, grads=False):
    c, r = par.col.shard_slice, par.row.shard_slice
    get = (lambda p: p.grad) if grads else (lambda p: p)
    _close(get(par.col.weight), get(ref[0].weight)[c], what + " column weight", rtol, atol)
    _close(get(par.col.bias), get(ref[0].bias)[c], what + " column bias", rtol, atol)
    _close(get(par.row.weight), get(ref[2].weight)[:, r], what + " row weight", rtol, atol)
    _close(get(par.row.bias), get(ref[2].bias), what + " row bias", rtol, atol)


def _dp_average_grads(params, g):
    if g.dp_size > 1:
        grads = hvd.grouped_allreduce([p.grad for p in params], op=hvd.Average, process_set=g.dp_group)
        for p, gr in zip(params, grads):
            p.grad.copy_(gr)


def _b_tp_mlp(rank, size, tp, variant):
    g = P.grid(tp=tp)
    try:
        ref = _mlp_reference()
        start = [p.detach().clone() for p in ref.parameters()]
        par = _ParallelMLP(ref, g.tp_group, variant)
        _check_mlp_shards(par, ref, "initial")
        gen = torch.Generator().manual_seed(1)
        steps, batch = 5, 8
        xs, ys = torch.randn(steps, batch, 8, generator=gen), torch.randn(steps, batch, 6, generator=gen)
        opt_ref = torch.optim.SGD(ref.parameters(), lr=0.2)
        opt_par = torch.optim.SGD(par.parameters(), lr=0.2)
        per = batch // g.dp_size
        mine = slice(g.dp_rank * per, (g.dp_rank + 1) * per)  # this DP replica's share of each batch
        for s in range(steps):
            opt_ref.zero_grad()
            loss_ref = F.mse_loss(ref(xs[s]), ys[s])
            loss_ref.backward()
            opt_par.zero_grad()
            loss_par = F.mse_loss(par(xs[s][mine]), ys[s][mine])
            loss_par.backward()
            _dp_average_grads(list(par.parameters()), g)
            loss_all = hvd.allreduce(loss_par.detach(), op=hvd.Average, process_set=g.dp_group)
            _close(loss_all, loss_ref, "loss at step %d" % s)
            if s == 0:
                _check_mlp_shards(par, ref, "step 0", grads=True)
            opt_ref.step()
            opt_par.step()
        _check_mlp_shards(par, ref, "after %d steps" % steps)
        for i, (a, b) in enumerate(zip(start, ref.parameters())):
            _moved(a, b, "reference parameter %d" % i)
    finally:
        g.destroy()
    hvd.barrier()


@pytest.mark.parametrize("size,tp", [(2, 2), (4, 2), (4, 4)])
@pytest.mark.parametrize("variant", ["megatron", "gather_scatter"])
def test_tp_mlp_trains_like_one_process(request, size, tp, variant):
    _pool(request, size).run(_b_tp_mlp, tp, variant)


def _b_tp_grad_accumulation(rank, size):
    g = P.grid(tp=size)
    try:
        ref = _mlp_reference(seed=3)
        par = _ParallelMLP(ref, g.tp_group, "megatron")
        gen = torch.Generator().manual_seed(4)
        opt_ref = torch.optim.SGD(ref.parameters(), lr=0.5)
        opt_par = torch.optim.SGD(par.parameters(), lr=0.5)
        start = [p.detach().clone() for p in ref.parameters()]
        for step in range(2):
            micro = [(torch.randn(4, 8, generator=gen), torch.randn(4, 6, generator=gen)) for _ in range(2)]
            opt_ref.zero_grad()
            opt_par.zero_grad()
            for x, y in micro:  # two micro-batches, gradients accumulate, one step
                (F.mse_loss(ref(x), y) / 2).backward()
                (F.mse_loss(par(x), y) / 2).backward()
            # the accumulated gradient is that of the whole batch (the reference's check)
            whole = _mlp_reference(seed=3) if step == 0 else None
            if whole is not None:
                x, y = torch.cat([m[0] for m in micro]), torch.cat([m[1] for m in micro])
                F.mse_loss(whole(x), y).backward()
                _close(par.col.weight.grad, whole[0].weight.grad[par.col.shard_slice], "accumulated gradient")
            _check_mlp_shards(par, ref, "accumulated step %d" % step, grads=True)
            opt_ref.step()
            opt_par.step()
        _check_mlp_shards(par, ref, "after accumulation")
        _moved(start[0], ref[0].weight, "reference weight")
    finally:
        g.destroy()
    hvd.barrier()


def test_tp_gradient_accumulation(pool2):
    pool2.run(_b_tp_grad_accumulation)


class _LM(nn.Module):
    """Embedding -> residual MLP -> LM head: the reference (single process)."""

    def __init__(self, vocab, dim, hidden, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(vocab, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.Tanh(), nn.Linear(hidden, dim))
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids, target):
        h = self.emb(ids)
        h = h + self.mlp(h)
        logits = self.head(h)
        return F.cross_entropy(logits.flatten(0, -2), target.flatten())


class _ParallelLM(nn.Module):
    """The same model, every layer sharded over ``group``; the logits stay split
    along the vocabulary into the vocab-parallel cross entropy."""

    def __init__(self, ref, group):
        super().__init__()
        self.group = group
        self.emb = P.VocabParallelEmbedding.from_full(ref.emb, group)
        self.col = P.ColumnParallelLinear.from_full(ref.mlp[0], group, gather_output=False)
        self.row = P.RowParallelLinear.from_full(ref.mlp[2], group, input_is_parallel=True)
        self.head = P.ColumnParallelLinear.from_full(ref.head, group, gather_output=False)

    def forward(self, ids, target):
        h = self.emb(ids)
        h = h + self.row(torch.tanh(self.col(h)))
        return P.vocab_parallel_cross_entropy(self.head(h), target, self.group).mean()


def _check_lm_shards(par, ref, what, grads=False):
    get = (lambda p: p.grad) if grads else (lambda p: p)
    _close(get(par.emb.weight), get(ref.emb.weight)[par.emb.shard_slice], what + " embedding")
    _close(get(par.col.weight), get(ref.mlp[0].weight)[par.col.shard_slice], what + " column weight")
    _close(get(par.row.weight), get(ref.mlp[2].weight)[:, par.row.shard_slice], what + " row weight")
    _close(get(par.row.bias), get(ref.mlp[2].bias), what + " row bias")
    _close(get(par.head.weight), get(ref.head.weight)[par.head.shard_slice], what + " LM head")


def _b_tp_lm(rank, size):
    g = P.grid(tp=size)
    try:
        vocab, dim = 16, 8
        ref = _LM(vocab, dim, 16, seed=5)
        par = _ParallelLM(ref, g.tp_group)
        start = ref.head.weight.detach().clone()
        gen = torch.Generator().manual_seed(6)
        opt_ref = torch.optim.SGD(ref.parameters(), lr=0.5)
        opt_par = torch.optim.SGD(par.parameters(), lr=0.5)
        for s in range(4):
            ids = torch.randint(0, vocab, (3, 5), generator=gen)
            target = torch.randint(0, vocab, (3, 5), generator=gen)
            opt_ref.zero_grad()
            opt_par.zero_grad()
            loss_ref, loss_par = ref(ids, target), par(ids, target)
            _close(loss_par, loss_ref, "loss at step %d" % s)
            loss_ref.backward()
            loss_par.backward()
            if s == 0:
                _check_lm_shards(par, ref, "step 0", grads=True)
            opt_ref.step()
            opt_par.step()
        _check_lm_shards(par, ref, "after 4 steps")
        _moved(start, ref.head.weight, "reference LM head")
    finally:
        g.destroy()
    hvd.barrier()


@pytest.mark.parametrize("size", [2, 4])
def test_tp_language_model_trains_like_one_process(request, size):
    _pool(request, size).run(_b_tp_lm)


def _b_vocab_cross_entropy(rank, size):
    """The loss and its gradient against F.cross_entropy, on logits large enough
    that an unstabilised exp() overflows, with per-token weights downstream."""
    g = P.grid(tp=size)
    try:
        gen = torch.Generator().manual_seed(7)
        vocab = 4 * size
        full = (torch.randn(2, 3, vocab, generator=gen, dtype=torch.float64) * 400).float()
        target = torch.randint(0, vocab, (2, 3), generator=gen)
        target[0, 0], target[1, 2] = 0, vocab - 1  # first and last class (first and last rank)
        weights = torch.rand(2, 3, generator=gen)
        ref_in = full.clone().requires_grad_()
        ref = F.cross_entropy(ref_in.flatten(0, 1), target.flatten(), reduction="none").view(2, 3)
        (ref * weights).sum().backward()
        mine = slice(4 * rank, 4 * (rank + 1))  # rank r holds classes [4r, 4r + 4)
        shard = full[..., mine].clone().requires_grad_()
        loss = P.vocab_parallel_cross_entropy(shard, target, g.tp_group)
        assert torch.isfinite(loss).all(), loss
        _close(loss, ref, "vocab-parallel cross entropy", rtol=1e-5, atol=1e-3)
        (loss * weights).sum().backward()
        _close(shard.grad, ref_in.grad[..., mine], "cross entropy gradient")
    finally:
        g.destroy()
    hvd.barrier()


@pytest.mark.parametrize("size", [2, 4])
def test_vocab_parallel_cross_entropy(request, size):
    _pool(request, size).run(_b_vocab_cross_entropy)


def _b_tp_bf16_autocast(rank, size):
    g = P.grid(tp=size)
    try:
        ref = _mlp_reference(seed=8)
        gen = torch.Generator().manual_seed(9)
        x, y = torch.randn(8, 8, generator=gen), torch.randn(8, 6, generator=gen)
        for variant in ("megatron", "gather_scatter"):
            par = _ParallelMLP(ref, g.tp_group, variant)
            ref.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out_ref, out_par = ref(x), par(x)
                assert out_par.dtype == torch.bfloat16, out_par.dtype  # the collectives ran in bf16
                loss_ref, loss_par = F.mse_loss(out_ref.float(), y), F.mse_loss(out_par.float(), y)
            _close(out_par, out_ref, "bf16 output (%s)" % variant, rtol=3e-2, atol=3e-2)
            loss_ref.backward()
            loss_par.backward()
            _check_mlp_shards(par, ref, "bf16 (%s)" % variant, rtol=5e-2, atol=2e-2, grads=True)
        # the four conjugate collectives in float16 and bfloat16, with autograd
        # (small integers: exact in both formats)
        for dt in (torch.float16, torch.bfloat16):
            x = (torch.arange(2 * 2 * size, dtype=torch.float32).view(2, 2 * size) + rank).to(dt).requires_grad_()
            y = P.reduce_from_region(x, g.tp_group)
            assert y.dtype == dt and torch.equal(y.float(), x.detach().float() * size - rank * size +
                                                 size * (size - 1) / 2), y
            z = P.gather_from_region(P.copy_to_region(x, g.tp_group), g.tp_group)
            assert z.shape == (2, 2 * size * size) and z.dtype == dt
            assert torch.equal(z[:, 2 * size * rank:2 * size * (rank + 1)], x.detach())
            w = P.scatter_to_region(z, g.tp_group)
            assert torch.equal(w, x.detach())
            (y.float().sum() + 2 * w.float().sum()).backward()
            # d/dx: reduce (identity back) gives 1; scatter->gather->copy gives 2 summed over the group
            assert x.grad.dtype == dt and torch.equal(x.grad.float(), torch.full_like(x.grad.float(), 1 + 2 * size))
    finally:
        g.destroy()
    hvd.barrier()


def test_tp_bf16_autocast_and_half_collectives(pool2):
    pool2.run(_b_tp_bf16_autocast)


def _b_tp_default_init(rank, size):
    g = P.grid(tp=size)
    try:
        torch.manual_seed(11)
        col = P.ColumnParallelLinear(8, 4 * size, group=g.tp_group)
        row = P.RowParallelLinear(4 * size, 8, group=g.tp_group)
        emb = P.VocabParallelEmbedding(4 * size, 8, group=g.tp_group)
        torch.manual_seed(11)
        lin1, lin2, e = nn.Linear(8, 4 * size), nn.Linear(4 * size, 8), nn.Embedding(4 * size, 8)
        _close(col.weight, lin1.weight[col.shard_slice], "column init", 0, 0)
        _close(col.bias, lin1.bias[col.shard_slice], "column bias init", 0, 0)
        _close(row.weight, lin2.weight[:, row.shard_slice], "row init", 0, 0)
        _close(row.bias, lin2.bias, "row bias init", 0, 0)
        _close(emb.weight, e.weight[emb.shard_slice], "embedding init", 0, 0)
        twin = copy.deepcopy(col)  # a copy shares the process set (a communicator, not a value)
        assert twin.group is g.tp_group and twin.weight is not col.weight
        x = torch.randn(3, 8)
        _close(twin(x), col(x), "deep copy's output", 0, 0)
        with pytest.raises(ValueError, match="not divisible by the tensor-parallel group size"):
            P.ColumnParallelLinear(8, 4 * size + 1, group=g.tp_group)
    finally:
        g.destroy()
    hvd.barrier()


def test_tp_default_init(pool2):
    pool2.run(_b_tp_default_init)


# ====================================================================== context parallel
def _reference_attention(q, k, v, causal):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = q.shape[-2]
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _b_cp_attention(rank, size, causal):
    g = P.grid(cp=size)
    try:
        assert g.cp_size == size and g.cp_rank == rank
        gen = torch.Generator().manual_seed(12)
        b, h, seq, d = 2, 3, 4 * size, 5
        q, k, v = (torch.randn(b, h, seq, d, generator=gen) for _ in range(3))
        upstream = torch.randn(b, h, seq, d, generator=gen)
        ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
        out_ref = _reference_attention(*ref_in, causal)
        (out_ref * upstream).sum().backward()
        chunk = slice(rank * 4, (rank + 1) * 4)  # this rank's contiguous chunk of positions
        mine = [t[:, :, chunk].clone().requires_grad_() for t in (q, k, v)]
        out = P.context_parallel_attention(*mine, group=g.cp_group, causal=causal)
        _close(out, out_ref[:, :, chunk], "attention output")
        (out * upstream[:, :, chunk]).sum().backward()
        for name, t, r in zip("qkv", mine, ref_in):
            _close(t.grad, r.grad[:, :, chunk], "d%s" % name)
        # the chunks' gradients really differ by rank (a mean in place of the sum would show)
        assert mine[1].grad.abs().sum() > 0

        # a self-attention block: split the replicated sequence, attend, gather it back;
        # weight gradients summed over the CP group equal the reference's
        torch.manual_seed(13)
        block = P.ContextParallelSelfAttention(12, 3, group=g.cp_group, causal=causal)
        x = torch.randn(2, seq, 12, generator=gen)
        xr = x.clone().requires_grad_()
        ref_q, ref_k, ref_v = (block.q_proj(xr), block.k_proj(xr), block.v_proj(xr))
        heads = [t.view(2, seq, 3, 4).transpose(1, 2) for t in (ref_q, ref_k, ref_v)]
        ref_out = block.out_proj(_reference_attention(*heads, causal).transpose(1, 2).reshape(2, seq, 12))
        up = torch.randn(2, seq, 12, generator=gen)
        (ref_out * up).sum().backward()
        ref_grads = [p.grad.clone() for p in block.parameters()]
        block.zero_grad()
        xp = x.clone().requires_grad_()
        out = P.gather_sequence(block(P.split_sequence(xp, g.cp_group)), g.cp_group)
        _close(out, ref_out, "self-attention block output")
        (out * up).sum().backward()  # the same loss on every rank
        _close(xp.grad, xr.grad, "self-attention block input gradient")
        summed = hvd.grouped_allreduce([p.grad for p in block.parameters()], op=hvd.Sum, process_set=g.cp_group)
        for (name, _), got, want in zip(block.named_parameters(), summed, ref_grads):
            _close(got, want, "CP-summed gradient of " + name)
        assert P.sequence_offset(4, g.cp_group) == 4 * rank
    finally:
        g.destroy()
    hvd.barrier()


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_cp_attention_equals_unsplit(request, size, causal):
    _pool(request, size).run(_b_cp_attention, causal)


def _b_cp_bf16(rank, size):
    g = P.grid(cp=size)
    try:
        gen = torch.Generator().manual_seed(14)
        q, k, v = (torch.randn(1, 2, 4 * size, 8, generator=gen) for _ in range(3))
        chunk = slice(rank * 4, (rank + 1) * 4)
        mine = [t[:, :, chunk].clone().requires_grad_() for t in (q, k, v)]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = P.context_parallel_attention(*[t.to(torch.bfloat16) for t in mine], group=g.cp_group, causal=True)
        assert out.dtype == torch.bfloat16
        _close(out, _reference_attention(q, k, v, True)[:, :, chunk], "bf16 attention", rtol=3e-2, atol=3e-2)
        out.float().sum().backward()
        assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in mine)
    finally:
        g.destroy()
    hvd.barrier()


def test_cp_attention_bf16(pool2):
    pool2.run(_b_cp_bf16)
