"""ZeroOptimizer (hora.torch.zero, ZeRO stages 1 and 2) on 2 and 3 ranks,
against the same model trained with hvd.DistributedOptimizer on the same
data per rank.

Bitwise or not: the update is the same elementwise arithmetic on a flat slice
as on the parameter, and the averaged gradient is the same sum scaled by
1/size. With 2 ranks a sum of two values does not depend on the order, so
float32 parameters must be EQUAL bitwise. With 3 ranks the allreduce and the
reducescatter may add the three contributions in different orders (which
rank's chunk an element falls in decides it), so the comparison is to 1e-6
relative there (measured: stage 1 equal, stage 2 off by one float32 ulp).
bfloat16 and float16 parameters are compared with a reference that steps
float32 masters the same way (DistributedOptimizer-averaged low-precision
gradients), to 1e-2 (parameters) and 1e-3 (masters). Gradient clipping computes the global norm
in a different order than torch.nn.utils.clip_grad_norm_: 1e-6.
"""
import os

import pytest
import torch
import torch.nn as nn

import hora.torch as hvd

STEPS = 4
BATCH = 6  # per rank
SMALL_BUCKETS = 256  # bytes: several buckets, parameters split across slices


def _model(dtype=torch.float32):
    torch.manual_seed(7)
    return nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3)).to(dtype)


def _data(rank, steps, dtype=torch.float32):
    g = torch.Generator().manual_seed(99 + rank)
    return [(torch.randn(BATCH, 5, generator=g).to(dtype), torch.randn(BATCH, 3, generator=g).to(dtype))
            for _ in range(steps)]


def _opt(name):
    if name == "sgd":
        return torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3}
    return torch.optim.Adam, {"lr": 0.01, "weight_decay": 1e-3}


def _loss(out, y):
    """MSE computed in float32 (torch 1.13 has no bfloat16 mse_loss on CPU); the
    gradients reaching the parameters are in their dtype."""
    return ((out.float() - y.float()) ** 2).mean()


