"""Sharded optimizer (ZeRO stage 1 or 2) with hora.torch: an MLP trained with
``hvd.ZeroOptimizer`` next to the same MLP trained with
``hvd.DistributedOptimizer`` on the same data per rank.

    horarun -np 2 /usr/bin/python3 examples/zero_train.py                  # stage 2, Adam
    horarun -np 3 /usr/bin/python3 examples/zero_train.py --stage 1 --optimizer sgd
    horarun -np 2 /usr/bin/python3 examples/zero_train.py --bench           # step time table

Every rank prints the bytes of its optimizer state against the unsharded
optimizer's (about 1/N), and the last line says whether the parameters match
the DistributedOptimizer run's (bitwise or to 1e-6 relative: with more than
2 ranks the reducescatter may add the ranks' gradients in another order
than the allreduce).

--bench times a training step (median over ranks' slowest, after warm-up)
of DistributedOptimizer, ZeRO-1 and ZeRO-2 on a wider model and prints a
table with the ratio to DistributedOptimizer and the state bytes per rank.
"""
import argparse
import statistics
import time

import torch

import hora.torch as hvd


def build_model(width, layers, seed=0):
    torch.manual_seed(seed)
    mods = []
    for i in range(layers):
        mods += [torch.nn.Linear(16 if i == 0 else width, width), torch.nn.GELU()]
    mods.append(torch.nn.Linear(width, 10))
    return torch.nn.Sequential(*mods)


def batch(step, rank, rows):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(rows, 16, generator=g)
    y = (x[:, :10] * 3).argmax(1)
    return x, y


def state_bytes(optimizer):
    return sum(v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values()
               if torch.is_tensor(v))


def train(model, opt, args, step):
    """``step()`` finishes each step: clipping (if asked) and the optimizer's step."""
    loss = None
    for i in range(args.steps):
        opt.zero_grad()
        x, y = batch(i, hvd.rank(), args.batch)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        step()
    return loss.item()


def bench(args, cls, kw):
    rows = []
    base = None
    for what in ("DistributedOptimizer", "ZeRO-1", "ZeRO-2"):
        model = build_model(args.width, args.layers)
        if what == "DistributedOptimizer":
            opt = hvd.DistributedOptimizer(cls(model.parameters(), **kw), named_parameters=model.named_parameters())
        else:
            opt = hvd.ZeroOptimizer(model.named_parameters(), cls, stage=int(what[-1]),
                                    bucket_bytes=args.bucket_bytes, **kw)
        times = []
        for i in range(args.bench_steps + 2):
            x, y = batch(i, hvd.rank(), args.batch)
            hvd.barrier()
            t0 = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            dt = torch.tensor([time.perf_counter() - t0])
            times.append(hvd.allreduce(dt, op=hvd.Max, name="zero_bench.t").item())  # the slowest rank's step
        ms = 1000 * statistics.median(times[2:])
        nbytes = state_bytes(opt) if what == "DistributedOptimizer" else opt.state_bytes()
        base = base or ms
        rows.append((what, ms, ms / base, nbytes))
    if hvd.rank() == 0:
        params = sum(p.numel() for p in build_model(args.width, args.layers).parameters())
        print("%d ranks, %d parameters, %s, %d rows per rank, bucket %d bytes"
              % (hvd.size(), params, args.optimizer, args.batch, args.bucket_bytes))
        print("| optimizer | step ms | vs DistributedOptimizer | state bytes per rank |")
        print("|---|---|---|---|")
        for what, ms, ratio, nbytes in rows:
            print("| %s | %.2f | %.2fx | %d |" % (what, ms, ratio, nbytes), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stage", type=int, default=2, choices=(1, 2))
    ap.add_argument("--optimizer", default="adam", choices=("adam", "sgd"))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16, help="rows per rank and step")
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--bucket-bytes", type=int, default=64 * 1024)
    ap.add_argument("--clip", type=float, default=0.0, help="clip gradients to this global norm (0: no)")
    ap.add_argument("--bench", action="store_true", help="time steps of DistributedOptimizer, ZeRO-1, ZeRO-2")
    ap.add_argument("--bench-steps", type=int, default=10)
    args = ap.parse_args()
    hvd.init()
    cls, kw = ((torch.optim.Adam, {"lr": 1e-3}) if args.optimizer == "adam"
               else (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}))
    if args.bench:
        bench(args, cls, kw)
        hvd.shutdown()
        return

    # the usual data-parallel run
    ref = build_model(args.width, args.layers)
    ref_opt = hvd.DistributedOptimizer(cls(ref.parameters(), **kw), named_parameters=ref.named_parameters())

    def ref_step():
        if args.clip:  # clip the averaged gradients, as torch does on one process
            ref_opt.synchronize()
            torch.nn.utils.clip_grad_norm_(ref.parameters(), args.clip)
            with ref_opt.skip_synchronize():
                ref_opt.step()
        else:
            ref_opt.step()
    ref_loss = train(ref, ref_opt, args, ref_step)

    # the sharded run
    model = build_model(args.width, args.layers)
    opt = hvd.ZeroOptimizer(model.named_parameters(), cls, stage=args.stage, bucket_bytes=args.bucket_bytes, **kw)

    def zero_step():
        if args.clip:
            opt.clip_grad_norm_(args.clip)  # by the global norm of the averaged gradient
        opt.step()
    loss = train(model, opt, args, zero_step)

    full = state_bytes(ref_opt)
    mine = opt.state_bytes()
    print("rank %d: ZeRO-%d %s optimizer state %d bytes vs %d unsharded (%.3f of it, 1/N = %.3f); "
          "%d buckets; loss %.4f (DistributedOptimizer %.4f)"
          % (hvd.rank(), args.stage, args.optimizer, mine, full, mine / full, 1.0 / hvd.size(), len(opt.buckets),
             loss, ref_loss), flush=True)

    bitwise = all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters()))
    close = all(torch.allclose(p, q, rtol=1e-6, atol=1e-7) for p, q in zip(model.parameters(), ref.parameters()))
    same = torch.tensor([int(close), int(bitwise)])
    same = hvd.allreduce(same, op=hvd.Min, name="zero_example.same")  # every rank must match
    hvd.barrier()
    if hvd.rank() == 0:
        print("ZeRO-%d parameters match DistributedOptimizer: %s (bitwise: %s, %d ranks)"
              % (args.stage, bool(same[0]), bool(same[1]), hvd.size()), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
