"""The plotting scripts (issue 16): scripts/render_timeline.py and
bench/plot_results.py, run as a user runs them (a subprocess of this
interpreter) on small synthetic inputs. Needs matplotlib, not libhora or
torch; skipped when matplotlib is missing."""
import json
import os
import struct
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
RENDER = os.path.join(REPO, "scripts", "render_timeline.py")
PLOT = os.path.join(REPO, "bench", "plot_results.py")

ALLREDUCE_RGB = (0x55, 0xA8, 0x68)  # render_timeline's fixed colour for "allreduce"
STALL_RGB = (0xD6, 0x27, 0x28)      # ... and for "stall" instants


@pytest.fixture(autouse=True)
def _need_matplotlib():
    pytest.importorskip("matplotlib", reason="python3-matplotlib not installed (scripts/install_deps.sh --python)")


def run(script, *args):
    p = subprocess.run([sys.executable, script] + [str(a) for a in args], capture_output=True, text=True,
                       timeout=120)
    assert "Traceback" not in p.stderr, p.stderr
    return p


def png_size(path):
    """(width, height) from the PNG header, after checking it is one."""
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "%s is not a PNG" % path
    assert head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def has_colour(path, rgb):
    """Whether some pixel of the PNG has exactly this colour (bar interiors do)."""
    import matplotlib.image
    import numpy as np
    img = matplotlib.image.imread(path)[..., :3]
    if img.dtype != np.uint8:
        img = np.round(img * 255).astype(np.uint8)
    return bool(np.all(img == np.array(rgb, dtype=np.uint8), axis=-1).any())


def synthetic_events(cycles=6):
    """2 ranks x 3 lanes with metadata, spans of several categories, cycle
    instants per lane, one process-scoped stall and one B event (skipped)."""
    ev = []
    for r in range(2):
        ev.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": "rank %d" % r}})
        for tid, lane in enumerate(["negotiation", "data plane", "framework"]):
            ev.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": lane}})
    t = 1000.0
    for c in range(cycles):
        for r in range(2):
            ev.append({"ph": "i", "name": "cycle", "cat": "cycle", "pid": r, "tid": 0, "ts": t, "s": "t"})
            ev.append({"ph": "X", "name": "negotiate", "cat": "negotiate", "pid": r, "tid": 0, "ts": t + 5,
                       "dur": 90 + 10 * r, "args": {"tensors": 2}})
            ev.append({"ph": "X", "name": "grad.%d" % c, "cat": "queue", "pid": r, "tid": 2, "ts": t - 40,
                       "dur": 140})
            ts = t + 120
            for cat, dur in (("pack", 40), ("allreduce", 400 + 50 * r), ("unpack", 30)):
                ev.append({"ph": "X", "name": cat, "cat": cat, "pid": r, "tid": 1, "ts": ts, "dur": dur,
                           "args": {"bytes": 1 << 20, "plane": "shm"}})
                ts += dur
        t += 1000.0
    ev.append({"ph": "i", "name": "stall", "pid": 1, "tid": 0, "ts": t - 300, "s": "p"})
    ev.append({"ph": "B", "name": "unpaired", "pid": 0, "tid": 1, "ts": t})
    return ev


def test_timeline_renders(tmp_path):
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": synthetic_events(), "displayTimeUnit": "ms",
                                 "otherData": {"hora_version": "test"}}))
    out = tmp_path / "trace.png"
    p = run(RENDER, trace, "--out", out, "--title", "synthetic")
    assert p.returncode == 0, p.stderr
    summary = p.stdout.strip()
    assert "\n" not in summary
    assert "2 ranks" in summary and "6 lanes" in summary and "1 events of other phases skipped" in summary
    w, h = png_size(out)
    assert 800 <= w <= 4000 and 200 <= h <= 3000, (w, h)
    assert has_colour(out, ALLREDUCE_RGB), "no allreduce bar drawn"
    assert has_colour(out, STALL_RGB), "no stall tick drawn"


def test_timeline_window_default_out(tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps(synthetic_events()))  # the bare-array form
    p = run(RENDER, trace, "--start-ms", 1, "--end-ms", 2.5)
    assert p.returncode == 0, p.stderr
    assert "window 1-2.5 ms" in p.stdout
    png_size(tmp_path / "t.png")


@pytest.mark.parametrize("form", ["array_without_bracket", "object_cut_mid_event"])
def test_timeline_truncated_trace_renders(tmp_path, form):
    lines = [json.dumps(e) for e in synthetic_events()]
    if form == "array_without_bracket":  # a writer that died after an event and its comma
        text = "[\n" + ",\n".join(lines) + ",\n"
    else:  # died in the middle of writing the last event
        text = '{"displayTimeUnit": "ms", "traceEvents": [\n' + ",\n".join(lines)
        text = text[:-25]
    trace = tmp_path / "dead.json"
    trace.write_text(text)
    out = tmp_path / "dead.png"
    p = run(RENDER, trace, "--out", out)
    assert p.returncode == 0, p.stderr
    assert "truncated trace" in p.stdout
    if form == "object_cut_mid_event":
        assert "partial last event dropped" in p.stdout
    png_size(out)
    assert has_colour(out, ALLREDUCE_RGB)


