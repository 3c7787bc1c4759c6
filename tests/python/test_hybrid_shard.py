"""Hybrid sharding on 4 ranks: state sharded within "hosts" {0,1} and {2,3},
replicated across them ({0,2} and {1,3}), for ZeroOptimizer (stages 1 and 2),
FullyShardedModule and LocalSGD over a data-parallel DistributedOptimizer.
The first two are compared with hvd.DistributedOptimizer over all 4 ranks on
the same data per rank (to float tolerance: the average is taken in two
stages, so the rounding differs).
"""
import pytest
import torch
import torch.nn as nn

import hora.torch as hvd
from harness import RankPool
from test_fully_sharded import _compare, _data, _model, _opt, _reference, _train


@pytest.fixture(scope="module")
def pool4():
    pool = RankPool(4, extra_env={"HORA_STALL_SHUTDOWN_TIME_S": 20})
    yield pool
    pool.close()


def _sets(rank):
    # every rank creates every set, in one order (process-set creation is collective)
    sets = [hvd.add_process_set(r) for r in ([0, 1], [2, 3], [0, 2], [1, 3])]
    shard = sets[0] if rank < 2 else sets[1]
    replicate = sets[2] if rank % 2 == 0 else sets[3]
    return sets, shard, replicate


def _same_across(replicate, tensors, what):
    for i, t in enumerate(tensors):
        t = t.detach()
        assert torch.equal(hvd.broadcast(t, replicate.ranks[0], process_set=replicate), t), (what, i)


def _b_fsdp(rank, size):
    sets, shard, replicate = _sets(rank)
    try:
        data = _data(rank, 4)
        ref = _reference("adam", data)
        model = hvd.FullyShardedModule(_model(), process_set=shard, replicate_process_set=replicate)
        assert model.shard_bytes() * 2 <= model.full_bytes() + 8 * len(model.flats)
        _train(model, _opt("adam", model.parameters()), data)
        _compare(model, ref, "hybrid FullyShardedModule")
        _same_across(replicate, model.parameters(), "shards")
    finally:
        for s in sets:
            hvd.remove_process_set(s)


def test_fully_sharded_hybrid(pool4):
    pool4.run(_b_fsdp, timeout=180)


def _b_zero(rank, size, stage):
    sets, shard, replicate = _sets(rank)
    try:
        data = _data(rank, 4)
        ref = _reference("adam", data)
        model = _model()
        opt = hvd.ZeroOptimizer(model.named_parameters(), torch.optim.Adam, stage=stage, process_set=shard,
                                replicate_process_set=replicate, bucket_bytes=2048, lr=0.01)
        _train(model, opt, data)
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            assert torch.allclose(p, q, rtol=1e-5, atol=1e-6), (n, (p - q).abs().max().item())
        # the optimizer state is half (sharded over 2), and the same on both "hosts"
        full = sum(p.numel() * 4 * 2 for p in model.parameters())  # Adam: two moments
        assert opt.state_bytes() <= full // 2 + 64 * len(opt.buckets)
        _same_across(replicate, [b.master for b in opt.buckets], "masters")
    finally:
        for s in sets:
            hvd.remove_process_set(s)


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_hybrid(pool4, stage):
    pool4.run(_b_zero, stage, timeout=180)


def _b_local_sgd(rank, size):
    # data parallel (every step) inside a host, local SGD (every 3 steps) across hosts
    sets, shard, replicate = _sets(rank)
    try:
        data = _data(rank, 6)
        model = _model()
        inner = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(), process_set=shard)
        opt = hvd.LocalSGD(inner, sync_every=3, process_set=replicate)
        loss_fn = nn.CrossEntropyLoss()
        for step, (x, y) in enumerate(data, 1):
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            params = [p.detach().clone() for p in model.parameters()]
            _same_across(shard, params, "host replicas at step %d" % step)
            # (the broadcast's root sees no difference: take the largest over the set)
            diff = max((hvd.broadcast(p, replicate.ranks[0], process_set=replicate) - p).abs().max().item()
                       for p in params)
            diff = hvd.allreduce(torch.tensor([diff]), op=hvd.Max, process_set=replicate).item()
            assert (diff == 0) == (step % 3 == 0), (step, diff)  # the hosts drift apart, then meet
        assert opt.syncs == 2
    finally:
        for s in sets:
            hvd.remove_process_set(s)


def test_local_sgd_across_hosts(pool4):
    pool4.run(_b_local_sgd, timeout=180)
