"""DistributedOptimizer, parameter/optimizer-state broadcast, join and SyncBatchNorm
on 2 ranks. The central check: two ranks training with DistributedOptimizer(SGD)
on their halves of each batch end with the same parameters as one process
training on the whole batches (computed on every rank, no hora involved)."""
import torch
import torch.nn as nn

import hora.torch as hvd

STEPS = 6
BATCH = 8  # per rank


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))


def _batches(size, steps=STEPS, batch=BATCH):
    g = torch.Generator().manual_seed(1234)
    return [(torch.randn(batch * size, 5, generator=g, dtype=torch.float64),
             torch.randn(batch * size, 3, generator=g, dtype=torch.float64)) for _ in range(steps)]


def _reference(size, lr, momentum, bpps=1, steps=STEPS):
    """One process, whole batches (mean loss over size*BATCH samples)."""
    model = _model(seed=100).double()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    data = _batches(size, steps * bpps)
    for s in range(steps):
        opt.zero_grad()
        for k in range(bpps):
            x, y = data[s * bpps + k]
            (nn.functional.mse_loss(model(x), y)).backward()
        opt.step()
    return model


def _b_equivalence(rank, size, bpps, momentum, compression):
    lr = 0.1
    model = _model(seed=100 + rank).double()  # different init per rank: broadcast must fix it
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    # after the broadcast every rank holds rank 0's initial parameters
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), _model(seed=100).double().parameters()))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), backward_passes_per_step=bpps,
                                   compression=getattr(hvd.Compression, compression))
    data = _batches(size, STEPS * bpps)
    for s in range(STEPS):
        opt.zero_grad()
        for k in range(bpps):
            x, y = data[s * bpps + k]
            mine = slice(rank * BATCH, (rank + 1) * BATCH)
            nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
        opt.step()
    ref = _reference(size, lr, momentum, bpps)
    tol = 1e-9 if compression == "none" else 2e-3
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=tol, rtol=0), (name, (p - q).abs().max().item())
    # every rank ends identical
    for p in model.parameters():
        assert torch.equal(hvd.broadcast(p.detach(), 0), p.detach())
    return [p.detach().sum().item() for p in model.parameters()]


def test_two_ranks_equal_one_process_on_union(pool2):
    """DistributedOptimizer(SGD) == SGD on the union of the ranks' batches."""
    pool2.run(_b_equivalence, 1, 0.0, "none")


def test_equivalence_with_momentum_and_accumulation(pool2):
    """backward_passes_per_step=2: local accumulation then one average (Horovod semantics);
    the reference accumulates the same two mean losses."""
    pool2.run(_b_equivalence, 2, 0.9, "none")


def test_equivalence_fp16_compression(pool2):
    pool2.run(_b_equivalence, 1, 0.0, "fp16")


def test_one_rank_equals_one_process(pool1):
    """At one rank there are no hooks (as in Horovod): step() reduces every
    gradient, the dense ones as one grouped allreduce; the result must still be
    plain SGD, with accumulation and compression too."""
    for bpps, momentum, compression in ((1, 0.0, "none"), (2, 0.9, "none"), (1, 0.0, "fp16")):
        pool1.run(_b_equivalence, bpps, momentum, compression)


def _b_unused_param(rank, size):
    """A parameter used on one rank only: no hang, its gradient is the average of
    the rank that used it and zeros."""
    torch.manual_seed(0)
    a, b = nn.Linear(3, 2), nn.Linear(3, 2)
    named = [("a." + k, v) for k, v in a.named_parameters()] + [("b." + k, v) for k, v in b.named_parameters()]
    opt = hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in named], lr=0.0), named_parameters=named)
    x = torch.ones(4, 3)
    out = a(x) if rank == 0 else a(x) + b(x)
    out.sum().backward()
    local_b = None if b.weight.grad is None else b.weight.grad.clone()
    opt.step()
    assert b.weight.grad is not None
    full = torch.full((2, 3), 4.0)  # d/dW of sum(b(x)) with x = ones(4, 3)
    # Gradients are reduced in place as backward produces them (as in Horovod), so
    # before step() the local gradient may already hold the averaged value.
    assert local_b is None if rank == 0 else (torch.equal(local_b, full) or torch.equal(local_b, full / size))
    assert torch.allclose(b.weight.grad, full / size), b.weight.grad
    assert torch.allclose(a.weight.grad, full)


def test_unused_parameter_does_not_hang(pool2):
    pool2.run(_b_unused_param, timeout=60)


