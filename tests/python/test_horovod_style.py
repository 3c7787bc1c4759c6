"""Horovod's test style (test/parallel/test_torch.py): many tests in ONE pair of
processes, each test calling ``hvd.init()`` first and ``hvd.barrier();
hvd.shutdown()`` last, so every test runs in a fresh runtime of the same
processes and the lifecycle has to stay honest (re-init scopes each runtime's
store keys by an epoch). The pool's workers do not init themselves
(``RankPool(init=False)``); the ``horovod_test`` wrapper does it per body."""
import functools

import pytest

from harness import RankPool


@pytest.fixture(scope="module")
def pair():
    pool = RankPool(2, extra_env={"HORA_STALL_SHUTDOWN_TIME_S": 20}, init=False)
    yield pool
    pool.close()


def horovod_test(body):
    """init before, barrier and shutdown after, as Horovod's tests do; the body
    gets the module (hvd) and torch."""
    @functools.wraps(body)
    def run(rank, size, *args):
        import torch
        import hora.torch as hvd
        assert not hvd.is_initialized(), "the previous test left hora initialized"
        hvd.init()
        assert hvd.rank() == rank and hvd.size() == size
        result = body(hvd, torch, *args)
        hvd.barrier()
        hvd.shutdown()
        assert not hvd.is_initialized()
        return result
    return run


@horovod_test
def allreduce_sum_and_average(hvd, torch):
    r, n = hvd.rank(), hvd.size()
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64):
        t = torch.arange(6, dtype=dtype).reshape(2, 3) * (r + 1)
        s = hvd.allreduce(t, op=hvd.Sum, name="sum.%s" % dtype)
        assert torch.equal(s, torch.arange(6, dtype=dtype).reshape(2, 3) * (n * (n + 1) // 2))
    a = hvd.allreduce(torch.full((4,), float(r)), name="avg")
    assert torch.allclose(a, torch.full((4,), (n - 1) / 2))
    m = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Max)
    assert m.item() == n - 1


@horovod_test
def allreduce_inplace_and_async(hvd, torch):
    t = torch.ones(5)
    hvd.allreduce_(t, op=hvd.Sum, name="inplace")
    assert torch.equal(t, torch.full((5,), float(hvd.size())))
    handles = [hvd.allreduce_async(torch.full((3,), float(i)), op=hvd.Sum, name="async.%d" % i) for i in range(4)]
    for i, h in enumerate(handles):
        out = hvd.synchronize(h)
        assert torch.equal(out, torch.full((3,), float(i * hvd.size())))
    h = hvd.allreduce_async(torch.ones(2), name="polled")
    while not hvd.poll(h):
        pass
    assert torch.equal(hvd.synchronize(h), torch.ones(2))


@horovod_test
def allreduce_pre_and_postscale(hvd, torch):
    out = hvd.allreduce(torch.ones(3), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    assert torch.allclose(out, torch.full((3,), float(hvd.size())))


@horovod_test
def grouped_allreduce(hvd, torch):
    ts = [torch.full((i + 1,), float(hvd.rank() + i)) for i in range(3)]
    outs = hvd.grouped_allreduce(ts, op=hvd.Sum, name="grouped")
    n = hvd.size()
    for i, o in enumerate(outs):
        assert torch.equal(o, torch.full((i + 1,), float(n * (n - 1) / 2 + n * i)))


@horovod_test
def allgather_uneven_first_dimension(hvd, torch):
    r = hvd.rank()
    t = torch.full((r + 1, 2), float(r))
    g = hvd.allgather(t, name="uneven")
    expect = torch.cat([torch.full((i + 1, 2), float(i)) for i in range(hvd.size())])
    assert torch.equal(g, expect)
    outs = hvd.grouped_allgather([t, t * 2], name="grouped_gather")
    assert torch.equal(outs[0], expect) and torch.equal(outs[1], expect * 2)


@horovod_test
def broadcast_from_every_root(hvd, torch):
    for root in range(hvd.size()):
        t = torch.full((3,), float(hvd.rank()))
        assert torch.equal(hvd.broadcast(t, root, name="b.%d" % root), torch.full((3,), float(root)))
        hvd.broadcast_(t, root, name="b_.%d" % root)
        assert torch.equal(t, torch.full((3,), float(root)))


@horovod_test
def alltoall_with_splits(hvd, torch):
    r, n = hvd.rank(), hvd.size()
    # Rank r sends j+1 rows to rank j, each row valued r.
    splits = torch.tensor([j + 1 for j in range(n)], dtype=torch.int32)
    t = torch.full((int(splits.sum()), 2), float(r))
    out, received = hvd.alltoall(t, splits=splits, name="a2a")
    assert received.tolist() == [r + 1] * n
    assert torch.equal(out, torch.cat([torch.full((r + 1, 2), float(i)) for i in range(n)]))


@horovod_test
def reducescatter_sum(hvd, torch):
    n = hvd.size()
    t = torch.arange(2 * n, dtype=torch.float32)
    out = hvd.reducescatter(t, op=hvd.Sum, name="rs")
    r = hvd.rank()
    assert torch.equal(out, torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) * n)


@horovod_test
def objects(hvd, torch):
    obj = hvd.broadcast_object({"from": hvd.rank(), "list": [1, 2]}, root_rank=0)
    assert obj == {"from": 0, "list": [1, 2]}
    assert hvd.allgather_object(("rank", hvd.rank())) == [("rank", i) for i in range(hvd.size())]


@horovod_test
def join_every_rank(hvd, torch):
    # Uneven work: rank r does r+1 steps, then joins; the others' allreduces see zeros from joined ranks.
    for step in range(hvd.rank() + 1):
        hvd.allreduce(torch.ones(2), op=hvd.Sum, name="join.step.%d" % step)
    last = hvd.join()
    assert last == hvd.size() - 1


@horovod_test
def process_sets(hvd, torch):
    ps = hvd.add_process_set([0])
    try:
        if hvd.rank() == 0:
            assert ps.included() and ps.size() == 1
            assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, process_set=ps), torch.ones(2))
        else:
            assert not ps.included()
    finally:
        hvd.remove_process_set(ps)


