"""hora.torch with CUDA tensors, end to end through libhora and the GPU plugin
(libhora_cuda.so). Skipped where torch sees no CUDA device (CI); run on the GPU
machine by scripts/gpu_check.sh.

At world size 1 the collectives go through NCCL; at 2 ranks both ranks share
GPU 0, which NCCL refuses, so hora's auto mode stages them through host memory
(docs/gpu.md). Every result is checked against the same computation on the CPU,
and every output must be on the input's device."""

import pytest
import torch

import hora.torch as hvd
from harness import RankPool

from test_torch_ops import FLOAT_DTYPES, INT_DTYPES, _data  # the CPU suite's dtypes and data

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch")


def _dev():
    return torch.device("cuda", 0)


def _on_dev(t):
    assert t.is_cuda and t.device == _dev(), "output on %s, input on %s" % (t.device, _dev())


def _b_collectives(rank, size):
    dev = _dev()
    for dt in FLOAT_DTYPES + INT_DTYPES:
        x = _data(rank, dt).to(dev)
        parts = [_data(r, dt).double() for r in range(size)]
        want = {hvd.Sum: sum(parts), hvd.Min: torch.stack(parts).min(0).values,
                hvd.Max: torch.stack(parts).max(0).values}
        if dt in FLOAT_DTYPES:
            want[hvd.Average] = sum(parts) / size
        for op, expect in want.items():
            out = hvd.allreduce(x, op=op, name="cuda.ar.%s.%s" % (dt, op))
            _on_dev(out)
            assert out.dtype == x.dtype and out.shape == x.shape
            assert torch.equal(out.cpu().double(), expect.to(x.dtype).double()), (dt, op, out, expect)
        y = x.clone()
        assert hvd.allreduce_(y, op=hvd.Sum, name="cuda.ar_.%s" % dt) is y
        assert torch.equal(y.cpu().double(), sum(parts).to(x.dtype).double()), dt
    # prescale / postscale
    x = torch.full((257,), float(rank + 1), device=dev)
    total = float(sum(range(1, size + 1)))
    out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=1.5, name="cuda.scaled")
    assert torch.allclose(out.cpu(), torch.full((257,), total * 3.0)), out
    # A fused group: many tensors of several shapes and dtypes in one call.
    shapes = [(1,), (7,), (33, 3), (1024,), (5, 5, 5)]
    tensors = [(_data(rank, "float32", s) * (i + 1)).to(dev) for i, s in enumerate(shapes)]
    outs = hvd.grouped_allreduce(tensors, op=hvd.Sum, name="cuda.group")
    for i, (s, o) in enumerate(zip(shapes, outs)):
        _on_dev(o)
        expect = sum(_data(r, "float32", s) * (i + 1) for r in range(size))
        assert torch.equal(o.cpu(), expect), (i, o, expect)
    # broadcast from every root
    for root in range(size):
        b = torch.full((3, 4), float(rank * 10 + 1), device=dev)
        out = hvd.broadcast(b, root_rank=root, name="cuda.bcast.%d" % root)
        _on_dev(out)
        assert torch.equal(out.cpu(), torch.full((3, 4), float(root * 10 + 1))), (root, out)
    # allgather with an uneven first dimension
    g = torch.full((rank + 1, 3), float(rank), device=dev)
    out = hvd.allgather(g, name="cuda.gather")
    _on_dev(out)
    expect = torch.cat([torch.full((r + 1, 3), float(r)) for r in range(size)])
    assert torch.equal(out.cpu(), expect), out
    # alltoall with splits: rank r sends (peer + 1) rows to each peer
    splits = [p + 1 for p in range(size)]
    rows = sum(splits)
    a = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) + 1000 * rank
    out = hvd.alltoall(a.to(dev), splits=torch.tensor(splits), name="cuda.a2a")
    if isinstance(out, tuple):
        out = out[0]
    _on_dev(out)
    first = sum(splits[:rank])
    expect = torch.cat([(torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) + 1000 * r)
                        [first:first + splits[rank]] for r in range(size)])
    assert torch.equal(out.cpu(), expect), (out, expect)
    # reducescatter (sum) of 2*size rows
    rs = (torch.arange(2 * size * 3, dtype=torch.float32).reshape(2 * size, 3) + rank)
    out = hvd.reducescatter(rs.to(dev), op=hvd.Sum, name="cuda.rs")
    _on_dev(out)
    full = sum(torch.arange(2 * size * 3, dtype=torch.float32).reshape(2 * size, 3) + r for r in range(size))
    assert torch.equal(out.cpu(), full[2 * rank:2 * rank + 2]), out
    return "ok"


def _b_ready_event(rank, size):
    """A tensor still being produced on the current stream when it is handed
    to hora: hora.torch records an event, hora's stream waits for it."""
    dev = _dev()
    gen = torch.Generator(device=dev)
    gen.manual_seed(1234)
    a = torch.randn(2048, 2048, device=dev, generator=gen)
    for i in range(3):
        y = (a @ a).sum(dim=0) * (rank + 1)  # queued, not finished, when submitted
        out = hvd.allreduce(y, op=hvd.Sum, name="cuda.ready.%d" % i)
        base = (a @ a).sum(dim=0)
        expect = sum(base * (r + 1) for r in range(size))
        assert torch.allclose(out, expect, rtol=1e-5, atol=1e-3), (out - expect).abs().max()
    return "ok"


