"""broadcast_parameters / broadcast_optimizer_state with parameters that have no
gradient or do not require one, and sparse gradients (nn.Embedding(sparse=True))
through DistributedOptimizer, checked against a single-process reference."""
import torch
import torch.nn as nn

import hora.torch as hvd


# ---------------------------------------------------------------- no gradient
class _ModelNoGrad(nn.Module):
    """horovod's test_broadcast_state_no_grad model: an int parameter without a gradient."""

    def __init__(self, a, b):
        super().__init__()
        self.a = nn.Parameter(a.int(), requires_grad=False)
        self.b = nn.Parameter(b)

    def forward(self, x):
        return torch.index_select(self.b, 0, self.a.long()) * x


def _b_state_no_grad(rank, size):
    torch.manual_seed(rank)
    model = _ModelNoGrad(torch.tensor([1.0, 3.0]), torch.rand(4))
    opt = torch.optim.SGD(model.parameters(), lr=0.001, weight_decay=1e-6, momentum=0.9, nesterov=True)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    b_root = hvd.broadcast(model.b.detach(), 0)
    assert torch.equal(model.b.detach(), b_root)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    # as in Horovod: the parameter without requires_grad keeps grad None, the
    # other one is left a zero gradient that can be broadcast
    assert opt.param_groups[0]["params"][0].grad is None
    grad = opt.param_groups[0]["params"][1].grad
    assert grad is not None and torch.equal(grad, torch.zeros(4))
    assert torch.equal(hvd.broadcast(grad, root_rank=0), grad)
    # the zero-gradient step did not move the parameters (weight decay)
    assert torch.equal(model.b.detach(), b_root)
    # training works afterwards
    for _ in range(2):
        opt.zero_grad()
        model(torch.ones(2)).sum().backward()
        opt.step()
    assert torch.equal(model.b.detach(), hvd.broadcast(model.b.detach(), 0)), "replicas diverged"


def test_broadcast_state_no_grad(pool2):
    pool2.run(_b_state_no_grad)


class _Partial(nn.Module):
    """A frozen layer, an unused layer and a used one; optional buffers set to None."""

    def __init__(self):
        super().__init__()
        self.frozen = nn.Linear(3, 3)
        self.frozen.requires_grad_(False)
        self.unused = nn.Linear(3, 3)
        self.used = nn.Linear(3, 1)
        self.register_buffer("maybe", None)

    def forward(self, x):
        return self.used(self.frozen(x))