def _train(model, opt, data, bpps, clip=None, step_fn=None):
    for s in range(len(data) // bpps):
        opt.zero_grad()
        for k in range(bpps):
            x, y = data[s * bpps + k]
            _loss(model(x), y).backward()
        if step_fn is not None:
            step_fn()
        elif clip is not None:
            opt.clip_grad_norm_(clip)
            opt.step()
        else:
            opt.step()


def _dist_train(model, name, data, bpps, clip=None):
    cls, kw = _opt(name)
    opt = hvd.DistributedOptimizer(cls(model.parameters(), **kw), named_parameters=model.named_parameters(),
                                   backward_passes_per_step=bpps)
    if clip is None:
        _train(model, opt, data, bpps)
    else:
        def step():
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            with opt.skip_synchronize():
                opt.step()
        _train(model, opt, data, bpps, step_fn=step)
    return opt


def _zero(model, name, stage, bpps=1, bucket_bytes=SMALL_BUCKETS):
    cls, kw = _opt(name)
    return hvd.ZeroOptimizer(model.named_parameters(), cls, stage=stage, backward_passes_per_step=bpps,
                             bucket_bytes=bucket_bytes, **kw)


def _compare(a, b, size, what):
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        if size == 2:
            assert torch.equal(p, q), (what, n, (p - q).abs().max().item())
        else:
            assert torch.allclose(p, q, rtol=1e-6, atol=1e-7), (what, n, (p - q).abs().max().item())


def _b_matches_distributed(rank, size, stage, name, bpps):
    data = _data(rank, STEPS * bpps)
    ref = _model()
    _dist_train(ref, name, data, bpps)
    model = _model()
    opt = _zero(model, name, stage, bpps)
    assert len(opt.buckets) > 2

    def step():
        # every bucket's reduction was started during backward (hooks), none waits for step()
        # (stage 2 may already have collected the finished ones, freeing their input buffers)
        assert all(b.handle is not None or b.collected for b in opt.buckets)
        opt.step()
    _train(model, opt, data, bpps, step_fn=step)
    _compare(model, ref, size, "stage %d %s bpps %d" % (stage, name, bpps))
    assert not all(torch.equal(p, q) for p, q in zip(model.parameters(), _model().parameters()))  # it trained
    if stage == 2:  # no full gradient kept: the local one was released into the bucket
        assert all(p.grad is None for p in model.parameters())
    else:  # stage 1: p.grad holds the averaged gradient, as with DistributedOptimizer
        ref_grads = [q.grad for q in ref.parameters()]
        for p, g in zip(model.parameters(), ref_grads):
            assert torch.allclose(p.grad, g, rtol=1e-6, atol=1e-7)
    # every rank ends with the same parameters
    for p in model.parameters():
        assert torch.equal(hvd.broadcast(p.detach(), 0), p.detach())


@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_matches_distributed_optimizer_2_ranks(pool2, stage, name):
    pool2.run(_b_matches_distributed, stage, name, 1, timeout=120)


@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_matches_distributed_optimizer_3_ranks(pool3, stage, name):
    pool3.run(_b_matches_distributed, stage, name, 1, timeout=120)


@pytest.mark.parametrize("stage", [1, 2])
def test_backward_passes_per_step_2(pool2, stage):
    pool2.run(_b_matches_distributed, stage, "adam", 2, timeout=120)


def test_backward_passes_per_step_2_three_ranks(pool3):
    pool3.run(_b_matches_distributed, 2, "sgd", 2, timeout=120)


class _CastMLP(nn.Module):
    """_model's layers with float16 parameters, computing in float32 (torch 1.13 has no float16 matmul
    on CPU); the gradients reach the parameters in float16."""

    def __init__(self, dtype):
        super().__init__()
        self.net = _model(dtype)

    def forward(self, x):
        h = x.float()
        for m in self.net:
            h = nn.functional.linear(h, m.weight.float(), m.bias.float()) if isinstance(m, nn.Linear) else m(h)
        return h


def _lowp_model(dtype):
    return _model(dtype) if dtype == torch.bfloat16 else _CastMLP(dtype)


def _b_lowp_master(rank, size, stage, name, dtype):
    dtype = getattr(torch, dtype)
    data = _data(rank, STEPS, dtype)
    cls, kw = _opt(name)
    # reference: low-precision model, gradients averaged by DistributedOptimizer, float32 masters stepped by torch
    ref = _lowp_model(dtype)
    dopt = hvd.DistributedOptimizer(torch.optim.SGD(ref.parameters(), lr=0.0),
                                    named_parameters=ref.named_parameters())
    masters = [p.detach().float().clone().requires_grad_() for p in ref.parameters()]
    mopt = cls(masters, **kw)
    for x, y in data:
        dopt.zero_grad()
        _loss(ref(x), y).backward()
        dopt.synchronize()
        for m, p in zip(masters, ref.parameters()):
            m.grad = p.grad.float()
        mopt.step()
        with torch.no_grad():
            for m, p in zip(masters, ref.parameters()):
                p.copy_(m)
    model = _lowp_model(dtype)
    opt = _zero(model, name, stage)
    _train(model, opt, data, 1)
    assert all(b.master.dtype == torch.float32 for b in opt.buckets)
    assert all(v.dtype == torch.float32 for s in opt.state.values() for v in s.values() if v.dim() > 0)
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        assert p.dtype == dtype
        assert torch.allclose(p.float(), q.float(), rtol=1e-2, atol=1e-2), (n, (p.float() - q.float()).abs().max())
    # the float32 masters (not the bf16 parameters) follow the reference's masters
    full = opt.state_dict()["zero_master"]
    for i, m in enumerate(masters):
        assert torch.allclose(full[i], m, rtol=1e-3, atol=1e-3), (i, (full[i] - m).abs().max())
    # the state dict's moments loaded into the reference's fp32 optimizer have its shapes
    return [(full[i] - m).abs().max().item() for i, m in enumerate(masters)]


@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_params_fp32_master(pool2, stage, dtype):
    pool2.run(_b_lowp_master, stage, "adam", dtype, timeout=120)


def _b_clip(rank, size, stage):
    data = _data(rank, STEPS)
    ref = _model()
    _dist_train(ref, "sgd", data, 1, clip=0.05)
    model = _model()
    opt = _zero(model, "sgd", stage)
    norms = []
    for x, y in data:
        opt.zero_grad()
        _loss(model(x), y).backward()
        norms.append(float(opt.clip_grad_norm_(0.05)))
        opt.step()
    assert all(n > 0.05 for n in norms), norms  # clipping was active in every step
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, rtol=1e-6, atol=1e-7), (n, (p - q).abs().max().item())


@pytest.mark.parametrize("stage", [1, 2])
def test_clip_grad_norm_matches_torch(pool2, stage):
    pool2.run(_b_clip, stage, timeout=120)


def test_clip_grad_norm_three_ranks(pool3):
    pool3.run(_b_clip, 2, timeout=120)


