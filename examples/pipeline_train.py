"""Pipeline parallel (x data parallel) training of an MLP with hora.torch:
the model is cut into P stages, one per rank of a pipeline; with more ranks
than stages the pipelines are data-parallel replicas whose gradients are
averaged by DistributedOptimizer over each stage's data-parallel set.

    horarun -np 2 /usr/bin/python3 examples/pipeline_train.py                # 2 stages
    horarun -np 4 /usr/bin/python3 examples/pipeline_train.py --stages 2     # 2 stages x 2 replicas
    horarun -np 2 /usr/bin/python3 examples/pipeline_train.py --bench        # bubble and memory table

Layout: global rank = replica * P + stage, so each pipeline is P consecutive
ranks. Every rank also trains the whole model in-process on the whole batch
and checks at the end that its stage's parameters equal that reference's
(the line "pipeline matches the single-process model: True").

--bench measures, for GPipe and 1F1B and several micro-batch counts m, the
fraction of each step a stage spends waiting (the bubble) against the
formula (p-1)/(m+p-1), and the peak bytes of activations kept for backward.
"""
import argparse
import copy
import statistics
import time

import torch

import hora.torch as hvd
from hora.torch.parallel import Pipeline, gpipe_bubble


def build_model(width, layers, seed=0):
    torch.manual_seed(seed)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.GELU()]
    mods.append(torch.nn.Linear(width, 10))
    return torch.nn.Sequential(*mods)


def stage_slice(model, stages, s):
    mods = list(model.children())
    bounds = [round(i * len(mods) / stages) for i in range(stages + 1)]
    return bounds[s], bounds[s + 1]


def batch(step, rows, width):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(rows, width, generator=g)
    y = (x[:, :10] * 3).argmax(1)
    return x, y


def make_sets(stages, replicas):
    """Process sets: one per pipeline (its stages) and one per stage (its replicas)."""
    pipes = [hvd.add_process_set([r * stages + s for s in range(stages)]) if replicas > 1 else None
             for r in range(replicas)]
    dps = [hvd.add_process_set([r * stages + s for r in range(replicas)]) if replicas > 1 else None
           for s in range(stages)]
    return pipes, dps


def train(args):
    size, rank = hvd.size(), hvd.rank()
    P = args.stages or size
    if size % P:
        raise SystemExit("--stages %d does not divide the world size %d" % (P, size))
    R = size // P
    replica, s = divmod(rank, P)
    pipes, dps = make_sets(P, R)
    full = build_model(args.width, args.layers)
    ref = copy.deepcopy(full)
    lo, hi = stage_slice(full, P, s)
    stage = torch.nn.Sequential(*list(full.children())[lo:hi])
    m = args.microbatches
    pipe = Pipeline(stage, process_set=pipes[replica] if R > 1 else None,
                    loss_fn=torch.nn.functional.cross_entropy, schedule=args.schedule)
    opt = torch.optim.SGD(stage.parameters(), lr=args.lr)
    if R > 1:  # average over the replicas of this stage once every micro-batch's backward ran
        opt = hvd.DistributedOptimizer(opt, named_parameters=[("s%d.%s" % (s, n), p) for n, p in stage.named_parameters()],
                                       process_set=dps[s], backward_passes_per_step=m)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=args.lr)
    rows = args.batch_size  # per replica
    for step in range(args.steps):
        x, y = batch(step, rows * R, args.width)
        mine = slice(replica * rows, (replica + 1) * rows)
        st = pipe.train_step(inputs=x[mine] if pipe.is_first else None, targets=y[mine] if pipe.is_last else None,
                             num_microbatches=m)
        opt.step()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
        if pipe.is_last and replica == 0:
            print("step %d loss %.4f (stage %d waited %.0f%% of %.1f ms)" %
                  (step, st.loss, s, 100 * st.bubble, 1000 * st.total_s), flush=True)
    want = [p for mod in list(ref.children())[lo:hi] for p in mod.parameters()]
    ok = all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(stage.parameters(), want))
    worst = max(float((a - b).abs().max()) for a, b in zip(stage.parameters(), want))
    oks = hvd.allgather_object(ok)
    if rank == 0:
        print("pipeline matches the single-process model: %s (stages %d, replicas %d, schedule %s, "
              "%d micro-batches, largest difference on rank 0 %.2e)" % (all(oks), P, R, args.schedule, m, worst),
              flush=True)
    return all(oks)


def bench(args):
    size, rank = hvd.size(), hvd.rank()
    P = size
    full = build_model(args.width, args.layers)
    lo, hi = stage_slice(full, P, rank)
    stage = torch.nn.Sequential(*list(full.children())[lo:hi])
    rows_table = []
    for schedule in ("gpipe", "1f1b"):
        pipe = Pipeline(stage, loss_fn=torch.nn.functional.cross_entropy, schedule=schedule)
        for m in args.bench_m:
            rows = args.batch_size * m // max(args.bench_m[0], 1)
            rows -= rows % m
            x, y = batch(0, rows, args.width)
            bubbles, peaks, totals = [], [], []
            for it in range(args.bench_steps + 1):
                st = pipe.train_step(inputs=x if pipe.is_first else None, targets=y if pipe.is_last else None,
                                     num_microbatches=m)
                stage.zero_grad()
                if it > 0:  # the first step warms up
                    bubbles.append(st.bubble)
                    totals.append(st.total_s)
                    peaks.append(st.peak_activation_bytes)
            mine = [statistics.median(bubbles), statistics.median(totals), max(peaks)]
            every = hvd.allgather_object(mine)
            if rank == 0:
                rows_table.append((schedule, m, rows, statistics.mean(e[0] for e in every), gpipe_bubble(P, m),
                                   statistics.mean(e[1] for e in every), every[0][2]))
    if rank == 0:
        print("| schedule | m | batch | measured bubble (mean of stages) | formula (p-1)/(m+p-1) | step ms | "
              "stage 0 peak activations (KiB) |")
        print("|---|---|---|---|---|---|---|")
        for sch, m, rows, b, f, t, pk in rows_table:
            print("| %s | %d | %d | %.3f | %.3f | %.1f | %.0f |" % (sch, m, rows, b, f, 1000 * t, pk / 1024.0))
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stages", type=int, default=0, help="pipeline stages (default: every rank is one stage)")
    ap.add_argument("--schedule", choices=["1f1b", "gpipe"], default="1f1b")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=32, help="rows per replica per step")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--bench", action="store_true", help="measure the bubble and activation memory instead")
    ap.add_argument("--bench-m", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--bench-steps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    t0 = time.time()
    ok = bench(args) if args.bench else train(args)
    if hvd.rank() == 0 and not args.bench:
        print("done in %.1f s" % (time.time() - t0))
    hvd.shutdown()
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
