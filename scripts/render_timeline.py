#!/usr/bin/env python3
"""Renders a hora timeline trace (HORA_TIMELINE, Chrome Trace Event Format) to a PNG.

For looking at a trace where no browser is at hand (CI artifacts, a headless
machine, a bug report): one row per (rank, lane), spans as bars coloured by
category, instants as thin ticks, time in ms from the trace's first event.

    /usr/bin/python3 scripts/render_timeline.py TRACE.json [--out TRACE.png]
        [--start-ms MS] [--end-ms MS] [--title TEXT] [--dpi N]

Input: the JSON object form {"traceEvents": [...], ...}, a bare JSON array of
events, or either one cut short (a job that died mid-write: the missing "]"
and a partial last event are tolerated, as chrome://tracing does). Understood
phases: "X" (complete span), "i"/"I" (instant, scope "g"/"p"/"t") and "M"
(process_name / thread_name); other phases are counted and skipped.

Prints one summary line. Exit status: 0 = PNG written; 2 = unreadable or
malformed trace, or bad options (the message names the file and the problem);
3 = matplotlib is missing (scripts/install_deps.sh --python installs it).
"""
import argparse
import json
import math
import os
import re
import sys

# Lane names for hora's tids when the trace carries no thread_name metadata
# (a trace cut short before its metadata was written).
DEFAULT_LANES = {0: "negotiation", 1: "data plane", 2: "framework"}

# Fixed colours for the categories hora writes, so that the same phase has the
# same colour in every picture; anything else gets a palette colour by name.
CATEGORY_COLOURS = {
    "negotiate": "#4c72b0",
    "queue": "#bbbbbb",
    "wait": "#999999",
    "pack": "#dd8452",
    "unpack": "#c44e52",
    "collective": "#55a868",
    "allreduce": "#55a868",
    "allgather": "#8172b3",
    "broadcast": "#937860",
    "alltoall": "#da8bc3",
    "reducescatter": "#8c8c8c",
    "barrier": "#ccb974",
    "framework": "#64b5cd",
}
INSTANT_COLOURS = {"cycle": "#555555", "stall": "#d62728"}


class TraceError(Exception):
    """Malformed input: reported as 'FILE: message', exit 2."""


# ---------------------------------------------------------------- reading

_PARTIAL_TOKEN = re.compile(r"[-+.eE0-9]+|t(r(ue?)?)?|f(a(l(se?)?)?)?|n(u(ll?)?)?|\\.*")


def _cut_by_eof(text, err):
    """True when a JSON error is what a file cut short produces (so the text
    before it may be salvaged), False for text that is wrong in itself."""
    rest = text[err.pos:].strip()
    return (not rest or err.msg.startswith("Unterminated string")
            or _PARTIAL_TOKEN.fullmatch(rest) is not None)


def _line_col(text, pos):
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


def _salvage_events(text):
    """The complete events of a truncated trace, read one by one from the
    start of its event array. Returns (events, dropped_partial_event)."""
    stripped = text.lstrip()
    if stripped.startswith("["):
        pos = len(text) - len(stripped) + 1
    else:
        m = re.search(r'"traceEvents"\s*:\s*\[', text)
        if not m:
            raise TraceError("truncated before its \"traceEvents\" array began")
        pos = m.end()
    decoder = json.JSONDecoder()
    events = []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return events, False
        try:
            event, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            if _cut_by_eof(text, err):
                return events, True
            line, col = _line_col(text, err.pos)
            raise TraceError("invalid JSON at line %d column %d: %s" % (line, col, err.msg))
        events.append(event)


