#!/usr/bin/env python3
"""Elastic chaos benchmark (issue 12): what losing workers costs an elastic job.

One invocation runs the same training script (this file with ``--worker``) three times,
each for ``--duration`` seconds of measured training after ``--warmup`` seconds:

  plain    ``horarun -np 4``, ``hvd.init()`` and a plain loop (no elastic state, no commits saved)
  elastic  ``horarun -np 4 --min-np 2 --max-np 4 --host-discovery-file F`` (F = localhost:4),
           ``hvd.elastic.run`` + ``TorchState``, commit every ``--commit-every`` steps, nothing fails
  chaos    the elastic job again, one random training worker SIGKILLed every 20-30 s
           (``--kill-every LO HI``); horarun replaces it (``--blacklist-cooldown-range 0 1``)

The worker: an MLP (``--layers`` x ``--width``², float32) on a fixed synthetic batch per step
(fixed compute per step), ``hvd.DistributedOptimizer`` (one allreduce per layer tensor, 4.2 MB of
gradients per step by default: 4 x 512²), one thread. Every worker writes JSON lines (wall time ``t``,
event ``ev``, membership ``epoch``, ``step``, ``committed`` step, committed ``samples``, ``size``,
``rank``, worker id ``wid``) to ``<log dir>/<phase>/<wid or rank>.jsonl``. The run stops when the
orchestrator creates ``STOP`` in the log dir: the workers look for it at every commit and agree
through an allreduce (max), so they stop at the same step.

Reported:
  throughput      committed samples/s in the window [first commit + warmup, STOP]
                  (chaos / elastic: target >= 0.8)
  recovery        per kill: time from the SIGKILL to the survivors' first commit in a newer
                  membership epoch (the max over survivors; median and max: target <= 1 s)
  lost commits    resumes (after a reset) at a step below the newest step any worker had
                  committed before: must be 0
  overhead        1 - elastic / plain throughput (target <= 1 %)

Usage:
  bench/elastic_chaos.py                     # 180 s per phase (~10 min in all)
  bench/elastic_chaos.py --duration 20       # smoke run (~1.5 min)
  bench/elastic_chaos.py --phases chaos --duration 60 --markdown out.md
"""
import argparse
import glob
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --------------------------------------------------------------------------- worker

def worker_main(args):
    import torch
    import hora.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    wid = os.environ.get("HORA_WORKER_ID") or "r%d" % hvd.rank()
    os.makedirs(os.path.join(args.log_dir, "pids"), exist_ok=True)
    with open(os.path.join(args.log_dir, "pids", wid), "w") as f:
        f.write("%d\n" % os.getpid())
    log = open(os.path.join(args.log_dir, wid + ".jsonl"), "a", buffering=1 << 16)
    stop_file = os.path.join(args.log_dir, "STOP")

    def emit(ev, **kw):
        rec = dict(t=time.time(), ev=ev, wid=wid, rank=hvd.rank(), size=hvd.size(),
                   epoch=hvd.epoch() if args.elastic else 0)
        rec.update(kw)
        log.write(json.dumps(rec) + "\n")
        if ev != "step":
            log.flush()

    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    gen = torch.Generator().manual_seed(1 + hvd.rank())
    x = torch.randn(args.batch, args.width, generator=gen)
    y = torch.randn(args.batch, args.width, generator=gen)

    def one_step():
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    def should_stop():
        flag = torch.tensor([1.0 if os.path.exists(stop_file) else 0.0])
        return hvd.allreduce(flag, op=hvd.Max, name="chaos.stop").item() > 0

    if not args.elastic:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        step = samples = 0
        emit("start", step=0, committed=0, samples=0)
        while True:
            one_step()
            step += 1
            samples += args.batch * hvd.size()
            emit("step", step=step)
            if step % args.commit_every == 0:
                emit("commit", step=step, committed=step, samples=samples)
                if should_stop():
                    break
        emit("end", step=step, committed=step, samples=samples)
        log.close()
        hvd.shutdown()
        return

    state = hvd.elastic.TorchState(model, opt, step=0, samples=0)
    state.register_reset_callbacks([lambda: emit("reset", step=state.step)])

    @hvd.elastic.run
    def train(state):
        # After every (re)start the state is rank 0's last commit.
        emit("start", step=state.step, committed=state.step, samples=state.samples)
        while True:
            one_step()
            state.step += 1
            state.samples += args.batch * hvd.size()
            emit("step", step=state.step)
            if state.step % args.commit_every == 0:
                try:
                    state.commit()
                except hvd.elastic.HostsUpdatedInterrupt:
                    # commit() saved before it asked about newcomers: the step is committed.
                    emit("commit", step=state.step, committed=state.step, samples=state.samples)
                    raise
                emit("commit", step=state.step, committed=state.step, samples=state.samples)
                if should_stop():
                    return

    train(state)
    emit("end", step=state.step, committed=state.step, samples=state.samples)
    log.close()
    hvd.shutdown()


