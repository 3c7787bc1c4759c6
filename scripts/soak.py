#!/usr/bin/python3
"""Fault-injecting soak driver (issue 14): runs jobs of tests/hora_soak under horarun and checks them.

Each job picks np in 2..4, a seed, and either no fault or one fault (kill9, sigstop, mismatch,
missing) on a random rank at a random step; it runs under a hard deadline (past it: a HANG, the
job is killed and its logs kept). Then every rank's report is checked:
  - every result exact (wrong = 0 everywhere);
  - no fault: every rank finishes every step without an error;
  - kill9 / sigstop: every survivor gets an error at the fault's step, naming the faulty rank;
  - mismatch: every rank (the faulty one too) gets HORA_ERR_MISMATCH for that tensor, naming it
    and the faulty rank, and the job goes on to the end;
  - missing: every survivor gets HORA_ERR_TIMEOUT for that tensor, naming it and the faulty rank
    as missing, and the job goes on to the end;
  - time to error (a survivor's error time minus the faulty rank's fault time, wall clocks of one
    host) within the bound for its kind (BOUNDS below).
Stops at the first limit reached (--seconds, --collectives, --jobs). Prints a summary and exits 1 if anything was wrong, hung, unreported or failed unexpectedly.

Usage: scripts/soak.py --build build [--seconds S] [--collectives N] [--jobs N] [--steps N]
       [--fault-percent P] [--base-seed N] [--keep DIR] [--summary FILE] [--ci]
Called by ctest (label soak, --ci: fixed seeds, every fault kind) and by scripts/soak.sh.
Runs on this driver's thread only; each job's processes are killed before the next starts.
"""
import argparse
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

KINDS = ["kill9", "sigstop", "mismatch", "missing"]
PEER_TIMEOUT_S = 2.0
# The stall shutdown is the missing tensor's detector; elsewhere it is kept above the peer
# timeout so a stopped rank is found by its silence (the documented path for SIGSTOP).
STALL_SHUTDOWN_S = {"missing": 2.0}
STALL_SHUTDOWN_OTHER_S = 4.0
# Time from the fault to each survivor's error, at most (seconds). kill9: the closed
# connection (milliseconds; the peer timeout is the backstop); sigstop: the peer timeout;
# missing: the stall shutdown; mismatch: one negotiation. +2 s of slack for a loaded machine.
BOUNDS = {
    "kill9": PEER_TIMEOUT_S + 2,
    "sigstop": PEER_TIMEOUT_S + 2,
    "missing": STALL_SHUTDOWN_S["missing"] + 2,
    "mismatch": 2.0,
}
# The status every survivor's first error must carry (hora.h).
STATUS = {"kill9": 7, "sigstop": 7, "mismatch": 11, "missing": 8}
# horarun's SIGTERM-to-SIGKILL delay. The survivors ignore SIGTERM until they saw their error,
# so this must exceed every bound: a survivor still without its error then is killed and counted.
GRACE_S = 5


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--horarun", default="", help="default: BUILD/launcher/horarun")
    p.add_argument("--binary", default="", help="default: BUILD/tests/hora_soak")
    p.add_argument("--seconds", type=float, default=0)
    p.add_argument("--collectives", type=int, default=0)
    p.add_argument("--jobs", type=int, default=0)
    p.add_argument("--steps", type=int, default=3000, help="steps per job")
    p.add_argument("--fault-percent", type=int, default=60)
    p.add_argument("--base-seed", type=int, default=1)
    p.add_argument("--keep", default="soak-logs", help="logs of failed or hung jobs go here")
    p.add_argument("--summary", default="", help="also write the summary to this file")
    p.add_argument("--ci", action="store_true", help="fixed plan: every fault kind, np 2..4")
    p.add_argument("--bed", default="",
                   help="run every job across two emulated hosts of a test bed of this name "
                        "(bench/netns_bed.sh, brought up and down here; needs root): ranks split "
                        "between the hosts, so the Gloo data plane and the hierarchy run too")
    p.add_argument("--bed-rate", default="none", help="the bed's link rate (tc tbf), e.g. 1gbit")
    a = p.parse_args()
    if not (a.seconds or a.collectives or a.jobs):
        a.jobs = 10
    return a


