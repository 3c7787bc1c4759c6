"""Context parallelism with hora.torch.parallel: a causal self-attention block
trained on a sequence split across the ranks, checked against the same block
trained in one process on the whole sequence.

    build/launcher/horarun -np 2 /usr/bin/python3 examples/context_parallel_attention.py
    build/launcher/horarun -np 4 /usr/bin/python3 examples/context_parallel_attention.py --seq-per-rank 8

Rank r holds positions [r*s, (r+1)*s) of every sequence (s = --seq-per-rank).
ContextParallelSelfAttention gathers the keys and values of all ranks, attends
its own queries with the causal mask in global positions, and backward sends
each rank the summed gradient of its own keys and values. The projection
weights are replicated and each rank saw only its tokens, so their gradients
are summed over the CP group (one grouped allreduce) before the step.

Every rank also trains the reference (an ordinary attention over the whole
sequence, same initial weights), and compares the first step's output chunk
and the final weights. The last line rank 0 prints says whether all ranks
matched; the exit code is 1 if not.
"""
import argparse
import copy
import math

import torch

import hora.torch as hvd
from hora.torch import parallel


def reference_forward(block, x):
    """The block on the whole sequence in one process: plain causal attention."""
    b, n, e = x.shape
    h, d = block.num_heads, block.head_dim
    q, k, v = (proj(x).view(b, n, h, d).transpose(1, 2) for proj in (block.q_proj, block.k_proj, block.v_proj))
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v
    return block.out_proj(out.transpose(1, 2).reshape(b, n, e))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq-per-rank", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--embed", type=int, default=32)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.5)
    args = p.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    grid = parallel.grid(cp=hvd.size())
    s, n = args.seq_per_rank, args.seq_per_rank * grid.cp_size
    mine = slice(grid.cp_rank * s, (grid.cp_rank + 1) * s)

    torch.manual_seed(0)  # identical weights and data on every rank
    block = parallel.ContextParallelSelfAttention(args.embed, args.heads, group=grid.cp_group, causal=True)
    ref = copy.deepcopy(block)
    opt = torch.optim.SGD(block.parameters(), lr=args.lr)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=args.lr)
    x = torch.randn(args.batch_size, n, args.embed)
    # target: a causal running mean of the input (what causal attention can learn)
    y = x.cumsum(1) / torch.arange(1, n + 1).view(1, n, 1)
    numel = y.numel()

    ok = True
    for step in range(args.steps):
        opt.zero_grad()
        out = block(x[:, mine])  # this rank's chunk only
        loss = ((out - y[:, mine]) ** 2).sum() / numel  # this rank's share of the mean
        loss.backward()
        grads = hvd.grouped_allreduce([q.grad for q in block.parameters()], op=hvd.Sum,
                                      process_set=grid.cp_group, name="grads")
        for q, g in zip(block.parameters(), grads):
            q.grad.copy_(g)
        opt.step()

        opt_ref.zero_grad()
        out_ref = reference_forward(ref, x)
        loss_ref = ((out_ref - y) ** 2).mean()
        loss_ref.backward()
        opt_ref.step()
        if step == 0:
            ok &= torch.allclose(out, out_ref[:, mine], rtol=1e-4, atol=1e-5)
        total = hvd.allreduce(loss.detach(), op=hvd.Sum, process_set=grid.cp_group, name="loss")
        if hvd.rank() == 0 and (step % 5 == 0 or step == args.steps - 1):
            print("step %3d  loss %.5f  (single-process reference %.5f)" % (step, total.item(), loss_ref.item()),
                  flush=True)

    ok &= all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(block.parameters(), ref.parameters()))
    agree = hvd.allreduce(torch.tensor(int(ok)), op=hvd.Min, name="agree").item()
    if hvd.rank() == 0:
        print("sequence of %d positions over %d ranks, %d each" % (n, grid.cp_size, s))
        print("context-parallel attention matches the single-process reference: %s" % bool(agree), flush=True)
    grid.destroy()
    hvd.shutdown()
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
