"""hora.torch answers as horovod.torch does (docs/horovod-compat.md): identity
and feature probes, the version string, Horovod's public names, and Horovod's
HOROVOD_* environment variables (docs/params.md) seen from a real job."""
import os
import re

import pytest

from harness import run_job

# Every public name of horovod.torch (horovod/torch/__init__.py, Horovod 0.28.1),
# plus is_homogeneous (in horovod.torch.mpi_ops).
HOROVOD_TORCH_NAMES = """
Adasum Average Compression DistributedOptimizer HorovodInternalError Max Min ProcessSet Product Sum SyncBatchNorm
add_process_set allgather allgather_async allgather_object allreduce allreduce_ allreduce_async allreduce_async_
alltoall alltoall_async barrier broadcast broadcast_ broadcast_async broadcast_async_ broadcast_object
broadcast_optimizer_state broadcast_parameters ccl_built cross_rank cross_size cuda_built ddl_built elastic
global_process_set gloo_built gloo_enabled grouped_allgather grouped_allgather_async grouped_allreduce
grouped_allreduce_ grouped_allreduce_async grouped_allreduce_async_ grouped_reducescatter grouped_reducescatter_async
init is_initialized join local_rank local_size mpi_built mpi_enabled mpi_threads_supported nccl_built poll rank
reducescatter reducescatter_async remove_process_set rocm_built shutdown size sparse_allreduce_async start_timeline
stop_timeline synchronize is_homogeneous
""".split()


def test_every_horovod_torch_name_exists():
    import hora.torch as hvd
    assert [n for n in HOROVOD_TORCH_NAMES if not hasattr(hvd, n)] == []


def test_compat_page_lists_every_name():
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "..", "docs", "horovod-compat.md")) as f:
        page = f.read()
    assert [n for n in HOROVOD_TORCH_NAMES if "`%s" % n not in page] == []


def test_version_says_hora():
    import hora
    import hora.torch as hvd
    assert hvd.__version__ == hora.__version__ + "+hora"
    assert re.fullmatch(r"\d+\.\d+\.\d+\+hora", hvd.__version__)


def test_probes_before_init():
    import hora.torch as hvd
    assert not hvd.is_initialized()
    assert hvd.gloo_built() and not hvd.mpi_built() and not hvd.mpi_enabled()
    assert not hvd.gloo_enabled()  # Horovod: the Gloo context is enabled by init()
    for fn in (hvd.rank, hvd.size, hvd.local_rank, hvd.local_size, hvd.cross_rank, hvd.cross_size,
               hvd.is_homogeneous):
        with pytest.raises(ValueError, match="init"):
            fn()
    # Horovod raises ValueError when MPI is not enabled (run with Gloo): so does hora.
    with pytest.raises(ValueError, match="MPI"):
        hvd.mpi_threads_supported()


def probes(rank, size):
    import hora.torch as hvd
    out = {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
           "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(), "homogeneous": hvd.is_homogeneous(),
           "gloo_enabled": hvd.gloo_enabled(), "mpi_enabled": hvd.mpi_enabled(), "nccl_built": hvd.nccl_built()}
    try:
        hvd.mpi_threads_supported()
        out["mpi_threads"] = "answered"
    except ValueError:
        out["mpi_threads"] = "ValueError"
    return out


def test_probes_after_init(pool2):
    for r, got in enumerate(pool2.run(probes)):
        assert got == {"rank": r, "size": 2, "local_rank": r, "local_size": 2, "cross_rank": 0, "cross_size": 1,
                       "homogeneous": True, "gloo_enabled": True, "mpi_enabled": False,
                       "nccl_built": got["nccl_built"], "mpi_threads": "ValueError"}
        assert isinstance(got["nccl_built"], int)


def homogeneity(rank, size):
    import hora.torch as hvd
    hvd.init()
    try:
        return [hvd.is_homogeneous(), hvd.local_size(), hvd.cross_size()]
    finally:
        hvd.shutdown()


