#!/usr/bin/env python3
"""Draws hora-bench's allreduce sweep as a PNG: busbw vs message size for hora
and every peer the run measured, and hora/peer vs size below it.

For putting a run's numbers in a results note or a review without reading
the table: one line per implementation (hora, raw Gloo ring, raw Gloo bcube,
and any peer a later hora-bench adds as <peer>_busbw), log-log axes.

    bench/run_bench.sh -np 2 | tee /tmp/run.txt
    /usr/bin/python3 bench/plot_results.py /tmp/run.txt [--out busbw.png]
        [--title TEXT] [--date YYYY-MM-DD] [--stat mean|median]
    bench/run_bench.sh -np 2 --json /tmp/hb.json && bench/plot_results.py /tmp/hb.json
    bench/run_bench.sh -np 2 | bench/plot_results.py - --out busbw.png

Input: run_bench.sh's (rank 0's) stdout, of which only the
"RESULT section=allreduce ..." lines are read, or hora-bench's --json file;
"-" reads stdin. A size measured more than once (several runs concatenated)
is drawn at its median. Bandwidths come from the mean time per allreduce, as
in the bench's table, or with --stat median from the median time (steadier on
a busy machine). With one rank busbw is 0 by definition, so algbw is drawn
instead. The date in the title is the input file's modification date
(today for stdin) unless --date is given.

Prints one summary line. Exit status: 0 = PNG written; 2 = unreadable input,
no sweep results in it, or bad options (the message names the file and the
problem); 3 = matplotlib is missing (scripts/install_deps.sh --python).
"""
import argparse
import datetime
import json
import math
import os
import statistics
import sys

# Readable names for hora-bench's variant keys; an unknown key is shown as is.
PEER_LABELS = {
    "hora": "hora",
    "ring": "raw Gloo ring",
    "bcube": "raw Gloo bcube",
    "mpi": "MPI_Allreduce",
    "torch": "torch.distributed",
    "nccl": "raw NCCL",
}
PEER_STYLES = {"hora": dict(color="#c44e52", marker="o", linewidth=2.2, zorder=3),
               "ring": dict(color="#4c72b0", marker="s"),
               "bcube": dict(color="#55a868", marker="^")}
OTHER_COLOURS = ["#8172b3", "#937860", "#da8bc3", "#ccb974", "#64b5cd"]
# Keys of a RESULT line that end in _busbw but are not one implementation's result.
NOT_PEERS = {"best_raw", "hora_over_raw"}


class InputError(Exception):
    """Bad input: reported as 'FILE: message', exit 2."""


class Sweep:
    """The allreduce sweep of one run: np, and per size, per implementation,
    lists of (busbw, algbw, wrong) samples (several when runs were concatenated)."""

    def __init__(self):
        self.np = None
        self.version = None
        self.quick = False
        self.points = {}  # bytes -> peer -> [(busbw, algbw, wrong)]

    def add(self, where, np_, nbytes, peer, busbw, algbw, wrong):
        if self.np is None:
            self.np = np_
        elif np_ != self.np:
            raise InputError("%s: results of %d ranks mixed with results of %d ranks; "
                             "plot one world size at a time" % (where, np_, self.np))
        self.points.setdefault(nbytes, {}).setdefault(peer, []).append((busbw, algbw, wrong))

    def peers(self):
        found = {p for by_peer in self.points.values() for p in by_peer}
        # hora first, then the peers in the bench's order, then anything new.
        order = ["hora", "ring", "bcube"]
        return [p for p in order if p in found] + sorted(found - set(order))


def _num(where, key, text, integer=False):
    try:
        v = int(text) if integer else float(text)
    except ValueError:
        raise InputError("%s: %s=%r is not a%s" % (where, key, text, "n integer" if integer else " number"))
    if not integer and not math.isfinite(v):
        raise InputError("%s: %s=%s is not finite" % (where, key, text))
    return v


