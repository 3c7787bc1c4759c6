"""hora.torch across emulated hosts: 4 ranks as 2 "hosts" x 2 (HORA_HOST_ID
hostA for ranks 0-1, hostB for 2-3), so the set takes the hierarchy (shared
memory inside a host, hora's TCP ring across) and every collective but the
allreduce runs on the TCP ring over all ranks, allgather and reducescatter
hierarchically from 1 MiB (HORA_HIER_COLLECTIVE_MIN_BYTES). Each collective
is checked element by element below and above that threshold, then ZeRO and
FullyShardedModule train across the hosts and match DistributedOptimizer.
"""
import re

import pytest
import torch

import hora.torch as hvd
from harness import RankPool
from test_fully_sharded import _b_matches
from test_zero import _b_matches_distributed


@pytest.fixture(scope="module")
def pool4_hosts():
    pool = RankPool(4, extra_env={"HORA_STALL_SHUTDOWN_TIME_S": 20},
                    per_rank_env=lambda r: {"HORA_HOST_ID": "hostA" if r < 2 else "hostB"})
    yield pool
    pool.close()


def _value(src, rows, cols, salt):
    # distinct small integers per (source rank, row, column): exact in float32
    r = torch.arange(rows, dtype=torch.float32).unsqueeze(1)
    c = torch.arange(cols, dtype=torch.float32).unsqueeze(0)
    return (src * 7 + salt * 3 + r * 5 + c) % 97


def _b_collectives(rank, size, cols):
    # allgather with a different first dimension on every rank
    rows = [3 + 2 * q for q in range(size)]
    got = hvd.allgather(_value(rank, rows[rank], cols, 1), name="x.ag.%d" % cols)
    assert torch.equal(got, torch.cat([_value(q, rows[q], cols, 1) for q in range(size)])), "allgather"
    # reducescatter (sum): rank r keeps its block of rows
    n = 4 * size
    got = hvd.reducescatter(_value(rank, n, cols, 2), op=hvd.Sum, name="x.rs.%d" % cols)
    want = sum(_value(q, n, cols, 2) for q in range(size))
    assert torch.equal(got, want[4 * rank:4 * rank + 4]), "reducescatter"
    # broadcast from each root
    for root in range(size):
        t = _value(rank, 6, cols, 3) if rank == root else torch.full((6, cols), -1.0)
        assert torch.equal(hvd.broadcast(t, root, name="x.bc.%d.%d" % (cols, root)), _value(root, 6, cols, 3))
    # alltoall with uneven splits: rank s sends s + d + 1 rows to rank d
    splits = [rank + d + 1 for d in range(size)]
    send = torch.cat([_value(rank * 10 + d, splits[d], cols, 4) for d in range(size)])
    got, received = hvd.alltoall(send, splits=torch.tensor(splits, dtype=torch.int32), name="x.a2a.%d" % cols)
    assert received.tolist() == [s + rank + 1 for s in range(size)], "alltoall splits"
    assert torch.equal(got, torch.cat([_value(s * 10 + rank, s + rank + 1, cols, 4) for s in range(size)])), \
        "alltoall"
    # and an allreduce (the hierarchy's own)
    got = hvd.allreduce(_value(rank, 8, cols, 5), op=hvd.Sum, name="x.ar.%d" % cols)
    assert torch.equal(got, sum(_value(q, 8, cols, 5) for q in range(size))), "allreduce"
    # where they ran (the flight recorder names each one's plane): inside the
    # negotiation, or on the hierarchy over the emulated hosts
    flight = hvd.metrics(format="flight")
    # hora.torch names a tensor "<kind>.<its name>", e.g. "allgather.x.ag.8"
    name = re.compile(r"^[a-z]+\.x\.[a-z0-9]+\.%d(\.\d+)?$" % cols)
    mine = [ln.split("\t") for ln in flight.splitlines()]
    mine = {f[3]: f[8] for f in mine if len(f) > 8 and f[1] == "done" and name.match(f[3])}
    assert len(mine) == 4 + size, flight[-2000:]
    hier = "hier(2 hosts x 2 ranks: shm, tcp-ring across; tcp-ring+gloo for the rest)"
    for tensor, plane in mine.items():
        inline = cols == 8 or (cols == 300 and tensor.startswith("allreduce.x.ar."))
        assert plane == ("inline" if inline else hier), (tensor, plane, flight[-2000:])


@pytest.mark.parametrize("cols", [8, 300, 1000, 40000])
def test_every_collective_across_hosts(pool4_hosts, cols):
    # cols 8: every result within HORA_INLINE_MAX_BYTES (16 KiB at 4 ranks
    # across hosts; 4 KiB for collectives other than allreduce): each
    # travels inside the negotiation;
    # cols 300: the allreduce (9.6 KB) inline, the others (7.2-28.8 KB)
    # past their quarter of the budget, on the ring;
    # cols 1000: past it, far below 1 MiB (the ring over all ranks);
    # cols 40000: allgather (24 rows, 3.8 MB) and reducescatter (16 rows,
    # 2.6 MB) above it (hierarchical), the rest on the ring and mesh
    pool4_hosts.run(_b_collectives, cols, timeout=120)


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_across_hosts_matches_distributed_optimizer(pool4_hosts, stage):
    pool4_hosts.run(_b_matches_distributed, stage, "adam", 1, timeout=180)


def test_fully_sharded_across_hosts_matches_distributed_optimizer(pool4_hosts):
    pool4_hosts.run(_b_matches, "adam", 1, True, timeout=180)
