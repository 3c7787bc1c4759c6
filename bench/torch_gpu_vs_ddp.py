"""hora.torch against DistributedDataParallel (NCCL) on the GPU: one training step
of the same model on the same batch (issue 19: hora/DDP step time <= 1.02).

    PYTHONPATH=bindings/python HORA_LIBRARY=<build>/bindings/c/libhora.so \\
        HORA_GPU_PLUGIN=<build>/ops/cuda/libhora_cuda.so python3 bench/torch_gpu_vs_ddp.py
    ... bench/torch_gpu_vs_ddp.py --model cnn --quick     # small built-in CNN, smoke-sized
    ... bench/torch_gpu_vs_ddp.py --amp                   # forward under torch.autocast(bfloat16)

World size 1 by default (one process on cuda:0, NCCL for both); -np N starts N
ranks, rank r on cuda:r (one GPU each: NCCL refuses two ranks on one GPU).
Two copies of one seeded model (torchvision's resnet50 by default, else the
built-in CNN), SGD with momentum, cross-entropy on random labels: (a) hora's
DistributedOptimizer after broadcast_parameters, (b) DDP with a plain SGD. The
arms alternate block by block (after warm-up), so that drift hits both alike;
a block is timed between torch.cuda.synchronize() calls, step time = block
time / steps. Then a deterministic check (cuDNN deterministic, fresh copies of
the same weights, a few steps each) must give the same losses and parameters
in both arms, else exit 1. Exit 77 without a CUDA device; the target not met
is reported, not an error (exit 0).
"""
import argparse
import copy
import gc
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TARGET = 1.02

sys.path.insert(0, HERE)
from torch_vs_ddp import free_port, launch  # noqa: E402  (the ranks' launcher, shared)


def build_model(name):
    import torch.nn as nn
    if name == "resnet50":
        try:
            from torchvision.models import resnet50
        except ImportError:
            print("torchvision is not importable: using the built-in CNN (--model cnn)", flush=True)
            name = "cnn"
        else:
            return resnet50(), name

    def block(cin, cout, stride):
        return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True)]
    layers = block(3, 32, 2) + block(32, 64, 2) + block(64, 128, 2) + block(128, 256, 2) + block(256, 256, 1)
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 1000)), name