def plan_job(args, i):
    """(np, seed, fault, rank, step, env) of job i, a function of the base seed and i only."""
    r = random.Random(args.base_seed * 1000003 + i)
    np = 2 + i % 3 if args.ci else r.randint(2, 4)
    seed = r.getrandbits(31)
    if args.ci:
        fault = (["none"] + KINDS)[i % 5]
    else:
        fault = r.choice(KINDS) if r.randrange(100) < args.fault_percent else "none"
    rank = r.randrange(np)
    step = r.randrange(1, args.steps)
    env = {}
    if r.randrange(4) == 0:
        env["HORA_SHM"] = "0"  # the Gloo data plane
    if r.randrange(4) == 0:
        env["HORA_CACHE_CAPACITY"] = str(r.choice([1, 8, 32]))  # evictions
    if r.randrange(4) == 0:
        env["HORA_FUSION_THRESHOLD_BYTES"] = str(r.choice([0, 4096, 65536]))
    if r.randrange(4) == 0:
        env["HORA_P2P_TRANSPORT"] = "tcp"  # point-to-point over sockets instead of shared memory
    return np, seed, fault, rank, step, env


def read_reports(path):
    """{rank: [(event, {key: value}, msg)]} from the ranks' report file."""
    out = {}
    if not os.path.exists(path):
        return out
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            head, _, msg = line.partition(" msg=")
            parts = head.split()
            if not parts:
                continue
            kv = dict(x.split("=", 1) for x in parts[1:] if "=" in x)
            if "rank" not in kv:
                continue
            out.setdefault(int(kv["rank"]), []).append((parts[0], kv, msg))
    return out


def names_rank(msg, rank):
    if re.search(r"\brank %d\b" % rank, msg):
        return True
    for m in re.finditer(r"missing on ranks ([0-9,]+)", msg):
        if str(rank) in m.group(1).split(","):
            return True
    return False


def check_job(job, reports, steps):
    """Returns (problems, time-to-error list, collectives, checks, wrong)."""
    np, fault, frank, fstep = job["np"], job["fault"], job["rank"], job["step"]
    problems, tte = [], []
    collectives = checks = wrong = 0
    fault_t = None
    fault_when = None
    for ev, kv, _ in reports.get(frank, []):
        if ev == "soak-fault":
            fault_t = float(kv["t"])
            fault_when = kv.get("when")
    if fault != "none" and fault_t is None:
        problems.append("rank %d never reached its fault at step %d" % (frank, fstep))
    for r in range(np):
        lines = reports.get(r, [])
        done = [kv for ev, kv, _ in lines if ev == "soak-done"]
        errors = [(kv, msg) for ev, kv, msg in lines if ev == "soak-error"]
        wrongs = [kv for ev, kv, _ in lines if ev == "soak-wrong"]
        wrong += len(wrongs)
        if wrongs:
            problems.append("rank %d: %d wrong results" % (r, len(wrongs)))
        if done:
            collectives += int(done[0]["led"])
            checks += int(done[0]["collectives"])
        faulty = r == frank and fault != "none"
        if faulty and fault in ("kill9", "sigstop"):
            continue  # it died or was killed while stopped
        if not done:
            problems.append("rank %d did not finish (no soak-done line)" % r)
            continue
        finish_all = fault in ("none", "mismatch", "missing")
        if finish_all and int(done[0]["steps"]) != steps:
            problems.append("rank %d stopped at step %s of %d" % (r, done[0]["steps"], steps))
        if fault == "none" or (faulty and fault == "missing"):
            for kv, msg in errors:
                problems.append("rank %d: unexpected error at step %s: %s" % (r, kv.get("step"), msg[:300]))
            continue
        if not errors:
            problems.append("rank %d: no error after %s of rank %d at step %d" % (r, fault, frank, fstep))
            continue
        first, msg = errors[0]
        # A rank killed or stopped with its step's tensors in flight may have
        # handed them over before the signal landed (small allreduces travel
        # inside the negotiation and need nothing more from it): survivors
        # then finish that step, and later ones without it, and fail at the
        # first that needs it. Still bounded in time from the fault, below.
        # The other way round, such a rank may be a step ahead: it reached
        # step fstep once its own part of step fstep-1 was done, while a
        # survivor was still finishing that step (its last data still on
        # the way, e.g. a ring reduce-scatter's final segment); the loss
        # then fails that step there (seen: rank 2 at step 158, the kill at
        # 159). It cannot be further ahead: finishing step fstep-1 needed
        # every rank's part of it.
        in_flight = fault in ("kill9", "sigstop") and fault_when == "in-flight"
        first_step = int(first.get("step", -1))
        earliest = fstep - 1 if in_flight else fstep
        if first_step < earliest or (first_step != fstep and not in_flight):
            problems.append("rank %d: first error at step %s, the fault was at %d: %s"
                            % (r, first.get("step"), fstep, msg[:300]))
        if not names_rank(msg, frank):
            problems.append("rank %d: the error does not name rank %d: %s" % (r, frank, msg[:300]))
        if int(first.get("status", -1)) != STATUS[fault]:
            problems.append("rank %d: status %s, want %d" % (r, first.get("status"), STATUS[fault]))
        if fault in ("mismatch", "missing"):
            if len(errors) != 1 or first.get("expected") != "1":
                problems.append("rank %d: %d errors, want exactly the fault's tensor" % (r, len(errors)))
            if ('"%s"' % first.get("name")) not in msg:
                problems.append("rank %d: the error does not name the tensor %s" % (r, first.get("name")))
        job.setdefault("example", msg)
        if fault_t is not None and "t" in first:
            dt = float(first["t"]) - fault_t
            tte.append(dt)
            if dt > BOUNDS[fault]:
                problems.append("rank %d: error %.2f s after the fault (bound %.1f s)" % (r, dt, BOUNDS[fault]))
    return problems, tte, collectives, checks, wrong