def load_events(path):
    """Reads a trace file. Returns (events, notes): notes are remarks for the
    summary line (e.g. that the file was truncated)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise TraceError("cannot read: %s" % (e.strerror or e))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError("not UTF-8 text (byte %d): not a JSON trace" % e.start)
    if not text.strip():
        raise TraceError("empty file")
    notes = []
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        if not _cut_by_eof(text, err):
            line, col = _line_col(text, err.pos)
            raise TraceError("invalid JSON at line %d column %d: %s" % (line, col, err.msg))
        events, partial = _salvage_events(text)
        notes.append("truncated trace" + (", partial last event dropped" if partial else ""))
        return events, notes
    if isinstance(doc, dict):
        if "traceEvents" not in doc:
            raise TraceError("JSON object without a \"traceEvents\" array")
        events = doc["traceEvents"]
        if not isinstance(events, list):
            raise TraceError("\"traceEvents\" is a JSON %s, not an array" % _json_type(events))
    elif isinstance(doc, list):
        events = doc
    else:
        raise TraceError("top level is a JSON %s, not an object or an array of events" % _json_type(doc))
    return events, notes


# ---------------------------------------------------------------- checking

def _json_type(v):
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
            float: "number", type(None): "null"}.get(type(v), type(v).__name__)


def _where(ev, i):
    name = ev.get("name")
    return "event %d (ph %s%s)" % (i, json.dumps(ev.get("ph")),
                                   ", name %s" % json.dumps(name) if name is not None else "")


def _short(v):
    text = json.dumps(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _number(ev, i, key, required=True):
    v = ev.get(key)
    if v is None and not required:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise TraceError("%s: \"%s\" must be a finite number, got %s" % (_where(ev, i), key, _short(v)))
    return float(v)


def _ident(ev, i, key):
    v = ev.get(key, 0)
    if not _is_int(v):
        raise TraceError("%s: \"%s\" must be an integer, got %s" % (_where(ev, i), key, _short(v)))
    return v


class Trace:
    """The checked content of a trace: spans (pid, tid, ts, dur, name, cat),
    instants (pid, tid, ts, name, scope) and names, times in microseconds."""

    def __init__(self, events):
        self.spans, self.instants = [], []
        self.process_names, self.thread_names = {}, {}
        self.skipped = 0  # events of phases not drawn (B/E, counters, flows...)
        for i, ev in enumerate(events):
            if not isinstance(ev, dict):
                raise TraceError("event %d is a JSON %s, not an object" % (i, _json_type(ev)))
            ph = ev.get("ph")
            if not isinstance(ph, str):
                raise TraceError("event %d has no \"ph\" (phase) string" % i)
            if ph == "X":
                dur = _number(ev, i, "dur")
                if dur < 0:
                    raise TraceError("%s: negative \"dur\" %g" % (_where(ev, i), dur))
                self.spans.append((_ident(ev, i, "pid"), _ident(ev, i, "tid"), _number(ev, i, "ts"), dur,
                                   str(ev.get("name", "")), str(ev.get("cat") or "(none)")))
            elif ph in ("i", "I"):
                scope = ev.get("s", "t")
                if scope not in ("g", "p", "t"):
                    raise TraceError("%s: instant scope \"s\" must be g, p or t, got %s"
                                     % (_where(ev, i), _short(scope)))
                self.instants.append((_ident(ev, i, "pid"), _ident(ev, i, "tid"), _number(ev, i, "ts"),
                                      str(ev.get("name", "")), scope))
            elif ph == "M":
                args = ev.get("args")
                label = args.get("name") if isinstance(args, dict) else None
                if ev.get("name") == "process_name" and isinstance(label, str):
                    self.process_names[_ident(ev, i, "pid")] = label
                elif ev.get("name") == "thread_name" and isinstance(label, str):
                    self.thread_names[(_ident(ev, i, "pid"), _ident(ev, i, "tid"))] = label
            else:
                self.skipped += 1
        times = [s[2] for s in self.spans] + [s[2] + s[3] for s in self.spans] + [t[2] for t in self.instants]
        if not times:
            raise TraceError("no spans (ph \"X\") or instants (ph \"i\") to draw")
        self.t0, self.t1 = min(times), max(times)
        rows = {(s[0], s[1]) for s in self.spans}
        rows |= {(t[0], t[1]) for t in self.instants if t[4] == "t"}
        # Ranks only named by process-scoped instants still get a row.
        for pid in {t[0] for t in self.instants if t[4] == "p"} - {r[0] for r in rows}:
            rows.add((pid, min((t[1] for t in self.instants if t[0] == pid), default=0)))
        self.rows = sorted(rows)
        self.ranks = sorted({r[0] for r in self.rows})

    def row_label(self, pid, tid):
        proc = self.process_names.get(pid, "rank %d" % pid)
        lane = self.thread_names.get((pid, tid), DEFAULT_LANES.get(tid, "tid %d" % tid))
        return "%s · %s" % (proc, lane)


# ---------------------------------------------------------------- drawing

def _category_colours(categories):
    import matplotlib
    import matplotlib.pyplot as plt
    palette = plt.get_cmap("tab20").colors
    used = {CATEGORY_COLOURS[c] for c in categories if c in CATEGORY_COLOURS}
    free = [matplotlib.colors.to_hex(c) for c in palette if matplotlib.colors.to_hex(c) not in used]
    colours, k = {}, 0
    for c in sorted(categories):
        if c in CATEGORY_COLOURS:
            colours[c] = CATEGORY_COLOURS[c]
        else:
            colours[c] = free[k % len(free)]
            k += 1
    return colours


def render(trace, out, start_ms, end_ms, title, dpi):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    lo = trace.t0 + start_ms * 1000.0 if start_ms is not None else trace.t0
    hi = trace.t0 + end_ms * 1000.0 if end_ms is not None else trace.t1
    if hi <= lo:  # a trace that is one instant, or a window of width 0
        hi = lo + 1.0
    if end_ms is None:  # a little room after the last span's end, so it does not look cut off
        hi += (hi - lo) * 0.01
    view_ms = (hi - lo) / 1000.0
    to_ms = lambda us: (us - trace.t0) / 1000.0  # noqa: E731

    row_of = {r: k for k, r in enumerate(trace.rows)}
    n = len(trace.rows)
    height = min(60.0, max(3.0, 1.6 + 0.32 * n))
    fig, ax = plt.subplots(figsize=(14, height))

    # Alternate shading per rank, so that a rank's lanes read as one group.
    rank_rows = {}  # pid -> (first row, last row); rows are sorted by pid
    for k, r in enumerate(trace.rows):
        rank_rows[r[0]] = (rank_rows.get(r[0], (k, k))[0], k)
    for k, pid in enumerate(trace.ranks):
        if k % 2:
            ax.axhspan(rank_rows[pid][0] - 0.5, rank_rows[pid][1] + 0.5, color="#f2f2f2", zorder=0)

    spans = [s for s in trace.spans if s[2] + s[3] >= lo and s[2] <= hi]
    colours = _category_colours({s[5] for s in spans})
    # Spans far shorter than a pixel would vanish; give them a minimum drawn
    # width (a 2000th of the view) so that a burst of tiny ops stays visible.
    min_w = view_ms / 2000.0
    by_row_cat = {}
    for pid, tid, ts, dur, _, cat in spans:
        by_row_cat.setdefault((row_of[(pid, tid)], cat), []).append((to_ms(ts), max(dur / 1000.0, min_w)))
    for (row, cat), bars in by_row_cat.items():
        ax.broken_barh(bars, (row - 0.38, 0.76), facecolors=colours[cat], linewidth=0, zorder=2)

    # Names inside bars wide enough to hold them (capped: text is slow to draw).
    wide = sorted((s for s in spans if s[3] / 1000.0 > view_ms / 12 and s[4]), key=lambda s: -s[3])[:200]
    for pid, tid, ts, dur, name, _ in wide:
        x = to_ms((max(ts, lo) + min(ts + dur, hi)) / 2)  # centre of the visible part
        ax.text(x, row_of[(pid, tid)], name, ha="center", va="center", fontsize=7, clip_on=True, zorder=3)

    instants = [t for t in trace.instants if lo <= t[2] <= hi]
    instant_names = sorted({t[3] for t in instants})
    palette = ["#555555", "#d62728", "#17becf", "#bcbd22", "#9467bd", "#8c564b"]
    icolour = {}
    for k, name in enumerate(instant_names):
        icolour[name] = INSTANT_COLOURS.get(name, palette[k % len(palette)])
    ticks = {}  # name -> ([x], [y0], [y1]): one vlines call per name, not per instant
    for pid, tid, ts, name, scope in instants:
        if scope == "g":
            y0, y1 = -0.5, n - 0.5
        elif scope == "p":
            y0, y1 = rank_rows[pid][0] - 0.45, rank_rows[pid][1] + 0.45
        else:
            y0, y1 = row_of[(pid, tid)] - 0.45, row_of[(pid, tid)] + 0.45
        xs, y0s, y1s = ticks.setdefault(name, ([], [], []))
        xs.append(to_ms(ts))
        y0s.append(y0)
        y1s.append(y1)
    for name, (xs, y0s, y1s) in ticks.items():
        # Not antialiased: a 1-pixel tick blended into its background would come out
        # as a pale line of neither colour.
        ax.vlines(xs, y0s, y1s, colors=icolour[name], linewidth=1.6 if name == "stall" else 0.8,
                  antialiased=False, zorder=4)

    ax.set_yticks(range(n))
    ax.set_yticklabels([trace.row_label(*r) for r in trace.rows], fontsize=8)
    ax.set_ylim(n - 0.5, -0.5)  # rank 0 at the top, as trace viewers show it
    ax.set_xlim(to_ms(lo), to_ms(hi))
    ax.set_xlabel("time (ms) from the first event")
    ax.grid(axis="x", color="#dddddd", linewidth=0.5, zorder=1)
    ax.set_axisbelow(True)
    ax.set_title(title)

    handles = [Patch(facecolor=colours[c], label=c) for c in sorted(colours)]
    handles += [Line2D([0], [0], color=icolour[nm], linewidth=1.2, label="%s (instant)" % nm)
                for nm in instant_names]
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8,
                  frameon=False, title="category", title_fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=dpi)
    finally:
        plt.close(fig)
    return len(spans), len(instants)


# ---------------------------------------------------------------- command line

def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Render a hora timeline trace (Chrome Trace Event Format JSON) to a PNG.")
    ap.add_argument("trace", help="trace file (JSON object or array; may be truncated)")
    ap.add_argument("--out", help="PNG to write (default: the trace's name with .png)")
    ap.add_argument("--start-ms", type=float, help="window start, ms from the first event")
    ap.add_argument("--end-ms", type=float, help="window end, ms from the first event")
    ap.add_argument("--title", help="figure title (default: the trace's file name)")
    ap.add_argument("--dpi", type=int, default=110, help="resolution (default 110)")
    args = ap.parse_args(argv)
    prog = "render_timeline.py"

    if args.start_ms is not None and args.end_ms is not None and args.end_ms <= args.start_ms:
        print("%s: --end-ms (%g) must be after --start-ms (%g)" % (prog, args.end_ms, args.start_ms),
              file=sys.stderr)
        return 2
    if not 10 <= args.dpi <= 1000:
        print("%s: --dpi must be between 10 and 1000" % prog, file=sys.stderr)
        return 2
    out = args.out or os.path.splitext(args.trace)[0] + ".png"
    try:
        events, notes = load_events(args.trace)
        trace = Trace(events)
    except TraceError as e:
        print("%s: %s: %s" % (prog, args.trace, e), file=sys.stderr)
        return 2
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("%s: matplotlib is missing (apt-get install python3-matplotlib, or "
              "scripts/install_deps.sh --python)" % prog, file=sys.stderr)
        return 3
    title = args.title if args.title is not None else os.path.basename(args.trace)
    try:
        n_spans, n_instants = render(trace, out, args.start_ms, args.end_ms, title, args.dpi)
    except OSError as e:
        print("%s: cannot write %s: %s" % (prog, out, e.strerror or e), file=sys.stderr)
        return 2
    if trace.skipped:
        notes.append("%d events of other phases skipped" % trace.skipped)
    window = ""
    if args.start_ms is not None or args.end_ms is not None:
        window = ", window %s-%s ms (%d spans, %d instants in it)" % (
            "%g" % args.start_ms if args.start_ms is not None else "start",
            "%g" % args.end_ms if args.end_ms is not None else "end", n_spans, n_instants)
    print("%s: %d events (%d spans, %d instants), %d ranks, %d lanes, span %.3f ms%s%s -> %s" % (
        args.trace, len(events), len(trace.spans), len(trace.instants), len(trace.ranks), len(trace.rows),
        (trace.t1 - trace.t0) / 1000.0, window, "".join("; " + s for s in notes), out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