def _b_synchronize_api(rank, size):
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters())
    model(torch.full((2, 4), float(rank + 1))).sum().backward()
    try:
        opt.zero_grad()
    except AssertionError as e:
        assert "zero_grad" in str(e)
    else:
        raise AssertionError("zero_grad with allreduces in flight must be refused")
    opt.synchronize()
    # averaged gradient visible before step (e.g. for clipping)
    assert torch.allclose(model.weight.grad, torch.full((1, 4), 2.0 * sum(range(1, size + 1)) / size))
    w = model.weight.detach().clone()
    with opt.skip_synchronize():
        opt.step()
    assert torch.allclose(model.weight.detach(), w - 0.5 * model.weight.grad)
    # a second backward before step with bpps=1 is an error (Horovod's message)
    opt.zero_grad()
    model(torch.ones(1, 4)).sum().backward()
    try:
        model(torch.ones(1, 4)).sum().backward()
    except AssertionError as e:
        assert "backward_passes_per_step" in str(e)
    else:
        raise AssertionError("two backward passes with backward_passes_per_step=1 must be refused")
    opt.synchronize()
    opt.zero_grad()


def test_synchronize_skip_synchronize_zero_grad(pool2):
    pool2.run(_b_synchronize_api)


def _b_optimizer_state(rank, size):
    torch.manual_seed(rank)
    model = nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (rank + 1))
    if rank == 0:  # only the root has stepped: state (exp_avg, step) exists there
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
        opt.step()
    w_before = [p.detach().clone() for p in model.parameters()]
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == 0.01
    # the zero-gradient step that materializes state elsewhere leaves parameters alone
    assert all(torch.equal(a, b.detach()) for a, b in zip(w_before, model.parameters()))
    st = [opt.state[p] for p in model.parameters()]
    summary = [[float(s["step"]), s["exp_avg"].sum().item(), s["exp_avg_sq"].sum().item()] for s in st]
    got = hvd.allgather_object(summary)
    assert got[0] == got[1], got
    assert got[0][0][0] == 2.0
    # a wrapped optimizer works too
    dopt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1 * (rank + 1), momentum=0.9),
                                    named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(dopt, root_rank=1)
    assert dopt.param_groups[0]["lr"] == 0.1 * size


def test_broadcast_optimizer_state(pool2):
    pool2.run(_b_optimizer_state)


def _b_join_uneven(rank, size):
    """Rank r trains r+2 steps; early finishers join; as in Horovod, a joined
    rank contributes zeros and the average still divides by the set's size."""
    model = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters())
    steps = rank + 2
    for s in range(steps):
        opt.zero_grad()
        model(torch.full((1, 2), float(rank + 1))).sum().backward()
        opt.step()
    last = hvd.join()
    assert last == size - 1, last
    # each step sums the active ranks' gradients and divides by size (joined ranks add zeros)
    expect = 0.0
    for s in range(steps):
        active = [r for r in range(size) if s < r + 2]
        expect -= sum(r + 1 for r in active) / size
    assert torch.allclose(model.weight.detach(), torch.full((1, 2), expect)), (model.weight, expect)
    return last


def test_join_with_uneven_steps(pool2):
    assert pool2.run(_b_join_uneven, timeout=60) == [1, 1]


def _b_sync_batch_norm(rank, size):
    torch.manual_seed(0)
    full = torch.randn(4 * size, 3, 5, dtype=torch.float64)
    upstream = torch.randn(4 * size, 3, 5, dtype=torch.float64)
    bn_ref = nn.BatchNorm1d(3).double()
    x_ref = full.clone().requires_grad_()
    (bn_ref(x_ref) * upstream).sum().backward()

    bn = hvd.SyncBatchNorm(3).double()
    mine = slice(rank * 4, (rank + 1) * 4)
    x = full[mine].clone().requires_grad_()
    out = bn(x)
    (out * upstream[mine]).sum().backward()
    ref_out = nn.functional.batch_norm(full, None, None, bn_ref.weight.detach(), bn_ref.bias.detach(), True, 0.1,
                                       bn_ref.eps)
    assert torch.allclose(out.detach(), ref_out[mine], atol=1e-10)
    assert torch.allclose(x.grad, x_ref.grad[mine], atol=1e-10), (x.grad - x_ref.grad[mine]).abs().max()
    # weight gradient: local part; summed over ranks it is the full-batch gradient
    wsum = hvd.allreduce(bn.weight.grad, op=hvd.Sum)
    assert torch.allclose(wsum, bn_ref.weight.grad, atol=1e-10)
    assert torch.allclose(bn.running_mean, bn_ref.running_mean, atol=1e-12)
    assert torch.allclose(bn.running_var, bn_ref.running_var, atol=1e-12)


def test_sync_batch_norm_matches_full_batch(pool2):
    pool2.run(_b_sync_batch_norm)
