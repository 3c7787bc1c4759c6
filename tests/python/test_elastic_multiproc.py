"""Elastic jobs under horarun (docs/elastic.md): a rank dies mid-training and the
survivors re-form and finish from the last commit.

It skips only when libhora lacks the elastic calls or horarun is not built.
The training script is the docs/elastic.md example shape; every survivor
prints its final size and a checksum of its model, which must agree."""
import os
import re
import subprocess
import sys

import pytest

from harness import HORARUN, PYTHON, REPO, elastic_ready


_SCRIPT = r'''
import os, sys, zlib
import torch
import hora.torch as hvd

hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
if os.environ.get("LOCAL_SGD"):  # DiLoCo-style: every rank steps alone, outer Nesterov every 3 steps
    opt = hvd.LocalSGD(opt, sync_every=3, outer_lr=0.7, outer_momentum=0.9, nesterov=True)
else:
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
dataset = torch.utils.data.TensorDataset(torch.randn(96, 8), torch.randn(96, 1))
sampler = hvd.elastic.ElasticSampler(dataset, seed=1)
loader = torch.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler)
state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, batch=0)
state.register_reset_callbacks([lambda: [g.update(lr=0.01 * hvd.size()) for g in opt.param_groups]])
victim = os.environ.get("VICTIM_WORKER")

@hvd.elastic.run(reset_limit=3)
def train(state):
    while state.epoch < 2:
        for x, y in loader:
            if state.epoch == 0 and state.batch == 5 and os.environ.get("HORA_WORKER_ID") == victim:
                os._exit(17)  # dies between commits
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            sampler.record_batch(state.batch, 4)
            state.batch += 1
            if state.batch % 2 == 0:
                state.commit()
        state.epoch, state.batch = state.epoch + 1, 0
        sampler.set_epoch(state.epoch)
        state.commit()

train(state)
if os.environ.get("LOCAL_SGD"):
    opt.synchronize()  # the last round's average: equal models only if every rank had the same outer state
    print("LOCALSGD steps=%d syncs=%d" % (opt.steps, opt.syncs), flush=True)
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
print("RESULT size=%d crc=%d" % (hvd.size(), zlib.crc32(flat.numpy().tobytes())), flush=True)
hvd.shutdown()
'''


_READY, _WHY = elastic_ready()


@pytest.mark.skipif(not _READY, reason=_WHY or "elastic runtime not ready")
@pytest.mark.parametrize("local_sgd", [False, True], ids=["distributed_optimizer", "local_sgd"])
def test_survivors_finish_after_a_rank_dies(tmp_path, local_sgd):
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "bindings", "python"), OMP_NUM_THREADS="1",
               HORA_ELASTIC_SETTLE_MS="500", LOCAL_SGD="1" if local_sgd else "")
    # horarun names workers w0, w1, ... in start order.
    env["VICTIM_WORKER"] = "w2"
    proc = subprocess.run([HORARUN, "-np", "3", "--min-np", "2", PYTHON, str(script)], env=env,
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    results = re.findall(r"RESULT size=(\d+) crc=(\d+)", out)
    assert len(results) == 2, "expected two survivors to finish:\n" + out[-6000:]
    assert {r[0] for r in results} == {"2"}, out[-6000:]
    assert len({r[1] for r in results}) == 1, "survivors' models differ:\n" + out[-6000:]
    assert "reset 1" in out, "no reset was logged:\n" + out[-6000:]
    if local_sgd:  # both survivors counted the same steps and rounds (rank 0's after the re-form)
        counters = re.findall(r"LOCALSGD (steps=\d+ syncs=\d+)", out)
        assert len(counters) == 2 and len(set(counters)) == 1, out[-6000:]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([os.path.abspath(__file__), "-q"]))
