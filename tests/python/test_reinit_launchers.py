"""Re-init under real launchers (issue 12): ``hvd.init(); hvd.shutdown();
hvd.init()`` many times in each process (50 under horarun, 6 under mpirun;
no file descriptor may leak), under horarun (the launcher hosts
the store, so every runtime's keys must be scoped by its epoch) and under
Open MPI's mpirun (rank 0 hosts a new store each time). Each cycle checks an
allreduce and the epoch."""
import os
import random
import shutil
import subprocess

import pytest

from harness import PYTHON, REPO, free_port

HORARUN = os.path.join(REPO, "build", "launcher", "horarun")

_SCRIPT = r'''
import os, sys
import hora, hora.torch as hvd, torch
cycles = int(sys.argv[1])
def fds():
    return len(os.listdir("/proc/self/fd"))
for cycle in range(cycles):
    if cycle == 1:
        base = fds()  # after the first runtime: lazily created things exist
    hvd.init()
    x = hvd.allreduce(torch.full((4,), float(hvd.rank() + cycle)), op=hvd.Sum, name="reinit.%d" % cycle)
    n = hvd.size()
    assert torch.equal(x, torch.full((4,), float(n * (n - 1) / 2 + n * cycle))), (cycle, x)
    epoch = hvd.epoch()
    hvd.barrier()
    hvd.shutdown()
assert fds() == base, "file descriptors grew from %d to %d over %d runtimes" % (base, fds(), cycles)
print("REINIT rank-ok cycles=%d last-epoch=%d" % (cycles, epoch), flush=True)
'''


def _env():
    return dict(os.environ, PYTHONPATH=os.path.join(REPO, "bindings", "python"), OMP_NUM_THREADS="1")


@pytest.mark.skipif(not os.access(HORARUN, os.X_OK), reason="horarun not built")
def test_reinit_fifty_times_under_horarun(tmp_path):
    script = tmp_path / "reinit.py"
    script.write_text(_SCRIPT)
    proc = subprocess.run([HORARUN, "-np", "3", PYTHON, str(script), "50"], env=_env(), capture_output=True,
                          text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    # horarun's store outlives the runtimes: each rank's 50th runtime is epoch 50.
    assert out.count("REINIT rank-ok cycles=50 last-epoch=50") == 3, out[-6000:]


def _open_mpi():
    mpirun = shutil.which("mpirun")
    if not mpirun:
        return None
    v = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30)
    return mpirun if "Open MPI" in v.stdout + v.stderr else None


@pytest.mark.skipif(_open_mpi() is None, reason="no Open MPI mpirun (scripts/install_deps.sh --mpi)")
def test_reinit_six_times_under_mpirun(tmp_path):
    script = tmp_path / "reinit.py"
    script.write_text(_SCRIPT)
    port = str(free_port())  # claimed, below the ephemeral range (a random one could be taken)
    env = _env()
    env.update(HORA_STORE_ADDR="127.0.0.1", HORA_STORE_PORT=port, HORA_SECRET="reinit-%d" % random.randint(0, 1 << 30))
    cmd = [_open_mpi(), "--allow-run-as-root", "--oversubscribe", "-np", "2"]
    for k in ("HORA_STORE_ADDR", "HORA_STORE_PORT", "HORA_SECRET", "PYTHONPATH", "OMP_NUM_THREADS", "HORA_LIBRARY"):
        if k in env:
            cmd += ["-x", k]
    proc = subprocess.run(cmd + [PYTHON, str(script), "6"], env=env, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    # A store rank 0 hosts is new for every runtime: epoch 1 each time.
    assert out.count("REINIT rank-ok cycles=6 last-epoch=1") == 2, out[-6000:]