def _b_state_size(rank, size, name):
    data = _data(rank, 2)
    # a wider model so that the padding is small next to the state
    torch.manual_seed(1)
    ref = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 3))
    model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 3))
    model.load_state_dict(ref.state_dict())
    data = [(torch.randn(BATCH, 64), y) for _, y in data]
    dopt = _dist_train(ref, name, data, 1)
    opt = _zero(model, name, 2, bucket_bytes=1 << 20)
    _train(model, opt, data, 1)
    full = sum(v.numel() * v.element_size() for s in dopt.state.values() for v in s.values() if torch.is_tensor(v))
    mine = opt.state_bytes()
    per_elem = sum(v.element_size() for v in opt.state[opt.buckets[0].master].values()
                   if torch.is_tensor(v) and v.dim() > 0)
    scalars = sum(v.numel() * v.element_size() for s in dopt.state.values() for v in s.values()
                  if torch.is_tensor(v) and v.dim() == 0)  # Adam's per-parameter step counters
    pad = sum(b.padded - b.numel for b in opt.buckets) * per_elem
    assert len(opt.buckets) == 1
    assert mine <= (full - scalars) / size + pad + 8 * len(opt.buckets), (mine, full)
    assert mine >= (full - scalars) / size, (mine, full)
    return mine, full


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_state_is_one_nth(pool2, pool3, name):
    for pool in (pool2, pool3):
        res = pool.run(_b_state_size, name, timeout=120)
        mine, full = res[0]
        assert mine * pool.size < full * 1.05, res


def _flat(sd):
    return {(i, k): v for i, s in sd["state"].items() for k, v in s.items()}


def _b_consolidated(rank, size, stage, name):
    data = _data(rank, STEPS + 2)
    ref = _model()
    dopt = _dist_train(ref, name, data[:STEPS], 1)
    model = _model()
    opt = _zero(model, name, stage)
    _train(model, opt, data[:STEPS], 1)
    sd = opt.state_dict()
    want = dopt.state_dict()
    assert sorted(_flat(sd)) == sorted(_flat(want))
    assert [{k: v for k, v in g.items()} for g in sd["param_groups"]] == want["param_groups"]
    for key, v in _flat(want).items():
        got = _flat(sd)[key]
        if torch.is_tensor(v):
            assert got.shape == v.shape and got.dtype == v.dtype, key
            assert torch.allclose(got, v, rtol=1e-6, atol=1e-8), (key, (got - v).abs().max())
            if size == 2:
                assert torch.equal(got, v), key
        else:
            assert got == v, key
    # a plain torch optimizer (under DistributedOptimizer) loads it and continues as the ZeroOptimizer does
    plain = _model()
    plain.load_state_dict(model.state_dict())
    cls, kw = _opt(name)
    # (DistributedOptimizer rebuilds the optimizer from its param groups, so the state is loaded after wrapping)
    popt = hvd.DistributedOptimizer(cls(plain.parameters(), **kw), named_parameters=plain.named_parameters())
    popt.load_state_dict(sd)
    _train(plain, popt, data[STEPS:], 1)
    _train(model, opt, data[STEPS:], 1)
    _compare(model, plain, size, "continued")
    # and a ZeroOptimizer loads the unsharded optimizer's state dict
    model2 = _model()
    model2.load_state_dict(ref.state_dict())
    opt2 = _zero(model2, name, stage)
    opt2.load_state_dict(want)
    _train(model2, opt2, data[STEPS:], 1)
    _train(ref, dopt, data[STEPS:], 1)
    _compare(model2, ref, size, "loaded from torch")


@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_consolidated_state_dict_loads_into_torch(pool2, stage, name):
    pool2.run(_b_consolidated, stage, name, timeout=120)


def test_consolidated_state_dict_three_ranks(pool3):
    pool3.run(_b_consolidated, 2, "adam", timeout=120)


def _b_save_sharded(rank, size, path, dtype):
    dtype = getattr(torch, dtype)
    data = _data(rank, STEPS, dtype)
    model = _model(dtype)
    opt = _zero(model, "adam", 2)
    _train(model, opt, data, 1)
    torch.save(opt.sharded_state_dict(), os.path.join(path, "zero.%d.pt" % rank))
    sd = opt.state_dict()
    if rank == 0:
        torch.save({"model": model.state_dict(), "optim": sd}, os.path.join(path, "full.pt"))
    # my part is about 1/size of the state
    mine = sum(v.numel() for b in opt.sharded_state_dict()["buckets"] for v in b["state"].values() if v.dim() > 0)
    whole = sum(v.numel() for s in sd["state"].values() for v in s.values() if v.dim() > 0)
    assert mine <= whole / size + 2 * len(opt.buckets) * (size - 1), (mine, whole)