def _b_optimizer(rank, size):
    """DistributedOptimizer on a CUDA model equals full-batch SGD on the CPU."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    ref.load_state_dict(model.state_dict())
    model = model.to(_dev())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(4):
        batches = []
        for r in range(size):
            g = torch.Generator().manual_seed(100 * step + r)
            batches.append((torch.randn(6, 8, generator=g), torch.randn(6, 2, generator=g)))
        x, t = batches[rank]
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x.to(_dev())), t.to(_dev())).backward()
        opt.step()
        ref_opt.zero_grad()
        loss = sum(torch.nn.functional.mse_loss(ref(bx), bt) for bx, bt in batches) / size
        loss.backward()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert p.is_cuda
        assert torch.allclose(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6), (name, p, q)
    return "ok"


def _b_p2p_staged(rank, size):
    """Send/recv of CUDA tensors through hora.torch's default (staged) path."""
    if size < 2:
        return "skipped"
    dev = _dev()
    if rank == 0:
        hvd.send(torch.arange(1000, dtype=torch.float32, device=dev) * 3, dst=1, tag=5)
        back = torch.empty(4, dtype=torch.int64, device=dev)
        hvd.recv(back, src=1, tag=6)
        assert torch.equal(back.cpu(), torch.tensor([9, 8, 7, 6])), back
    elif rank == 1:
        buf = torch.zeros(1000, dtype=torch.float32, device=dev)
        hvd.recv(buf, src=0, tag=5)
        assert torch.equal(buf.cpu(), torch.arange(1000, dtype=torch.float32) * 3), buf
        hvd.send(torch.tensor([9, 8, 7, 6], device=dev), dst=0, tag=6)
    return "ok"


_SLEEP_CYCLES_PER_S = []


def _gpu_sleep(seconds):
    """Keeps the current stream busy for about `seconds`: torch.cuda._sleep
    spins for a number of GPU clock cycles, whose rate is measured once."""
    if not _SLEEP_CYCLES_PER_S:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 50_000_000
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _SLEEP_CYCLES_PER_S.append(cycles / (start.elapsed_time(end) / 1000.0))
    torch.cuda._sleep(int(seconds * _SLEEP_CYCLES_PER_S[0]))


def _b_reused_output_block(rank, size):
    """An output block the caller freed on its stream while kernels queued
    there still read it. torch's caching allocator hands such a block to the
    next allocation on that stream at once (later work on the stream is
    ordered after the reads); hora writes it on its own stream, so it must
    wait for the event recorded after the allocation (options.alloc_event).

    Stream S: [sleep 0.2 s] (A's ready event) [sleep 0.6 s] [keep <- x]; x is
    freed right after. Allreduce A's input is produced after the first sleep;
    allgather B, submitted next, gets its output once the ranks agreed, with
    x's block. Without the wait, B's result lands in x's block at about
    0.2 s, before the queued copy read x at 0.8 s, and `keep` holds B's data
    instead of 7s. Three rounds: one-time set-up in the first (a process's
    first collectives of a kind) can hold the host until the stream drained,
    which hides the case; the later rounds meet it (measured on an H200:
    every element of the block overwritten without the event)."""
    dev = _dev()
    reused = 0
    for rnd in range(3):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # no other free block of x's size to pick instead
        n = 262147  # elements per rank, an odd size no other test leaves behind
        g = torch.full((n,), float(rank + 1), device=dev)
        x = torch.full((size * n,), 7.0, device=dev)  # exactly the allgather's output size
        keep = torch.zeros_like(x)
        x_ptr = x.data_ptr()
        y = torch.ones(16, device=dev)
        torch.cuda.synchronize()
        _gpu_sleep(0.2)
        ha = hvd.allreduce_async(y * 2, op=hvd.Sum, name="cuda.reuse.a.%d" % rnd)
        hb = hvd.allgather_async(g, name="cuda.reuse.b.%d" % rnd)
        _gpu_sleep(0.6)
        keep.copy_(x)
        del x
        out = hvd.synchronize(hb)
        assert torch.equal(hvd.synchronize(ha).cpu(), torch.full((16,), 2.0 * size))
        torch.cuda.synchronize()
        reused += out.data_ptr() == x_ptr
        bad = int((keep != 7.0).sum())
        assert bad == 0, "round %d: %d of %d elements of the freed block were overwritten before the " \
            "queued copy read them" % (rnd, bad, keep.numel())
        expect = torch.cat([torch.full((n,), float(r + 1)) for r in range(size)])
        assert torch.equal(out.cpu(), expect)
    assert reused > 0, "the allocator never handed x's block to the output: the case did not occur"
    return "ok"


@pytest.fixture(scope="module", params=[1, 2], ids=["nccl-1rank", "staged-2ranks-one-gpu"])
def cuda_pool(request):
    pool = RankPool(request.param, extra_env={"HORA_STALL_SHUTDOWN_TIME_S": 20})
    yield pool
    pool.close()


def test_cuda_collectives(cuda_pool):
    assert cuda_pool.run(_b_collectives, timeout=180) == ["ok"] * cuda_pool.size


def test_cuda_ready_event_orders_the_producer(cuda_pool):
    assert cuda_pool.run(_b_ready_event, timeout=120) == ["ok"] * cuda_pool.size


def test_cuda_distributed_optimizer(cuda_pool):
    assert cuda_pool.run(_b_optimizer, timeout=120) == ["ok"] * cuda_pool.size


def test_cuda_p2p_staged(cuda_pool):
    cuda_pool.run(_b_p2p_staged, timeout=60)


def test_cuda_output_block_freed_on_the_callers_stream_is_not_written_early(cuda_pool):
    assert cuda_pool.run(_b_reused_output_block, timeout=60) == ["ok"] * cuda_pool.size