# --------------------------------------------------------------------------- orchestrator

def read_events(d):
    evs = []
    for path in glob.glob(os.path.join(d, "*.jsonl")):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    evs.append(json.loads(line))
                except ValueError:
                    pass  # a killed worker's last line may be cut
    evs.sort(key=lambda e: e["t"])
    return evs


def first_commit_time(d):
    ts = [e["t"] for e in read_events(d) if e["ev"] == "commit"]
    return min(ts) if ts else None


def wait_idle(args):
    if args.no_wait_idle:
        return
    t0 = time.time()
    while True:
        busy = [p for p in ("ctest", "hora_multirank")
                if subprocess.run(["pgrep", "-f", p], capture_output=True).returncode == 0]
        if not busy:
            break
        if time.time() - t0 > args.wait_idle_max:
            print("elastic_chaos: still busy (%s) after %d s; measuring anyway" % (busy, args.wait_idle_max))
            break
        print("elastic_chaos: waiting for %s to finish (its load would skew the numbers)" % ", ".join(busy),
              flush=True)
        time.sleep(15)


def live_members(d, marker):
    """Worker ids -> pid of training workers that are alive and have started training."""
    started = {e["wid"] for e in read_events(d) if e["ev"] == "start"}
    out = {}
    for pf in glob.glob(os.path.join(d, "pids", "*")):
        wid = os.path.basename(pf)
        if wid not in started:
            continue
        try:
            pid = int(open(pf).read())
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                if marker.encode() not in f.read():
                    continue
        except (OSError, ValueError):
            continue
        out[wid] = pid
    return out


def pids_with_marker(marker, exclude=()):
    """Worker processes of this phase (horarun's own argv holds the marker too: excluded)."""
    r = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    return [int(p) for p in r.stdout.split() if int(p) != os.getpid() and int(p) not in exclude]