def _b_load_sharded(rank, size, path, old_size, dtype):
    dtype = getattr(torch, dtype)
    saved = torch.load(os.path.join(path, "full.pt"))
    model = _model(dtype)
    model.load_state_dict(saved["model"])
    opt = _zero(model, "adam", 1, bucket_bytes=512)  # another stage and bucket size: re-sharded all the same
    opt.load_sharded_state_dict([os.path.join(path, "zero.%d.pt" % r) for r in range(old_size)])
    sd = opt.state_dict()
    want = saved["optim"]
    assert sorted(_flat(sd)) == sorted(_flat(want))
    for key, v in _flat(want).items():
        assert torch.equal(_flat(sd)[key], v) if torch.is_tensor(v) else _flat(sd)[key] == v, key
    if "zero_master" in want:
        assert all(torch.equal(sd["zero_master"][i], m) for i, m in want["zero_master"].items())
    # continues exactly as the same ZeroOptimizer loaded from the consolidated dict saved at the old size
    model2 = _model(dtype)
    model2.load_state_dict(saved["model"])
    opt2 = _zero(model2, "adam", 1, bucket_bytes=512)
    opt2.load_state_dict(want)
    data = _data(rank, 2, dtype)
    _train(model, opt, data, 1)
    _train(model2, opt2, data, 1)
    for p, q, p0 in zip(model.parameters(), model2.parameters(), saved["model"].values()):
        assert torch.equal(p, q)
        assert not torch.equal(p, p0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sharded_checkpoint_2_to_3_ranks(pool2, pool3, tmp_path, dtype):
    os.chmod(tmp_path, 0o777)
    pool2.run(_b_save_sharded, str(tmp_path), dtype, timeout=120)
    assert sorted(os.listdir(tmp_path)) == ["full.pt", "zero.0.pt", "zero.1.pt"]
    pool3.run(_b_load_sharded, str(tmp_path), 2, dtype, timeout=120)
    pool2.run(_b_load_sharded, str(tmp_path), 2, dtype, timeout=120)  # and back at the same size


def _b_api_errors(rank, size):
    model = _model()
    with pytest.raises(ValueError):
        hvd.ZeroOptimizer(model.parameters(), torch.optim.SGD, stage=3, lr=0.1)
    with pytest.raises(TypeError):
        hvd.ZeroOptimizer(model.parameters(), torch.optim.SGD(model.parameters(), lr=0.1), lr=0.1)
    opt = hvd.ZeroOptimizer(model.parameters(), torch.optim.SGD, stage=2, lr=0.1)
    x, y = _data(rank, 1)[0]
    _loss(model(x), y).backward()
    with pytest.raises(AssertionError):  # a second backward without backward_passes_per_step=2
        _loss(model(x), y).backward()
    opt.step()


def test_api_errors(pool2):
    pool2.run(_b_api_errors, timeout=60)


def _b_process_set(rank, size):
    """Sharded over a set of 2 of the 3 ranks, compared with DistributedOptimizer over the same set."""
    ps = hvd.add_process_set([0, 2])
    try:
        if not ps.included():
            return None
        data = _data(rank, STEPS)
        ref = _model()
        opt = hvd.DistributedOptimizer(torch.optim.Adam(ref.parameters(), lr=0.01),
                                       named_parameters=ref.named_parameters(), process_set=ps)
        _train(ref, opt, data, 1)
        model = _model()
        zopt = hvd.ZeroOptimizer(model.parameters(), torch.optim.Adam, stage=2, process_set=ps,
                                 bucket_bytes=SMALL_BUCKETS, lr=0.01)
        _train(model, zopt, data, 1)
        _compare(model, ref, 2, "process set")
    finally:
        hvd.remove_process_set(ps)


def test_process_set(pool3):
    pool3.run(_b_process_set, timeout=120)


def _b_lr_scheduler(rank, size):
    """An LR scheduler drives the inner optimizer (``opt.optimizer``), whose groups are ``opt.param_groups``."""
    data = _data(rank, STEPS)
    ref = _model()
    dopt = hvd.DistributedOptimizer(torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9),
                                    named_parameters=ref.named_parameters())
    rsched = torch.optim.lr_scheduler.StepLR(dopt, step_size=1, gamma=0.5)
    model = _model()
    opt = hvd.ZeroOptimizer(model.parameters(), torch.optim.SGD, stage=2, bucket_bytes=SMALL_BUCKETS, lr=0.1,
                            momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt.optimizer, step_size=1, gamma=0.5)
    _train(ref, dopt, data, 1, step_fn=lambda: (dopt.step(), rsched.step()))
    _train(model, opt, data, 1, step_fn=lambda: (opt.step(), sched.step()))
    assert opt.param_groups[0]["lr"] == 0.1 * 0.5 ** STEPS
    _compare(model, ref, size, "lr scheduler")


