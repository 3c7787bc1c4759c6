"""examples/elastic_train.py under horarun with a host discovery file that grows
from 2 to 3 slots mid-run: a newcomer starts, joins at the next commit, every
worker re-forms with size 3 and all three end with the same model."""
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from harness import HORARUN, PYTHON, REPO, elastic_ready

EXAMPLE = os.path.join(REPO, "examples", "elastic_train.py")


_READY, _WHY = elastic_ready()


def _write_atomically(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)  # horarun re-reads the file every second: never show it half written


def _run_changing_hosts(cmd, env, hosts, trigger, new_hosts, timeout=110):
    """Runs horarun `cmd`; once a line matches `trigger` (training runs),
    rewrites the discovery file `hosts` to `new_hosts`; returns (rc, output)."""
    deadline = time.time() + timeout
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    # extend() over the pipe appends line by line as they come.
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        while not any(re.search(trigger, l) for l in list(lines)):
            assert proc.poll() is None, "job ended before training:\n" + "".join(lines)[-6000:]
            assert time.time() < deadline, "no progress line in time:\n" + "".join(lines)[-6000:]
            time.sleep(0.1)
        _write_atomically(hosts, new_hosts)
        proc.wait(timeout=max(1, deadline - time.time()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        reader.join(5)
        pytest.fail("elastic example did not finish in time:\n" + "".join(lines)[-6000:])
    reader.join(10)
    return proc.returncode, "".join(lines)


@pytest.mark.skipif(not _READY, reason=_WHY or "elastic runtime not ready")
def test_example_grows_from_2_to_3_workers(tmp_path):
    hosts = str(tmp_path / "hosts.txt")
    _write_atomically(hosts, "localhost:2\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "bindings", "python"), OMP_NUM_THREADS="1",
               HORA_ELASTIC_SETTLE_MS="500")
    cmd = [HORARUN, "-np", "2", "--min-np", "2", "--max-np", "4", "--host-discovery-file", hosts,
           "--blacklist-cooldown-range", "0", "0",
           PYTHON, EXAMPLE, "--epochs", "3", "--num-samples", "2048", "--batches-per-commit", "2",
           "--log-interval", "4", "--batch-sleep", "0.15"]
    # Grow once both first workers train (a progress line at size 2).
    rc, out = _run_changing_hosts(cmd, env, hosts, r"size 2 worker \S+ epoch \d+ batch", "localhost:3\n")
    assert rc == 0, "horarun exit %d:\n%s" % (rc, out[-6000:])
    done = re.findall(r"\[(w\d+)\]<stdout>: DONE rank=\d+ size=(\d+) .*checksum=([0-9a-f]+)", out)
    assert len(done) == 3, "expected three workers to finish:\n" + out[-6000:]
    assert {d[0] for d in done} == {"w0", "w1", "w2"}, out[-6000:]
    assert {d[1] for d in done} == {"3"}, "not every worker ended at size 3:\n" + out[-6000:]
    assert len({d[2] for d in done}) == 1, "the workers' models differ:\n" + out[-6000:]
    # Each of the three (re)started training at size 3 (the newcomer's first start,
    # the others' after the reset that let it in), and the two first workers reset.
    starts = set(re.findall(r"\[(w\d+)\]<stdout>: start: rank \d+/size 3 ", out))
    assert starts == {"w0", "w1", "w2"}, "not every worker trained at size 3:\n" + out[-6000:]
    resets = set(re.findall(r"\[(w\d+)\]<stdout>: reset: rank \d+/size 3 ", out))
    assert resets == {"w0", "w1"}, "the first two workers did not reset to size 3:\n" + out[-6000:]



@pytest.mark.skipif(not _READY, reason=_WHY)
def test_newcomers_still_waiting_when_training_ends_do_not_fail_the_job(tmp_path):
    """Discovery offers 4 slots to a 2-worker job that ends before the
    newcomers are admitted (they join only at a commit): horarun stops them
    and the job succeeds, instead of their waiting out the elastic timeout
    and failing it (found by bench/elastic_chaos.py)."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:4\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "bindings", "python"), OMP_NUM_THREADS="1")
    t0 = time.time()
    # An elastic timeout far past the bound below: waiting it out cannot pass
    # for a slow start on a loaded machine.
    proc = subprocess.run([HORARUN, "-np", "2", "--min-np", "2", "--max-np", "4", "--elastic-timeout", "600",
                           "--host-discovery-file", str(hosts), PYTHON, EXAMPLE, "--epochs", "1",
                           "--num-samples", "256"], env=env, capture_output=True, text=True, timeout=110)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert time.time() - t0 < 100, "the job waited for never-admitted newcomers:\n" + out[-3000:]


@pytest.mark.skipif(not _READY, reason=_WHY)
def test_example_shrinks_when_discovery_offers_fewer_slots(tmp_path):
    """Discovery drops from 3 slots to 2 while the job trains: horarun stops the
    newest worker (as horovodrun does; not a failure), the other two re-form,
    restore the last commit and finish at size 2 with identical models."""
    hosts = str(tmp_path / "hosts.txt")
    _write_atomically(hosts, "localhost:3\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "bindings", "python"), OMP_NUM_THREADS="1",
               HORA_ELASTIC_SETTLE_MS="500")
    cmd = [HORARUN, "-np", "3", "--min-np", "2", "--max-np", "3", "--host-discovery-file", hosts,
           PYTHON, EXAMPLE, "--epochs", "2", "--num-samples", "3072", "--batches-per-commit", "2",
           "--log-interval", "4", "--batch-sleep", "0.1"]
    rc, out = _run_changing_hosts(cmd, env, hosts, r"size 3 worker \S+ epoch \d+ batch", "localhost:2\n")
    assert rc == 0, "horarun exit %d:\n%s" % (rc, out[-6000:])
    assert "w2 on localhost stopped" in out or "worker w2 on localhost stopped" in out, out[-6000:]
    done = re.findall(r"\[(w\d+)\]<stdout>: DONE rank=\d+ size=(\d+) .*checksum=([0-9a-f]+)", out)
    assert {d[0] for d in done} == {"w0", "w1"}, "expected w0 and w1 to finish:\n" + out[-6000:]
    assert {d[1] for d in done} == {"2"}, out[-6000:]
    assert len({d[2] for d in done}) == 1, "the workers' models differ:\n" + out[-6000:]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([os.path.abspath(__file__), "-q"]))
