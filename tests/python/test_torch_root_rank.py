"""root_rank in hora.torch is a GLOBAL rank, also with process_set= (as in
horovod.torch); a root outside the set is refused with a ValueError naming
the set and its members. Run on 3 ranks with the set {1, 2}, whose set ranks
(0, 1) differ from the global ones, so reading the root as a set rank shows."""
import torch

import hora.torch as hvd


def _expect_value_error(fn, *words):
    try:
        fn()
    except ValueError as e:
        for w in words:
            assert w in str(e), "%r not in %r" % (w, str(e))
        return
    raise AssertionError("expected a ValueError naming %s" % (words,))


def _b_root_is_global(rank, size):
    members = [1, 2]
    ps = hvd.add_process_set(members)
    try:
        if rank in members:
            for root in members:
                mine = torch.full((3,), float(rank * 10))
                want = torch.full((3,), float(root * 10))
                assert torch.equal(hvd.broadcast(mine, root, process_set=ps), want), root
                t = mine.clone()
                assert torch.equal(hvd.broadcast_(t, root, process_set=ps), want)
                assert torch.equal(hvd.synchronize(hvd.broadcast_async(mine, root, process_set=ps)), want)
                t = mine.clone()
                hvd.synchronize(hvd.broadcast_async_(t, root, process_set=ps))
                assert torch.equal(t, want)
                assert hvd.broadcast_object({"from": rank}, root_rank=root, process_set=ps) == {"from": root}
                # broadcast_parameters: state_dict, named_parameters and a list
                model = torch.nn.Linear(2, 2)
                with torch.no_grad():
                    model.weight.fill_(rank)
                    model.bias.fill_(-rank)
                hvd.broadcast_parameters(model.state_dict(), root_rank=root, process_set=ps)
                assert torch.all(model.weight == root) and torch.all(model.bias == -root)
                with torch.no_grad():
                    model.weight.fill_(rank)
                hvd.broadcast_parameters(list(model.named_parameters()), root_rank=root, process_set=ps)
                assert torch.all(model.weight == root)
                # broadcast_optimizer_state: lr and momentum buffers from the root
                w = torch.nn.Parameter(torch.zeros(2))
                opt = torch.optim.SGD([w], lr=0.1 * (rank + 1), momentum=0.9)
                w.grad = torch.full((2,), float(rank + 1))
                opt.step()
                hvd.broadcast_optimizer_state(opt, root_rank=root, process_set=ps)
                assert abs(opt.param_groups[0]["lr"] - 0.1 * (root + 1)) < 1e-12
                assert torch.equal(opt.state[w]["momentum_buffer"], torch.full((2,), float(root + 1)))
                # gradient flows back to the (global) root only
                x = torch.ones(2, requires_grad=True)
                hvd.broadcast(x, root, process_set=ps).sum().backward()
                assert torch.equal(x.grad, torch.ones(2) * (1.0 if rank == root else 0.0)), (root, x.grad)
            # rank 0 is not a member: refused on every member, before anything is sent
            for fn in (lambda: hvd.broadcast(torch.ones(1), 0, process_set=ps),
                       lambda: hvd.broadcast_(torch.ones(1), 0, process_set=ps),
                       lambda: hvd.broadcast_async(torch.ones(1), 0, process_set=ps),
                       lambda: hvd.broadcast_async_(torch.ones(1), 0, process_set=ps),
                       lambda: hvd.broadcast_object(1, root_rank=0, process_set=ps),
                       lambda: hvd.broadcast_parameters([torch.ones(1)], root_rank=0, process_set=ps),
                       lambda: hvd.broadcast_optimizer_state(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))],
                                                                             lr=1.0), root_rank=0, process_set=ps)):
                _expect_value_error(fn, "root_rank 0", "not a member", "[1, 2]", "global rank")
            # the set still works after the refusals
            assert hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=ps).item() == 2.0
    finally:
        hvd.remove_process_set(ps)
    # the global set: root_rank unchanged
    assert hvd.broadcast(torch.tensor([rank]), size - 1).item() == size - 1
    assert hvd.broadcast_object(rank, root_rank=size - 1) == size - 1
    hvd.barrier()


def test_root_rank_is_global_in_process_sets(pool3):
    pool3.run(_b_root_is_global, timeout=120)


def _b_root_set_size_one(rank, size):
    """The issue's report: a one-member set {1} with root_rank=1 ("root 1 is outside the process set")."""
    ps = hvd.add_process_set([1])
    try:
        if rank == 1:
            assert hvd.broadcast(torch.tensor([7.0]), 1, process_set=ps).item() == 7.0
            assert hvd.broadcast_object("x", root_rank=1, process_set=ps) == "x"
    finally:
        hvd.remove_process_set(ps)
    hvd.barrier()


def test_root_rank_single_member_set(pool2):
    pool2.run(_b_root_set_size_one)
