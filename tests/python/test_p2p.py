"""hora.torch send/recv (docs/p2p.md) on 2 and 3 ranks: blocking and async
forms, negotiated receives, batches, tags, process sets with global peers,
the mismatch error on both sides, and argument errors."""
import pytest
import torch

import hora.torch as hvd


def _b_send_recv(rank, size):
    peer = 1 - rank
    for dtype in (torch.float32, torch.float64, torch.int64, torch.bfloat16, torch.bool, torch.uint8):
        for n in (0, 1, 1000, 70000):
            t = (torch.arange(n) % 2 if dtype == torch.bool else torch.arange(n) * (rank + 1)).to(dtype)
            if rank == 0:
                hvd.send(t, dst=1, tag=n)
                back = hvd.recv(torch.empty_like(t), src=1, tag=n)
                assert torch.equal(back, (torch.arange(n) % 2 if dtype == torch.bool
                                          else torch.arange(n) * 2).to(dtype)), (dtype, n)
            else:
                got = hvd.recv(torch.empty_like(t), src=0, tag=n)
                assert torch.equal(got, (torch.arange(n) % 2 if dtype == torch.bool
                                         else torch.arange(n)).to(dtype)), (dtype, n)
                hvd.send(t, dst=0, tag=n)
    # negotiated shape and dtype
    if rank == 0:
        hvd.send(torch.arange(12, dtype=torch.int32).reshape(3, 4), dst=1, tag=5)
    else:
        got = hvd.recv(src=0, tag=5)
        assert got.dtype == torch.int32 and got.shape == (3, 4) and got.flatten().tolist() == list(range(12))
    # async forms; tags taken out of order
    if rank == 0:
        hs = [hvd.isend(torch.full((4,), float(tag)), dst=1, tag=tag) for tag in (1, 2, 3)]
        for h in hs:
            hvd.synchronize(h)
    else:
        h3 = hvd.irecv(torch.empty(4), src=0, tag=3)
        h1 = hvd.irecv(torch.empty(4), src=0, tag=1)
        h2 = hvd.irecv(None, src=0, tag=2)
        assert hvd.synchronize(h3).tolist() == [3.0] * 4
        assert hvd.synchronize(h1).tolist() == [1.0] * 4
        assert hvd.synchronize(h2).tolist() == [2.0] * 4
    # a batch: both send to each other at once, no deadlock
    out = torch.full((100000,), float(rank))
    into = torch.empty(100000)
    h = hvd.batch_isend_irecv([hvd.P2POp(hvd.isend, out, peer, tag=9), hvd.P2POp(hvd.irecv, into, peer, tag=9)])
    res = hvd.synchronize(h)
    assert res[1] is into and torch.all(into == float(peer))
    # non-contiguous tensors are sent as a contiguous copy / received through one
    if rank == 0:
        hvd.send(torch.arange(20.0).reshape(4, 5).t(), dst=1)
    else:
        dst = torch.empty(5, 4).t()  # non-contiguous view
        hvd.recv(dst, src=0)
        assert torch.equal(dst, torch.arange(20.0).reshape(4, 5).t().contiguous().reshape(4, 5)), dst


def test_send_recv(pool2):
    pool2.run(_b_send_recv)


def _b_mismatch(rank, size):
    if rank == 0:
        with pytest.raises(hvd.HoraMismatchError) as e:
            hvd.send(torch.ones(8), dst=1, tag=3)
        assert "expected float64[8]" in str(e.value) or "float64" in str(e.value), str(e.value)
    else:
        buf = torch.full((8,), 7.0, dtype=torch.float64)
        with pytest.raises(hvd.HoraMismatchError) as e:
            hvd.recv(buf, src=0, tag=3)
        assert "the message is float32[8]" in str(e.value), str(e.value)
        assert torch.all(buf == 7.0)
    # the pair still works afterwards
    if rank == 0:
        hvd.send(torch.ones(3), dst=1)
    else:
        assert hvd.recv(src=0).tolist() == [1.0] * 3


def test_mismatch_fails_both_sides(pool2):
    pool2.run(_b_mismatch)


def _b_three_ranks_sets(rank, size):
    # a ring on the global set
    right, left = (rank + 1) % size, (rank - 1) % size
    got = torch.empty(3)
    hvd.synchronize(hvd.batch_isend_irecv([hvd.P2POp(hvd.irecv, got, left), hvd.P2POp(hvd.isend,
                                                                                       torch.full((3,), rank * 1.0), right)]))
    assert got.tolist() == [float(left)] * 3
    # a set {0, 2}: peers are global ranks
    ps = hvd.add_process_set([0, 2])
    if rank == 0:
        hvd.send(torch.tensor([42]), dst=2, process_set=ps)
        with pytest.raises(ValueError, match="not a member"):
            hvd.send(torch.tensor([1]), dst=1, process_set=ps)
    elif rank == 2:
        assert hvd.recv(src=0, process_set=ps).tolist() == [42]
    hvd.remove_process_set(ps)
    # argument errors
    with pytest.raises(hvd.HoraInvalidArgumentError, match="itself"):
        hvd.send(torch.ones(1), dst=rank)
    with pytest.raises(hvd.HoraInvalidArgumentError, match="not a rank"):
        hvd.send(torch.ones(1), dst=size + 3)
    with pytest.raises(ValueError):
        hvd.P2POp(hvd.allreduce, torch.ones(1), 0)
    hvd.barrier()


def test_three_ranks_and_sets(pool3):
    pool3.run(_b_three_ranks_sets)


def _b_numpy(rank, size):
    import numpy as np
    import hora.numpy as hn
    if rank == 0:
        hn.send(np.arange(6, dtype=np.int16).reshape(2, 3), dst=1, tag=4)
        buf = np.zeros(3)
        assert hn.recv(buf, src=1) is buf and buf.tolist() == [1.0, 2.0, 3.0]
    else:
        got = hn.recv(src=0, tag=4)
        assert got.dtype == np.int16 and got.shape == (2, 3) and got.flatten().tolist() == list(range(6))
        hn.send(np.array([1.0, 2.0, 3.0]), dst=0)


def test_numpy_send_recv(pool2):
    pool2.run(_b_numpy)
