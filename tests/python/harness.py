"""Multi-rank test harness for the Python binding: ranks are subprocesses of
/usr/bin/python3 started with the HORA_* environment contract, so no launcher
is needed.

Two ways to run a body function ``fn(rank, size, *args)`` on every rank:

* ``RankPool``: N long-lived workers that call ``hora.init()`` once and then run
  one body after another (importing torch costs seconds on a 2-core machine,
  so the suite shares workers). A body that fails or passes its deadline
  makes the pool restart, so one broken test does not poison the next.
* ``run_job``: a fresh job for one body (shutdown, killed ranks, init tests).

Bodies are module-level functions in test modules (looked up by module and
name in the worker); they assert on their own and may return a JSON value.
Every wait has a deadline: a hang fails the test with each rank's output.
"""
import json
import os
import queue
import secrets
import socket
import subprocess
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
PYTHON = os.environ.get("HORA_TEST_PYTHON", "/usr/bin/python3")
WORKER = os.path.join(HERE, "_rank_worker.py")
MARK = "@@HORA@@"


_PORT_CLAIMS = []  # open lock files: a claimed port stays ours while this process lives


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _claim_port(port):
    """The claim free_port() takes on one port: an flock under
    /tmp/hora-test-ports held for this process's life, and a bind that
    succeeds now. None if either fails."""
    import fcntl
    os.makedirs("/tmp/hora-test-ports", exist_ok=True)
    f = open("/tmp/hora-test-ports/%d" % port, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    except OSError:
        f.close()
        return None
    _PORT_CLAIMS.append(f)
    return f


def free_port(count=1):
    """A port for a job's rendezvous store, as the C++ harness picks it
    (tests/common/free_port.h): below the kernel's ephemeral
    range, which any socket may be given between this check and the store's
    bind, and claimed with an flock under /tmp/hora-test-ports so that
    concurrent tests (C++ or Python) never share one. With count > 1 the
    first of `count` consecutive ports claimed alike (a launcher whose
    store listens next to the port it is given: torchrun's MASTER_PORT + 1)."""
    import random
    lo, hi = 10000, _ephemeral_low() - (count - 1)
    for _ in range(10000):
        port = random.randrange(lo, hi)
        if all(_claim_port(port + i) is not None for i in range(count)):
            return port
    raise RuntimeError("no %d free consecutive port(s) in %d..%d" % (count, lo, hi - 1))


def rank_env(rank, size, port, secret, extra=None):
    env = dict(os.environ)
    pypath = os.path.join(REPO, "bindings", "python")
    env["PYTHONPATH"] = pypath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update({
        "HORA_RANK": str(rank), "HORA_SIZE": str(size), "HORA_LOCAL_RANK": str(rank),
        "HORA_LOCAL_SIZE": str(size), "HORA_STORE_ADDR": "127.0.0.1", "HORA_STORE_PORT": str(port),
        "HORA_SECRET": secret, "OMP_NUM_THREADS": "1", "HORA_TEST_DIR": HERE,
    })
    env.pop("HORA_STORE_EXTERNAL", None)
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


class RankFailure(AssertionError):
    pass


class _Worker:
    def __init__(self, rank, size, port, secret, extra_env, init=True):
        self.rank = rank
        self.proc = subprocess.Popen([PYTHON, "-u", WORKER] + ([] if init else ["--no-init"]), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env=rank_env(rank, size, port, secret, extra_env),
                                     text=True, bufsize=1)
        self.lines = queue.Queue()
        self.log = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, msg):
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def next_result(self, deadline):
        """The next result message, collecting other output into self.log."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return {"ok": False, "error": "deadline passed (hang?)"}
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                return {"ok": False, "error": "worker exited with %s" % self.proc.wait()}
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
            self.log.append(line)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


class RankPool:
    """``init=False``: the workers do not call hora.init(); each body does its
    own lifecycle (Horovod's test style: init before, barrier and shutdown after)."""

    def __init__(self, size, extra_env=None, start_timeout=60.0, init=True, per_rank_env=None):
        """per_rank_env: rank -> dict of variables for that rank only (e.g. an
        emulated host per rank through HORA_HOST_ID)."""
        self.size = size
        self.init = init
        self.extra_env = extra_env
        self.per_rank_env = per_rank_env
        self.start_timeout = start_timeout
        self.workers = []

    def _env(self, rank):
        env = dict(self.extra_env or {})
        if self.per_rank_env:
            env.update(self.per_rank_env(rank))
        return env

    def _start(self):
        port, secret = free_port(), secrets.token_hex(8)
        self.workers = [_Worker(r, self.size, port, secret, self._env(r), self.init) for r in range(self.size)]
        deadline = time.monotonic() + self.start_timeout
        results = [w.next_result(deadline) for w in self.workers]
        if not all(r.get("ok") for r in results):
            self._fail("start-up", results)

    def close(self):
        for w in self.workers:
            try:
                w.send({"cmd": "exit"})
            except (BrokenPipeError, OSError):
                pass
        deadline = time.monotonic() + 20
        for w in self.workers:
            try:
                w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            w.kill()
        self.workers = []

    def _fail(self, what, results):
        report = []
        for w, r in zip(self.workers, results):
            if not r.get("ok"):
                report.append("rank %d: %s\n%s" % (w.rank, r.get("error"), "".join(w.log[-40:])))
        self.close()
        raise RankFailure("%s failed on rank(s) %s:\n%s" % (
            what, [w.rank for w, r in zip(self.workers or [], results) if not r.get("ok")] or
            [i for i, r in enumerate(results) if not r.get("ok")], "\n".join(report)))

    def run(self, fn, *args, timeout=60.0):
        """Runs fn(rank, size, *args) on every rank; returns the list of results."""
        if not self.workers or any(w.proc.poll() is not None for w in self.workers):
            self.close()
            self._start()
        msg = {"cmd": "run", "module": fn.__module__, "fn": fn.__name__, "args": list(args)}
        for w in self.workers:
            w.log = []
            w.send(msg)
        deadline = time.monotonic() + timeout
        results = [w.next_result(deadline) for w in self.workers]
        if not all(r.get("ok") for r in results):
            self._fail("%s.%s" % (fn.__module__, fn.__name__), results)
        return [r.get("value") for r in results]


def run_job(fn, size, *args, timeout=60.0, extra_env=None, per_rank_env=None, expect_exit=None):
    """One fresh job (no shared runtime): every rank runs fn(rank, size, *args)
    after its own hora.init() inside fn when it wants one (``init`` is not called
    for it). Returns (results, logs). ``expect_exit``: {rank: code} for ranks that
    are expected to die (their result is not required)."""
    port, secret = free_port(), secrets.token_hex(8)
    procs = []
    for r in range(size):
        env = rank_env(r, size, port, secret, extra_env)
        if per_rank_env and r in per_rank_env:
            env.update({k: str(v) for k, v in per_rank_env[r].items()})
        cmd = [PYTHON, "-u", WORKER, "--once", fn.__module__, fn.__name__, json.dumps(list(args))]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True))
    readers = []
    for p in procs:
        buf = []
        t = threading.Thread(target=lambda p=p, buf=buf: buf.extend(p.stdout), daemon=True)
        t.start()
        readers.append((t, buf))
    deadline = time.monotonic() + timeout
    timed_out = False
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    logs, results, bad = [], [], []
    for r, (t, buf) in enumerate(readers):
        t.join(timeout=5)
        text = "".join(buf)
        logs.append(text)
        value, ok = None, False
        for line in text.splitlines():
            if line.startswith(MARK):
                msg = json.loads(line[len(MARK):])
                ok, value = msg.get("ok"), msg.get("value")
                if not ok:
                    value = msg.get("error")
        results.append(value)
        code = procs[r].returncode
        if expect_exit and r in expect_exit:
            if expect_exit[r] is not None and code != expect_exit[r]:
                bad.append("rank %d exited %s, expected %s" % (r, code, expect_exit[r]))
        elif not ok or code != 0:
            bad.append("rank %d: exit %s, %s" % (r, code, value))
    if timed_out or bad:
        raise RankFailure("%s%s\n%s" % ("deadline passed; " if timed_out else "", "; ".join(bad),
                                        "\n".join("--- rank %d\n%s" % (i, l[-4000:]) for i, l in enumerate(logs))))
    return results, logs


HORARUN = os.path.join(REPO, "build", "launcher", "horarun")


def elastic_ready():
    """(True, "") when the loaded libhora has the elastic calls and horarun is
    built, else (False, why): the skip reason of the elastic tests under
    horarun."""
    try:
        from hora import _lib
        if not _lib.has_symbol("hora_reform"):
            return False, "libhora has no hora_reform"
    except ImportError as e:
        return False, "libhora not loadable: %s" % e
    if not os.access(HORARUN, os.X_OK):
        return False, "horarun not built (%s)" % HORARUN
    return True, ""


HORARUN = os.path.join(REPO, "build", "launcher", "horarun")


def run_example(np, script, args, timeout=240):
    """Runs examples/<script> under horarun with ``np`` ranks as a user would;
    asserts it exited 0 and returns its output (stdout + stderr)."""
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "bindings", "python"), OMP_NUM_THREADS="1")
    proc = subprocess.run([HORARUN, "-np", str(np), PYTHON, os.path.join(REPO, "examples", script)] + list(args),
                          env=env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    return out
