"""hora.torch collectives on 2 ranks: values, dtypes, ops, in-place/async variants,
grouped ops, autograd, object helpers, errors. Each body runs on every rank
(harness.RankPool) and checks its own result against a locally computed one."""
import torch

import hora.torch as hvd

FLOAT_DTYPES = ["float32", "float64", "float16", "bfloat16"]
INT_DTYPES = ["uint8", "int8", "int16", "int32", "int64"]


def _data(rank, dtype, shape=(3, 5)):
    """Small integer-valued data (exact in every dtype) depending on the rank."""
    n = 1
    for d in shape:
        n *= d
    base = (torch.arange(n, dtype=torch.int64) % 7 + rank + 1).reshape(shape)
    return base.to(getattr(torch, dtype))


# ---------------------------------------------------------------- allreduce
def _b_allreduce_dtypes_ops(rank, size):
    for dt in FLOAT_DTYPES + INT_DTYPES:
        x = _data(rank, dt)
        parts = [_data(r, dt).double() for r in range(size)]
        want = {hvd.Sum: sum(parts), hvd.Min: torch.stack(parts).min(0).values,
                hvd.Max: torch.stack(parts).max(0).values, hvd.Product: torch.stack(parts).prod(0)}
        if dt in FLOAT_DTYPES:
            want[hvd.Average] = sum(parts) / size
        for op, expect in want.items():
            out = hvd.allreduce(x, op=op, name="ar.%s.%s" % (dt, op))
            assert out.dtype == x.dtype, (dt, op, out.dtype)
            assert out.shape == x.shape
            assert torch.equal(out.double(), expect.to(x.dtype).double()), (dt, op, out, expect)
            assert torch.equal(x, _data(rank, dt)), "allreduce must not modify its input"
    # bool: max = logical or, min = logical and
    b = torch.tensor([rank == 0, False, True])
    assert hvd.allreduce(b, op=hvd.Max).tolist() == [True, False, True]
    assert hvd.allreduce(b, op=hvd.Min).tolist() == [False, False, True]


def test_allreduce_dtypes_and_ops(pool2):
    pool2.run(_b_allreduce_dtypes_ops)


def _b_allreduce_variants(rank, size):
    x = torch.full((4,), float(rank + 1))
    total = float(sum(range(1, size + 1)))
    # average default, deprecated average=, prescale/postscale
    assert torch.allclose(hvd.allreduce(x), torch.full((4,), total / size))
    assert torch.allclose(hvd.allreduce(x, average=False), torch.full((4,), total))
    out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5 * 3)
    assert torch.allclose(out, torch.full((4,), total * 3)), out
    # in place
    y = x.clone()
    assert hvd.allreduce_(y, op=hvd.Sum) is y
    assert torch.allclose(y, torch.full((4,), total))
    # async + poll + synchronize (new tensor / in place)
    h1 = hvd.allreduce_async(x, op=hvd.Sum, name="async1")
    z = x.clone()
    h2 = hvd.allreduce_async_(z, op=hvd.Sum, name="async2")
    assert hvd.synchronize(h2) is z
    out1 = hvd.synchronize(h1)
    assert hvd.poll(hvd.allreduce_async(x, name="polled")) in (True, False)
    assert torch.allclose(out1, torch.full((4,), total)) and torch.allclose(z, out1)
    # many outstanding requests, unnamed, completed in reverse order
    hs = [hvd.allreduce_async(torch.full((i + 1,), float(rank)), op=hvd.Sum) for i in range(20)]
    for i, h in reversed(list(enumerate(hs))):
        assert torch.allclose(hvd.synchronize(h), torch.full((i + 1,), float(sum(range(size)))))
    # scalar (0-d) and empty tensors
    assert hvd.allreduce(torch.tensor(float(rank)), op=hvd.Sum).item() == sum(range(size))
    assert hvd.allreduce(torch.zeros(0), op=hvd.Sum).shape == (0,)
    # fp16 compression: travels as half, comes back float32
    c = hvd.allreduce(torch.full((3,), 0.5 + rank), compression=hvd.Compression.fp16, op=hvd.Sum)
    assert c.dtype == torch.float32 and torch.allclose(c, torch.full((3,), 0.5 * size + sum(range(size))))
    return True


