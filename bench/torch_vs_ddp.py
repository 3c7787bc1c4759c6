"""hora.torch against torch.distributed (gloo) in one job, same model, batch and ranks.

    /usr/bin/python3 bench/torch_vs_ddp.py -np 2            # starts the ranks itself
    /usr/bin/python3 bench/torch_vs_ddp.py -np 2 --quick    # CI-sized

Two sections, hora and torch alternating block by block so that load from
other processes hits both about equally:

1. training throughput (img/sec per rank) of the synthetic-benchmark model
   with hora's DistributedOptimizer vs torch.nn.parallel.DistributedDataParallel
   (gloo backend); ratio hora/DDP (target >= 1.0);
2. allreduce-only ResNet-50 gradient step (161 tensors from
   bench/resnet50_grad_shapes.txt, 25.6M float32): every tensor reduced
   asynchronously then all waited for, through hora.torch (allreduce_async_,
   the core fuses) vs torch.distributed.all_reduce(async_op=True) per tensor
   and vs DDP-style 25 MB flattened buckets; ms/step and ratio hora/torch
   (target <= 0.8 of DDP's communication time). Results are checked.

Rank 0 prints a RESULT line per section. Each rank is a subprocess with both
hora's HORA_* contract and torch.distributed's MASTER_ADDR/PORT.
"""
import argparse
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args, script=None, omp_threads="1"):
    """Starts args.np ranks of `script` (default this one) with "--worker" and
    this command's arguments, with both hora's HORA_* contract and
    torch.distributed's MASTER_ADDR/PORT; rank 0's output shows. Returns the
    first non-zero exit status, 124 past args.timeout. bench/torch_gpu_vs_ddp.py
    starts its ranks with it too."""
    hora_port, torch_port, secret = free_port(), free_port(), os.urandom(8).hex()
    pythonpath = os.path.join(REPO, "bindings", "python") + os.pathsep + os.environ.get("PYTHONPATH", "")
    procs = []
    for r in range(args.np):
        env = dict(os.environ, HORA_RANK=str(r), HORA_SIZE=str(args.np), HORA_STORE_ADDR="127.0.0.1",
                   HORA_STORE_PORT=str(hora_port), HORA_SECRET=secret, MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(torch_port), RANK=str(r), WORLD_SIZE=str(args.np), PYTHONPATH=pythonpath)
        if omp_threads:
            env["OMP_NUM_THREADS"] = omp_threads
        cmd = [sys.executable, os.path.abspath(script or __file__), "--worker"] + sys.argv[1:]
        procs.append(subprocess.Popen(cmd, env=env, stdout=None if r == 0 else subprocess.DEVNULL))
    deadline = time.time() + args.timeout
    rc = 0
    for p in procs:
        try:
            rc = rc or p.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            rc = 124
    for p in procs:
        if p.poll() is None:
            p.kill()
    return rc


def read_shapes(path):
    shapes = []
    for line in open(path):
        line = line.strip()
        if line and not line.startswith("#"):
            shapes.append(tuple(int(d) for d in line.split("x")))
    return shapes


