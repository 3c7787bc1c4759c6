"""hora.torch.parallel.Pipeline (GPipe and 1F1B) on 2 and 3 stages: a few
SGD steps give the parameters of the same model trained in one process on
the same data; 1F1B keeps at most p-s micro-batches alive where GPipe keeps
all m; autocast bf16 activations flow between stages; gradient accumulation
over two steps matches one step on the doubled batch."""
import copy

import torch

import hora.torch as hvd
from hora.torch.parallel import Pipeline


def _model(seed=0, width=16, layers=6):
    torch.manual_seed(seed)
    mods = []
    for i in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    mods.append(torch.nn.Linear(width, 3))
    return torch.nn.Sequential(*mods)


def _split(model, p, s):
    """Stage s of p: a contiguous slice of the Sequential's modules."""
    mods = list(model.children())
    bounds = [round(i * len(mods) / p) for i in range(p + 1)]
    return torch.nn.Sequential(*[copy.deepcopy(m) for m in mods[bounds[s]:bounds[s + 1]]]), (bounds[s], bounds[s + 1])


def _data(step, rows=24, width=16):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(rows, width, generator=g), torch.randint(0, 3, (rows,), generator=g)


def _train(rank, size, schedule, m, steps=3, accumulate=1, autocast=False):
    full = _model()
    ref = copy.deepcopy(full)
    stage, (lo, hi) = _split(full, size, rank)
    pipe = Pipeline(stage, loss_fn=torch.nn.functional.cross_entropy, schedule=schedule)
    opt = torch.optim.SGD(stage.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    stats = []
    for step in range(steps):
        for k in range(accumulate):
            x, y = _data(step * accumulate + k)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                st = pipe.train_step(inputs=x if pipe.is_first else None, targets=y if pipe.is_last else None,
                                     num_microbatches=m, scale_loss=lambda loss: loss / accumulate)
                stats.append(st)
                ref_loss = torch.nn.functional.cross_entropy(ref(x), y) / accumulate
            ref_loss.backward()
        opt.step()
        opt.zero_grad()
        ref_opt.step()
        ref_opt.zero_grad()
    ref_params = [p for mod in list(ref.children())[lo:hi] for p in mod.parameters()]
    return list(stage.parameters()), ref_params, stats


def _b_pipeline_matches_one_process(rank, size):
    for schedule in ("gpipe", "1f1b"):
        for m in (1, 4):
            got, want, stats = _train(rank, size, schedule, m)
            assert len(got) == len(want) and len(got) > 0
            for a, b in zip(got, want):
                assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (schedule, m, (a - b).abs().max())
            peak = stats[-1].peak_live
            if schedule == "gpipe":
                assert peak == m, (schedule, m, peak)
            else:
                assert peak == min(m, size - rank), (schedule, m, peak)
            if rank == size - 1:
                assert stats[-1].loss is not None and stats[-1].loss > 0
    # gradient accumulation: two train_steps per optimizer step
    got, want, _ = _train(rank, size, "1f1b", 2, steps=2, accumulate=2)
    for a, b in zip(got, want):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a - b).abs().max()
    # bf16 autocast: activations travel as bf16; results close to one process's
    got, want, stats = _train(rank, size, "1f1b", 4, steps=1, autocast=True)
    for a, b in zip(got, want):
        assert torch.allclose(a, b, rtol=5e-2, atol=5e-2), (a - b).abs().max()


def test_pipeline_two_stages(pool2):
    pool2.run(_b_pipeline_matches_one_process)


def test_pipeline_three_stages(pool3):
    pool3.run(_b_pipeline_matches_one_process)


def _b_bad_arguments(rank, size):
    import pytest
    stage = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match="schedule"):
        Pipeline(stage, loss_fn=torch.nn.functional.mse_loss, schedule="zigzag")
    pipe = Pipeline(stage, loss_fn=torch.nn.functional.mse_loss)
    with pytest.raises(ValueError, match="divide"):
        pipe.train_step(inputs=torch.ones(5, 4), targets=torch.ones(5, 4), num_microbatches=2)
    hvd.barrier()


def test_pipeline_arguments(pool2):
    pool2.run(_b_bad_arguments)