def test_allreduce_variants(pool2):
    pool2.run(_b_allreduce_variants)


def _b_poll_handle(rank, size):
    import time
    h = hvd.allreduce_async(torch.ones(8), op=hvd.Sum, name="poll.me")
    deadline = time.time() + 20
    while not hvd.poll(h):
        assert time.time() < deadline, "poll never became true"
        time.sleep(0.001)
    assert torch.equal(hvd.synchronize(h), torch.full((8,), float(size)))
    try:
        hvd.synchronize(h)
    except ValueError:
        pass
    else:
        raise AssertionError("a handle synchronized twice must be rejected")


def test_poll(pool2):
    pool2.run(_b_poll_handle)


def _b_grouped_allreduce(rank, size):
    ts = [torch.full((i + 2,), float(rank + i)) for i in range(5)] + [torch.arange(6, dtype=torch.int32) * rank]
    outs = hvd.grouped_allreduce(ts, op=hvd.Sum, name="grp")
    for i in range(5):
        assert torch.allclose(outs[i], torch.full((i + 2,), float(sum(r + i for r in range(size)))))
    assert torch.equal(outs[5], torch.arange(6, dtype=torch.int32) * sum(range(size)))
    avg = hvd.grouped_allreduce([torch.full((2,), float(rank))], name="grp.avg")
    assert torch.allclose(avg[0], torch.full((2,), sum(range(size)) / size))
    inplace = [t.clone() for t in ts[:2]]
    hvd.grouped_allreduce_(inplace, op=hvd.Sum)
    assert torch.allclose(inplace[0], outs[0])
    h = hvd.grouped_allreduce_async([torch.ones(3)], op=hvd.Sum)
    assert torch.allclose(hvd.synchronize(h)[0], torch.full((3,), float(size)))
    h = hvd.grouped_allreduce_async_(inplace, op=hvd.Sum)
    assert hvd.synchronize(h)[0] is inplace[0]


def test_grouped_allreduce(pool2):
    pool2.run(_b_grouped_allreduce)


# ---------------------------------------------------------------- allgather / broadcast
def _b_allgather(rank, size):
    for dt in FLOAT_DTYPES + INT_DTYPES + ["bool"]:
        x = (torch.ones((rank + 1, 3), dtype=torch.int64) * (rank + 1)).to(getattr(torch, dt))
        out = hvd.allgather(x, name="ag." + dt)
        want = torch.cat([(torch.ones((r + 1, 3), dtype=torch.int64) * (r + 1)).to(getattr(torch, dt))
                          for r in range(size)])
        assert out.dtype == x.dtype and torch.equal(out, want), (dt, out)
    # a rank contributing zero rows
    x = torch.arange(4.0).reshape(2, 2) if rank == 0 else torch.zeros((0, 2))
    assert torch.equal(hvd.allgather(x), torch.arange(4.0).reshape(2, 2))
    h = hvd.allgather_async(torch.tensor([rank]))
    assert hvd.synchronize(h).tolist() == list(range(size))
    g = hvd.grouped_allgather([torch.tensor([rank]), torch.tensor([[rank, rank]])], name="gag")
    assert g[0].tolist() == list(range(size)) and g[1].tolist() == [[r, r] for r in range(size)]


def test_allgather(pool2):
    pool2.run(_b_allgather)


