"""examples/fsdp_train.py under horarun as a user runs it: FullyShardedModule
(a small transformer: Embedding, LayerNorm, MultiheadAttention, Linear) against
DistributedOptimizer on 2-4 ranks, hybrid, bfloat16 and with clipping; each
rank prints its shard bytes and the most gathered bytes it held at once."""
import os
import re

import pytest

from harness import HORARUN, run_example


@pytest.mark.skipif(not os.access(HORARUN, os.X_OK), reason="horarun not built")
@pytest.mark.parametrize("np,args,shard_over", [(2, [], 2), (3, ["--clip", "0.5"], 3), (4, ["--hybrid", "2"], 2),
                                                (2, ["--bf16"], 2)])
def test_fsdp_example_matches_distributed_optimizer(np, args, shard_over):
    out = run_example(np, "fsdp_train.py", args + ["--steps", "3"])
    assert "parameters match DistributedOptimizer: True" in out, out[-3000:]
    rows = re.findall(r"parameter shards (\d+) bytes vs (\d+) unsharded .*?gathered at most (\d+) bytes at once, "
                      r"largest unit (\d+) bytes", out)
    assert len(rows) == np, out[-3000:]
    for shard, full, gathered, largest in (tuple(map(int, r)) for r in rows):
        # 1/N of the parameters, plus the padding of each unit to a multiple of N
        assert full / shard_over <= shard <= full / shard_over * 1.01, (shard, full)
        # never more than the unit in use and the one prefetched
        assert largest <= gathered <= 2 * largest, (gathered, largest)
