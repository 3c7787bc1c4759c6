"""Gradients of every differentiable hora.torch collective against the expected
value, computed here on every rank from every rank's upstream gradient.

The expectations are horovod.torch's backward rules (hora is a drop-in):
  allreduce / grouped_allreduce   grad_j = allreduce(G, same op, pre, post)
                                         = pre*post*sum_r G_r (/ n for Average)
  allgather / grouped_allgather   grad_j = (1/n) sum_r G_r, rows of rank j
  broadcast(root)                 grad_j = (1/n) sum_r G_r on the root, 0 elsewhere
  alltoall                        grad_j's block for rank d = G_d's block from j
  reducescatter / grouped         grad_j = pre*post*concat_r G_r (* n for Sum)
where G_r is the upstream gradient on rank r of the set and n the set size.
Allreduce and alltoall are the derivative of the sum of the ranks' losses;
allgather and broadcast that of their mean; reduce-scatter is Horovod's own
convention (n times the derivative of the sum of losses for Sum), kept so that
Horovod scripts and tests get the same numbers.

Upstream gradients differ between ranks and between elements, so a rule that
is off by a factor, a rank or a slice shows. Each body runs at world sizes 2
and 3, over the global set and over a process set whose set ranks differ from
the global ones.
"""
import torch

import hora.torch as hvd

SCALES = [(1.0, 1.0), (0.5, 3.0)]
OPS = [("sum", hvd.Sum), ("average", hvd.Average)]


def _set(rank, size, kind):
    """(process_set, members as global ranks); members None when rank is outside."""
    if kind == "global":
        return hvd.global_process_set, list(range(size))
    # the last ranks, so that set ranks differ from global ones (size 2: {1}; 3: {1, 2})
    members = list(range(1, size))
    ps = hvd.add_process_set(members)
    return ps, members


def _upstream(i, shape):
    """Upstream gradient of set rank i: distinct per element and per rank."""
    n = 1
    for d in shape:
        n *= d
    return ((torch.arange(n, dtype=torch.float64) % 5 + 1) + 10 * (i + 1)).reshape(shape)


def _input(i, shape):
    n = 1
    for d in shape:
        n *= d
    return (torch.arange(n, dtype=torch.float64) * 0.25 + i).reshape(shape).requires_grad_()


def _close(got, want, what):
    assert got is not None, "%s: no gradient" % what
    assert got.shape == want.shape, "%s: gradient shape %s, expected %s" % (what, tuple(got.shape), tuple(want.shape))
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12), "%s: gradient\n%s\nexpected\n%s" % (what, got, want)