def _b_output_allocation_failure(rank, size):
    # The result is allocated by torch when hora knows its shape; if that
    # fails on one rank, only that rank's request fails, with torch's error
    # chained on, and the job goes on.
    import hora.torch.mpi_ops as ops
    real_empty = ops.torch.empty

    def failing_empty(*args, **kwargs):
        raise RuntimeError("simulated allocation failure")
    if rank == 1:
        ops.torch.empty = failing_empty
    try:
        out = hvd.allgather(torch.tensor([rank]), name="ag.alloc.fail")
        assert rank != 1, "the failing rank must raise"
        assert out.tolist() == list(range(size))
    except hvd.HoraError as e:
        assert rank == 1, e
        assert "allocator callback failed" in str(e), e
        assert isinstance(e.__cause__, RuntimeError) and "simulated" in str(e.__cause__), e.__cause__
    finally:
        ops.torch.empty = real_empty
    assert hvd.allgather(torch.tensor([rank]), name="ag.after").tolist() == list(range(size))


def test_output_allocation_failure(pool2):
    pool2.run(_b_output_allocation_failure)


def _b_broadcast(rank, size):
    for root in range(size):
        for dt in FLOAT_DTYPES + INT_DTYPES + ["bool"]:
            x = _data(rank, dt) if dt != "bool" else torch.tensor([rank == 0, rank == 1])
            want = _data(root, dt) if dt != "bool" else torch.tensor([root == 0, root == 1])
            out = hvd.broadcast(x, root, name="bc.%d.%s" % (root, dt))
            assert torch.equal(out, want), (root, dt)
            if rank != root:
                assert not torch.equal(x, want), "broadcast (not in place) must leave the input alone"
        y = torch.full((5,), float(rank))
        assert hvd.broadcast_(y, root) is y and torch.equal(y, torch.full((5,), float(root)))
        h = hvd.broadcast_async(torch.tensor([rank]), root)
        assert hvd.synchronize(h).item() == root
        z = torch.tensor([rank])
        hvd.synchronize(hvd.broadcast_async_(z, root))
        assert z.item() == root


def test_broadcast(pool2):
    pool2.run(_b_broadcast)


# ---------------------------------------------------------------- alltoall / reducescatter
def _b_alltoall(rank, size):
    # equal split, no splits given: returns only the tensor
    x = torch.arange(size * 2, dtype=torch.float32) + 100 * rank
    out = hvd.alltoall(x)
    want = torch.cat([torch.arange(rank * 2, rank * 2 + 2, dtype=torch.float32) + 100 * r for r in range(size)])
    assert torch.equal(out, want), out
    # uneven splits: rank r sends r+1+dest rows to dest
    splits = [rank + 1 + d for d in range(size)]
    rows = sum(splits)
    x = torch.stack([torch.full((2,), 10.0 * rank + i) for i in range(rows)])
    out, recv = hvd.alltoall(x, splits=torch.tensor(splits, dtype=torch.int32), name="a2a.uneven")
    assert recv.dtype == torch.int32 and recv.tolist() == [s + 1 + rank for s in range(size)]
    parts = []
    for src in range(size):
        src_splits = [src + 1 + d for d in range(size)]
        start = sum(src_splits[:rank])
        parts += [torch.full((2,), 10.0 * src + i) for i in range(start, start + src_splits[rank])]
    assert torch.equal(out, torch.stack(parts))
    out2, recv2 = hvd.synchronize(hvd.alltoall_async(x, splits=splits))
    assert torch.equal(out2, out) and torch.equal(recv2, recv)


def test_alltoall(pool2):
    pool2.run(_b_alltoall)


def _b_reducescatter(rank, size):
    for rows in (size * 2, size * 2 + 1, 1):
        x = torch.arange(rows * 3, dtype=torch.float64).reshape(rows, 3) * (rank + 1)
        total = torch.arange(rows * 3, dtype=torch.float64).reshape(rows, 3) * sum(range(1, size + 1))
        base, extra = divmod(rows, size)
        start = rank * base + min(rank, extra)
        n = base + (1 if rank < extra else 0)
        out = hvd.reducescatter(x, op=hvd.Sum, name="rs.%d" % rows)
        assert torch.equal(out, total[start:start + n]), (rows, out)
        avg = hvd.reducescatter(x, name="rs.avg.%d" % rows)
        assert torch.allclose(avg, total[start:start + n] / size)
    h = hvd.reducescatter_async(torch.ones(size, 2), op=hvd.Sum)
    assert torch.equal(hvd.synchronize(h), torch.full((1, 2), float(size)))
    g = hvd.grouped_reducescatter([torch.ones(size, 2), torch.ones(size * 2)], op=hvd.Sum)
    assert torch.equal(g[0], torch.full((1, 2), float(size))) and torch.equal(g[1], torch.full((2,), float(size)))