def kill_job(proc, report):
    """SIGKILL horarun's group and every rank's group (ranks run in their own groups)."""
    pids = [int(kv["pid"]) for lines in read_reports(report).values() for ev, kv, _ in lines
            if ev == "soak-start" and "pid" in kv]
    for pg in [proc.pid] + pids:
        try:
            os.killpg(pg, signal.SIGKILL)
        except OSError:
            pass
        try:  # a rank started through a remote shell need not lead its group
            os.kill(pg, signal.SIGKILL)
        except OSError:
            pass
    proc.wait()


def run_job(args, i, horarun, binary, workdir):
    np, seed, fault, rank, step, env_extra = plan_job(args, i)
    job = dict(index=i, np=np, seed=seed, fault=fault, rank=rank, step=step, env=env_extra)
    d = os.path.join(workdir, "job%06d" % i)
    os.makedirs(d)
    report = os.path.join(d, "report.txt")
    stall = STALL_SHUTDOWN_S.get(fault, STALL_SHUTDOWN_OTHER_S)
    prefix = []
    if args.bed:
        # horarun on host 0, the ranks split between the hosts (host 0 gets the odd one).
        h0 = (np + 1) // 2
        prefix = [args.bed_script, "exec", "--name", args.bed, "0"]
        hosts = ["-H", "10.78.0.1:%d,10.78.0.2:%d" % (h0, np - h0),
                 "--ssh-command", args.bed_rsh + " {host}"]
    cmd = prefix + [horarun, "-np", str(np)] + (hosts if args.bed else []) + [
           "--grace-seconds", str(GRACE_S),
           "--peer-timeout-seconds", str(PEER_TIMEOUT_S),
           "--stall-check-shutdown-time-seconds", str(stall),
           "--stall-check-warning-time-seconds", str(stall / 2),
           "-x", "HORA_FLIGHT_RECORDER_DIR=" + d]
    for k, v in env_extra.items():
        cmd += ["-x", "%s=%s" % (k, v)]
    cmd += [binary, "--seed", str(seed), "--steps", str(args.steps), "--report", report]
    if fault != "none":
        cmd += ["--fault", fault, "--fault-rank", str(rank), "--fault-step", str(step)]
    job["cmd"] = " ".join(cmd)
    deadline = 60 + args.steps * 0.03
    t0 = time.time()
    with open(os.path.join(d, "horarun.out"), "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            job["rc"] = proc.wait(timeout=deadline)
            job["hang"] = False
        except subprocess.TimeoutExpired:
            kill_job(proc, report)
            job["rc"], job["hang"] = None, True
    job["seconds"] = time.time() - t0
    problems, tte, coll, checks, wrong = check_job(job, read_reports(report), args.steps)
    if job["hang"]:
        problems.insert(0, "HANG: the job was still running after %.0f s" % deadline)
    # A sanitizer build (ASan, LSan, UBSan) reports on the ranks' stderr, which horarun forwards.
    with open(os.path.join(d, "horarun.out"), errors="replace") as f:
        for line in f:
            if re.search(r"ERROR: \w+Sanitizer|runtime error:", line):
                problems.append("sanitizer: " + line.strip()[:300])
                break
    job.update(problems=problems, tte=tte, collectives=coll, checks=checks, wrong=wrong, dir=d)
    return job


def summarize(jobs, elapsed):
    lines = []
    add = lines.append
    tot = lambda k: sum(j[k] for j in jobs)
    hangs = sum(1 for j in jobs if j["hang"])
    bad = [j for j in jobs if j["problems"] and not j["hang"]]
    add("jobs: %d (np 2/3/4: %s), %.0f s" % (len(jobs), "/".join(
        str(sum(1 for j in jobs if j["np"] == n)) for n in (2, 3, 4)), elapsed))
    add("collectives: %d (each checked on every member rank: %d rank results)" % (tot("collectives"), tot("checks")))
    add("wrong: %d" % tot("wrong"))
    add("hangs: %d" % hangs)
    add("jobs with unexpected failures or unreported faults: %d" % len(bad))
    add("")
    add("| fault | injected | reported on every survivor, naming the rank | time to error min / median / max (s) | bound (s) |")
    add("|---|---|---|---|---|")
    for k in KINDS:
        js = [j for j in jobs if j["fault"] == k]
        ok = sum(1 for j in js if not j["problems"])
        t = [x for j in js for x in j["tte"]]
        times = "%.3f / %.3f / %.3f" % (min(t), statistics.median(t), max(t)) if t else "-"
        add("| %s | %d | %d | %s | %.1f |" % (k, len(js), ok, times, BOUNDS[k]))
    add("| none | %d | %d finished clean | - | - |" % (
        sum(1 for j in jobs if j["fault"] == "none"),
        sum(1 for j in jobs if j["fault"] == "none" and not j["problems"])))
    for k in KINDS:
        ex = next((j["example"] for j in jobs if j["fault"] == k and "example" in j), None)
        if ex:
            add("")
            add("%s, a survivor's error: %s" % (k, ex[:400]))
    for j in jobs:
        if j["problems"]:
            add("")
            add("job %d (np %d, fault %s rank %d step %d, env %s), logs in %s:" % (
                j["index"], j["np"], j["fault"], j["rank"], j["step"], j["env"], j.get("kept", j["dir"])))
            add("  " + j["cmd"])
            for p in j["problems"][:10]:
                add("  - " + p)
    return lines, bool(tot("wrong") or hangs or bad)


def main():
    args = parse_args()
    horarun = args.horarun or os.path.join(args.build, "launcher", "horarun")
    binary = args.binary or os.path.join(args.build, "tests", "hora_soak")
    for f in (horarun, binary):
        if not os.access(f, os.X_OK):
            sys.exit("soak.py: %s not built (ninja -C %s horarun hora_soak)" % (f, args.build))
    if args.bed:
        args.bed_script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench",
                                       "netns_bed.sh")
        if os.geteuid() != 0:
            print("SKIP: --bed needs root (network namespaces)")
            sys.exit(77)
        up = subprocess.run([args.bed_script, "up", "--name", args.bed, "--hosts", "2", "--rate",
                             args.bed_rate, "--owner", str(os.getpid())],
                            capture_output=True, text=True)
        if up.returncode != 0:
            if re.search(r"ip netns add|UTS namespace", up.stdout + up.stderr):
                print("SKIP: no test bed here: " + (up.stdout + up.stderr).strip()[:300])
                sys.exit(77)
            sys.exit("soak.py: bed up failed: " + (up.stdout + up.stderr).strip()[:600])
        args.bed_rsh = subprocess.run([args.bed_script, "rsh", "--name", args.bed],
                                      capture_output=True, text=True, check=True).stdout.strip()
        # Every path the ranks use must be absolute: the remote shell starts them in this
        # directory, but the binaries are given as the driver saw them.
        horarun, binary = os.path.abspath(horarun), os.path.abspath(binary)
    workdir = tempfile.mkdtemp(prefix="hora-soak.")
    jobs, t0, i = [], time.time(), 0
    try:
        while True:
            if args.jobs and i >= args.jobs:
                break
            if args.seconds and time.time() - t0 >= args.seconds:
                break
            if args.collectives and sum(j["collectives"] for j in jobs) >= args.collectives:
                break
            job = run_job(args, i, horarun, binary, workdir)
            if job["problems"]:
                os.makedirs(args.keep, exist_ok=True)
                job["kept"] = os.path.join(args.keep, os.path.basename(job["dir"]))
                shutil.rmtree(job["kept"], ignore_errors=True)
                shutil.copytree(job["dir"], job["kept"])
            shutil.rmtree(job["dir"], ignore_errors=True)
            jobs.append(job)
            print("job %d: np %d %s%s: %d collectives, %.1f s%s" % (
                i, job["np"], job["fault"],
                "" if job["fault"] == "none" else " rank %d step %d" % (job["rank"], job["step"]),
                job["collectives"], job["seconds"],
                ", time to error " + ",".join("%.3f" % x for x in job["tte"]) if job["tte"] else ""),
                flush=True)
            for p in job["problems"]:
                print("  PROBLEM: " + p, flush=True)
            if args.summary:  # after every job, so a run cut short still has its summary
                with open(args.summary, "w") as f:
                    f.write("\n".join(summarize(jobs, time.time() - t0)[0]) + "\n")
            i += 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if args.bed:
            subprocess.run([args.bed_script, "down", "--name", args.bed])
    lines, failed = summarize(jobs, time.time() - t0)
    print("\n".join(["", "== soak summary =="] + lines))
    if args.summary:
        with open(args.summary, "w") as f:
            f.write("\n".join(lines) + "\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
