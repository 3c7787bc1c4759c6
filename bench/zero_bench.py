"""ZeRO and local SGD measured (issue 18): hora.torch's ZeroOptimizer against
DistributedOptimizer and torch's ZeroRedundancyOptimizer, optimizer-state
memory per rank, and local SGD's bytes per step, in one run at several world
sizes.

    /usr/bin/python3 bench/zero_bench.py                     # 2 and 4 ranks, all sections (minutes)
    /usr/bin/python3 bench/zero_bench.py -np 2 --quick       # smoke run (seconds)
    /usr/bin/python3 bench/zero_bench.py -np 4 --sections step --model resnet50

The script starts the ranks itself (one job per world size, ranks as
subprocesses with hora's HORA_* contract and torch.distributed's
MASTER_ADDR/PORT, Gloo for torch), gathers rank 0's results of every job and
prints markdown tables at the end. Exit status: 0 = every check passed,
1 = a correctness check failed (the tables say which), 2 = a job failed or
timed out.

Sections (``--sections``, default all):

step    Training step time of the same model, data and Adam settings through
        each optimizer variant (``VARIANTS``): hora's DistributedOptimizer,
        ZeroOptimizer stage 1 and 2, torch's DDP + Adam and DDP +
        ZeroRedundancyOptimizer(Adam). Every step is timed on every rank between
        barriers; a step's time is the slowest rank's, a variant's the median
        over ``--rounds`` rounds of ``--steps`` steps after ``--warmup``, the
        variants taking turns round by round (order reversed every other round)
        so load from other processes hits them alike. Ratios against
        DistributedOptimizer (target <= 1.05) and torch's ZeRO. hora's bytes per
        step and collective kind come from its metrics. Checked: every
        variant's parameters are bitwise equal across ranks and within
        ``--tol`` (relative to the largest parameter) of DistributedOptimizer's.
memory  Adam's state bytes per rank over the ResNet-50 parameter shapes
        (bench/resnet50_grad_shapes.txt, 25.6M float32), summed over the
        actual state tensors after one step: torch Adam unsharded,
        ZeroOptimizer stage 1 and 2 (``state_bytes()``, ``master_bytes()``),
        torch's ZeroRedundancyOptimizer; also the gradient bytes each keeps
        after ``step()`` (distinct storages).
localsgd  Bytes per step and step time of hvd.LocalSGD(SGD, sync_every=k)
        for each ``--local-k`` against DistributedOptimizer(SGD) reducing
        every step. Bytes are hora's metrics (bytes this rank submitted to
        allreduce, counted by the C runtime) diffed around the timed steps,
        cross-checked against LocalSGD.bytes_communicated. Step time is the
        mean over whole sync periods (the median would hide the sync step).
        ``--local-rounds`` timed periods of max(k) steps per variant, the
        variants taking turns. Checked: parameters equal across ranks after
        the last sync, and
        k=1 (plain SGD) within ``--tol`` of DistributedOptimizer.

Adding a variant (e.g. ZeRO-3's FullyShardedModule vs torch FSDP): subclass
``Variant`` below (``__init__(ctx, model)`` wraps a fresh model copy and
builds the optimizer; override ``full_params()`` if the parameters are
sharded), add it to ``VARIANTS`` and ``LABELS``, and, for a ratio column, a
pair to ``RATIOS``.
"""
import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_vs_ddp import free_port, read_shapes  # noqa: E402  (the same launcher helpers)
REPO = os.path.dirname(HERE)
SECTIONS = ("step", "memory", "localsgd", "zero3mem")


# ====================================================================== launcher
def run_job(args, np_, result_file, extra=()):
    """One job of np_ ranks running this script with --worker (and ``extra``
    options, which override the command line's); rank 0 writes its results to
    result_file. Returns the job's exit status."""
    hora_port, torch_port = free_port(), free_port()
    secret = os.urandom(8).hex()
    procs = []
    for r in range(np_):
        env = dict(os.environ, HORA_RANK=str(r), HORA_SIZE=str(np_), HORA_STORE_ADDR="127.0.0.1",
                   HORA_STORE_PORT=str(hora_port), HORA_SECRET=secret, MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(torch_port), RANK=str(r), WORLD_SIZE=str(np_), OMP_NUM_THREADS="1")
        env["PYTHONPATH"] = os.path.join(REPO, "bindings", "python") + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--result-file", result_file] + sys.argv[1:] + \
            list(extra)
        # only rank 0 reports; the others' stderr stays visible for failures
        procs.append(subprocess.Popen(cmd, env=env, stdout=None if r == 0 else subprocess.DEVNULL))
    deadline = time.time() + args.timeout
    rc = 0
    for p in procs:
        try:
            code = p.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            code = 124
        rc = rc or code
        if code != 0:  # one rank gone: the others would wait for it until their own timeouts
            break
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    return rc


