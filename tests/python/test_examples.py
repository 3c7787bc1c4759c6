"""The Horovod-shaped examples run under horarun as a user runs them
(issue 13): the synthetic benchmark (Horovod's flags and output) and the
MNIST-like script on synthetic data, briefly, at 2 ranks, with fp16
compression too. The elastic example has its own test (test_elastic_example)."""
import os
import subprocess

import pytest

from harness import PYTHON, REPO

HORARUN = os.path.join(REPO, "build", "launcher", "horarun")
EXAMPLES = os.path.join(REPO, "examples")


def _run(args, timeout=180):
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "bindings", "python"), OMP_NUM_THREADS="1")
    proc = subprocess.run([HORARUN, "-np", "2", PYTHON] + args, env=env, capture_output=True, text=True,
                          timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    return out


@pytest.mark.skipif(not os.access(HORARUN, os.X_OK), reason="horarun not built")
@pytest.mark.parametrize("extra", [[], ["--fp16-allreduce"]])
def test_synthetic_benchmark_runs_as_horovods(extra):
    out = _run([os.path.join(EXAMPLES, "pytorch_synthetic_benchmark.py"), "--model", "mlp", "--num-warmup-batches",
                "1", "--num-batches-per-iter", "2", "--num-iters", "2", "--batch-size", "8"] + extra)
    assert "Img/sec per" in out or "img/sec per" in out.lower(), out[-3000:]


@pytest.mark.skipif(not os.access(HORARUN, os.X_OK), reason="horarun not built")
def test_mnist_like_example_trains():
    out = _run([os.path.join(EXAMPLES, "pytorch_mnist_like.py"), "--epochs", "1", "--samples-per-rank", "128"])
    assert out.count("average loss") == 2 and "parameters identical on all ranks: True" in out, out[-3000:]