def test_lr_scheduler_on_inner_optimizer(pool2):
    pool2.run(_b_lr_scheduler, timeout=60)


class _Branchy(nn.Module):
    """An MLP with a head that only odd ranks use: its gradient is missing on the others."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.body = nn.Sequential(nn.Linear(5, 16), nn.Tanh())
        self.head = nn.Linear(16, 3)
        self.extra = nn.Linear(16, 3)

    def forward(self, x, use_extra):
        h = self.body(x)
        return self.head(h) + (self.extra(h) if use_extra else 0)


def _b_unused_parameters(rank, size, stage):
    """Parameters without a gradient on some ranks: zeros are reduced for them (DistributedOptimizer's
    semantics), started at step() instead of during backward."""
    data = _data(rank, STEPS)
    ref, model = _Branchy(), _Branchy()
    dopt = hvd.DistributedOptimizer(torch.optim.Adam(ref.parameters(), lr=0.01),
                                    named_parameters=ref.named_parameters())
    opt = hvd.ZeroOptimizer(model.named_parameters(), torch.optim.Adam, stage=stage, bucket_bytes=SMALL_BUCKETS,
                            lr=0.01)
    for m, o in ((ref, dopt), (model, opt)):
        for x, y in data:
            o.zero_grad()
            _loss(m(x, rank % 2 == 1), y).backward()
            o.step()
    _compare(model, ref, size, "unused parameters")
    assert not torch.equal(model.extra.weight, _Branchy().extra.weight)  # the other ranks' gradients arrived


@pytest.mark.parametrize("stage", [1, 2])
def test_parameters_unused_on_some_ranks(pool2, stage):
    pool2.run(_b_unused_parameters, stage, timeout=60)


def test_parameters_unused_on_some_ranks_three(pool3):
    pool3.run(_b_unused_parameters, 2, timeout=60)


def _b_param_storage_replaced(rank, size, stage):
    """The parameters become views of each bucket's flat buffer (the allgather writes them in place);
    one whose storage the user replaced since is still updated, by a copy."""
    data = _data(rank, STEPS)
    ref = _model()
    _dist_train(ref, "sgd", data, 1)
    model = _model()
    opt = _zero(model, "sgd", stage)
    _train(model, opt, data[:2], 1)
    b = opt.buckets[0]
    assert model[0].weight.data_ptr() == b.pflat.data_ptr()  # a view of the flat buffer
    model[0].weight.data = model[0].weight.data.clone()
    _train(model, opt, data[2:], 1)
    assert model[0].weight.data_ptr() != b.pflat.data_ptr()
    _compare(model, ref, size, "storage replaced")


@pytest.mark.parametrize("stage", [1, 2])
def test_parameter_storage_replaced(pool2, stage):
    pool2.run(_b_param_storage_replaced, stage, timeout=60)


def _b_param_groups(rank, size, stage):
    """Two param groups with their own options (and a frozen parameter): same updates and the same
    consolidated state dict (groups, indices) as the unsharded optimizer under DistributedOptimizer."""
    data = _data(rank, STEPS)
    ref, model = _model(), _model()
    for m in (ref, model):
        m[2].bias.requires_grad_(False)

    def groups(m):
        return [{"params": list(m[0].parameters()) + [m[2].weight, m[2].bias], "lr": 0.02},
                {"params": list(m[4].parameters()), "lr": 0.005, "betas": (0.8, 0.99)}]
    dopt = hvd.DistributedOptimizer(torch.optim.Adam(groups(ref), lr=0.01), named_parameters=ref.named_parameters())
    _train(ref, dopt, data, 1)
    opt = hvd.ZeroOptimizer(groups(model), torch.optim.Adam, stage=stage, bucket_bytes=SMALL_BUCKETS, lr=0.01)
    assert [g["lr"] for g in opt.param_groups] == [0.02, 0.005]
    _train(model, opt, data, 1)
    _compare(model, ref, size, "param groups")
    sd, want = opt.state_dict(), dopt.state_dict()
    assert sd["param_groups"] == want["param_groups"]
    assert sorted(_flat(sd)) == sorted(_flat(want))
    assert torch.equal(model[2].bias, _model()[2].bias)  # frozen


@pytest.mark.parametrize("stage", [1, 2])
def test_param_groups(pool2, stage):
    pool2.run(_b_param_groups, stage, timeout=60)