def launch(args):
    sizes = [int(s) for s in args.np.split(",")]
    results, status = [], 0
    with tempfile.TemporaryDirectory(prefix="zero_bench.") as tmp:
        sections = args.sections.split(",")
        # zero3mem measures the peak resident memory: it needs processes whose
        # heap no earlier section grew, so it runs as a job of its own
        jobs = [s for s in (",".join(x for x in sections if x != "zero3mem"),
                            "zero3mem" if "zero3mem" in sections else "") if s]
        for n in sizes:
            merged = None
            for j, secs in enumerate(jobs):
                path = os.path.join(tmp, "np%d.%d.json" % (n, j))
                print("## %d ranks: %s" % (n, secs), flush=True)
                t0 = time.time()
                rc = run_job(args, n, path, ["--sections", secs])
                print("(%d ranks: %.0f s, exit %d)" % (n, time.time() - t0, rc), flush=True)
                if rc not in (0, 1) or not os.path.exists(path):
                    print("zero_bench: the %d-rank job failed (exit %d); its ranks' stderr is above" % (n, rc),
                          file=sys.stderr)
                    status = 2
                    continue
                with open(path) as f:
                    got = json.load(f)
                if merged is None:
                    merged = got
                else:
                    merged["failures"] += got.pop("failures")
                    merged.update(got)
            if merged is not None:
                results.append(merged)
    print()
    report(args, results)
    report_zero3mem(results)
    failures = [f for r in results for f in r["failures"]]
    for f in failures:
        print("CHECK FAILED: %s" % f)
    return status or (1 if failures else 0)


# ====================================================================== report
def fmt_bytes(n):
    return "%.2f MB" % (n / 1e6)


def ring_bytes(per_kind, n):
    """What a ring algorithm sends per rank for the bytes each rank submitted
    (hora's metrics count a collective's input): allreduce 2(n-1)/n of it,
    reducescatter (n-1)/n, allgather (n-1) times (the input is one slice).
    A model, not a measurement: on one host hora's shared-memory path puts
    nothing on a wire at all."""
    f = {"allreduce": 2.0 * (n - 1) / n, "reducescatter": (n - 1.0) / n, "allgather": n - 1.0}
    return sum(b * f.get(k, 1.0) for k, b in per_kind.items())


