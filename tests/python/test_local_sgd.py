"""hvd.LocalSGD on 2 and 3 ranks: with sync_every=1 and SGD it matches
DistributedOptimizer; with sync_every=k (plain averaging, and DiLoCo's outer
Nesterov momentum over Adam inner steps) every rank ends on the parameters
of a reference that simulates all ranks' local training in one process; and
it sends 1/k of the bytes per step."""
import copy
import os

import pytest
import torch

import hora.torch as hvd
from harness import HORARUN, run_example


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _data(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(5, 6, generator=g), torch.randn(5, 2, generator=g)


def _local_step(model, opt, rank, step):
    x, y = _data(rank, step)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def _simulate(size, steps, k, make_opt, outer_lr=1.0, mu=0.0, nesterov=False):
    """Every rank's local training, synchronized every k steps, in one process."""
    models = [_model() for _ in range(size)]
    opts = [make_opt(m.parameters()) for m in models]
    anchor = [p.detach().clone() for p in models[0].parameters()]
    mom = [torch.zeros_like(p) for p in anchor]
    with torch.no_grad():
        for step in range(steps):
            for r in range(size):
                with torch.enable_grad():
                    _local_step(models[r], opts[r], r, step)
            if (step + 1) % k:
                continue
            params = [list(m.parameters()) for m in models]
            if outer_lr == 1.0 and mu == 0.0:
                for i in range(len(anchor)):
                    avg = sum(params[r][i] for r in range(size)) / size
                    for r in range(size):
                        params[r][i].copy_(avg)
                continue
            for i in range(len(anchor)):
                d = sum(anchor[i] - params[r][i] for r in range(size)) / size
                if mu > 0:
                    mom[i].mul_(mu).add_(d)
                    d = d.add(mom[i], alpha=mu) if nesterov else mom[i]
                anchor[i].sub_(d, alpha=outer_lr)
                for r in range(size):
                    params[r][i].copy_(anchor[i])
    return models[0]


def _b_every_step_equals_distributed_optimizer(rank, size):
    a, b = _model(), _model()
    lsgd = hvd.LocalSGD(torch.optim.SGD(a.parameters(), lr=0.1), sync_every=1)
    dopt = hvd.DistributedOptimizer(torch.optim.SGD(b.parameters(), lr=0.1), named_parameters=b.named_parameters())
    for step in range(4):
        _local_step(a, lsgd, rank, step)
        _local_step(b, dopt, rank, step)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p, q, rtol=1e-6, atol=1e-7), (p - q).abs().max()


def _b_autocast_and_accumulation(rank, size):
    # bf16 autocast and two backward passes per step: with sync_every=1 and
    # plain SGD still DistributedOptimizer(backward_passes_per_step=2)'s result
    a, b = _model(), _model()
    lsgd = hvd.LocalSGD(torch.optim.SGD(a.parameters(), lr=0.1), sync_every=1)
    dopt = hvd.DistributedOptimizer(torch.optim.SGD(b.parameters(), lr=0.1), named_parameters=b.named_parameters(),
                                    backward_passes_per_step=2)
    for step in range(3):
        for model, opt in ((a, lsgd), (b, dopt)):
            opt.zero_grad()
            for k in range(2):
                x, y = _data(rank, 2 * step + k)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    out = model(x)
                torch.nn.functional.mse_loss(out.float(), y).backward()
            opt.step()
    assert lsgd.syncs == 3
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-6), (p - q).abs().max()


def _b_every_rank_agrees_and_bytes_are_counted(rank, size):
    cases = [
        (3, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.5), {}),
        (2, lambda ps: torch.optim.Adam(ps, lr=0.01), dict(outer_lr=0.7, outer_momentum=0.9, nesterov=True)),
        (2, lambda ps: torch.optim.SGD(ps, lr=0.05), dict(outer_lr=0.5)),
    ]
    for k, make_opt, outer in cases:
        model = _model()
        opt = hvd.LocalSGD(make_opt(model.parameters()), sync_every=k, **outer)
        steps = 2 * k + 1  # ends one local step after a synchronization
        for step in range(steps):
            _local_step(model, opt, rank, step)
        opt.synchronize()  # the final one
        got = [p.detach().clone() for p in model.parameters()]
        everyone = hvd.allgather_object([t.tolist() for t in got])
        assert all(e == everyone[0] for e in everyone), "ranks disagree after synchronize()"
        assert opt.syncs == steps // k + 1
        param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        assert opt.bytes_communicated == opt.syncs * param_bytes
        assert opt.bytes_every_step == steps * param_bytes


