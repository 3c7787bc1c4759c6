"""hora.jax: JAX arrays through libhora by DLPack, on the CPU and, where JAX
sees one, on the GPU (NCCL at world size 1; staged through host memory at 2
ranks sharing GPU 0, docs/gpu.md). Skipped where JAX is not installed (CI:
Debian has no JAX); run on the GPU machine by scripts/gpu_check.sh.

Every result is checked on the host against NumPy, must be on the input's
device, and the input must be unchanged (JAX arrays are immutable)."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from harness import RankPool  # noqa: E402


def _devices():
    kinds = ["cpu"]
    try:
        if jax.devices("gpu"):
            kinds.append("gpu")
    except RuntimeError:
        pass
    return kinds


def _put(a, kind):
    return jax.device_put(jnp.asarray(a), jax.devices(kind)[0])


def _check_on(y, x):
    assert y.devices() == x.devices(), "result on %s, input on %s" % (y.devices(), x.devices())


def _b_collectives(rank, size, kind):
    import hora.jax as hj
    rows = 5
    for dt in (np.float32, np.int32, np.float16):
        base = (np.arange(rows * 3).reshape(rows, 3) % 7).astype(dt)
        parts = [base + r for r in range(size)]
        x = _put(parts[rank], kind)
        for op, want in ((hj.Sum, sum(p.astype(np.float64) for p in parts)),
                         (hj.Max, np.max(np.stack(parts), axis=0)),
                         (hj.Min, np.min(np.stack(parts), axis=0))):
            y = hj.allreduce(x, op=op, name="jax.%s.ar.%s.%s" % (kind, np.dtype(dt).name, op))
            _check_on(y, x)
            assert y.dtype == x.dtype and y.shape == x.shape
            np.testing.assert_array_equal(np.asarray(y).astype(np.float64), np.asarray(want, dtype=np.float64))
        np.testing.assert_array_equal(np.asarray(x), parts[rank])  # the input is untouched
    x = _put(np.full((4, 2), rank + 1.0, np.float32), kind)
    y = hj.allreduce(x, name="jax.%s.avg" % kind)  # Average, the default
    np.testing.assert_allclose(np.asarray(y), np.full((4, 2), (size + 1) / 2.0))
    # bfloat16 through DLPack
    xb = _put(np.full((8,), rank + 1.0, np.float32), kind).astype(jnp.bfloat16)
    yb = hj.allreduce(xb, op=hj.Sum, name="jax.%s.bf16" % kind)
    assert yb.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(yb.astype(jnp.float32)), np.full((8,), size * (size + 1) / 2.0))
    for root in range(size):
        b = _put(np.arange(6, dtype=np.float32) + 10 * rank, kind)
        y = hj.broadcast(b, root_rank=root, name="jax.%s.bcast.%d" % (kind, root))
        _check_on(y, b)
        np.testing.assert_array_equal(np.asarray(y), np.arange(6, dtype=np.float32) + 10 * root)
        np.testing.assert_array_equal(np.asarray(b), np.arange(6, dtype=np.float32) + 10 * rank)
    g = _put(np.full((rank + 1, 2), float(rank), np.float32), kind)
    y = hj.allgather(g, name="jax.%s.gather" % kind)
    _check_on(y, g)
    np.testing.assert_array_equal(np.asarray(y),
                                  np.concatenate([np.full((r + 1, 2), float(r), np.float32) for r in range(size)]))
    rs = np.arange(2 * size * 3, dtype=np.float32).reshape(2 * size, 3)
    y = hj.reducescatter(_put(rs + rank, kind), op=hj.Sum, name="jax.%s.rs" % kind)
    full = sum(rs + r for r in range(size))
    np.testing.assert_array_equal(np.asarray(y), full[2 * rank:2 * rank + 2])
    return "ok"


def _b_refuses_non_jax(rank, size):
    import hora.jax as hj
    try:
        hj.allreduce(np.ones(3), name="jax.numpy.input")
    except TypeError as e:
        assert "expected a jax.Array" in str(e), e
        return "ok"
    raise AssertionError("a NumPy array was accepted by hora.jax.allreduce")


@pytest.fixture(scope="module", params=[1, 2], ids=["1rank", "2ranks"])
def jax_pool(request):
    # JAX takes 75% of a GPU's memory per process by default; ranks share one.
    pool = RankPool(request.param, extra_env={"XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                                               "HORA_STALL_SHUTDOWN_TIME_S": 20})
    yield pool
    pool.close()


@pytest.mark.parametrize("kind", _devices())
def test_jax_collectives(jax_pool, kind):
    assert jax_pool.run(_b_collectives, kind, timeout=180) == ["ok"] * jax_pool.size


def test_jax_refuses_other_arrays(jax_pool):
    assert jax_pool.run(_b_refuses_non_jax, timeout=60) == ["ok"] * jax_pool.size