def report(args, results):
    """Markdown tables from every job's rank-0 results."""
    step = [r for r in results if "step" in r]
    if step:
        r0 = step[0]["step"]
        print("### Step time (%s, %d params, batch %d per rank, Adam lr %g; median of the slowest rank's step over "
              "%d rounds x %d steps after %d warm-up)\n" % (r0["model"], r0["params"], r0["batch"], r0["lr"],
                                                            args.rounds, args.steps, args.warmup))
        print("| ranks | variant | step ms (median) | round medians min-max | hora bytes/step submitted "
              "(metrics) | ring-model bytes sent/step | params equal across ranks "
              "| max rel diff vs DistributedOptimizer |")
        print("|---|---|---|---|---|---|---|---|")
        for r in step:
            for v in r["step"]["variants"]:
                per = v["bytes_per_step"]
                kinds = ", ".join("%s %s" % (k, fmt_bytes(b)) for k, b in sorted(per.items()) if b)
                print("| %d | %s | %.1f | %.1f-%.1f | %s | %s | %s | %.1e |"
                      % (r["size"], v["label"], v["ms"], min(v["round_ms"]), max(v["round_ms"]), kinds or "-",
                         fmt_bytes(ring_bytes(per, r["size"])) if kinds else "-",
                         "yes" if v["equal_across_ranks"] else "**NO**", v["rel_diff"]))
        print()
        cols = [(a, b, t) for a, b, t in RATIOS
                if all(any(v["key"] == k for v in step[0]["step"]["variants"]) for k in (a, b))]
        if cols:
            labels = LABELS
            print("| ranks | " + " | ".join("%s / %s" % (labels[a], labels[b]) for a, b, _ in cols) + " |")
            print("|---|" + "---|" * len(cols))
            for r in step:
                ms = {v["key"]: v["ms"] for v in r["step"]["variants"]}
                print("| %d | " % r["size"] + " | ".join("**%.3f**" % (ms[a] / ms[b]) for a, b, _ in cols) + " |")
            print("| target | " + " | ".join(t or "" for _, _, t in cols) + " |")
            print()
        for label, why in sorted(step[0]["step"].get("skipped", {}).items()):
            print("Not measured: %s: %s\n" % (label, why))

    mem = [r for r in results if "memory" in r]
    if mem:
        m0 = mem[0]["memory"]
        print("### Optimizer state per rank, Adam over the ResNet-50 parameter shapes (%d tensors, %.2f M float32; "
              "bytes of the state tensors after one step)\n" % (m0["tensors"], m0["numel"] / 1e6))
        print("| ranks | optimizer | state bytes per rank (max over ranks) | min over ranks | vs unsharded "
              "| master copies | gradient bytes kept after step() |")
        print("|---|---|---|---|---|---|---|")
        for r in mem:
            rows = r["memory"]["rows"]
            full = rows[0]["state_max"]
            for row in rows:
                print("| %d | %s | %s | %s | %.3f | %s | %s |"
                      % (r["size"], row["label"], fmt_bytes(row["state_max"]), fmt_bytes(row["state_min"]),
                         row["state_max"] / full, fmt_bytes(row["master_max"]) if row["master_max"] is not None
                         else "-", fmt_bytes(row["grad_max"])))
        print()

    lsgd = [r for r in results if "localsgd" in r]
    if lsgd:
        l0 = lsgd[0]["localsgd"]
        print("### Local SGD vs every-step gradient allreduce (%s, %d params, SGD lr %g, batch %d per rank; "
              "%d timed periods of %d steps)\n"
              % (l0["model"], l0["params"], l0["lr"], l0["batch"], args.local_rounds, l0["period"]))
        print("| ranks | variant | allreduce bytes/step per rank (hora metrics) | vs every step "
              "| ring bytes sent/step per rank, 2(n-1)/n x | ms/step (mean) | vs every step "
              "| params equal across ranks | max rel diff vs DistributedOptimizer |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in lsgd:
            rows = r["localsgd"]["variants"]
            base = rows[0]
            n = r["size"]
            for v in rows:
                print("| %d | %s | %s | %.4f | %s | %.1f | %.3f | %s | %s |"
                      % (n, v["label"], fmt_bytes(v["bytes_per_step"]), v["bytes_per_step"] / base["bytes_per_step"],
                         fmt_bytes(v["bytes_per_step"] * 2 * (n - 1) / n), v["ms"], v["ms"] / base["ms"],
                         "yes" if v["equal_across_ranks"] else "**NO**",
                         "%.1e" % v["rel_diff"] if v["rel_diff"] is not None else "-"))
        print()


def report_zero3mem(results):
    z3 = [r for r in results if "zero3mem" in r]
    if not z3:
        return
    print("### Peak memory of a training step, ZeRO-3 vs data parallel (MLP 1024 -> 4 x 2048 -> 10, batch 4, Adam, "
          "3 steps; VmHWM above "
          "the RSS before the model was built, max over ranks)\n")
    print("| ranks | variant | peak bytes | vs DistributedOptimizer | parameters (unsharded) "
          "| most gathered at once | largest unit |")
    print("|---|---|---|---|---|---|---|")
    for r in z3:
        rows = r["zero3mem"]["rows"]
        for row in rows:
            print("| %d | %s | %s | %.3f | %s | %s | %s |"
                  % (r["size"], row["label"], fmt_bytes(row["peak_max"]), row["peak_max"] / rows[0]["peak_max"],
                     fmt_bytes(row["params_bytes"]),
                     fmt_bytes(row["max_gathered"]) if row["max_gathered"] is not None else "-",
                     fmt_bytes(row["largest_unit"]) if row["largest_unit"] is not None else "-"))
    print()


# ====================================================================== workloads
def make_workload(args, name):
    """(build(seed) -> module whose forward(*batch) is the loss, batch(step, rank))."""
    import torch
    import torch.nn.functional as F

    if name == "mlp":
        class MLP(torch.nn.Module):
            def __init__(self):
                super().__init__()
                mods, d = [], args.mlp_in
                for _ in range(args.mlp_layers):
                    mods += [torch.nn.Linear(d, args.mlp_width), torch.nn.GELU()]
                    d = args.mlp_width
                mods.append(torch.nn.Linear(d, 10))
                self.net = torch.nn.Sequential(*mods)

            def forward(self, x, y):
                return F.cross_entropy(self.net(x), y)

        def batch(step, rank):
            g = torch.Generator().manual_seed(100003 * rank + step)
            x = torch.randn(args.batch, args.mlp_in, generator=g)
            return x, (x[:, :10] * 3).argmax(1)
        cls = MLP
    elif name == "resnet50":
        shapes = read_shapes(args.shapes)

        class FlatStack(torch.nn.Module):
            """ResNet-50's parameters without its compute: the loss is a cheap
            elementwise function of every parameter, so the step is dominated
            by the reduction and the optimizer, as in a large model."""
            def __init__(self):
                super().__init__()
                self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(s) * 0.02) for s in shapes])

            def forward(self, a, b):
                return sum(((p * p) * a + p * b[i]).sum() for i, p in enumerate(self.ps))

        def batch(step, rank):
            g = torch.Generator().manual_seed(100003 * rank + step)
            return torch.rand(1, generator=g) * 1e-2, torch.randn(len(shapes), generator=g)
        cls = FlatStack
    else:
        raise SystemExit("zero_bench: unknown --model %r (mlp, resnet50)" % name)

    def build(seed=0):
        torch.manual_seed(seed)
        return cls()
    return build, batch