def _b_synchronized_rounds_match_simulation(rank, size):
    for k, make_opt, outer in [
        (3, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.5), dict()),
        (2, lambda ps: torch.optim.Adam(ps, lr=0.01), dict(outer_lr=0.7, outer_momentum=0.9, nesterov=True)),
        (2, lambda ps: torch.optim.SGD(ps, lr=0.05), dict(outer_lr=0.5)),
    ]:
        model = _model()
        opt = hvd.LocalSGD(make_opt(model.parameters()), sync_every=k, **outer)
        steps = 3 * k  # ends on a synchronization
        for step in range(steps):
            _local_step(model, opt, rank, step)
        ref = _simulate(size, steps, k, make_opt, outer.get("outer_lr", 1.0), outer.get("outer_momentum", 0.0),
                        outer.get("nesterov", False))
        for p, q in zip(model.parameters(), ref.parameters()):
            assert torch.allclose(p, q, rtol=1e-5, atol=1e-6), (k, outer, (p - q).abs().max())


def _b_arguments(rank, size):
    m = _model()
    with pytest.raises(ValueError, match="sync_every"):
        hvd.LocalSGD(torch.optim.SGD(m.parameters(), lr=0.1), sync_every=0)
    with pytest.raises(ValueError, match="outer_momentum"):
        hvd.LocalSGD(torch.optim.SGD(m.parameters(), lr=0.1), outer_momentum=1.5)
    # state_dict round trip keeps the outer state
    opt = hvd.LocalSGD(torch.optim.SGD(m.parameters(), lr=0.1), sync_every=2, outer_momentum=0.5)
    for step in range(2):
        _local_step(m, opt, rank, step)
    st = copy.deepcopy(opt.state_dict())
    m2 = copy.deepcopy(m)
    opt2 = hvd.LocalSGD(torch.optim.SGD(m2.parameters(), lr=0.1), sync_every=2, outer_momentum=0.5)
    opt2.load_state_dict(st)
    assert opt2.steps == 2 and opt2.syncs == 1
    assert all(torch.equal(a, b) for a, b in zip(opt2._momentum, opt._momentum))


def _b_elastic_state_joiner_takes_rank0s(rank, size):
    # every rank trains 4 steps (one synchronization, so the synchronized point
    # and the outer momentum moved); then the last rank stands in for a worker
    # that joined an elastic job: fresh model and LocalSGD. TorchState.sync()
    # must give it rank 0's whole state, or its next rounds would average
    # from another point at other steps.
    def make():
        m = _model()
        return m, hvd.LocalSGD(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.5), sync_every=3,
                               outer_lr=0.7, outer_momentum=0.9, nesterov=True)
    model, opt = make()
    for step in range(4):
        _local_step(model, opt, rank, step)
    if rank == size - 1:
        torch.manual_seed(5)
        model, opt = make()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
    state = hvd.elastic.TorchState(model, opt, epoch=0)
    state.sync()
    assert (opt.steps, opt.syncs) == (4, 1)
    inner = [opt.optimizer.state[p]["momentum_buffer"] for p in model.parameters()]
    for t in list(model.parameters()) + opt._anchor + opt._momentum + inner:
        assert torch.equal(hvd.broadcast(t.detach(), 0), t.detach())
    # and the rounds go on together: one more synchronization at step 6
    for step in range(4, 6):
        _local_step(model, opt, rank, step)
    assert opt.syncs == 2
    for p in model.parameters():
        assert torch.equal(hvd.broadcast(p.detach(), 0), p.detach())


@pytest.mark.parametrize("pool", ["pool2", "pool3"])
def test_local_sgd(pool, request):
    p = request.getfixturevalue(pool)
    p.run(_b_every_step_equals_distributed_optimizer)
    p.run(_b_autocast_and_accumulation)
    p.run(_b_synchronized_rounds_match_simulation)
    p.run(_b_every_rank_agrees_and_bytes_are_counted)
    p.run(_b_arguments)
    p.run(_b_elastic_state_joiner_takes_rank0s)


@pytest.mark.skipif(not os.access(HORARUN, os.X_OK), reason="horarun not built")
@pytest.mark.parametrize("args", [[], ["--outer-momentum", "0.9", "--outer-lr", "0.7", "--nesterov"]])
def test_local_sgd_example(args):
    out = run_example(2, "local_sgd_train.py", args + ["--steps", "20"])
    assert "parameters identical on all ranks: True" in out, out[-3000:]
    # 20 steps, synchronized every 4 and once at the end: 20/6 of the bytes
    assert "for 6 synchronizations" in out and "(3.3x more)" in out, out[-3000:]