def worker(args):
    sys.path.append(os.path.join(REPO, "bindings", "python"))  # PYTHONPATH or an installed hora come first
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    import hora._lib
    import hora.torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if args.device == "cuda":
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        torch.backends.cudnn.benchmark = True
    else:  # debug: the logic on the CPU (gloo), timings meaningless
        dev = torch.device("cpu")
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", init_method="env://",
                            rank=rank, world_size=size)

    def log(*a):
        if rank == 0:
            print(*a, flush=True)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    torch.manual_seed(args.seed)
    base, model_name = build_model(args.model)
    gen = torch.Generator().manual_seed(args.seed + 1 + rank)  # each rank its own batch: averaging matters
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=gen).to(dev)
    target = torch.randint(0, 1000, (args.batch_size,), generator=gen).to(dev)

    log("torch %s (CUDA %s), %s, libhora %s, GPU plugin %s" % (
        torch.__version__, torch.version.cuda,
        torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU (debug run)",
        hora._lib.library_path(), os.environ.get("HORA_GPU_PLUGIN", "(libhora's default search)")))
    if dev.type == "cuda":
        try:
            log("NCCL %s" % ".".join(str(v) for v in torch.cuda.nccl.version()))
        except Exception:  # older torch returns an int, or no NCCL
            pass
    log("model %s (%.1f M parameters), batch %d x 3 x %d x %d float32 per rank, %d rank(s), SGD momentum %.2f, "
        "lr %g%s" % (model_name, sum(p.numel() for p in base.parameters()) / 1e6, args.batch_size,
                     args.image_size, args.image_size, size, args.momentum, args.lr,
                     ", autocast bfloat16" if args.amp else ""))

    def make_arms():
        """Two copies of the initial weights: hora (DistributedOptimizer) and DDP."""
        m_h = copy.deepcopy(base).to(dev)
        opt_h = hvd.DistributedOptimizer(torch.optim.SGD(m_h.parameters(), lr=args.lr, momentum=args.momentum),
                                         named_parameters=m_h.named_parameters())
        hvd.broadcast_parameters(m_h.state_dict(), root_rank=0)
        m_d = DDP(copy.deepcopy(base).to(dev), device_ids=[dev.index] if dev.type == "cuda" else None)
        opt_d = torch.optim.SGD(m_d.parameters(), lr=args.lr, momentum=args.momentum)

        def step(model, opt):
            def run():
                opt.zero_grad(set_to_none=True)
                with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.amp):
                    loss = F.cross_entropy(model(data), target)
                loss.backward()
                opt.step()
                return loss
            return run
        return {"hora": (m_h, step(m_h, opt_h)), "ddp": (m_d.module, step(m_d, opt_d))}

    # ---- timed run
    arms = make_arms()
    for _ in range(args.warmup):
        for name in ("hora", "ddp"):
            arms[name][1]()
    sync()
    times = {"hora": [], "ddp": []}
    for b in range(args.blocks):
        for name in ("hora", "ddp") if b % 2 == 0 else ("ddp", "hora"):
            fn = arms[name][1]
            if size > 1:
                dist.barrier(**({"device_ids": [dev.index]} if dev.type == "cuda" else {}))
            sync()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                fn()
            sync()
            times[name].append((time.perf_counter() - t0) / args.steps * 1000)
    # The copies took the same number of steps on the same data; cuDNN's
    # nondeterminism lets them drift a little (information only).
    drift = max(((a.float() - b.float()).abs().max() / (b.float().abs().max() + 1e-12)).item()
                for a, b in zip(arms["hora"][0].parameters(), arms["ddp"][0].parameters()))
    del arms
    gc.collect()

    med = {k: statistics.median(v) for k, v in times.items()}
    mean = {k: statistics.mean(v) for k, v in times.items()}
    pair = statistics.median(h / d for h, d in zip(times["hora"], times["ddp"]))
    log("%d blocks x %d steps per arm, alternating, after %d warm-up steps each" % (args.blocks, args.steps,
                                                                                 args.warmup))
    for name, label in (("hora", "hora DistributedOptimizer"), ("ddp", "DDP (%s)" % dist.get_backend())):
        log("  %-28s median %8.2f ms/step  mean %8.2f  min %8.2f  max %8.2f  (%.1f img/s per rank)" % (
            label, med[name], mean[name], min(times[name]), max(times[name]), args.batch_size * 1000 / med[name]))
    log("  per-block hora/DDP: %s" % " ".join("%.3f" % (h / d) for h, d in zip(times["hora"], times["ddp"])))
    log("  median of block-pair ratios %.4f; max relative parameter drift after the timed run %.2e" % (pair,
                                                                                                        drift))

    # ---- deterministic check: fresh copies, same weights, a few steps each
    sync()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True
    arms = make_arms()
    losses = {"hora": [], "ddp": []}
    for name in ("hora", "ddp"):
        for _ in range(args.check_steps):
            losses[name].append(arms[name][1]().item())
    ok = all(abs(h - d) <= 1e-3 * abs(d) + 1e-4 for h, d in zip(losses["hora"], losses["ddp"]))
    # parameters only: with several ranks, DDP's buffers (BatchNorm statistics) are rank 0's, hora's each rank's
    ok = ok and all(torch.allclose(a.float(), b.float(), rtol=1e-3, atol=1e-4)
                    for a, b in zip(arms["hora"][0].parameters(), arms["ddp"][0].parameters()))
    ok = ok and losses["ddp"][-1] != losses["ddp"][0]  # the steps did train
    log("check (%d deterministic steps each from the same weights): losses hora %s, DDP %s: %s" % (
        args.check_steps, " ".join("%.6f" % v for v in losses["hora"]), " ".join("%.6f" % v for v in losses["ddp"]),
        "agree" if ok else "DISAGREE"))

    if not ok and rank != 0:
        print("rank %d: check FAILED: losses hora %s, DDP %s" % (rank, losses["hora"], losses["ddp"]), file=sys.stderr)
    ratio = med["hora"] / med["ddp"]
    log("RESULT hora/DDP step time: %.4f (target <= %.2f) %s" % (ratio, TARGET,
                                                                 "MET" if ratio <= TARGET else "NOT MET"))
    log("RESULT model=%s batch=%d image=%d ranks=%d amp=%d hora_ms=%.3f ddp_ms=%.3f hora_mean_ms=%.3f ddp_mean_ms=%.3f "
        "ratio=%.4f pair_ratio=%.4f check=%s" % (model_name, args.batch_size, args.image_size, size, int(args.amp),
                                                 med["hora"], med["ddp"], mean["hora"], mean["ddp"], ratio, pair,
                                                 "ok" if ok else "FAILED"))
    dist.destroy_process_group()
    hvd.shutdown()
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description="hora.torch DistributedOptimizer vs DDP (NCCL) on the GPU")
    p.add_argument("-np", type=int, default=1, help="ranks, one GPU each (default 1)")
    p.add_argument("--model", default="resnet50", choices=["resnet50", "cnn"],
                   help="torchvision resnet50 (the built-in CNN if torchvision is missing) or a small built-in CNN")
    p.add_argument("--batch-size", type=int, default=64, help="images per rank")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--amp", action="store_true", help="forward and loss under torch.autocast(bfloat16)")
    p.add_argument("--warmup", type=int, default=10, help="warm-up steps per arm")
    p.add_argument("--blocks", type=int, default=10, help="timed blocks per arm")
    p.add_argument("--steps", type=int, default=20, help="steps per block")
    p.add_argument("--check-steps", type=int, default=3, help="steps per arm of the deterministic check")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="smoke run: 2 warm-up steps, 2 blocks of 3 steps")
    p.add_argument("--timeout", type=float, default=1200, help="-np > 1: seconds before the ranks are killed")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help=argparse.SUPPRESS)  # cpu: gloo, debug
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:
        args.warmup, args.blocks, args.steps = 2, 2, 3
    if args.check_steps < 2:
        p.error("--check-steps must be at least 2")
    if args.worker:
        return worker(args)
    import torch
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("no CUDA device visible to torch %s: this benchmark needs a GPU (exit 77, skipped)"
                  % torch.__version__, file=sys.stderr)
            return 77
        if args.np > torch.cuda.device_count():
            print("-np %d needs %d GPUs (one per rank; NCCL refuses two ranks on one GPU), %d visible"
                  % (args.np, args.np, torch.cuda.device_count()), file=sys.stderr)
            return 2
    if args.np > 1:
        return launch(args, __file__, omp_threads=None)
    # one rank, in this process: hora's identity and torch's rendezvous for world size 1
    os.environ.update(HORA_RANK="0", HORA_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                      RANK="0", WORLD_SIZE="1")
    return worker(args)


if __name__ == "__main__":
    raise SystemExit(main())
