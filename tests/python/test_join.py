"""hvd.join() with the other collectives, and errors at submission, through
hora.torch (issue 13), written like Horovod's test_torch.py test_horovod_join_*
and *_duplicate_name_error. Each rank joins first in turn, with 2 and 3 ranks.

Where hora differs from Horovod 0.28 (which refuses allgather and broadcast
with any joined rank): the joined rank's allgather slice is empty, and a
broadcast from a root that did not join goes on. A broadcast from a joined
root raises on every rank that called it (a RuntimeError, as in Horovod)."""
import pytest
import torch

import hora.torch as hvd


def _rows(rank):
    return torch.arange(3 * (rank + 1), dtype=torch.float32).reshape(rank + 1, 3) + 100 * rank


def _b_join_allgather_broadcast(rank, size):
    out = []
    for first in range(size):
        # Warm the cache with two named allreduces (Horovod's join pattern).
        hvd.synchronize(hvd.allreduce_async(torch.ones(5), name="tensor_a"))
        hvd.synchronize(hvd.allreduce_async(torch.ones(17), name="tensor_b"))
        if rank == first:
            ret = hvd.join()
        else:
            gathered = hvd.allgather(_rows(rank), name="rows")
            want = torch.cat([_rows(r) for r in range(size) if r != first])
            assert torch.equal(gathered, want), (gathered, want)
            a = hvd.allreduce(torch.ones(5), name="tensor_a", op=hvd.Sum)
            assert torch.equal(a, torch.full((5,), float(size - 1))), a
            root = 1 if first == 0 else 0
            b = hvd.broadcast(torch.full((4,), float(rank)), root, name="b")
            assert torch.equal(b, torch.full((4,), float(root))), b
            with pytest.raises(RuntimeError) as err:
                hvd.broadcast(torch.zeros(4), first, name="from_joined")
            msg = str(err.value)
            assert "root rank %d" % first in msg and "joined" in msg and "from_joined" in msg, msg
            ret = hvd.join()
        assert ret != first, (ret, first)
        out.append(ret)
    return out


def test_join_allgather_and_broadcast_two_ranks(pool2):
    res = pool2.run(_b_join_allgather_broadcast, timeout=90)
    assert res[0] == res[1]


def test_join_allgather_and_broadcast_three_ranks(pool3):
    res = pool3.run(_b_join_allgather_broadcast, timeout=90)
    assert res[0] == res[1] == res[2]


def _b_duplicate_names(rank, size):
    """Horovod's test_horovod_*_duplicate_name_error: the second call with a name in
    flight raises ValueError at once; the first completes once every rank calls it."""
    t = torch.ones(4, 3)
    calls = {
        "allreduce": lambda: hvd.allreduce_async(t, name="dup"),
        "allgather": lambda: hvd.allgather_async(t, name="dup"),
        "broadcast": lambda: hvd.broadcast_async(t, 0, name="dup"),
        "alltoall": lambda: hvd.alltoall_async(t, name="dup"),
        "reducescatter": lambda: hvd.reducescatter_async(t, name="dup"),
    }
    for kind, call in calls.items():
        handle = None
        if rank == 0:
            handle = call()
            with pytest.raises(ValueError) as err:
                call()
            assert "already in flight" in str(err.value), (kind, str(err.value))
        hvd.barrier()
        if rank != 0:
            handle = call()
        hvd.synchronize(handle)
    return True


def test_duplicate_name_raises_at_submission(pool2):
    assert pool2.run(_b_duplicate_names) == [True, True]


def _b_join_average_divides_by_size(rank, size):
    """Horovod's test_horovod_join_allreduce: with one rank joined, an Average
    allreduce of ones gives (size - 1) / size (the joined rank adds zeros and
    the average divides by the set's size), for float32 and float64."""
    for first in range(size):
        if rank == first:
            hvd.join()
            continue
        for dtype in (torch.float32, torch.float64):
            x = hvd.allreduce(torch.ones(7, dtype=dtype), name="avg.%s" % dtype, op=hvd.Average)
            want = torch.full((7,), (size - 1) / size, dtype=dtype)
            assert torch.allclose(x, want), (x, want)
        hvd.join()
    return True


def test_join_average_divides_by_size_as_horovod(pool3):
    assert pool3.run(_b_join_average_divides_by_size, timeout=90) == [True] * 3