def parse_result_lines(text, stat):
    """run_bench.sh output: 'RESULT section=allreduce np=2 bytes=... hora_busbw=... ring_us=...'."""
    sweep = Sweep()
    for lineno, line in enumerate(text.splitlines(), 1):
        at = line.find("RESULT section=allreduce ")
        if at < 0:
            continue  # tables, comments, the other sections
        where = "line %d" % lineno
        fields = {}
        for tok in line[at + len("RESULT "):].split():
            key, eq, value = tok.partition("=")
            if not eq:
                raise InputError("%s: %r is not key=value" % (where, tok))
            fields[key] = value
        for key in ("np", "bytes"):
            if key not in fields:
                raise InputError("%s: RESULT line without %s=" % (where, key))
        np_ = _num(where, "np", fields["np"], integer=True)
        nbytes = _num(where, "bytes", fields["bytes"], integer=True)
        if np_ < 1 or nbytes < 1:
            raise InputError("%s: np=%d bytes=%d: both must be positive" % (where, np_, nbytes))
        peers = [k[:-len("_busbw")] for k in fields if k.endswith("_busbw")]
        for peer in peers:
            if peer in NOT_PEERS:
                continue
            busbw = _num(where, peer + "_busbw", fields[peer + "_busbw"])
            # busbw is printed with 4 decimals, which rounds small sizes to 0.0000 GB/s; the
            # time has 5-6 digits there, so both bandwidths are recomputed from it as
            # hora-bench defines them (algbw = size/time, busbw = algbw * 2(n-1)/n).
            key = peer + ("_us" if stat == "mean" else "_med_us")
            if stat == "median" and key not in fields:
                raise InputError("%s: no %s= for --stat median" % (where, key))
            us = _num(where, key, fields[key]) if key in fields else None
            algbw = nbytes / us / 1e3 if us and us > 0 else float("nan")
            if us and us > 0:
                busbw = algbw * 2 * (np_ - 1) / np_
            wrong = _num(where, peer + "_wrong", fields.get(peer + "_wrong", "0"), integer=True)
            sweep.add(where, np_, nbytes, peer, busbw, algbw, wrong)
    return sweep


def parse_json(doc, stat):
    """hora-bench --json: {"np": N, "results": [{"section": "allreduce", "bytes": B,
    "hora": {"busbw_GBps": ...}, "ring": {...}, ...}, ...]}."""
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise InputError("JSON without a \"results\" array: not a hora-bench --json file")
    np_ = doc.get("np")
    if not isinstance(np_, int) or isinstance(np_, bool) or np_ < 1:
        raise InputError("JSON \"np\" must be a positive integer, got %s" % json.dumps(np_))
    sweep = Sweep()
    sweep.version = doc.get("hora_version") if isinstance(doc.get("hora_version"), str) else None
    sweep.quick = doc.get("quick") is True
    for i, res in enumerate(doc["results"]):
        if not isinstance(res, dict) or res.get("section") != "allreduce":
            continue
        where = "results[%d]" % i
        nbytes = res.get("bytes")
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 1:
            raise InputError("%s: \"bytes\" must be a positive integer, got %s" % (where, json.dumps(nbytes)))
        for peer, val in res.items():
            if not isinstance(val, dict) or "busbw_GBps" not in val:
                continue
            vals = []
            for key in ("busbw_GBps", "algbw_GBps", "mean_us" if stat == "mean" else "median_us"):
                v = val.get(key, float("nan"))
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise InputError("%s.%s.%s must be a number, got %s" % (where, peer, key, json.dumps(v)))
                vals.append(float(v))
            if vals[2] > 0:  # from the time, as hora-bench computes them (the only way for medians)
                vals[1] = nbytes / vals[2] / 1e3
                vals[0] = vals[1] * 2 * (np_ - 1) / np_
            elif stat == "median":
                raise InputError("%s.%s: no median_us for --stat median" % (where, peer))
            wrong = val.get("wrong", 0)
            if not isinstance(wrong, int) or isinstance(wrong, bool):
                raise InputError("%s.%s.wrong must be an integer, got %s" % (where, peer, json.dumps(wrong)))
            sweep.add(where, np_, nbytes, peer, vals[0], vals[1], wrong)
    return sweep


