"""examples/pipeline_train.py under horarun as a user runs it: 2 stages on
2 ranks (GPipe and 1F1B), and 2 stages x 2 data-parallel replicas on 4
ranks; each run checks its parameters against one-process training."""
import os

import pytest

from harness import HORARUN, run_example


def _run(np, args, timeout=240):
    return run_example(np, "pipeline_train.py", args, timeout)


@pytest.mark.skipif(not os.access(HORARUN, os.X_OK), reason="horarun not built")
@pytest.mark.parametrize("np,args", [(2, ["--schedule", "gpipe"]), (2, ["--schedule", "1f1b"]),
                                     (4, ["--stages", "2", "--microbatches", "2"])])
def test_pipeline_example_matches_one_process(np, args):
    out = _run(np, args + ["--steps", "3"])
    assert "pipeline matches the single-process model: True" in out, out[-3000:]


@pytest.mark.skipif(not os.access(HORARUN, os.X_OK), reason="horarun not built")
def test_pipeline_bench_mode_prints_its_table():
    out = _run(2, ["--bench", "--bench-m", "1", "4", "--bench-steps", "1", "--width", "32"])
    assert "| 1f1b | 4 |" in out and "| gpipe | 1 |" in out, out[-3000:]