# ====================================================================== step variants
class Ctx:
    """What every variant may need: the options, hora and torch.distributed."""
    def __init__(self, args, hvd, dist):
        self.args, self.hvd, self.dist = args, hvd, dist


def _state_bytes(optimizer):
    import torch
    return sum(v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values()
               if torch.is_tensor(v))


class Variant:
    """One way of training the step section's model. A subclass builds its
    optimizer (and wrapper) around ``model``, a fresh copy with the same
    initial values on every rank, in ``__init__(ctx, model)``; ``step(batch)``
    is one training step, ``state_bytes()`` this rank's optimizer state.
    ``full_params()`` must give the whole, unsharded parameters in the
    model's order (for the correctness check): a variant that shards the
    parameters themselves (ZeRO-3, FSDP) gathers them there."""
    label = "?"

    def step(self, batch):
        self.opt.zero_grad()
        self.model(*batch).backward()
        self.opt.step()

    def full_params(self):
        module = self.model.module if hasattr(self.model, "module") else self.model  # DDP's wrapped module
        return list(module.parameters())

    def state_bytes(self):
        return _state_bytes(self.opt)


class HoraDistributed(Variant):
    label = "hora DistributedOptimizer"

    def __init__(self, ctx, model):
        import torch
        self.model = model
        self.opt = ctx.hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=ctx.args.lr),
                                                named_parameters=model.named_parameters())


class HoraZero(Variant):
    stage = 1

    def __init__(self, ctx, model):
        import torch
        self.model = model
        self.opt = ctx.hvd.ZeroOptimizer(model.named_parameters(), torch.optim.Adam, stage=self.stage,
                                         bucket_bytes=int(ctx.args.bucket_mb * 2**20), lr=ctx.args.lr)

    @property
    def label(self):
        return "hora ZeroOptimizer stage %d" % self.stage

    def state_bytes(self):
        return self.opt.state_bytes()


class HoraZero2(HoraZero):
    stage = 2


class TorchDDP(Variant):
    """torch DDP (gloo, its default 25 MB buckets) + unsharded Adam: the
    reference for torch's ZeRO."""
    label = "torch DDP + Adam"

    def __init__(self, ctx, model):
        import torch
        self.model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=ctx.args.bucket_mb)
        self.opt = self.make_optimizer(ctx, model)

    def make_optimizer(self, ctx, model):
        import torch
        return torch.optim.Adam(model.parameters(), lr=ctx.args.lr)


class TorchZero(TorchDDP):
    """torch.distributed.optim.ZeroRedundancyOptimizer(Adam) under DDP: DDP
    allreduces the whole gradient, each rank steps the parameters it owns
    (whole tensors, greedily balanced) and broadcasts them."""
    label = "torch DDP + ZeroRedundancyOptimizer"

    def make_optimizer(self, ctx, model):
        import torch
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=ctx.args.lr)

    def state_bytes(self):
        return _state_bytes(self.opt.optim)


class HoraZero3(Variant):
    """hvd.FullyShardedModule (ZeRO-3): parameters sharded, gathered per layer
    just in time; a plain torch Adam over the shards."""
    label = "hora FullyShardedModule (ZeRO-3)"

    @staticmethod
    def unavailable(args):
        if args.model != "mlp":
            return ("the resnet50 workload reads its parameters outside any submodule's forward, which "
                    "FullyShardedModule does not gather")
        return None

    def __init__(self, ctx, model):
        import torch
        self.model = ctx.hvd.FullyShardedModule(model, name="zero_bench.z3")
        self.opt = torch.optim.Adam(self.model.parameters(), lr=ctx.args.lr)

    def full_params(self):
        return list(self.model.state_dict().values())  # gathered (a collective); the MLP has no buffers


class TorchFSDP(Variant):
    """torch.distributed.fsdp.FullyShardedDataParallel on CPU/gloo, where the
    installed torch has a working one."""
    label = "torch FSDP"

    @staticmethod
    def unavailable(args):
        try:
            from torch.distributed.fsdp import FullyShardedDataParallel  # noqa: F401
        except Exception as e:  # Debian's torch 1.13 under Python 3.11 fails to import it
            return "`from torch.distributed.fsdp import FullyShardedDataParallel` fails in the installed torch: " \
                "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:160])
        return None

    def __init__(self, ctx, model):
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel
        self.model = FullyShardedDataParallel(model)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=ctx.args.lr)

    def full_params(self):
        from torch.distributed.fsdp import FullyShardedDataParallel
        with FullyShardedDataParallel.summon_full_params(self.model):
            return [p.detach().clone() for p in self.model.parameters()]