def _b_state_partial(rank, size):
    torch.manual_seed(100 + rank)
    for opt_cls, kw in ((torch.optim.Adam, dict(lr=0.01)), (torch.optim.SGD, dict(lr=0.1, momentum=0.5)),
                        (torch.optim.SGD, dict(lr=0.1))):
        model = _Partial()  # a fresh one: an optimizer's hooks stay on its model's parameters
        opt = hvd.DistributedOptimizer(opt_cls(model.parameters(), **kw), named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_parameters(dict(model.named_parameters()), root_rank=0)
        model.used.weight.grad = torch.full_like(model.used.weight, float(rank))  # an existing gradient is kept
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        assert torch.equal(model.used.weight.grad, torch.full_like(model.used.weight, float(rank)))
        assert model.frozen.weight.grad is None
        for _ in range(2):
            opt.zero_grad()
            model(torch.rand(4, 3) + rank).sum().backward()
            opt.step()
        # broadcast the state of a trained optimizer, then everything agrees with the root
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        for p in model.parameters():
            assert torch.equal(p.detach(), hvd.broadcast(p.detach(), 0)), "parameters diverged"
        for st in opt.state.values():
            for k, v in st.items():
                if torch.is_tensor(v):
                    assert torch.equal(v, hvd.broadcast(v, 0)), k


def test_broadcast_state_partial_grads(pool2):
    pool2.run(_b_state_partial)


# ---------------------------------------------------------------- sparse
def _inputs(r):
    """Embedding indices of rank r (different lengths and overlapping rows)."""
    g = torch.Generator().manual_seed(1000 + r)
    return torch.randint(0, 10, (2, 3 + r), generator=g)


class _Emb(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.embedding = nn.Embedding(10, 3, sparse=True)

    def forward(self, x):
        return self.embedding(x)


def _loss(model, inp, step):
    return (model(inp) * (step + 1)).pow(2).sum()


def _b_sparse(rank, size, opt_name, sparse_as_dense, op_name):
    op = {"average": hvd.Average, "sum": hvd.Sum}[op_name]
    make = {"sparse_adam": lambda ps: torch.optim.SparseAdam(list(ps), lr=0.1),
            "sgd": lambda ps: torch.optim.SGD(list(ps), lr=0.05)}[opt_name]
    model, ref = _Emb(), _Emb()
    opt = hvd.DistributedOptimizer(make(model.parameters()), named_parameters=model.named_parameters(),
                                   sparse_as_dense=sparse_as_dense, op=op)
    ref_opt = make(ref.parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0, model=model)
    assert model.embedding.weight.grad is None or not model.embedding.weight.grad.is_sparse
    # the state was made by one step on an empty gradient (as in Horovod: for
    # SparseAdam its step count is 1); the reference does the same
    ref.embedding.weight.grad = torch.zeros(10, 3).to_sparse()
    ref_opt.step()
    ref.embedding.weight.grad = None
    assert torch.equal(model.embedding.weight, ref.embedding.weight)
    for step in range(3):
        opt.zero_grad()
        _loss(model, _inputs(rank), step).backward()
        assert model.embedding.weight.grad.is_sparse
        opt.step()
        assert model.embedding.weight.grad.is_sparse, "the reduced gradient must stay sparse"
        # reference: one process, the ranks' losses summed (Sum) or averaged (Average)
        ref_opt.zero_grad()
        total = sum(_loss(ref, _inputs(r), step) for r in range(size))
        (total / size if op == hvd.Average else total).backward()
        ref_opt.step()
        assert torch.allclose(model.embedding.weight, ref.embedding.weight, rtol=1e-5, atol=1e-6), \
            "step %d: %s\n%s" % (step, model.embedding.weight, ref.embedding.weight)


def test_sparse_adam_allgather(pool2):
    pool2.run(_b_sparse, "sparse_adam", False, "average")


def test_sparse_adam_as_dense(pool2):
    pool2.run(_b_sparse, "sparse_adam", True, "average")


def test_sparse_sgd_sum_3(pool3):
    pool3.run(_b_sparse, "sgd", False, "sum")
    pool3.run(_b_sparse, "sgd", True, "sum")


def test_sparse_adam_3(pool3):
    pool3.run(_b_sparse, "sparse_adam", False, "average")


def _b_sparse_unused_on_one_rank(rank, size):
    """A sparse embedding that rank 0 never uses: with SparseAdam its missing
    gradient is submitted as an empty sparse one, so the ranks agree."""
    model, ref = _Emb(), _Emb()
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(model.parameters()), lr=0.1),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SparseAdam(list(ref.parameters()), lr=0.1)
    for step in range(2):
        opt.zero_grad(set_to_none=True)
        if rank != 0:
            _loss(model, _inputs(rank), step).backward()
        opt.step()
        ref_opt.zero_grad(set_to_none=True)
        (sum(_loss(ref, _inputs(r), step) for r in range(1, size)) / size).backward()
        ref_opt.step()
        assert torch.allclose(model.embedding.weight, ref.embedding.weight, rtol=1e-5, atol=1e-6), step


def test_sparse_unused_on_one_rank(pool2):
    pool2.run(_b_sparse_unused_on_one_rank)


def _b_sparse_allreduce_async(rank, size):
    """horovod's test_async_sparse_allreduce: allgather of indices and values
    equals the dense allreduce, Average and Sum, named and unnamed, empty included."""
    g = torch.Generator().manual_seed(rank)
    tensors = []
    for d0 in (17, 32, 5):
        t = torch.rand(d0, 10, generator=g)
        t[t < 0.8] = 0
        tensors.append(t.to_sparse())
    tensors.append(torch.zeros(4, 3).to_sparse())
    for op in (hvd.Average, hvd.Sum):
        dense = [hvd.allreduce(t.to_dense(), op=op) for t in tensors]
        handles = [hvd.sparse_allreduce_async(t, name=None if i % 2 else "sp.%d.%s" % (i, op), op=op)
                   for i, t in enumerate(tensors)]
        for want, h in zip(dense, handles):
            got = h()
            assert got.is_sparse and got.shape == want.shape
            assert torch.allclose(got.to_dense(), want, atol=1e-6)


def test_sparse_allreduce_async(pool2):
    pool2.run(_b_sparse_allreduce_async)
