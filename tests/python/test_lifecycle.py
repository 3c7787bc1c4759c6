"""Lifecycle, library loading, exceptions and failure handling. Each test is a
fresh job (harness.run_job) because it starts, breaks or stops runtimes."""
import os
import signal
import time

import pytest

from harness import RankFailure, run_job


def test_not_initialized_raises_value_error():
    import hora.torch as hvd
    assert not hvd.is_initialized()
    with pytest.raises(ValueError, match="init"):
        hvd.rank()
    with pytest.raises(ValueError):
        hvd.allreduce(__import__("torch").ones(1))


def test_library_loads_from_hora_library_env():
    import hora
    from hora import _lib
    info = hora.library_info()
    assert os.path.exists(info["path"]) and info["version"].count(".") == 2
    if os.environ.get("HORA_LIBRARY"):
        assert os.path.samefile(info["path"], os.environ["HORA_LIBRARY"])
    assert _lib.status_name(7)


def test_error_classes():
    import hora
    from hora.exceptions import error_from_status
    e = error_from_status(7, "rank 1 lost", "HORA_ERR_REMOTE")
    assert isinstance(e, hora.HorovodInternalError) and isinstance(e, RuntimeError)
    assert isinstance(e, hora.HoraRemoteError) and e.status == 7 and str(e) == "rank 1 lost"
    assert isinstance(error_from_status(1, "x"), ValueError)
    assert isinstance(error_from_status(11, "x"), hora.HorovodInternalError)
    assert isinstance(error_from_status(8, "x"), hora.HoraTimeoutError)
    assert isinstance(error_from_status(14, "x"), hora.HorovodInternalError)
    import hora.torch as hvd
    assert hvd.HorovodInternalError is hora.HorovodInternalError


def _j_identity_and_reinit(rank, size):
    import torch
    import hora.torch as hvd
    hvd.init()
    hvd.init()  # idempotent
    ident = [hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()]
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size
    hvd.shutdown()
    hvd.shutdown()  # safe twice
    assert not hvd.is_initialized()
    try:
        hvd.size()
    except ValueError:
        pass
    else:
        raise AssertionError("size() after shutdown")
    return ident


def test_init_reads_environment_and_shutdown():
    results, _ = run_job(_j_identity_and_reinit, 2, timeout=60)
    assert results == [[0, 2, 0, 2], [1, 2, 1, 2]]


def _j_single_rank(rank, size):
    import torch
    import hora.torch as hvd
    hvd.init()
    assert hvd.size() == 1
    model = torch.nn.Linear(2, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model(torch.ones(1, 2)).sum().backward()
    g = model.weight.grad.clone()
    opt.step()  # one rank: the average is the gradient itself
    assert torch.allclose(model.weight.grad, g)
    assert hvd.allgather(torch.tensor([5])).tolist() == [5]
    hvd.shutdown()


def test_single_rank_job():
    run_job(_j_single_rank, 1, timeout=60)


def _j_rank_dies(rank, size):
    import torch
    import hora.torch as hvd
    hvd.init()
    hvd.allreduce(torch.ones(4), name="warmup")
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.time()
    try:
        for i in range(100):  # the dead rank never submits these
            hvd.allreduce(torch.ones(4), name="after.%d" % i)
    except hvd.HorovodInternalError as e:
        assert time.time() - t0 < 20, "loss detected too late"
        assert "rank 1" in str(e), str(e)
        return type(e).__name__
    raise AssertionError("no error after a rank died")


def test_lost_rank_raises_instead_of_hanging():
    results, logs = run_job(_j_rank_dies, 2, timeout=60, expect_exit={1: -signal.SIGKILL})
    assert results[0] == "HoraRemoteError", (results, logs[0][-2000:])


def _j_stall(rank, size):
    import torch
    import hora.torch as hvd
    hvd.init()
    if rank == 0:
        try:
            hvd.allreduce(torch.ones(2), name="only.rank0")
        except hvd.HorovodInternalError as e:
            assert "only.rank0" in str(e) and "missing on ranks 1" in str(e), str(e)
            assert isinstance(e, hvd.HoraTimeoutError)
            return "stall reported"
        raise AssertionError("stalled tensor did not fail")
    time.sleep(6)  # alive but never submitting "only.rank0"
    return "ok"


def test_stall_shutdown_names_tensor_and_missing_rank():
    results, _ = run_job(_j_stall, 2, timeout=60, extra_env={"HORA_STALL_SHUTDOWN_TIME_S": 3,
                                                             "HORA_STALL_WARNING_TIME_S": 1})
    assert results == ["stall reported", "ok"]


def test_harness_reports_failing_rank():
    """The harness itself: a failing body fails the test (so tests can fail)."""
    with pytest.raises(RankFailure, match="boom"):
        run_job(_j_fails, 2, timeout=60)


def _j_fails(rank, size):
    if rank == 1:
        raise RuntimeError("boom")