# key -> class; the table rows follow this order. DistributedOptimizer ("dist")
# is the reference of the correctness check and must stay. A class may say
# why it cannot run here (``unavailable(args)``): it is skipped and the report
# says why.
VARIANTS = {"dist": HoraDistributed, "zero1": HoraZero, "zero2": HoraZero2, "zero3": HoraZero3,
            "torch_ddp": TorchDDP, "torch_zero": TorchZero, "torch_fsdp": TorchFSDP}
LABELS = {"dist": "DistOpt", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3", "torch_ddp": "torch DDP",
          "torch_zero": "torch ZeRO", "torch_fsdp": "torch FSDP"}
# (numerator, denominator, target) columns of the ratio table
RATIOS = [("zero1", "dist", "<= 1.05"), ("zero2", "dist", "<= 1.05"), ("zero3", "dist", ""),
          ("zero1", "torch_zero", ""), ("zero2", "torch_zero", ""), ("zero3", "torch_fsdp", ""),
          ("dist", "torch_ddp", ""), ("torch_zero", "torch_ddp", "")]


def flat_params(params):
    import torch
    return torch.cat([p.detach().reshape(-1) for p in params])


def equal_across_ranks(hvd, v, name):
    """Bitwise: the elementwise max and min over ranks are both this rank's values."""
    hi = hvd.allreduce(v, op=hvd.Max, name=name + ".max")
    lo = hvd.allreduce(v, op=hvd.Min, name=name + ".min")
    return bool(hi.equal(v) and lo.equal(v))


def hora_bytes(hvd):
    return {k: c["bytes"] for k, c in hvd.metrics()["collectives"].items()}


def section_step(ctx, out, failures):
    import torch
    args, hvd, dist = ctx.args, ctx.hvd, ctx.dist
    build, batch = make_workload(args, args.model)
    keys = args.variants.split(",")
    unknown = [k for k in keys if k not in VARIANTS]
    if unknown or "dist" not in keys:
        raise SystemExit("zero_bench: --variants %r: known are %s, and 'dist' (the reference) must be in"
                         % (args.variants, ",".join(VARIANTS)))
    skipped = {}
    for k in list(keys):
        why = getattr(VARIANTS[k], "unavailable", lambda a: None)(args)
        if why:
            skipped[VARIANTS[k].label] = why
            keys.remove(k)
            ctx.log("  step: %s skipped: %s" % (VARIANTS[k].label, why))
    variants = [(k, VARIANTS[k](ctx, build(seed=0))) for k in keys]
    rank = hvd.rank()
    done = {k: 0 for k in keys}  # steps taken: every variant sees the same batches in the same order
    times = {k: [] for k in keys}
    sent = {k: {} for k in keys}

    def run(k, v, n, timed):
        for _ in range(n):
            b = batch(done[k], rank)
            dist.barrier()
            before = hora_bytes(hvd) if timed else None
            t0 = time.perf_counter()
            v.step(b)
            dt = time.perf_counter() - t0
            done[k] += 1
            if timed:
                times[k].append(dt)
                for kind, total in hora_bytes(hvd).items():
                    sent[k][kind] = sent[k].get(kind, 0) + total - before[kind]

    for k, v in variants:
        run(k, v, args.warmup, False)
        ctx.log("  step: %s warmed up" % v.label)
    for rnd in range(args.rounds):
        for k, v in (variants if rnd % 2 == 0 else variants[::-1]):
            run(k, v, args.steps, True)
        ctx.log("  step: round %d/%d done" % (rnd + 1, args.rounds))

    ref = flat_params(variants[0][1].full_params())
    scale = ref.abs().max().item()
    rows = []
    for k, v in variants:
        mine = flat_params(v.full_params())
        equal = equal_across_ranks(hvd, mine, "zero_bench.eq.%s" % k)
        rel = (mine - ref).abs().max().item() / scale
        if not equal:
            failures.append("step: %s parameters differ across ranks (%d ranks)" % (v.label, hvd.size()))
        if rel > args.tol:
            failures.append("step: %s parameters differ from DistributedOptimizer's by %.2e relative (> --tol %g) "
                            "at %d ranks" % (v.label, rel, args.tol, hvd.size()))
        # the slowest rank's time for each step
        t = hvd.allreduce(torch.tensor(times[k], dtype=torch.float64), op=hvd.Max, name="zero_bench.t.%s" % k)
        ms = [1000 * x for x in t.tolist()]
        per_round = [statistics.median(ms[i * args.steps:(i + 1) * args.steps]) for i in range(args.rounds)]
        nsteps = len(ms)
        rows.append({"key": k, "label": v.label, "ms": statistics.median(ms), "round_ms": per_round,
                     "state_bytes": v.state_bytes(), "equal_across_ranks": equal, "rel_diff": rel,
                     "bytes_per_step": {kind: b / nsteps for kind, b in sent[k].items()}})
        ctx.log("  step: %-38s %8.1f ms  equal %s  rel diff %.1e" % (v.label, rows[-1]["ms"], equal, rel))
    out["step"] = {"model": args.model, "params": ref.numel(), "batch": args.batch, "lr": args.lr,
                   "variants": rows, "skipped": skipped}
    del variants
    gc.collect()