@horovod_test
def optimizer_step(hvd, torch):
    torch.manual_seed(hvd.rank())
    model = torch.nn.Linear(4, 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    x = torch.full((2, 4), float(hvd.rank() + 1))
    model(x).sum().backward()
    opt.step()
    # Same parameters on every rank after the averaged step.
    w = model.weight.detach().clone()
    assert torch.allclose(hvd.allreduce(w, name="w"), w)


@horovod_test
def identity_and_probes(hvd, torch):
    assert hvd.local_rank() == hvd.rank() and hvd.local_size() == hvd.size()
    assert hvd.is_homogeneous() and hvd.gloo_enabled() and not hvd.mpi_enabled()
    return hvd.epoch()


@horovod_test
def unnamed_ops_restart_their_names(hvd, torch):
    # Unnamed ops are named in call order; a fresh runtime starts the count again,
    # so both ranks agree whatever ran before.
    for _ in range(3):
        assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum), torch.full((1,), float(hvd.size())))


TESTS = [allreduce_sum_and_average, allreduce_inplace_and_async, allreduce_pre_and_postscale, grouped_allreduce,
         allgather_uneven_first_dimension, broadcast_from_every_root, alltoall_with_splits, reducescatter_sum, objects,
         join_every_rank, process_sets, optimizer_step, identity_and_probes, unnamed_ops_restart_their_names]


@pytest.mark.parametrize("body", TESTS, ids=[t.__name__ for t in TESTS])
def test_horovod_style(pair, body):
    pair.run(body, timeout=90)


def test_each_test_had_its_own_runtime(pair):
    # The same processes ran every body above, each in a fresh runtime: they
    # are still the same two workers, and a runtime answers the same each time
    # (both ranks agree on the epoch; with rank 0 hosting the store, each
    # runtime starts a new store, so the epoch does not grow here).
    pids = pair.run(worker_pid)
    first = pair.run(identity_and_probes)
    second = pair.run(identity_and_probes)
    assert first[0] == first[1] and second == first
    assert pair.run(worker_pid) == pids


def worker_pid(rank, size):
    import os
    import hora.torch as hvd
    assert not hvd.is_initialized()
    return os.getpid()