def load(path, stat="mean"):
    """Returns (sweep, date) from a run_bench.sh output file, a --json file, or stdin ("-");
    bandwidths from the mean or the median time per allreduce (stat)."""
    try:
        if path == "-":
            raw = sys.stdin.buffer.read()
            date = datetime.date.today()
        else:
            with open(path, "rb") as f:
                raw = f.read()
            date = datetime.date.fromtimestamp(os.path.getmtime(path))
    except OSError as e:
        raise InputError("cannot read: %s" % (e.strerror or e))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError("not UTF-8 text (byte %d): not hora-bench output" % e.start)
    if not text.strip():
        raise InputError("empty input")
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError("invalid JSON at line %d column %d: %s" % (e.lineno, e.colno, e.msg))
        sweep = parse_json(doc, stat)
    else:
        sweep = parse_result_lines(text, stat)
    if not sweep.points:
        raise InputError("no allreduce sweep results (no \"RESULT section=allreduce\" lines, or a --json "
                         "file without allreduce results): is this run_bench.sh output with the sweep "
                         "section?")
    if "hora" not in sweep.peers():
        raise InputError("the sweep has no hora results")
    return sweep, date


# ---------------------------------------------------------------- drawing

def fmt_bytes(b):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return "%d %s" % (b >> shift, unit)
    return "%d B" % b


def series(sweep, peer, metric):
    """(sizes, values) of one implementation, median over repeats, positive values only."""
    k = 0 if metric == "busbw" else 1
    xs, ys = [], []
    for nbytes in sorted(sweep.points):
        samples = [s[k] for s in sweep.points[nbytes].get(peer, []) if s[k] > 0]
        if samples:
            xs.append(nbytes)
            ys.append(statistics.median(samples))
    return xs, ys