def test_is_homogeneous_false_when_hosts_differ():
    # Hosts a:2, b:1 as horarun would number them (local rank, local size, cross rank, cross size).
    layout = {0: (0, 2, 0, 2), 1: (1, 2, 0, 1), 2: (0, 1, 1, 2)}
    env = {r: {"HORA_LOCAL_RANK": lr, "HORA_LOCAL_SIZE": ls, "HORA_CROSS_RANK": cr, "HORA_CROSS_SIZE": cs}
           for r, (lr, ls, cr, cs) in layout.items()}
    results, _ = run_job(homogeneity, 3, per_rank_env=env, timeout=90)
    assert [r[0] for r in results] == [False, False, False]
    results, _ = run_job(homogeneity, 2, timeout=90)
    assert [r[0] for r in results] == [True, True]


_TIMELINE = "/tmp/hora-compat-timeline-%d.json" % os.getuid()  # the same in the ranks (other processes)


def horovod_env_job(rank, size):
    """Identity and tuning from Horovod's names only; HORA_* wins where both are set."""
    os.environ.pop("HORA_LOCAL_RANK", None)
    os.environ.pop("HORA_LOCAL_SIZE", None)
    os.environ.update({"HOROVOD_LOCAL_RANK": str(rank), "HOROVOD_LOCAL_SIZE": str(size), "HOROVOD_CROSS_RANK": "0",
                       "HOROVOD_CROSS_SIZE": "1", "HOROVOD_CYCLE_TIME": "2", "HOROVOD_FUSION_THRESHOLD": "1048576",
                       "HOROVOD_TIMELINE": _TIMELINE, "HOROVOD_HIERARCHICAL_ALLGATHER": "1",
                       "HOROVOD_HIERARCHICAL_ALLREDUCE": "1",
                       "HOROVOD_AUTOTUNE": "1", "HOROVOD_RANK": "99"})
    import torch
    import hora.torch as hvd
    out = []
    for _ in range(2):  # two lifetimes: still one log line per process
        hvd.init()
        out.append([hvd.rank(), hvd.local_rank(), hvd.local_size()])
        assert hvd.allreduce(torch.ones(3), op=hvd.Sum).tolist() == [size] * 3
        hvd.barrier()
        hvd.shutdown()
    return out


def test_horovod_variables_are_honoured_and_logged_once():
    results, logs = run_job(horovod_env_job, 2, timeout=90)
    for r, (res, log) in enumerate(zip(results, logs)):
        assert res == [[r, r, 2], [r, r, 2]]  # HORA_RANK (set) beat HOROVOD_RANK=99
        lines = [l for l in log.splitlines() if "Horovod variables:" in l]
        assert len(lines) == 1, log
        line = lines[0]
        for part in ("HOROVOD_LOCAL_RANK=%d -> HORA_LOCAL_RANK=%d" % (r, r),
                     "HOROVOD_CYCLE_TIME=2 -> HORA_CYCLE_TIME_MS=2",
                     "HOROVOD_FUSION_THRESHOLD=1048576 -> HORA_FUSION_THRESHOLD_BYTES=1048576",
                     "HOROVOD_RANK=99 not used (HORA_RANK is set)",
                     "HOROVOD_TIMELINE=%s -> HORA_TIMELINE=%s" % (_TIMELINE, _TIMELINE),
                     "HOROVOD_HIERARCHICAL_ALLGATHER=1 IGNORED",
                     "HOROVOD_HIERARCHICAL_ALLREDUCE=1 -> HORA_HIER_ALLREDUCE=hier", "HOROVOD_AUTOTUNE=1 -> HORA_AUTOTUNE=1"):
            assert part in line, (part, line)
    with open(_TIMELINE) as f:
        assert f.read().startswith("[\n")  # hora writes HOROVOD_TIMELINE's file


def bad_horovod_value(rank, size):
    os.environ["HOROVOD_FUSION_THRESHOLD"] = "64MB"
    import hora.torch as hvd
    try:
        hvd.init()
    except ValueError as e:
        return str(e)
    hvd.shutdown()
    return "initialized"


def test_bad_horovod_value_fails_init_naming_it():
    results, _ = run_job(bad_horovod_value, 1, timeout=60)
    assert "HOROVOD_FUSION_THRESHOLD='64MB'" in results[0] and "HORA_FUSION_THRESHOLD_BYTES" in results[0]


def test_package_version_matches_the_library_it_ships_with():
    import hora
    import hora.torch as hvd
    assert hora.__version__ == hora.library_info()["version"]
    assert hvd.__version__ == hora.__version__ + "+hora"
