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


def _run_np(np_, args, timeout=180):
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "bindings", "python"), OMP_NUM_THREADS="1")
    proc = subprocess.run([HORARUN, "-np", str(np_), PYTHON] + args, env=env, capture_output=True, text=True,
                          timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    return out


@pytest.mark.skipif(not os.access(HORARUN, os.X_OK), reason="horarun not built")
@pytest.mark.parametrize("np_,tp", [(2, 2), (4, 2)])
def test_tensor_parallel_example_matches_one_process(np_, tp):
    """issue 17: the TP (+ DP at 4 ranks) example trains and its shards equal the
    single-process reference's slices."""
    out = _run_np(np_, [os.path.join(EXAMPLES, "tensor_parallel_train.py"), "--tp", str(tp), "--steps", "12"])
    assert "tensor-parallel training matches the single-process reference: True" in out, out[-3000:]
    assert "world %d = tp %d x dp %d" % (np_, tp, np_ // tp) in out, out[-3000:]


@pytest.mark.skipif(not os.access(HORARUN, os.X_OK), reason="horarun not built")
def test_context_parallel_example_matches_one_process():
    """issue 17: the CP example's attention block, trained on a sequence split over
    2 ranks, ends with the single-process reference's weights."""
    out = _run_np(2, [os.path.join(EXAMPLES, "context_parallel_attention.py"), "--steps", "4"])
    assert "context-parallel attention matches the single-process reference: True" in out, out[-3000:]
