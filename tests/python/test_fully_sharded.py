"""FullyShardedModule (hora.torch.fully_sharded, ZeRO stage 3) on 2, 3 and 4
ranks, against the same model trained with hvd.DistributedOptimizer on the
same data per rank.

Not bitwise: the gradient of a flat is reduce-scattered where
DistributedOptimizer allreduces each parameter (different summation
grouping on 3 ranks, and fusion), so float32 parameters are compared to
1e-5 relative; bfloat16 gathers to 2e-2.
"""
import gc
import weakref

import pytest
import torch
import torch.nn as nn

import hora.torch as hvd
from harness import RankPool

STEPS = 4
BATCH = 4  # per rank
VOCAB, EMB, SEQ = 20, 8, 6


@pytest.fixture(scope="module")
def pool4():
    pool = RankPool(4, extra_env={"HORA_STALL_SHUTDOWN_TIME_S": 20})
    yield pool
    pool.close()


class _Net(nn.Module):
    """Embedding -> Conv2d -> Linear -> LayerNorm -> Linear (the four kinds the issue names)."""

    def __init__(self, tied=False, unused=False):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, EMB)
        self.conv = nn.Conv2d(1, 2, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(2 * SEQ * EMB, 32)
        self.norm = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, EMB)
        self.out = nn.Linear(EMB, VOCAB, bias=False)
        if tied:
            self.out.weight = self.embed.weight
        self.spare = nn.Linear(4, 4) if unused else None

    def forward(self, tokens):
        h = self.embed(tokens).unsqueeze(1)                   # B, 1, SEQ, EMB
        h = torch.tanh(self.conv(h)).flatten(1)               # B, 2*SEQ*EMB
        # in the norm's dtype: torch 1.13's CPU autocast has no bf16 layer_norm with fp32 weights
        h = self.norm(torch.tanh(self.fc1(h)).to(self.norm.weight.dtype))
        return self.out(torch.tanh(self.fc2(h)))              # B, VOCAB


def _model(**kw):
    torch.manual_seed(11)
    return _Net(**kw)


def _data(rank, steps):
    g = torch.Generator().manual_seed(123 + rank)
    return [(torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), torch.randint(0, VOCAB, (BATCH,), generator=g))
            for _ in range(steps)]


