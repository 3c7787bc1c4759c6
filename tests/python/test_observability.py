"""Observability from Python (issue 16): hvd.start_timeline/stop_timeline write one
Chrome trace of every rank that parses and holds the expected events (negotiation,
fused data-plane groups, cache hits, cycle markers, a wait for the slow rank);
hora.metrics() counts a known schedule; the straggler ranking names a slow rank;
misuse (a second start, an unwritable path, stop without start) raises a clear
error and training goes on."""
import json
import os
import tempfile

from harness import run_job


def load_trace(path):
    """The trace as Perfetto reads it: the JSON Array Format may lack its "]"."""
    with open(path) as f:
        text = f.read().rstrip()
    if text.endswith(","):
        text = text[:-1]
    if not text.endswith("]"):
        text += "]"
    return json.loads(text)


def timeline_job(rank, size, path):
    import time
    import torch
    import hora.torch as hvd
    hvd.init()
    hvd.start_timeline(path, mark_cycles=True)
    for step in range(4):
        if rank == 1:
            time.sleep(0.03)  # rank 1 is the slow one
        handles = [hvd.allreduce_async(torch.ones(64) * (rank + 1), name="g.%d" % i, op=hvd.Sum) for i in range(6)]
        for h in handles:
            assert hvd.synchronize(h).tolist() == [sum(range(1, size + 1))] * 64
    hvd.stop_timeline()
    m = hvd.metrics()
    hvd.shutdown()
    return m


def test_timeline_holds_every_rank_and_the_expected_events():
    path = os.path.join(tempfile.mkdtemp(prefix="hora-tl-"), "trace.json")
    results, logs = run_job(timeline_job, 2, path, timeout=120)
    events = load_trace(path)
    spans = [e for e in events if e.get("ph") == "X"]
    assert {e["pid"] for e in spans} == {0, 1}, "not every rank's events are in the one file"
    names = {(e["pid"], e["args"]["name"]) for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    assert {p for p, _ in names} == {0, 1}
    for rank in (0, 1):
        nego = [e for e in spans if e["pid"] == rank and e["cat"] == "negotiate"]
        assert len(nego) == 24, (rank, len(nego))  # 6 tensors x 4 steps
        assert {e["args"]["cache"] for e in nego} == {"hit", "miss"}
        data = [e for e in spans if e["pid"] == rank and e["cat"] == "allreduce"]
        assert sum(e["args"]["count"] for e in data) == 24
        assert all(e["args"]["status"] == "ok" and e["args"]["plane"] for e in data)
        assert all(e["dur"] >= 0 and e["tid"] == 2 for e in data)
        # pack and unpack, summed over the ranges the backend interleaves with the network
        assert all(0 <= e["args"]["pack_us"] and 0 <= e["args"]["unpack_us"] for e in data)
        assert any("fused" in e["name"] for e in data) or len(data) == 24
        cycles = [e for e in events if e.get("ph") == "i" and e["name"] == "cycle" and e["pid"] == rank]
        assert cycles, "mark_cycles=True but no cycle markers on rank %d" % rank
    waits = [e for e in spans if e["cat"] == "wait"]
    assert waits and all(e["pid"] == 0 for e in waits)  # the coordinator sees arrivals
    assert any(e["args"]["last_rank"] == 1 for e in waits)
    # Rank 0 (coordinator) ranks rank 1 as the straggler.
    m0 = results[0]
    assert m0["collectives"]["allreduce"]["count"] == 24
    assert m0["stragglers"][0]["rank"] == 1, m0["stragglers"]
    assert results[1]["stragglers"] == []  # only the coordinator sees arrivals


def misuse_job(rank, size, path):
    import torch
    import hora
    import hora.torch as hvd
    hvd.init()
    out = {}
    try:
        hvd.stop_timeline()
    except hora.HoraError as e:
        out["stop"] = str(e)
    try:
        hvd.start_timeline("/proc/no-such-dir/trace.json")
    except hora.HoraError as e:
        out["unwritable"] = str(e)
    hvd.start_timeline(path)
    try:
        hvd.start_timeline(path)
    except hora.HoraError as e:
        out["twice"] = str(e)
    assert hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist() == [size, size]
    hvd.stop_timeline()
    try:
        hora.metrics(format="xml")
    except ValueError as e:
        out["format"] = str(e)
    out["prom"] = hora.metrics(format="prometheus")
    out["flight"] = hora.metrics(format="flight")
    out["dump"] = hora.dump_flight_recorder("from the test")
    with open(out["dump"]) as f:
        out["dump_text"] = f.read()
    hvd.shutdown()
    return out


def test_misuse_is_a_clear_error_and_training_goes_on():
    d = tempfile.mkdtemp(prefix="hora-tl-")
    results, _ = run_job(misuse_job, 2, os.path.join(d, "t.json"), timeout=120,
                         extra_env={"HORA_FLIGHT_RECORDER_DIR": d})
    for rank, out in enumerate(results):
        assert "no timeline is being recorded" in out["stop"]
        assert "/proc/no-such-dir/trace.json" in out["unwritable"] and "cannot open" in out["unwritable"]
        assert "already records to" in out["twice"]
        assert "format must be one of" in out["format"]
        assert 'hora_collectives_total{set="global",rank="%d",kind="allreduce"} 1' % rank in out["prom"]
        assert "done\tallreduce" in out["flight"]
        assert out["dump"].startswith(d) and "why: from the test" in out["dump_text"]
