"""Parameter sharding (ZeRO stage 3, FSDP style) with hora.torch: a small
transformer trained with ``hvd.FullyShardedModule`` next to the same model
trained with ``hvd.DistributedOptimizer`` on the same data per rank.

    horarun -np 2 /usr/bin/python3 examples/fsdp_train.py
    horarun -np 4 /usr/bin/python3 examples/fsdp_train.py --hybrid 2      # shard in pairs, replicate across
    horarun -np 2 /usr/bin/python3 examples/fsdp_train.py --bf16          # gather and compute in bfloat16

Every rank keeps only its shard of every parameter (about 1/N of the
model); a unit's parameters are allgathered just before its forward and
again in backward, and dropped after. Each rank prints the bytes of its
shards against the whole model's, and the most bytes of gathered
parameters it held at once against the largest unit's; the last line says
whether the parameters match the DistributedOptimizer run's (to 1e-4
absolute, see below; with --bf16 to 3e-2).
"""
import argparse

import torch
import torch.nn as nn

import hora.torch as hvd


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab, dim, heads, layers, seq):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        pos = torch.arange(tokens.shape[1])
        x = self.blocks(self.embed(tokens) + self.pos(pos))
        return self.head(self.norm(x))


def build(args):
    torch.manual_seed(0)
    return TinyLM(args.vocab, args.dim, args.heads, args.layers, args.seq)


def batch(step, rank, args):
    g = torch.Generator().manual_seed(1000 * rank + step)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def train(model, opt, args):
    loss = None
    for step in range(args.steps):
        x, y = batch(step, hvd.rank(), args)
        opt.zero_grad()
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.float().reshape(-1, args.vocab), y.reshape(-1))
        loss.backward()
        if isinstance(model, hvd.FullyShardedModule) and args.clip:
            model.clip_grad_norm_(args.clip)
        elif args.clip:
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            with opt.skip_synchronize():
                opt.step()
            continue
        opt.step()
    return loss.item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=4, help="sequences per rank and step")
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--clip", type=float, default=0.0, help="clip gradients to this global norm (0: no)")
    ap.add_argument("--hybrid", type=int, default=0,
                    help="shard within groups of this many consecutive ranks, replicate across groups")
    ap.add_argument("--bf16", action="store_true", help="gather and compute in bfloat16 (fp32 shards)")
    args = ap.parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()

    shard_set, replicate_set, sets = hvd.global_process_set, None, []
    if args.hybrid:
        if size % args.hybrid:
            raise SystemExit("fsdp_train.py: --hybrid %d does not divide the world size %d" % (args.hybrid, size))
        groups = [list(range(g, g + args.hybrid)) for g in range(0, size, args.hybrid)]
        across = [list(range(i, size, args.hybrid)) for i in range(args.hybrid)]
        sets = [hvd.add_process_set(r) for r in groups + across]  # every rank creates every set, in one order
        shard_set = sets[rank // args.hybrid]
        replicate_set = sets[len(groups) + rank % args.hybrid]

    ref = build(args)
    ref_opt = hvd.DistributedOptimizer(torch.optim.AdamW(ref.parameters(), lr=args.lr),
                                       named_parameters=ref.named_parameters())
    ref_loss = train(ref, ref_opt, args)

    model = hvd.FullyShardedModule(build(args), process_set=shard_set, replicate_process_set=replicate_set,
                                   param_dtype=torch.bfloat16 if args.bf16 else None,
                                   reduce_dtype=torch.float32 if args.bf16 else None)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)  # a plain torch optimizer over the shards
    loss = train(model, opt, args)

    largest = max(f.nbytes() for f in model.flats)
    print("rank %d: parameter shards %d bytes vs %d unsharded (1/%.2f); gathered at most %d bytes at once, "
          "largest unit %d bytes; %d units; loss %.4f (DistributedOptimizer %.4f)"
          % (rank, model.shard_bytes(), model.full_bytes(), model.full_bytes() / model.shard_bytes(),
             model.max_gathered_bytes, largest, len(model.flats), loss, ref_loss), flush=True)

    got, want = model.state_dict(), ref.state_dict()
    if args.bf16:
        ok = all((got[k] - want[k]).abs().max().item() < 3e-2 for k in want)
    else:
        # 1e-4 absolute: the two runs sum gradients in different groupings, and
        # Adam turns the rounding noise of gradients that are mathematically
        # zero (attention's key bias: softmax ignores a shift) into steps of up
        # to lr; everything else agrees to ~1e-7.
        ok = all(torch.allclose(got[k], want[k], rtol=1e-5, atol=1e-4) for k in want)
    worst = max(want, key=lambda k: (got[k] - want[k]).abs().max().item())
    if rank == 0:
        print("largest difference %.3g (in %s)" % ((got[worst] - want[worst]).abs().max().item(), worst))
    ok = bool(hvd.allreduce(torch.tensor([int(ok)]), op=hvd.Min, name="fsdp_example.ok").item())
    if rank == 0:
        print("parameters match DistributedOptimizer: %s (%d ranks%s%s)"
              % (ok, size, ", hybrid %d" % args.hybrid if args.hybrid else "", ", bf16" if args.bf16 else ""),
              flush=True)
    for s in sets:
        hvd.remove_process_set(s)
    hvd.shutdown()


if __name__ == "__main__":
    main()