def worker(args):
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import hora.torch as hvd
    sys.path.insert(0, os.path.join(REPO, "examples"))
    from pytorch_synthetic_benchmark import build_model

    torch.set_num_threads(1)
    hvd.init()
    dist.init_process_group("gloo")
    rank, size = hvd.rank(), hvd.size()

    def log(*a):
        if rank == 0:
            print(*a, flush=True)

    # ---- 1. training throughput
    image = args.image_size
    torch.manual_seed(0)
    data = torch.randn(args.batch_size, 3, image, image)
    target = torch.LongTensor(args.batch_size).random_() % 1000

    m_hora = build_model(args.model, image)
    opt_h = hvd.DistributedOptimizer(torch.optim.SGD(m_hora.parameters(), lr=0.01),
                                     named_parameters=m_hora.named_parameters())
    hvd.broadcast_parameters(m_hora.state_dict(), 0)
    m_ddp_inner = build_model(args.model, image)
    m_ddp_inner.load_state_dict(m_hora.state_dict())
    m_ddp = torch.nn.parallel.DistributedDataParallel(m_ddp_inner)
    opt_d = torch.optim.SGD(m_ddp.parameters(), lr=0.01)

    def step_hora():
        opt_h.zero_grad()
        F.cross_entropy(m_hora(data), target).backward()
        opt_h.step()

    def step_ddp():
        opt_d.zero_grad()
        F.cross_entropy(m_ddp(data), target).backward()
        opt_d.step()

    for _ in range(args.warmup):
        step_hora()
        step_ddp()
    rates = {"hora": [], "ddp": []}
    for it in range(args.iters):
        for name, fn in (("hora", step_hora), ("ddp", step_ddp)) if it % 2 == 0 else (("ddp", step_ddp), ("hora", step_hora)):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(args.batches_per_iter):
                fn()
            rates[name].append(args.batch_size * args.batches_per_iter / (time.perf_counter() - t0))
    # the two copies trained identically: same parameters up to float noise
    diff = max((a - b).abs().max().item() for a, b in zip(m_hora.parameters(), m_ddp.module.parameters()))
    h, d = np.mean(rates["hora"]), np.mean(rates["ddp"])
    log("training (%s, batch %d, image %d, %d ranks): hora %.1f +-%.1f img/sec per rank, DDP %.1f +-%.1f; "
        "hora/DDP = %.3f; max |param diff| = %.2e" % (args.model, args.batch_size, image, size, h,
                                                      1.96 * np.std(rates["hora"]), d, 1.96 * np.std(rates["ddp"]),
                                                      h / d, diff))
    log("RESULT section=train model=%s batch=%d ranks=%d hora_img_sec=%.2f ddp_img_sec=%.2f ratio=%.4f param_diff=%.3e"
        % (args.model, args.batch_size, size, h, d, h / d, diff))

    # ---- 2. allreduce-only ResNet-50 gradient step
    shapes = read_shapes(args.shapes)[::-1]  # backward order
    grads = [torch.empty(s) for s in shapes]
    total = sum(g.numel() for g in grads)

    def fill(it):
        for i, g in enumerate(grads):
            g.fill_(float((rank + 1) * (i % 5 + 1) + it % 3))

    def expect(i, it):
        return float(sum((r + 1) * (i % 5 + 1) + it % 3 for r in range(size)))

    def check(it):
        for i in (0, len(grads) // 2, len(grads) - 1):
            if grads[i].view(-1)[0].item() != expect(i, it) or grads[i].view(-1)[-1].item() != expect(i, it):
                raise SystemExit("wrong allreduce result in tensor %d" % i)

    def hora_step(it):
        hs = [hvd.allreduce_async_(g, name="g%d" % i, op=hvd.Sum) for i, g in enumerate(grads)]
        for h_ in hs:
            hvd.synchronize(h_)

    def torch_step(it):
        works = [dist.all_reduce(g, async_op=True) for g in grads]
        for w in works:
            w.wait()

    bucket_elems = 25 * 1024 * 1024 // 4
    buckets, cur, n = [], [], 0
    for g in grads:
        cur.append(g)
        n += g.numel()
        if n >= bucket_elems:
            buckets.append(cur)
            cur, n = [], 0
    if cur:
        buckets.append(cur)
    flats = [torch.empty(sum(g.numel() for g in b)) for b in buckets]

    def bucket_step(it):
        works = []
        for b, flat in zip(buckets, flats):
            torch.cat([g.view(-1) for g in b], out=flat)
            works.append(dist.all_reduce(flat, async_op=True))
        for b, flat, w in zip(buckets, flats, works):
            w.wait()
            off = 0
            for g in b:
                g.view(-1).copy_(flat[off:off + g.numel()])
                off += g.numel()

    times = {"hora": [], "torch_per_tensor": [], "torch_bucketed": []}
    variants = [("hora", hora_step), ("torch_per_tensor", torch_step), ("torch_bucketed", bucket_step)]
    for it in range(args.steps + 1):
        order = variants if it % 2 == 0 else variants[::-1]
        for name, fn in order:
            fill(it)
            dist.barrier()
            t0 = time.perf_counter()
            fn(it)
            dt = time.perf_counter() - t0
            check(it)
            if it > 0:  # the first round is warm-up
                times[name].append(dt * 1000)
    ms = {k: float(np.mean(v)) for k, v in times.items()}
    best_torch = min(ms["torch_per_tensor"], ms["torch_bucketed"])
    log("ResNet-50 gradient allreduce (%d tensors, %.1f M float32, %d ranks): hora %.1f ms, torch per-tensor %.1f ms, "
        "torch 25MB buckets %.1f ms; hora/best torch = %.3f" % (len(grads), total / 1e6, size, ms["hora"],
                                                                ms["torch_per_tensor"], ms["torch_bucketed"],
                                                                ms["hora"] / best_torch))
    log("RESULT section=resnet50_allreduce ranks=%d hora_ms=%.2f torch_per_tensor_ms=%.2f torch_bucketed_ms=%.2f "
        "ratio_vs_best=%.4f" % (size, ms["hora"], ms["torch_per_tensor"], ms["torch_bucketed"], ms["hora"] / best_torch))
    dist.destroy_process_group()
    hvd.shutdown()
    return 0


def main():
    p = argparse.ArgumentParser(description="hora.torch vs torch.distributed (gloo)")
    p.add_argument("-np", type=int, default=2)
    p.add_argument("--model", default="cnn")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=6)
    p.add_argument("--batches-per-iter", type=int, default=5)
    p.add_argument("--steps", type=int, default=5, help="ResNet-50 allreduce steps")
    p.add_argument("--shapes", default=os.path.join(HERE, "resnet50_grad_shapes.txt"))
    p.add_argument("--quick", action="store_true", help="fewer iterations (smoke run)")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:
        args.warmup, args.iters, args.batches_per_iter, args.steps = 1, 2, 2, 1
    if args.worker:
        return worker(args)
    return launch(args)


if __name__ == "__main__":
    raise SystemExit(main())