def run_phase(args, phase, root):
    d = os.path.join(root, phase)
    n = 1
    while os.path.exists(d):  # a phase listed twice (A/B/A/B) gets its own logs
        n += 1
        d = os.path.join(root, "%s%d" % (phase, n))
    os.makedirs(d)
    marker = "chaos-marker-%s-%d" % (os.path.basename(d), os.getpid())
    worker = [sys.executable, os.path.abspath(__file__), "--worker", "--log-dir", d, "--marker", marker,
              "--commit-every", str(args.commit_every), "--layers", str(args.layers),
              "--width", str(args.width), "--batch", str(args.batch)]
    if phase == "plain":
        cmd = [args.horarun, "-np", str(args.np)] + worker
    else:
        hosts = os.path.join(d, "hosts.txt")
        with open(hosts, "w") as f:
            f.write("localhost:%d\n" % args.np)
        cmd = [args.horarun, "-np", str(args.np), "--min-np", str(args.min_np), "--max-np", str(args.np),
               "--host-discovery-file", hosts, "--blacklist-cooldown-range"] + \
              [str(v) for v in args.cooldown] + worker + ["--elastic"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.path.join(REPO, "bindings", "python") + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = open(os.path.join(d, "horarun.out"), "w")
    print("== %s: %s" % (phase, " ".join(cmd)), flush=True)
    t_launch = time.time()
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    kills = []
    # Wait for training to start.
    t_first = None
    while t_first is None:
        if proc.poll() is not None:
            raise SystemExit("elastic_chaos: %s job ended before training started; see %s/horarun.out"
                             % (phase, d))
        if time.time() - t_launch > 180:
            proc.kill()
            raise SystemExit("elastic_chaos: %s job did not start training in 180 s" % phase)
        time.sleep(0.2)
        t_first = first_commit_time(d)
    t_begin = t_first + args.warmup
    t_end = t_begin + args.duration
    rng = random.Random(args.seed)
    next_kill = t_begin + rng.uniform(*args.kill_every) if phase == "chaos" else float("inf")
    while time.time() < t_end:
        if proc.poll() is not None:
            break
        now = time.time()
        if now >= next_kill:
            members = live_members(d, marker)
            if len(members) > args.min_np:
                wid = rng.choice(sorted(members))
                t_kill = time.time()
                try:
                    os.kill(members[wid], signal.SIGKILL)
                    kills.append(dict(t=t_kill, wid=wid, pid=members[wid]))
                    print("   %6.1f s: SIGKILL %s (pid %d), %d workers were training"
                          % (t_kill - t_begin, wid, members[wid], len(members)), flush=True)
                except ProcessLookupError:
                    pass
            else:
                print("   %6.1f s: only %d worker(s) training, no kill" % (now - t_begin, len(members)), flush=True)
            next_kill = now + rng.uniform(*args.kill_every)
        time.sleep(0.05)
    stop_t = time.time()
    open(os.path.join(d, "STOP"), "w").close()
    # The members stop at their next commit. A newcomer that was still starting
    # would wait (up to --elastic-timeout) to be admitted to a job that ended:
    # horarun does not stop it (see bench/results/2026-11-24-elastic-chaos.md),
    # so once the members are done, stop the workers that never trained.
    t_stop = time.time()
    while proc.poll() is None and time.time() - t_stop < args.stop_grace:
        ended = {e["wid"] for e in read_events(d) if e["ev"] == "end"}
        if ended and not (set(live_members(d, marker)) - ended):
            for pid in pids_with_marker(marker, exclude=(proc.pid,)):
                if pid not in live_members(d, marker).values():
                    try:
                        os.kill(pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
            break
        time.sleep(0.2)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    out.close()
    return analyse(phase, d, t_begin, stop_t, kills, proc.returncode)


def analyse(phase, d, t_begin, t_end, kills, rc):
    evs = read_events(d)
    commits = [e for e in evs if e["ev"] == "commit"]
    # One row per committed step: the time the last member logged it.
    by_step = {}
    for e in commits:
        k = (e["epoch"], e["step"])
        by_step[k] = max(by_step.get(k, (0, 0))[0], e["t"]), e["samples"]
    timeline = sorted(by_step.values())

    def samples_at(t):
        best = 0
        for tt, s in timeline:
            if tt <= t:
                best = s
        return best

    last_in = [tt for tt, _ in timeline if tt <= t_end]
    t_last = max(last_in) if last_in else t_end
    s0, s1 = samples_at(t_begin), samples_at(t_last)
    window = t_last - t_begin
    thr = (s1 - s0) / window if window > 0 else float("nan")

    # Recovery: kill -> survivors' first commit in a newer membership epoch.
    recov = []
    for k in kills:
        before = [e for e in commits if e["t"] <= k["t"]]
        if not before:
            continue
        ep = max(e["epoch"] for e in before)
        members = {e["wid"] for e in before if e["epoch"] == ep} - {k["wid"]}
        firsts = {}
        for e in commits:
            if e["t"] > k["t"] and e["epoch"] > ep and e["wid"] in members and e["wid"] not in firsts:
                firsts[e["wid"]] = e["t"]
        resumed = {}
        for e in evs:
            if e["t"] > k["t"] and e["ev"] == "start" and e["epoch"] > ep and e["wid"] in members \
                    and e["wid"] not in resumed:
                resumed[e["wid"]] = e["t"]
        if resumed:
            k["resumed_s"] = max(resumed.values()) - k["t"]
        if firsts:
            k["recovery_s"] = max(firsts.values()) - k["t"]
            k["survivors_committed"] = len(firsts)
            k["survivors"] = len(members)
            recov.append(k["recovery_s"])

    # Lost commits: a (re)start below the newest step committed before it.
    lost = []
    max_committed = 0
    for e in evs:
        if e["ev"] == "commit":
            max_committed = max(max_committed, e["committed"])
        elif e["ev"] == "start" and e["step"] < max_committed:
            lost.append(dict(wid=e["wid"], t=e["t"], resumed=e["step"], newest_commit=max_committed))
    # Where the time goes: step -> step intervals, and step -> its commit returning
    # (elastic: state.save() + the newcomer check; plain: nothing), per worker log.
    step_dt, commit_dt = [], []
    prev = {}
    for e in evs:
        p = prev.get(e["wid"])
        if p is not None and p["ev"] == "step" and t_begin <= e["t"] <= t_end:
            (step_dt if e["ev"] == "step" else commit_dt if e["ev"] == "commit" else []).append(e["t"] - p["t"])
        prev[e["wid"]] = e
    resets = sum(1 for e in evs if e["ev"] == "reset")
    sizes = sorted({e["size"] for e in commits if t_begin <= e["t"] <= t_end})
    return dict(phase=phase, rc=rc, t_begin=t_begin, t_end=t_end, throughput=thr,
                step_s=statistics.median(step_dt) if step_dt else float("nan"),
                commit_s=statistics.median(commit_dt) if commit_dt else float("nan"), window_s=window, samples=s1 - s0, kills=kills,
                recovery=recov, lost=lost, resets=resets, sizes=sizes,
                epochs=max((e["epoch"] for e in commits), default=0), log_dir=d)


def fmt(v, f="%.1f"):
    return "-" if v is None or v != v else f % v


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--elastic", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--marker", default="", help=argparse.SUPPRESS)
    ap.add_argument("--log-dir", default=None, help="where the logs go (default: a new dir under /tmp)")
    ap.add_argument("--duration", type=float, default=180.0, help="measured seconds per phase (180)")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds after the first commit not measured (5)")
    ap.add_argument("--phases", default="plain,elastic,chaos", help="comma list of plain,elastic,chaos")
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--min-np", type=int, default=2)
    ap.add_argument("--kill-every", type=float, nargs=2, default=[20.0, 30.0], metavar=("LO", "HI"))
    ap.add_argument("--cooldown", type=float, nargs=2, default=[0, 1], metavar=("LO", "HI"),
                    help="horarun --blacklist-cooldown-range (0 1)")
    ap.add_argument("--commit-every", type=int, default=5, help="commit every k steps (5)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32, help="samples per worker per step (32)")
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--stop-grace", type=float, default=30.0)
    ap.add_argument("--horarun", default=os.path.join(REPO, "build", "launcher", "horarun"))
    ap.add_argument("--analyse", metavar="LOGDIR", default=None,
                    help="only print the report again from a finished run's logs (its results.json)")
    ap.add_argument("--markdown", default=None, help="also write the results as markdown here")
    ap.add_argument("--no-wait-idle", action="store_true", help="do not wait for ctest/hora_multirank to end")
    ap.add_argument("--wait-idle-max", type=float, default=1800)
    args = ap.parse_args()
    if args.worker:
        return worker_main(args)
    if args.analyse:
        with open(os.path.join(args.analyse, "results.json")) as f:
            saved = json.load(f)
        results = {}
        for p, r in saved.items():
            d = r["log_dir"]
            t_begin = r.get("t_begin") or first_commit_time(d) + args.warmup
            t_end = r.get("t_end") or os.path.getmtime(os.path.join(d, "STOP"))
            results[p] = analyse(p, d, t_begin, t_end, r["kills"], r["rc"])
        print("\n".join(report(args, results)))
        return 0

    root = args.log_dir or "/tmp/elastic_chaos.%d" % os.getpid()
    os.makedirs(root, exist_ok=True)
    wait_idle(args)
    print("elastic_chaos: logs in %s; %d cores; load %s" % (root, os.cpu_count(), os.getloadavg()), flush=True)
    results = {}
    for phase in args.phases.split(","):
        results[phase] = run_phase(args, phase, root)
        r = results[phase]
        print("   %s: %.1f samples/s over %.1f s, sizes %s, %d reset(s), horarun exit %s"
              % (phase, r["throughput"], r["window_s"], r["sizes"], r["resets"], r["rc"]), flush=True)

    lines = report(args, results)
    print("\n".join(lines))
    with open(os.path.join(root, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


def report(args, results):
    L = ["| phase | committed samples/s | window (s) | median step (ms) | median commit (ms) | sizes seen | "
         "resets | kills | horarun exit |",
         "|---|---|---|---|---|---|---|---|---|"]
    for p, r in results.items():
        L.append("| %s | %.1f | %.1f | %.1f | %.1f | %s | %d | %d | %s |" % (
            p, r["throughput"], r["window_s"], 1000 * r.get("step_s", float("nan")),
            1000 * r.get("commit_s", float("nan")), ",".join(map(str, r["sizes"])), r["resets"],
            len(r["kills"]), r["rc"]))
    L.append("")
    el, pl, ch = results.get("elastic"), results.get("plain"), results.get("chaos")
    if el and ch:
        ratio = ch["throughput"] / el["throughput"]
        L.append("- throughput chaos / fault-free elastic: **%.3f** (target >= 0.8)" % ratio)
    if ch:
        rec = ch["recovery"]
        if rec:
            L.append("- kill -> survivors' next commit (new epoch), %d kills: median **%.2f s**, max **%.2f s** "
                     "(target <= 1 s); each: %s" % (len(rec), statistics.median(rec), max(rec),
                                                   ", ".join("%.2f" % v for v in rec)))
            res = [k["resumed_s"] for k in ch["kills"] if "resumed_s" in k]
            if res:
                L.append("- kill -> survivors training again (restored, re-formed, synced; before the k steps "
                         "to the next commit): median %.2f s, max %.2f s" % (statistics.median(res), max(res)))
        else:
            L.append("- kill -> next commit: no kill measured")
        L.append("- lost commits (chaos): **%d**%s" % (len(ch["lost"]), (" " + json.dumps(ch["lost"])) if ch["lost"] else ""))
    if el:
        L.append("- lost commits (fault-free elastic): %d" % len(el["lost"]))
    if el and pl:
        L.append("- elastic overhead, nothing failing: 1 - elastic/plain = **%.1f %%** (target <= 1 %%)"
                 % (100 * (1 - el["throughput"] / pl["throughput"])))
    return L


if __name__ == "__main__":
    sys.exit(main())
