"""Tensor-parallel (and data-parallel) training of a tiny language model with
hora.torch.parallel, checked against the same model trained in one process.

    build/launcher/horarun -np 2 /usr/bin/python3 examples/tensor_parallel_train.py
    build/launcher/horarun -np 4 /usr/bin/python3 examples/tensor_parallel_train.py --tp 2   # + 2-way DP

The model: a vocab-parallel embedding, a Megatron MLP (ColumnParallelLinear
-> tanh -> RowParallelLinear, one allreduce each way) with a residual, and a
column-parallel LM head whose logits stay split along the vocabulary into
vocab_parallel_cross_entropy. The ranks of a TP group share every batch; DP
replicas (world size / tp of them) take equal slices of it, and
hvd.DistributedOptimizer averages their gradients over the grid's dp_group.

Every rank also trains the unsharded model on the whole batch (the
single-process reference, built from the same seed), and at the end each rank
compares its shards with the matching slices of the reference. The last line
rank 0 prints says whether all ranks matched; the exit code is 1 if not.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import hora.torch as hvd
from hora.torch import parallel


class TinyLM(nn.Module):
    """The single-process reference: embedding -> residual MLP -> LM head."""

    def __init__(self, vocab, dim, hidden):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids, target):
        h = self.emb(ids)
        h = h + self.fc2(torch.tanh(self.fc1(h)))
        return F.cross_entropy(self.head(h).flatten(0, -2), target.flatten())


class TensorParallelLM(nn.Module):
    """TinyLM with every weight sharded over ``group`` (a TP process set)."""

    def __init__(self, ref, group):
        super().__init__()
        self.group = group
        self.emb = parallel.VocabParallelEmbedding.from_full(ref.emb, group)
        self.fc1 = parallel.ColumnParallelLinear.from_full(ref.fc1, group, gather_output=False)
        self.fc2 = parallel.RowParallelLinear.from_full(ref.fc2, group, input_is_parallel=True)
        self.head = parallel.ColumnParallelLinear.from_full(ref.head, group, gather_output=False)

    def forward(self, ids, target):
        h = self.emb(ids)
        h = h + self.fc2(torch.tanh(self.fc1(h)))
        return parallel.vocab_parallel_cross_entropy(self.head(h), target, self.group).mean()


def batch(step, args):
    """The global batch of a step, identical on every rank: sequences whose next
    token follows a fixed rule, so the loss can fall."""
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, args.vocab, (args.batch_size, args.seq_len), generator=g)
    return ids, (3 * ids + 1) % args.vocab


def shards_match(model, ref, rtol=1e-4, atol=1e-5):
    """Each shard against the matching slice of the reference's weight."""
    pairs = [(model.emb.weight, ref.emb.weight[model.emb.shard_slice]),
             (model.fc1.weight, ref.fc1.weight[model.fc1.shard_slice]),
             (model.fc1.bias, ref.fc1.bias[model.fc1.shard_slice]),
             (model.fc2.weight, ref.fc2.weight[:, model.fc2.shard_slice]),
             (model.fc2.bias, ref.fc2.bias),
             (model.head.weight, ref.head.weight[model.head.shard_slice])]
    return all(torch.allclose(a.detach(), b.detach(), rtol=rtol, atol=atol) for a, b in pairs)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel size (default: every rank)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=8, help="global batch, split over the DP replicas")
    p.add_argument("--seq-len", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.5)
    args = p.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    grid = parallel.grid(tp=args.tp or hvd.size())
    if args.batch_size % grid.dp_size:
        raise SystemExit("--batch-size %d does not split over %d DP replicas" % (args.batch_size, grid.dp_size))

    torch.manual_seed(0)  # the same reference on every rank
    ref = TinyLM(args.vocab, args.dim, args.hidden)
    model = TensorParallelLM(ref, grid.tp_group)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=args.lr)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    if grid.dp_size > 1:  # average the DP replicas' gradients of each shard
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), process_set=grid.dp_group)

    per = args.batch_size // grid.dp_size
    mine = slice(grid.dp_rank * per, (grid.dp_rank + 1) * per)
    for step in range(args.steps):
        ids, target = batch(step, args)
        opt.zero_grad()
        loss = model(ids[mine], target[mine])
        loss.backward()
        opt.step()
        opt_ref.zero_grad()
        ref_loss = ref(ids, target)
        ref_loss.backward()
        opt_ref.step()
        avg = hvd.allreduce(loss.detach(), op=hvd.Average, name="loss")  # over every rank: the DP mean
        if hvd.rank() == 0 and (step % 10 == 0 or step == args.steps - 1):
            print("step %3d  loss %.4f  (single-process reference %.4f)" % (step, avg.item(), ref_loss.item()),
                  flush=True)

    ok = shards_match(model, ref)
    agree = hvd.allreduce(torch.tensor(int(ok)), op=hvd.Min, name="agree").item()
    if hvd.rank() == 0:
        print("grid: world %d = tp %d x dp %d" % (hvd.size(), grid.tp_size, grid.dp_size))
        print("tensor-parallel training matches the single-process reference: %s" % bool(agree), flush=True)
    grid.destroy()
    hvd.shutdown()
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