def test_reducescatter(pool2):
    pool2.run(_b_reducescatter)


# ---------------------------------------------------------------- autograd
def _b_autograd(rank, size):
    x = torch.full((2, 3), float(rank + 1), requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Sum)
    (y * (rank + 1)).sum().backward()
    # d/dx_r of sum_k (k+1) * sum_j x_j = sum_k (k+1)
    assert torch.allclose(x.grad, torch.full((2, 3), float(sum(range(1, size + 1)))))

    x = torch.full((rank + 1, 2), 1.0, requires_grad=True)
    g = hvd.allgather(x)
    (g * torch.arange(g.shape[0], dtype=torch.float32).unsqueeze(1)).sum().backward()
    # averaged allreduce of the identical upstream gradient = its value; slice = this rank's rows
    offset = sum(r + 1 for r in range(rank))
    want = torch.arange(offset, offset + rank + 1, dtype=torch.float32).unsqueeze(1).expand(rank + 1, 2)
    assert torch.allclose(x.grad, want), x.grad

    x = torch.ones(3, requires_grad=True)
    hvd.broadcast(x, 0).sum().backward()
    assert torch.allclose(x.grad, torch.ones(3) * (1.0 if rank == 0 else 0.0))

    x = torch.arange(size * 2, dtype=torch.float32, requires_grad=True)
    out = hvd.alltoall(x)
    (out * (rank + 1)).sum().backward()
    # element sent to rank d is multiplied by (d+1) there
    assert torch.allclose(x.grad, torch.tensor([float(d + 1) for d in range(size) for _ in range(2)]))

    x = torch.ones(size * 2, 2, requires_grad=True)
    out = hvd.reducescatter(x, op=hvd.Sum)
    (out * (rank + 1)).sum().backward()
    # horovod.torch's rule for Sum: allgather of size x the output's gradient (test_torch_grads.py)
    assert torch.allclose(x.grad, size * torch.tensor([float(d + 1) for d in range(size) for _ in range(2)])
                          .unsqueeze(1).expand(size * 2, 2))

    a = torch.ones(2, requires_grad=True)
    b = torch.ones(3, requires_grad=True)
    ga, gb = hvd.grouped_allreduce([a, b], op=hvd.Sum)
    (ga.sum() + 2 * gb.sum()).backward()
    assert torch.allclose(a.grad, torch.full((2,), float(size))) and torch.allclose(b.grad, torch.full((3,), 2.0 * size))


def test_autograd(pool2):
    pool2.run(_b_autograd)


# ---------------------------------------------------------------- objects / barrier
def _b_objects(rank, size):
    obj = hvd.broadcast_object({"rank": rank, "list": list(range(rank + 3))}, root_rank=1)
    assert obj == {"rank": 1, "list": [0, 1, 2, 3]}
    got = hvd.allgather_object(("r", rank, "x" * (rank * 100)))
    assert got == [("r", r, "x" * (r * 100)) for r in range(size)]
    hvd.barrier()
    return [hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()]


def test_objects_barrier_identity(pool2):
    ids = pool2.run(_b_objects)
    assert ids == [[0, 2, 0, 2, 0, 1], [1, 2, 1, 2, 0, 1]]


