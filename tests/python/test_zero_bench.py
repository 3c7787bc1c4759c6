"""bench/zero_bench.py --quick on 2 ranks, as a user runs it (~10 s): every
section prints its table and the bench's own correctness checks pass (exit
0). Timings are printed, never checked."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
BENCH = os.path.join(REPO, "bench", "zero_bench.py")


def test_zero_bench_quick_passes_its_checks_and_prints_every_table():
    pytest.importorskip("torch")
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "bindings", "python"), OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, BENCH, "-np", "2", "--quick", "--timeout", "120"], env=env,
                       capture_output=True, text=True, timeout=180)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-6000:]
    for row in ("| 2 | hora ZeroOptimizer stage 2 |", "| 2 | torch DDP + ZeroRedundancyOptimizer |",
                "| 2 | torch Adam (unsharded) |", "| 2 | LocalSGD k=2 |"):
        assert row in out, out[-6000:]
    assert "CHECK FAILED" not in out, out[-6000:]