@pytest.mark.parametrize("text, reason", [
    ("", "empty file"),
    ('{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2, "pid": 0, "tid": 0}, {oops}, '
     '{"ph": "i", "ts": 3, "pid": 0}]}', "invalid JSON at line 1"),
    ('{"events": []}', '"traceEvents"'),
    ('[{"ph": "X", "ts": "soon", "dur": 2, "pid": 0, "tid": 0}]', '"ts" must be a finite number'),
    ('[{"ph": "X", "ts": 1, "dur": -5, "pid": 0, "tid": 0}]', 'negative "dur"'),
    ('[{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "rank 0"}}]', "no spans"),
    ("42", "top level is a JSON number"),
])
def test_timeline_malformed_input_exits_2(tmp_path, text, reason):
    trace = tmp_path / "bad.json"
    trace.write_text(text)
    out = tmp_path / "bad.png"
    p = run(RENDER, trace, "--out", out)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert str(trace) in p.stderr and reason in p.stderr, p.stderr
    assert not out.exists()


def test_timeline_missing_file_exits_2(tmp_path):
    p = run(RENDER, tmp_path / "none.json")
    assert p.returncode == 2 and "none.json" in p.stderr and "cannot read" in p.stderr


# ---------------------------------------------------------------- plot_results

def bench_output(np_=2):
    """What run_bench.sh prints, reduced to a few table lines and the RESULT lines."""
    lines = ["# ==== 1+2. allreduce sweep, hora vs raw Gloo: float32 sum, in place, %d ranks ====" % np_]
    size = 4
    while size <= 4 << 20:
        us = {"hora": 40 + size / 4000.0, "ring": 70 + size / 1100.0, "bcube": 90 + size / 1000.0}
        bus = {k: size / v / 1e3 * 2 * (np_ - 1) / np_ for k, v in us.items()}
        best = "ring" if us["ring"] <= us["bcube"] else "bcube"
        lines.append("  %d %d 10 | table row" % (size, size // 4))
        lines.append(
            "RESULT section=allreduce np=%d bytes=%d count=%d iters=10 warmup=1 "
            "hora_us=%.2f hora_med_us=%.2f hora_algbw=%.4f hora_busbw=%.4f hora_wrong=0 "
            "ring_us=%.2f ring_med_us=%.2f ring_busbw=%.4f ring_wrong=0 "
            "bcube_us=%.2f bcube_med_us=%.2f bcube_busbw=%.4f bcube_wrong=0 "
            "best_raw=%s best_raw_busbw=%.4f hora_over_raw_busbw=%.4f" % (
                np_, size, size // 4, us["hora"], us["hora"], size / us["hora"] / 1e3, bus["hora"],
                us["ring"], us["ring"], bus["ring"], us["bcube"], us["bcube"], bus["bcube"],
                best, bus[best], us[best] / us["hora"]))
        size *= 16
    lines.append("RESULT section=latency np=%d bytes=4 iters=200 warmup=20 hora_mean_us=150.00" % np_)
    lines.append("RESULT section=summary np=%d total_wrong=0 elapsed_s=12.0" % np_)
    return "\n".join(lines) + "\n"


def test_plot_results_from_run_output(tmp_path):
    src = tmp_path / "run.txt"
    src.write_text(bench_output())
    out = tmp_path / "busbw.png"
    p = run(PLOT, src, "--out", out, "--date", "2026-01-02")
    assert p.returncode == 0, p.stderr
    assert "np=2" in p.stdout and "6 sizes" in p.stdout and "raw Gloo ring" in p.stdout, p.stdout
    w, h = png_size(out)
    assert 600 <= w <= 3000 and 500 <= h <= 3000, (w, h)
    p = run(PLOT, src, "--out", tmp_path / "median.png", "--stat", "median")
    assert p.returncode == 0, p.stderr
    png_size(tmp_path / "median.png")


def test_plot_results_from_json(tmp_path):
    results = []
    for size in (1024, 1 << 20, 64 << 20):
        entry = {"section": "allreduce", "bytes": size, "count": size // 4, "iters": 10, "warmup": 1,
                 "best_raw": "ring", "hora_over_raw_busbw": 2.0}
        for peer, gbps in (("hora", 2.0), ("ring", 1.0), ("bcube", 0.9)):
            entry[peer] = {"mean_us": size / gbps / 1e3, "busbw_GBps": gbps * size / (64 << 20) + 0.01,
                           "algbw_GBps": 2 * gbps, "wrong": 0}
        results.append(entry)
    src = tmp_path / "hb.json"
    src.write_text(json.dumps({"np": 4, "quick": True, "hora_version": "0.1.0", "total_wrong": 0,
                               "results": results + [{"section": "latency", "hora": {"mean_us": 9}}]}))
    p = run(PLOT, src)
    assert p.returncode == 0, p.stderr
    assert "np=4" in p.stdout and "3 sizes" in p.stdout, p.stdout
    png_size(tmp_path / "hb.png")


def test_plot_results_without_sweep_exits_2(tmp_path):
    src = tmp_path / "latency_only.txt"
    src.write_text("RESULT section=latency np=2 bytes=4 hora_mean_us=150.00\n")
    p = run(PLOT, src, "--out", tmp_path / "x.png")
    assert p.returncode == 2 and "latency_only.txt" in p.stderr and "no allreduce sweep" in p.stderr, p.stderr
