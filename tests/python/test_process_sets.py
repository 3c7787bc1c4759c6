"""Process sets on 3 ranks: a set {0, 2} runs its own collectives (ranks within
the set; broadcast roots are global ranks, as in horovod.torch) while the
global set keeps working; a non-member is refused; sets are removed again."""
import torch

import hora.torch as hvd


def _b_process_sets(rank, size):
    ps = hvd.add_process_set([0, 2])
    assert ps.included() == (rank in (0, 2)) and ps.size() == 2
    assert ps.rank() == {0: 0, 1: -1, 2: 1}[rank]
    if ps.included():
        s = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum, process_set=ps)
        assert s.item() == 2.0
        g = hvd.allgather(torch.tensor([rank]), process_set=ps)
        assert g.tolist() == [0, 2]
        b = hvd.broadcast(torch.tensor([rank]), root_rank=2, process_set=ps)  # global rank 2 = set rank 1
        assert b.item() == 2
        out, recv = hvd.alltoall(torch.tensor([rank, rank]), splits=[1, 1], process_set=ps)
        assert out.tolist() == [0, 2]
        rs = hvd.reducescatter(torch.ones(2, 2), op=hvd.Sum, process_set=ps)
        assert rs.tolist() == [[2.0, 2.0]]
        assert hvd.broadcast_object(rank, root_rank=2, process_set=ps) == 2
        assert hvd.allgather_object(rank, process_set=ps) == [0, 2]
        hvd.barrier(process_set=ps)
        # a DistributedOptimizer over the set averages over its members only
        w = torch.nn.Parameter(torch.zeros(2))
        opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), named_parameters=[("w", w)], process_set=ps)
        (w * (rank + 1)).sum().backward()
        opt.step()
        assert torch.allclose(w.detach(), torch.full((2,), -(1 + 3) / 2.0)), w
    else:
        try:
            hvd.allreduce(torch.ones(1), process_set=ps)
        except ValueError as e:
            assert "not a member" in str(e)
        else:
            raise AssertionError("a non-member used the set")
    # the global set at the same time
    assert hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item() == size
    hvd.remove_process_set(ps)
    assert ps.process_set_id is None
    # grouped ops in a second set
    ps2 = hvd.add_process_set(hvd.ProcessSet([1, 2]))
    if ps2.included():
        out = hvd.grouped_allreduce([torch.ones(2), torch.ones(3)], op=hvd.Sum, process_set=ps2)
        assert [t.tolist() for t in out] == [[2.0, 2.0], [2.0, 2.0, 2.0]]
    hvd.remove_process_set(ps2)
    hvd.barrier()


def test_process_sets(pool3):
    pool3.run(_b_process_sets)


def _b_three_rank_basics(rank, size):
    # odd world size: uneven reducescatter and averages
    x = torch.arange(8, dtype=torch.float64).reshape(4, 2) * (rank + 1)
    out = hvd.reducescatter(x, op=hvd.Sum)
    rows = {0: (0, 2), 1: (2, 3), 2: (3, 4)}[rank]
    assert torch.equal(out, (torch.arange(8, dtype=torch.float64).reshape(4, 2) * 6)[rows[0]:rows[1]])
    avg = hvd.allreduce(torch.tensor([float(rank)]))
    assert avg.item() == 1.0
    return hvd.allgather_object(rank)


def test_three_ranks(pool3):
    assert pool3.run(_b_three_rank_basics) == [[0, 1, 2]] * 3