def _rs_rows(dim0, n):
    """Rows per set rank of a reduce-scatter of dim0 rows (the first dim0 % n ranks get one more)."""
    return [dim0 // n + (1 if i < dim0 % n else 0) for i in range(n)]


def _b_grads(rank, size, kind):
    ps, members = _set(rank, size, kind)
    try:
        if rank in members:
            _check_all(rank, ps, members)
    finally:
        if kind != "global":
            hvd.remove_process_set(ps)
    hvd.barrier()


def _check_all(rank, ps, members):
    n, me = len(members), members.index(rank)
    G = _upstream
    # ---- allreduce and grouped_allreduce
    for op_name, op in OPS:
        for pre, post in SCALES:
            what = "allreduce %s pre=%s post=%s" % (op_name, pre, post)
            div = n if op == hvd.Average else 1
            x = _input(me, (2, 3))
            y = hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post, process_set=ps)
            assert y.grad_fn is not None, what
            y.backward(G(me, (2, 3)))
            _close(x.grad, pre * post * sum(G(i, (2, 3)) for i in range(n)) / div, what)

            what = "grouped_allreduce %s pre=%s post=%s" % (op_name, pre, post)
            a, b = _input(me, (3,)), _input(me, (2, 2))
            ya, yb = hvd.grouped_allreduce([a, b], op=op, prescale_factor=pre, postscale_factor=post,
                                           process_set=ps)
            torch.autograd.backward([ya, yb], [G(me, (3,)), 2 * G(me, (2, 2))])
            _close(a.grad, pre * post * sum(G(i, (3,)) for i in range(n)) / div, what + " [0]")
            _close(b.grad, pre * post * sum(2 * G(i, (2, 2)) for i in range(n)) / div, what + " [1]")

    # ---- allgather (uneven first dims) and grouped_allgather
    rows = [i + 1 for i in range(n)]
    total = sum(rows)
    off = sum(rows[:me])
    x = _input(me, (rows[me], 2))
    y = hvd.allgather(x, process_set=ps)
    assert y.shape == (total, 2)
    y.backward(G(me, (total, 2)))
    _close(x.grad, (sum(G(i, (total, 2)) for i in range(n)) / n)[off:off + rows[me]], "allgather")

    a, b = _input(me, (rows[me], 2)), _input(me, (2 * rows[me],))
    ya, yb = hvd.grouped_allgather([a, b], process_set=ps)
    assert ya.grad_fn is not None and yb.grad_fn is not None, "grouped_allgather outputs need a grad_fn"
    assert ya.shape == (total, 2) and yb.shape == (2 * total,)
    torch.autograd.backward([ya, yb], [G(me, (total, 2)), G(me, (2 * total,))])
    _close(a.grad, (sum(G(i, (total, 2)) for i in range(n)) / n)[off:off + rows[me]], "grouped_allgather [0]")
    _close(b.grad, (sum(G(i, (2 * total,)) for i in range(n)) / n)[2 * off:2 * (off + rows[me])],
           "grouped_allgather [1]")

    # ---- broadcast: root_rank is a global rank
    for root in members:
        x = _input(me, (4,))
        y = hvd.broadcast(x, root, process_set=ps)
        _close(y.detach(), _input(members.index(root), (4,)).detach(), "broadcast value from %d" % root)
        y.backward(G(me, (4,)))
        want = sum(G(i, (4,)) for i in range(n)) / n if rank == root else torch.zeros(4, dtype=torch.float64)
        _close(x.grad, want, "broadcast root %d" % root)

    # ---- alltoall: uneven splits; rank i sends i+d+1 rows to rank d
    splits = [me + d + 1 for d in range(n)]
    x = _input(me, (sum(splits), 2))
    y, received = hvd.alltoall(x, splits=splits, process_set=ps)
    assert received.tolist() == [i + me + 1 for i in range(n)]
    y.backward(G(me, tuple(y.shape)))
    parts = []
    for d in range(n):  # the rows this rank sent to d come back from d's gradient
        recv_d = [i + d + 1 for i in range(n)]
        g_d = G(d, (sum(recv_d), 2))
        start = sum(recv_d[:me])
        parts.append(g_d[start:start + recv_d[me]])
    _close(x.grad, torch.cat(parts), "alltoall")
    x = _input(me, (2 * n,))  # equal split, no splits argument
    y = hvd.alltoall(x, process_set=ps)
    y.backward(G(me, (2 * n,)))
    _close(x.grad, torch.cat([G(d, (2 * n,))[2 * me:2 * me + 2] for d in range(n)]), "alltoall equal split")

    # ---- reducescatter and grouped_reducescatter (uneven rows)
    for op_name, op in OPS:
        for pre, post in SCALES:
            factor = pre * post * (n if op == hvd.Sum else 1)
            what = "reducescatter %s pre=%s post=%s" % (op_name, pre, post)
            dim0 = 2 * n + 1
            rr = _rs_rows(dim0, n)
            x = _input(me, (dim0, 2))
            y = hvd.reducescatter(x, op=op, prescale_factor=pre, postscale_factor=post, process_set=ps)
            assert y.shape == (rr[me], 2), (what, y.shape)
            assert y.grad_fn is not None, what
            y.backward(G(me, (rr[me], 2)))
            _close(x.grad, factor * torch.cat([G(i, (rr[i], 2)) for i in range(n)]), what)

            what = "grouped_reducescatter %s pre=%s post=%s" % (op_name, pre, post)
            rb = _rs_rows(n + 1, n)
            a, b = _input(me, (dim0, 2)), _input(me, (n + 1,))
            ya, yb = hvd.grouped_reducescatter([a, b], op=op, prescale_factor=pre, postscale_factor=post,
                                               process_set=ps)
            assert ya.grad_fn is not None and yb.grad_fn is not None, what + ": outputs need a grad_fn"
            torch.autograd.backward([ya, yb], [G(me, (rr[me], 2)), G(me, (rb[me],))])
            _close(a.grad, factor * torch.cat([G(i, (rr[i], 2)) for i in range(n)]), what + " [0]")
            _close(b.grad, factor * torch.cat([G(i, (rb[i],)) for i in range(n)]), what + " [1]")


def test_grads_global_2(pool2):
    pool2.run(_b_grads, "global", timeout=120)


def test_grads_global_3(pool3):
    pool3.run(_b_grads, "global", timeout=120)


def test_grads_process_set_2(pool2):
    pool2.run(_b_grads, "set", timeout=120)


def test_grads_process_set_3(pool3):
    pool3.run(_b_grads, "set", timeout=120)


def _b_horovod_reducescatter_grad(rank, size):
    """horovod's own test (test_horovod_reducescatter_grad[_average]): ones
    upstream gives size x ones for Sum, ones for Average."""
    for op, want in ((hvd.Sum, float(size)), (hvd.Average, 1.0)):
        for dtype in (torch.float32, torch.float64):
            x = torch.rand(size * 4, size * 4, dtype=dtype).requires_grad_()
            hvd.reducescatter(x, op=op).backward(torch.ones(4, size * 4, dtype=dtype))
            assert torch.equal(x.grad, torch.full_like(x, want)), (op, dtype, x.grad)


def test_horovod_reducescatter_grad(pool2):
    pool2.run(_b_horovod_reducescatter_grad)


def _b_positional_reducescatter(rank, size):
    """horovod.torch's argument order: (tensor, name, compression, op, process_set, prescale, postscale)."""
    x = torch.ones(size, 2)
    out = hvd.reducescatter(x, "rs.pos", hvd.Compression.none, hvd.Sum, hvd.global_process_set, 2.0, 3.0)
    assert torch.equal(out, torch.full((1, 2), 6.0 * size)), out
    out = hvd.synchronize(hvd.reducescatter_async(x, "rs.pos.async", hvd.Sum, hvd.global_process_set, 2.0))
    assert torch.equal(out, torch.full((1, 2), 2.0 * size)), out


def test_reducescatter_horovod_argument_order(pool2):
    pool2.run(_b_positional_reducescatter)
