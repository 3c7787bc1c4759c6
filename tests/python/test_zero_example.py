"""examples/zero_train.py under horarun as a user runs it: ZeroOptimizer
(stages 1 and 2, Adam and SGD, with clipping) against DistributedOptimizer
on 2 and 3 ranks; each run prints the per-rank state bytes and whether the
parameters matched."""
import os
import re

import pytest

from harness import HORARUN, run_example


def _run(np, args, timeout=240):
    return run_example(np, "zero_train.py", args, timeout)


@pytest.mark.skipif(not os.access(HORARUN, os.X_OK), reason="horarun not built")
@pytest.mark.parametrize("np,args", [(2, []), (2, ["--stage", "1", "--optimizer", "sgd", "--clip", "0.5"]),
                                     (3, ["--clip", "0.5"])])
def test_zero_example_matches_distributed_optimizer(np, args):
    out = _run(np, args + ["--steps", "3"])
    assert "parameters match DistributedOptimizer: True" in out, out[-3000:]
    if np == 2:  # two ranks: the sums do not depend on the order, the parameters are equal bitwise
        assert "(bitwise: True, 2 ranks)" in out, out[-3000:]
    ratios = [(int(a), int(b)) for a, b in re.findall(r"optimizer state (\d+) bytes vs (\d+) unsharded", out)]
    assert len(ratios) == np, out[-3000:]
    for mine, full in ratios:  # about 1/N: the padding of each bucket to a multiple of N is all that is added
        assert full / np <= mine <= full / np * 1.01, (mine, full)


@pytest.mark.skipif(not os.access(HORARUN, os.X_OK), reason="horarun not built")
def test_zero_example_bench_mode_prints_its_table():
    out = _run(2, ["--bench", "--bench-steps", "2", "--width", "32"])
    for row in ("| DistributedOptimizer |", "| ZeRO-1 |", "| ZeRO-2 |"):
        assert row in out, out[-3000:]