def _opt(name, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.Adam(params, lr=0.01)


def _train(model, opt, data, bpps=1, clip=None, autocast=False):
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    for s in range(len(data) // bpps):
        opt.zero_grad()
        for k in range(bpps):
            x, y = data[s * bpps + k]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = loss_fn(model(x).float(), y)
            loss.backward()
            losses.append(loss.item())
        if clip is not None:
            clip()
        opt.step()
    return losses


def _reference(name, data, bpps=1, clip=None, autocast=False, **kw):
    ref = _model(**kw)
    opt = hvd.DistributedOptimizer(_opt(name, ref.parameters()), named_parameters=ref.named_parameters(),
                                   backward_passes_per_step=bpps)
    if clip is None:
        _train(ref, opt, data, bpps, autocast=autocast)
        return ref

    class _Clipped:
        def zero_grad(self):
            opt.zero_grad()

        def step(self):
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
            with opt.skip_synchronize():
                opt.step()
    _train(ref, _Clipped(), data, bpps, autocast=autocast)
    return ref


def _compare(sharded, ref, what, rtol=1e-5, atol=1e-6):
    got, want = sharded.state_dict(), ref.state_dict()
    assert list(got) == list(want), (what, list(got), list(want))
    for k in want:
        assert got[k].shape == want[k].shape, (what, k)
        err = (got[k].float() - want[k].float()).abs().max().item()
        assert torch.allclose(got[k].float(), want[k].float(), rtol=rtol, atol=atol), (what, k, err)
    assert not torch.equal(want["fc1.weight"], _model().state_dict()["fc1.weight"])  # it trained


def _b_matches(rank, size, name, bpps, prefetch, tied=False, unused=False):
    data = _data(rank, STEPS * bpps)
    ref = _reference(name, data, bpps, tied=tied, unused=unused)
    model = hvd.FullyShardedModule(_model(tied=tied, unused=unused), prefetch=prefetch)
    # the optimizer sees only this rank's shards: about 1/size of the parameters
    assert model.shard_bytes() * size <= model.full_bytes() + 4 * size * len(model.flats)
    assert model.shard_bytes() < model.full_bytes() or size == 1
    _train(model, _opt(name, model.parameters()), data, bpps)
    _compare(model, ref, "%s bpps %d prefetch %s" % (name, bpps, prefetch))
    assert model.gathered_bytes == 0  # nothing left gathered after a step
    return model.max_gathered_bytes


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_matches_distributed_optimizer_2_ranks(pool2, name):
    pool2.run(_b_matches, name, 1, True, timeout=120)


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_matches_distributed_optimizer_3_ranks(pool3, name):
    pool3.run(_b_matches, name, 1, True, timeout=120)


def test_without_prefetch(pool2):
    pool2.run(_b_matches, "adam", 1, False, timeout=120)


def test_gradient_accumulation(pool3):
    pool3.run(_b_matches, "sgd", 2, True, timeout=120)


def test_tied_weights(pool2):
    pool2.run(_b_matches, "adam", 1, True, True, timeout=120)


def test_unused_unit_gets_zero_gradient(pool2):
    # spare is never run: its shard gets zeros (as DistributedOptimizer gives
    # unused parameters), and no rank waits for a reduction nobody submits
    pool2.run(_b_matches, "sgd", 1, True, False, True, timeout=120)


def _b_clip(rank, size):
    data = _data(rank, STEPS)
    ref = _reference("sgd", data, clip=0.05)
    model = hvd.FullyShardedModule(_model())
    norms = []

    class _Opt:
        inner = _opt("sgd", model.parameters())

        def zero_grad(self):
            self.inner.zero_grad()

        def step(self):
            self.inner.step()
    opt = _Opt()
    _train(model, opt, data, clip=lambda: norms.append(float(model.clip_grad_norm_(0.05))))
    assert all(n > 0.05 for n in norms)  # the clipping was active
    _compare(model, ref, "clip")


def test_clip_grad_norm(pool2):
    pool2.run(_b_clip, timeout=120)


def _b_mixed_precision(rank, size, how):
    data = _data(rank, STEPS)
    if how == "autocast":
        ref = _reference("adam", data, autocast=True)
        model = hvd.FullyShardedModule(_model())
        _train(model, _opt("adam", model.parameters()), data, autocast=True)
        _compare(model, ref, "autocast", rtol=1e-3, atol=1e-4)
    else:  # gathered and computed in bfloat16, shards and optimizer in float32
        ref = _reference("adam", data)

        class _Bf16In(nn.Module):
            def __init__(self):
                super().__init__()
                self.net = _model()

            def forward(self, x):
                return self.net(x)
        model = hvd.FullyShardedModule(_Bf16In(), param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        assert all(p.dtype == torch.float32 for p in model.parameters())
        _train(model, _opt("adam", model.parameters()), data)
        got = model.state_dict()
        for k, v in ref.state_dict().items():
            assert got["net." + k].dtype == torch.float32
            err = (got["net." + k] - v).abs().max().item()
            assert err < 3e-2, (k, err)


@pytest.mark.parametrize("how", ["autocast", "param_dtype"])
def test_mixed_precision(pool2, how):
    pool2.run(_b_mixed_precision, how, timeout=120)


class _Probe(nn.Linear):
    """A Linear that remembers (weakly) the gathered buffer its weight is a view of:
    any view of it still alive (one autograd saved, say) keeps that base alive."""
    seen = []

    def forward(self, x):
        assert self.weight._base is not None
        _Probe.seen.append(weakref.ref(self.weight._base))
        return super().forward(x)


def _b_memory(rank, size):
    torch.manual_seed(3)
    width, depth = 64, 6
    net = nn.Sequential(*[m for _ in range(depth) for m in (_Probe(width, width), nn.Tanh())])
    model = hvd.FullyShardedModule(net)
    layer_bytes = (width * width + width) * 4
    x = torch.randn(3, width)
    _Probe.seen.clear()
    loss = model(x).square().sum()
    # between forward and backward no gathered weight is alive: autograd kept
    # where the saved weights were, not the weights
    assert model.gathered_bytes == 0
    assert len(_Probe.seen) == depth and all(r() is None for r in _Probe.seen)
    loss.backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())
    # at most the unit in use and the one prefetched, never the whole model
    assert model.max_gathered_bytes <= 2 * layer_bytes + 64 * size, model.max_gathered_bytes
    assert model.max_gathered_bytes < depth * layer_bytes
    assert model.shard_bytes() <= depth * (layer_bytes // size + 4)
    return model.max_gathered_bytes


def test_memory_bounds(pool3):
    pool3.run(_b_memory, timeout=120)


def _b_checkpoint(rank, size):
    data = _data(rank, STEPS)
    model = hvd.FullyShardedModule(_model())
    _train(model, _opt("sgd", model.parameters()), data)
    sd = model.state_dict()
    plain = _model()
    plain.load_state_dict(sd)  # loadable without hora, same keys and shapes
    fresh = hvd.FullyShardedModule(_model(), sync_module_states=False)
    fresh.load_state_dict(sd)
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, sd[k]), k
    x = data[0][0]
    assert torch.allclose(fresh(x), plain(x), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="fc1.weight"):
        bad = dict(sd)
        bad["fc1.weight"] = torch.zeros(3)
        fresh.load_state_dict(bad)
    with torch.no_grad():  # eval forward without autograd
        assert torch.allclose(fresh(x), plain(x), rtol=1e-6, atol=1e-6)
    assert fresh.gathered_bytes == 0


def test_checkpoint_round_trip(pool3):
    pool3.run(_b_checkpoint, timeout=120)


def _b_sync_states(rank, size):
    torch.manual_seed(rank)  # different initialization on every rank
    model = hvd.FullyShardedModule(_Net())
    sd = model.state_dict()
    for k, v in sd.items():
        assert torch.equal(hvd.broadcast(v, 0), v), k


def test_sync_module_states(pool3):
    pool3.run(_b_sync_states, timeout=120)


def _b_outputs_freed_without_gc(rank, size):
    # a collective's output must not outlive its last reference (a reference
    # cycle through hora's allocation callback used to keep every allgather
    # output until the cyclic GC ran: gathered parameters stayed in memory)
    gc.disable()
    try:
        out = hvd.allgather(torch.ones(1000))
        probe = weakref.ref(out)
        del out
        assert probe() is None
    finally:
        gc.enable()


def test_outputs_freed_without_gc(pool2):
    pool2.run(_b_outputs_freed_without_gc, timeout=60)


def test_single_rank_and_errors():
    # without hora initialized, construction fails with a clear error, not a crash
    with pytest.raises(TypeError, match="torch.nn.Module"):
        hvd.FullyShardedModule(object())