def render(sweep, out, title, metric):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    peers = sweep.peers()
    others = [p for p in peers if p != "hora"]
    style = {}
    for k, p in enumerate(others):
        style[p] = PEER_STYLES.get(p, dict(color=OTHER_COLOURS[k % len(OTHER_COLOURS)], marker="D"))
    style["hora"] = PEER_STYLES["hora"]

    fig, (ax, axr) = plt.subplots(2, 1, figsize=(10, 8.5), sharex=True,
                                  gridspec_kw=dict(height_ratios=[3, 2]))
    data = {p: dict(zip(*series(sweep, p, metric))) for p in peers}
    for p in peers:
        xs = sorted(data[p])
        if xs:
            ax.plot(xs, [data[p][x] for x in xs], label=PEER_LABELS.get(p, p), markersize=4, **style[p])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_ylabel("%s (GB/s)" % metric)
    ax.grid(True, which="major", color="#dddddd", linewidth=0.6)
    ax.legend(loc="upper left", fontsize=9)
    ax.set_title(title, fontsize=11)

    # hora / peer per size; above 1 hora is faster (bandwidth ratio = inverse time ratio).
    ratio_lines = 0
    for p in others:
        xs = sorted(x for x in data["hora"] if x in data[p])
        if xs:
            axr.plot(xs, [data["hora"][x] / data[p][x] for x in xs], label="hora / %s" % PEER_LABELS.get(p, p),
                     markersize=4, **dict(style[p], linewidth=1.4, zorder=2))
            ratio_lines += 1
    if len(others) > 1:
        xs = sorted(x for x in data["hora"] if any(x in data[p] for p in others))
        best = [max(data[p][x] for p in others if x in data[p]) for x in xs]
        axr.plot(xs, [data["hora"][x] / b for x, b in zip(xs, best)], color="black", linestyle="--",
                 linewidth=1.6, label="hora / best peer", zorder=3)
        ratio_lines += 1
    axr.axhline(1.0, color="#888888", linewidth=0.8, zorder=1)
    axr.set_yscale("log")
    # Ratios mostly lie within a decade or two of 1: plain numbers (0.5, 1, 2, 5) read better
    # than log ticks like 4x10^0; finer steps only when the range is narrow.
    lo, hi = axr.get_ylim()
    for mantissas in ((1, 2, 5), (1, 1.5, 2, 3, 5, 7), (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8)):
        ticks = [m * 10.0 ** e for e in range(-4, 5) for m in mantissas if lo <= m * 10.0 ** e <= hi]
        if len(ticks) >= 4:
            break
    axr.yaxis.set_major_locator(FixedLocator(ticks))
    axr.yaxis.set_major_formatter(FuncFormatter(lambda y, _: "%g" % float("%.3g" % y)))
    axr.yaxis.set_minor_formatter(NullFormatter())
    axr.set_ylabel("hora / peer (>1: hora faster)")
    axr.set_xlabel("message size")
    axr.grid(True, which="major", color="#dddddd", linewidth=0.6)
    if ratio_lines:
        axr.legend(loc="best", fontsize=9)

    # Ticks at the measured sizes (thinned to about 14), named in B/KiB/MiB.
    sizes = sorted(sweep.points)
    step = max(1, math.ceil(len(sizes) / 14))
    axr.xaxis.set_major_locator(FixedLocator(sizes[::step]))
    axr.xaxis.set_minor_locator(NullLocator())
    axr.xaxis.set_major_formatter(FuncFormatter(lambda x, _: fmt_bytes(int(round(x)))))
    plt.setp(axr.get_xticklabels(), rotation=45, ha="right", fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=110)
    finally:
        plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Plot hora-bench's allreduce busbw vs size (and hora/peer) as a PNG.")
    ap.add_argument("input", help="run_bench.sh output (RESULT lines), hora-bench --json file, or - for stdin")
    ap.add_argument("--out", help="PNG to write (default: the input's name with .png; required for stdin)")
    ap.add_argument("--title", help="figure title (default: what, world size and date)")
    ap.add_argument("--date", help="date for the title (default: the input file's modification date)")
    ap.add_argument("--stat", choices=("mean", "median"), default="mean",
                    help="time per allreduce the bandwidths come from (default mean, as in the "
                         "bench's table; median ignores the scheduling outliers of a busy machine)")
    args = ap.parse_args(argv)
    prog = "plot_results.py"
    if args.input == "-" and not args.out:
        print("%s: reading stdin needs --out FILE.png" % prog, file=sys.stderr)
        return 2
    out = args.out or os.path.splitext(args.input)[0] + ".png"
    if os.path.abspath(out) == os.path.abspath(args.input):
        print("%s: --out would overwrite the input %s" % (prog, args.input), file=sys.stderr)
        return 2
    try:
        sweep, date = load(args.input, args.stat)
    except InputError as e:
        print("%s: %s: %s" % (prog, "stdin" if args.input == "-" else args.input, e), file=sys.stderr)
        return 2
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("%s: matplotlib is missing (apt-get install python3-matplotlib, or "
              "scripts/install_deps.sh --python)" % prog, file=sys.stderr)
        return 3

    metric = "busbw" if sweep.np > 1 else "algbw"  # busbw = algbw * 2(n-1)/n is 0 for one rank
    peers = sweep.peers()
    wrong = sum(s[2] for by_peer in sweep.points.values() for ss in by_peer.values() for s in ss)
    repeats = max(len(ss) for by_peer in sweep.points.values() for ss in by_peer.values())
    if args.title is not None:
        title = args.title
    else:
        title = "hora allreduce (float32 sum) %s vs size: %d rank%s, %s" % (
            metric, sweep.np, "" if sweep.np == 1 else "s", args.date or date.isoformat())
        extras = [x for x in ("hora " + sweep.version if sweep.version else "",
                              "--quick" if sweep.quick else "",
                              "median times" if args.stat == "median" else "",
                              "median of %d runs" % repeats if repeats > 1 else "") if x]
        if extras:
            title += " (" + ", ".join(extras) + ")"
        if wrong:
            title += "\nWRONG RESULTS: %d mismatching elements" % wrong
    try:
        render(sweep, out, title, metric)
    except OSError as e:
        print("%s: cannot write %s: %s" % (prog, out, e.strerror or e), file=sys.stderr)
        return 2
    sizes = sorted(sweep.points)
    hx, hy = series(sweep, "hora", metric)
    top = "hora %s at %s %.3f GB/s" % (metric, fmt_bytes(hx[-1]), hy[-1]) if hx else "no positive hora values"
    print("%s: np=%d, %d sizes (%s..%s), %s: %s; %d wrong -> %s" % (
        "stdin" if args.input == "-" else args.input, sweep.np, len(sizes), fmt_bytes(sizes[0]),
        fmt_bytes(sizes[-1]), ", ".join(PEER_LABELS.get(p, p) for p in peers), top, wrong, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