# ---------------------------------------------------------------- numpy / generic DLPack
def _b_numpy(rank, size):
    import numpy as np
    import hora.numpy as hn
    x = np.arange(6, dtype=np.float32).reshape(2, 3) + rank
    out = hn.allreduce(x, op=hn.Sum)
    assert isinstance(out, np.ndarray) and np.array_equal(out, sum(np.arange(6, dtype=np.float32).reshape(2, 3) + r
                                                                      for r in range(size)))
    y = x.copy()
    hn.allreduce_(y, op=hn.Max)
    assert np.array_equal(y, np.arange(6, dtype=np.float32).reshape(2, 3) + size - 1)
    assert np.array_equal(hn.allgather(np.full((rank + 1,), rank, dtype=np.int16)),
                          np.concatenate([np.full((r + 1,), r, dtype=np.int16) for r in range(size)]))
    assert hn.allreduce(np.array([rank == 1, False]), op=hn.Max).tolist() == [True, False]
    assert np.array_equal(hn.broadcast(np.full(3, rank, dtype=np.int64), 1), np.full(3, 1))
    b = np.full(3, rank, dtype=np.int64)
    hn.broadcast_(b, 0)
    assert np.array_equal(b, np.zeros(3))
    out, recv = hn.alltoall(np.arange(size, dtype=np.float64) + 10 * rank, splits=[1] * size)
    assert out.tolist() == [10.0 * r + rank for r in range(size)] and recv.tolist() == [1] * size
    assert np.array_equal(hn.reducescatter(np.ones((size, 2)), op=hn.Sum), np.full((1, 2), float(size)))
    # any __dlpack__ producer: a torch tensor through the generic path
    t = torch.full((2,), float(rank))
    assert np.array_equal(hn.allreduce(t, op=hn.Sum), np.full(2, float(sum(range(size))), dtype=np.float32))
    g = hn.grouped_allreduce([np.ones(2), np.ones(3, dtype=np.int32)], op=hn.Sum)
    assert np.array_equal(g[0], np.full(2, float(size))) and g[1].dtype == np.int32


def test_numpy_and_generic_dlpack(pool2):
    pool2.run(_b_numpy)


# ---------------------------------------------------------------- errors
def _b_errors(rank, size):
    import hora
    # argument errors are raised at once, on the calling rank only, as ValueError
    try:
        hvd.allreduce(torch.ones(4, 4).t())
    except ValueError as e:
        assert "contiguous" in str(e)
    else:
        raise AssertionError("non-contiguous input accepted")
    try:
        hvd.broadcast_(torch.ones(2), root_rank=size + 3)
    except hora.HoraInvalidArgumentError as e:
        assert isinstance(e, ValueError) and "root" in str(e) and e.status == 1
    else:
        raise AssertionError("root outside the set accepted")
    try:
        hvd.allreduce(torch.ones(2, dtype=torch.complex64))
    except (ValueError, TypeError, RuntimeError) as e:
        assert "dtype" in str(e) or "complex" in str(e).lower() or "support" in str(e)
    else:
        raise AssertionError("complex dtype accepted")
    # a shape mismatch between ranks: the same error on every rank, job continues
    try:
        hvd.allreduce(torch.ones(2 + rank), name="mismatched")
    except hvd.HorovodInternalError as e:
        assert isinstance(e, hora.HoraMismatchError) and isinstance(e, RuntimeError), type(e)
        assert "mismatched" in str(e), str(e)
        msg = str(e)
    else:
        raise AssertionError("shape mismatch not reported")
    # duplicate name in flight: rank 0's first "dup" cannot complete before rank 1 submits it
    t = torch.ones(2)
    if rank == 0:
        h = hvd.allreduce_async(t, name="dup")
        try:
            hvd.allreduce_async(t, name="dup")
        except hora.HoraInvalidUsageError as e:
            assert "dup" in str(e)
        else:
            raise AssertionError("duplicate name in flight accepted")
        hvd.barrier()
    else:
        hvd.barrier()
        h = hvd.allreduce_async(t, name="dup")
    hvd.synchronize(h)
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(size)))
    return msg


def test_errors_and_mismatch(pool2):
    msgs = pool2.run(_b_errors)
    assert msgs[0] == msgs[1], "every rank must see the coordinator's same mismatch message"