# ====================================================================== memory
def unique_bytes(tensors):
    """Bytes of the distinct storages among ``tensors`` (views of one buffer count once)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()  # (torch < 2.0: storage())
        if s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            total += s.nbytes()
    return total


def section_memory(ctx, out, failures):
    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer
    args, hvd = ctx.args, ctx.hvd
    shapes = read_shapes(args.shapes)
    build, batch = make_workload(args, "resnet50")

    def zero_grad_tensors(opt):
        # what ZeroOptimizer itself keeps for gradients: its bucket buffers (stage 1's flat buffer is what
        # p.grad views, stage 2's reducescatter output is what the master's .grad is)
        ts = []
        for b in opt.buckets:
            ts += [b.flat, b.gshard, b.gmaster, b.master.grad]
        ts += getattr(opt, "_free_buffers", [])  # stage 2: the pooled bucket buffers it keeps between steps
        return ts

    def measure(label):
        model = build(seed=0)
        params = list(model.parameters())
        master = None
        if label == "torch Adam (unsharded)":
            opt = torch.optim.Adam(params, lr=args.lr)
            model(*batch(0, hvd.rank())).backward()
            opt.step()
            state, extra = _state_bytes(opt), []
        elif label.startswith("hora ZeroOptimizer"):
            opt = hvd.ZeroOptimizer(params, torch.optim.Adam, stage=int(label[-1]),
                                    bucket_bytes=int(args.bucket_mb * 2**20), lr=args.lr, name="zero_bench.mem%s"
                                    % label[-1])
            model(*batch(0, hvd.rank())).backward()
            opt.step()
            state, master, extra = opt.state_bytes(), opt.master_bytes(), zero_grad_tensors(opt)
        else:
            opt = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.Adam, lr=args.lr)
            model(*batch(0, hvd.rank())).backward()  # (no DDP: the gradients stay local, enough for the bytes)
            opt.step()
            state, extra = _state_bytes(opt.optim), []
        grad = unique_bytes([p.grad for p in params] + extra)
        vals = torch.tensor([state, -state, grad, master or 0], dtype=torch.float64)
        hi = hvd.allreduce(vals, op=hvd.Max, name="zero_bench.mem")
        row = {"label": label, "state_max": hi[0].item(), "state_min": -hi[1].item(), "grad_max": hi[2].item(),
               "master_max": hi[3].item() if master is not None else None}
        ctx.log("  memory: %-34s state %s per rank (max), gradients kept %s" % (label, fmt_bytes(row["state_max"]),
                                                                                 fmt_bytes(row["grad_max"])))
        del opt, model, params, extra
        gc.collect()
        return row

    rows = [measure(lab) for lab in ("torch Adam (unsharded)", "hora ZeroOptimizer stage 1",
                                     "hora ZeroOptimizer stage 2", "torch ZeroRedundancyOptimizer")]
    n = hvd.size()
    full = rows[0]["state_max"]
    for row in rows[1:3]:
        # 1/N plus the padding of each bucket to a multiple of N and one scalar 'step' per bucket
        if row["state_max"] > full / n * 1.01:
            failures.append("memory: %s keeps %d state bytes per rank, more than 1.01 x 1/%d of %d"
                            % (row["label"], row["state_max"], n, full))
    out["memory"] = {"tensors": len(shapes), "numel": sum(int(torch.Size(s).numel()) for s in shapes), "rows": rows}


# ====================================================================== local SGD
def section_localsgd(ctx, out, failures):
    import torch
    args, hvd, dist = ctx.args, ctx.hvd, ctx.dist
    build, batch = make_workload(args, args.model)
    ks = [int(k) for k in args.local_k.split(",")]
    period = max(ks)  # every variant's timed block ends on a sync of each k dividing it
    if any(period % k for k in ks):
        raise SystemExit("zero_bench: --local-k %s: every k must divide the largest" % args.local_k)
    rank = hvd.rank()

    class Every:
        label = "DistributedOptimizer (allreduce every step)"

        def __init__(self):
            self.model = build(seed=0)
            self.opt = hvd.DistributedOptimizer(torch.optim.SGD(self.model.parameters(), lr=args.sgd_lr),
                                                named_parameters=[("lsgd." + n, p) for n, p in
                                                                  self.model.named_parameters()])
            self.counted = None

    class Local:
        def __init__(self, k):
            self.label = "LocalSGD k=%d" % k
            self.model = build(seed=0)
            self.opt = hvd.LocalSGD(torch.optim.SGD(self.model.parameters(), lr=args.sgd_lr), sync_every=k)

        @property
        def counted(self):
            return self.opt.bytes_communicated

    variants = [Every()] + [Local(k) for k in ks]
    done = [0] * len(variants)
    times = [[] for _ in variants]
    sent = [0] * len(variants)
    counted = [0] * len(variants)

    def block(i, timed):
        v = variants[i]
        dist.barrier()  # torch's: hora's metrics count only the variant's own collectives
        before, c0 = hora_bytes(hvd), v.counted
        t0 = time.perf_counter()
        for _ in range(period):
            v.opt.zero_grad()
            v.model(*batch(done[i], rank)).backward()
            v.opt.step()
            done[i] += 1
        dt = time.perf_counter() - t0
        if timed:
            after = hora_bytes(hvd)
            times[i].append(dt / period)
            sent[i] += sum(after[k] - before[k] for k in after)
            if c0 is not None:
                counted[i] += v.counted - c0

    for i in range(len(variants)):
        block(i, False)  # warm-up
    for rnd in range(args.local_rounds):
        order = list(range(len(variants)))
        for i in (order if rnd % 2 == 0 else order[::-1]):
            block(i, True)
        ctx.log("  localsgd: round %d/%d done" % (rnd + 1, args.local_rounds))

    nsteps = period * args.local_rounds
    ref = flat_params(variants[0].model.parameters())
    scale = ref.abs().max().item()
    rows = []
    for i, v in enumerate(variants):
        mine = flat_params(v.model.parameters())
        equal = equal_across_ranks(hvd, mine, "zero_bench.lsgd.eq.%d" % i)
        if not equal:
            failures.append("localsgd: %s parameters differ across ranks after a sync (%d ranks)"
                            % (v.label, hvd.size()))
        rel = None
        if i == 0 or v.opt.sync_every == 1:  # plain SGD averaged every step is DistributedOptimizer
            rel = (mine - ref).abs().max().item() / scale
            if rel > args.tol:
                failures.append("localsgd: %s differs from DistributedOptimizer(SGD) by %.2e relative (> --tol %g)"
                                % (v.label, rel, args.tol))
        if i > 0 and counted[i] != sent[i]:
            failures.append("localsgd: %s: hora's metrics counted %d allreduce bytes, LocalSGD.bytes_communicated %d"
                            % (v.label, sent[i], counted[i]))
        t = hvd.allreduce(torch.tensor(times[i], dtype=torch.float64), op=hvd.Max, name="zero_bench.lsgd.t.%d" % i)
        ms = 1000 * sum(t.tolist()) / len(times[i])
        rows.append({"label": v.label, "bytes_per_step": sent[i] / nsteps, "ms": ms, "equal_across_ranks": equal,
                     "rel_diff": rel})
        ctx.log("  localsgd: %-44s %s/step %7.1f ms/step" % (v.label, fmt_bytes(rows[-1]["bytes_per_step"]), ms))
    out["localsgd"] = {"model": args.model, "params": ref.numel(), "lr": args.sgd_lr, "batch": args.batch,
                       "period": period, "variants": rows}


# ====================================================================== ZeRO-3 memory
def _rss_kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError("no %s in /proc/self/status" % field)


def section_zero3mem(ctx, out, failures):
    """Peak resident memory of a training step, DistributedOptimizer vs
    FullyShardedModule, measured by the kernel (VmHWM, reset through
    /proc/self/clear_refs) with glibc returning every freed block above 64 KiB
    to the OS at once (mallopt M_MMAP_THRESHOLD), so that the peak is what
    was alive, not what malloc kept. Last section: the mallopt slows later
    allocations down."""
    import ctypes
    import torch
    args, hvd = ctx.args, ctx.hvd
    # always the default MLP (14.7M parameters, 59 MB), also with --quick: a
    # model of a few hundred KB lives in malloc's small blocks and shows nothing
    big = argparse.Namespace(**dict(vars(args), mlp_in=1024, mlp_width=2048, mlp_layers=4, batch=4))
    build, batch = make_workload(big, "mlp")
    if ctypes.CDLL("libc.so.6").mallopt(-3, 65536) != 1:  # M_MMAP_THRESHOLD
        raise RuntimeError("mallopt(M_MMAP_THRESHOLD) failed")
    rows = []
    for label in ("hora DistributedOptimizer", "hora FullyShardedModule (ZeRO-3)"):
        gc.collect()
        base = _rss_kb("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        model = build(seed=0)
        params_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        if label.startswith("hora Dist"):
            opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=args.lr),
                                           named_parameters=[("z3m." + n, p) for n, p in model.named_parameters()])
        else:
            model = hvd.FullyShardedModule(model, name="zero_bench.z3m")
            opt = torch.optim.Adam(model.parameters(), lr=args.lr)
        for i in range(3):
            opt.zero_grad()
            model(*batch(i, hvd.rank())).backward()
            opt.step()
        peak = (_rss_kb("VmHWM") - base) * 1024
        gathered = getattr(model, "max_gathered_bytes", None)
        largest = max((f.nbytes() for f in model.flats), default=0) if gathered is not None else None
        vals = hvd.allreduce(torch.tensor([float(peak)], dtype=torch.float64), op=hvd.Max, name="zero_bench.z3m")
        rows.append({"label": label, "peak_max": vals[0].item(), "params_bytes": params_bytes,
                     "max_gathered": gathered, "largest_unit": largest})
        ctx.log("  zero3mem: %-36s peak %s above the start (max over ranks)" % (label, fmt_bytes(vals[0].item())))
        del opt, model
        gc.collect()
    # the persistent part of ZeRO-3 is 1/N: its peak must be well under data parallel's
    if rows[1]["peak_max"] >= rows[0]["peak_max"]:
        failures.append("zero3mem: FullyShardedModule's peak (%d B) is not below DistributedOptimizer's (%d B)"
                        % (rows[1]["peak_max"], rows[0]["peak_max"]))
    out["zero3mem"] = {"rows": rows}


# ====================================================================== worker
def worker(args):
    import torch
    import torch.distributed as dist
    import hora.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    dist.init_process_group("gloo")
    ctx = Ctx(args, hvd, dist)
    ctx.log = (lambda *a: print(*a, flush=True)) if hvd.rank() == 0 else (lambda *a: None)
    out = {"size": hvd.size(), "failures": []}
    sections = args.sections.split(",")
    for s in sections:
        if s not in SECTIONS:
            raise SystemExit("zero_bench: unknown section %r (%s)" % (s, ",".join(SECTIONS)))
    for s in SECTIONS:
        if s in sections:
            t0 = time.time()
            globals()["section_" + s](ctx, out, out["failures"])
            ctx.log("  (%s: %.0f s)" % (s, time.time() - t0))
    if hvd.rank() == 0:
        with open(args.result_file, "w") as f:
            json.dump(out, f)
    dist.destroy_process_group()
    hvd.shutdown()
    return 1 if out["failures"] else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("-np", default="2,4", help="world sizes, one job each, comma-separated (default 2,4)")
    p.add_argument("--sections", default=",".join(SECTIONS), help="any of %s (default: all)" % ",".join(SECTIONS))
    p.add_argument("--model", default="mlp", choices=("mlp", "resnet50"),
                   help="step/localsgd model: an MLP (--mlp-*) or ResNet-50's parameter shapes with a synthetic "
                        "elementwise loss (default mlp)")
    p.add_argument("--mlp-in", type=int, default=1024, help="MLP input features (default 1024)")
    p.add_argument("--mlp-width", type=int, default=2048, help="MLP hidden width (default 2048)")
    p.add_argument("--mlp-layers", type=int, default=4, help="MLP hidden layers (default 4: 14.7M parameters)")
    # small batches: at 32 rows the MLP's matmuls took ~75% of a step on the 2-core test machine, hiding the
    # optimizers' differences in its noise
    p.add_argument("--batch", type=int, default=4, help="rows per rank and step (default 4)")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help="step section's variants (default all: %s)" % ",".join(VARIANTS))
    p.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate (default 1e-3)")
    p.add_argument("--sgd-lr", type=float, default=0.01, help="local SGD section's SGD learning rate (default 0.01)")
    p.add_argument("--bucket-mb", type=float, default=25, help="ZeroOptimizer's bucket_bytes and DDP's "
                   "bucket_cap_mb, MiB (default 25)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per variant first (default 3)")
    p.add_argument("--rounds", type=int, default=4, help="timed rounds; variants take turns (default 4)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per variant and round (default 5)")
    p.add_argument("--local-rounds", type=int, default=3, help="local SGD section: timed periods of max(k) steps "
                   "per variant, taking turns (default 3)")
    p.add_argument("--local-k", default="1,4,16", help="LocalSGD sync_every values; each divides the largest "
                   "(default 1,4,16)")
    p.add_argument("--tol", type=float, default=1e-4, help="largest accepted |param - DistributedOptimizer's| "
                   "over max |param| (default 1e-4)")
    p.add_argument("--shapes", default=os.path.join(HERE, "resnet50_grad_shapes.txt"),
                   help="parameter shapes file (default bench/resnet50_grad_shapes.txt)")
    p.add_argument("--quick", action="store_true", help="smoke run: small MLP, 1 warm-up, 2 rounds of 2 steps, "
                   "local k 1,2, 2 periods")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per job (default 1800)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result-file", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:
        args.mlp_in, args.mlp_width, args.mlp_layers, args.batch = 64, 256, 2, 8
        args.warmup, args.rounds, args.steps, args.local_rounds, args.local_k = 1, 2, 2, 2, "1,2"
    if args.worker:
        return worker(args)
    return launch(args)


if __name__ == "__main__":
    raise SystemExit(main())
