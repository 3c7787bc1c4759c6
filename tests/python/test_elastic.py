"""hora.torch.elastic (docs/elastic.md, Python section).

Most tests run in this process at size 1 (hora.init() without a launcher):
commit/restore, the run() retry loop, the HostsUpdatedInterrupt path (with the
membership query replaced), ElasticSampler's sharding arithmetic (with explicit
num_replicas/rank). A few run at size 2 in the shared rank pool: sync from rank 0
and the agreement on a pending join. Tests of the C calls hora_epoch and
hora_membership_pending skip while the loaded libhora lacks them. Killing a rank
under horarun --min-np is in test_elastic_multiproc.py (skipped until the
launcher and runtime side land)."""
import collections
import os

import pytest


@pytest.fixture(scope="module")
def hvd():
    import hora.torch as hvd
    hvd.init()
    assert hvd.size() == 1, "these tests expect a single-process job (no HORA_SIZE in the environment)"
    yield hvd
    hvd.shutdown()


def _lib_has(name):
    from hora import _lib
    return _lib.has_symbol(name)


def _model_and_opt(kind="sgd"):
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 1))
    if kind == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
    return model, opt


def _train_step(model, opt, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 4, generator=g)
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()


def _snapshot(model, opt):
    import copy
    return copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())


def _assert_same(a, b, path="state"):
    import torch
    if torch.is_tensor(a):
        assert torch.is_tensor(b) and torch.equal(a, b), "%s differs" % path
    elif isinstance(a, dict):
        assert set(a) == set(b), "%s keys differ: %s vs %s" % (path, sorted(a), sorted(b))
        for k in a:
            _assert_same(a[k], b[k], "%s[%r]" % (path, k))
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), "%s length differs" % path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, "%s[%d]" % (path, i))
    else:
        assert a == b, "%s: %r != %r" % (path, a, b)


# ---------------------------------------------------------------- exceptions, exports

def test_membership_error_and_exports():
    import hora
    import hora.torch as hvd
    from hora.exceptions import error_from_status
    e = error_from_status(15, "rank 2 lost", "HORA_ERR_MEMBERSHIP")
    assert isinstance(e, hora.HoraMembershipError) and isinstance(e, hora.HorovodInternalError)
    assert isinstance(e, RuntimeError) and e.status == 15
    from hora.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
    assert HorovodInternalError is hvd.HorovodInternalError
    assert HostsUpdatedInterrupt is hvd.elastic.HostsUpdatedInterrupt
    assert HostsUpdatedInterrupt(True).skip_sync and not HostsUpdatedInterrupt().skip_sync
    assert not issubclass(HostsUpdatedInterrupt, HorovodInternalError)
    from hora.torch.elastic import ElasticSampler, ObjectState, State, TorchState, run  # noqa: F401
    assert hvd.elastic.run is run and hvd.elastic.TorchState is TorchState
    from hora.common.elastic import run_fn  # noqa: F401


# ---------------------------------------------------------------- TorchState

@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_restore_rolls_back_to_last_commit(hvd, kind):
    model, opt = _model_and_opt(kind)
    _train_step(model, opt, 1)  # the optimizer has state (momentum / Adam moments)
    state = hvd.elastic.TorchState(model, opt, epoch=2, batch=7, history=[1, 2])
    _train_step(model, opt, 2)
    state.epoch, state.batch = 3, 11
    state.commit()
    committed = _snapshot(model, opt)

    for round_ in range(2):  # twice: the first restore must not have aliased the commit
        _train_step(model, opt, 10 + round_)
        _train_step(model, opt, 20 + round_)
        model[0].weight.data.add_(1.0)  # also an in-place change outside the optimizer
        state.history.append(5)  # in place: the commit holds a copy
        state.epoch, state.batch = 9, 99
        state.restore()
        _assert_same(committed[0], model.state_dict(), "model")
        _assert_same(committed[1], opt.state_dict(), "optimizer")
        assert (state.epoch, state.batch, state.history) == (3, 11, [1, 2])


def test_object_state_copies_and_keeps_uncopyable_values():
    import threading
    from hora.elastic import ObjectState
    lock = threading.Lock()
    state = ObjectState(bcast_object=lambda obj: obj, get_rank=lambda: 0, counts={"a": 1}, lock=lock)
    state.counts["a"] = 2
    state.save()
    state.counts["a"] = 3
    state.restore()
    assert state.counts == {"a": 2} and state.lock is lock
    state.sync()
    assert state.counts == {"a": 2}


def test_commit_copies_to_host_and_keeps_metadata(hvd):
    model, opt = _model_and_opt()
    state = hvd.elastic.TorchState(model, opt)
    saved = state._handlers["model"]._saved
    live = model.state_dict()
    for k, v in saved.items():
        assert v.device.type == "cpu" and v.data_ptr() != live[k].data_ptr(), k
    assert getattr(saved, "_metadata", None) is not None  # BatchNorm's version for load_state_dict


def test_assigning_a_model_saves_it(hvd):
    import torch
    model, opt = _model_and_opt()
    state = hvd.elastic.TorchState(model, opt)
    other = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 1))
    state.model = other
    assert state.model is other
    want = {k: v.clone() for k, v in other.state_dict().items()}
    other[0].weight.data.zero_()
    state.restore()
    _assert_same(want, other.state_dict(), "assigned model")


def test_reset_drops_a_distributed_optimizers_failed_step(hvd):
    """After a reset, a DistributedOptimizer holds no allreduce of the old runtime
    and its gradient countdowns start over (here set by hand: at size 1 no hooks run)."""
    import torch
    model, opt = _model_and_opt()
    dopt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, dopt)
    p = next(model.parameters())
    p.grad = torch.ones_like(p)
    dopt._handles[p] = dopt._allreduce_grad_async(p)  # a step in flight when the member was lost
    dopt._allreduce_delay[p] = 0
    hvd.elastic._reset()
    state.on_reset()
    assert not dopt._handles and dopt._allreduce_delay[p] == dopt.backward_passes_per_step
    dopt.zero_grad()  # would raise with a handle left over
    _train_step(model, dopt, 3)


def test_sync_at_size_one_keeps_state(hvd):
    model, opt = _model_and_opt()
    _train_step(model, opt, 1)
    state = hvd.elastic.TorchState(model, opt, epoch=4)
    before = _snapshot(model, opt)
    state.sync()
    _assert_same(before[0], model.state_dict(), "model")
    _assert_same(before[1], opt.state_dict(), "optimizer")
    assert state.epoch == 4


# ---------------------------------------------------------------- run() retry loop

class _Recorder:
    """A State that records the calls run() makes on it."""

    def __init__(self, log):
        from hora.elastic import State
        self.log = log
        outer = self

        class S(State):
            def save(self):
                outer.log.append("save")

            def restore(self):
                outer.log.append("restore")

            def sync(self):
                outer.log.append("sync")

            def reset(self):
                outer.log.append("state.reset")

        self.state = S(bcast_object=lambda obj: obj, get_rank=lambda: 0)
        self.state.register_reset_callbacks([lambda: log.append("callback1"), lambda: log.append("callback2")])


def test_run_retries_membership_errors_in_order():
    from hora.elastic import run_fn
    from hora.exceptions import HoraMembershipError, HoraRemoteError
    log = []
    rec = _Recorder(log)
    failures = [HoraMembershipError("rank 1 lost", 15), HoraRemoteError("peer failed", 7)]

    def func(state, x, y=0):
        log.append("func")
        if failures:
            raise failures.pop(0)
        return x + y

    wrapped = run_fn(func, lambda: log.append("reset"))
    assert wrapped(rec.state, 2, y=3) == 5
    once = ["restore", "reset", "state.reset", "callback1", "callback2", "sync", "func"]
    assert log == ["sync", "func"] + once + once


def test_run_on_hosts_updated_does_not_restore(monkeypatch):
    from hora import basics
    from hora.elastic import run_fn
    log = []
    rec = _Recorder(log)
    pending = [True]
    monkeypatch.setattr(basics, "_membership_supported", lambda: True)
    monkeypatch.setattr(basics, "_membership_pending", lambda: pending.pop(0) if pending else False)

    def func(state):
        log.append("func")
        state.commit()  # raises HostsUpdatedInterrupt the first time
        return "done"

    assert run_fn(func, lambda: log.append("reset"))(rec.state) == "done"
    assert log == ["sync", "func", "save", "reset", "state.reset", "callback1", "callback2", "sync", "func",
                   "save"]


def test_run_skip_sync_interrupt():
    from hora.elastic import run_fn
    from hora.exceptions import HostsUpdatedInterrupt
    log = []
    rec = _Recorder(log)
    raised = []

    def func(state):
        log.append("func")
        if not raised:
            raised.append(1)
            raise HostsUpdatedInterrupt(skip_sync=True)

    run_fn(func, lambda: log.append("reset"))(rec.state)
    assert log == ["sync", "func", "reset", "state.reset", "callback1", "callback2", "func"]


def test_reset_limit_gives_a_clear_error(monkeypatch):
    from hora.elastic import run_fn
    from hora.exceptions import HoraMembershipError, HoraResetLimitError, HorovodInternalError
    log = []
    rec = _Recorder(log)
    calls = []

    def func(state):
        calls.append(1)
        raise HoraMembershipError("rank %d lost" % len(calls), 15)

    with pytest.raises(HoraResetLimitError) as info:
        run_fn(func, lambda: log.append("reset"), reset_limit=2)(rec.state)
    assert len(calls) == 3 and log.count("reset") == 2
    msg = str(info.value)
    assert "2 reset(s)" in msg and "reset_limit=2" in msg and "rank 3 lost" in msg and "HoraMembershipError" in msg
    assert isinstance(info.value.__cause__, HoraMembershipError)
    assert not isinstance(info.value, HorovodInternalError)  # an outer elastic loop must not retry it

    monkeypatch.setenv("HORA_ELASTIC_RESET_LIMIT", "0")
    calls.clear()
    with pytest.raises(HoraResetLimitError, match="HORA_ELASTIC_RESET_LIMIT=0"):
        run_fn(func, lambda: None)(rec.state)
    assert len(calls) == 1

    monkeypatch.setenv("HORA_ELASTIC_RESET_LIMIT", "many")
    with pytest.raises(ValueError, match="HORA_ELASTIC_RESET_LIMIT=many is not a reset count"):
        run_fn(func, lambda: None)(rec.state)


def test_mismatch_is_not_retried():
    from hora.elastic import run_fn
    from hora.exceptions import HoraMismatchError
    log = []
    rec = _Recorder(log)

    def func(state):
        raise HoraMismatchError("shapes differ", 11)

    with pytest.raises(HoraMismatchError):
        run_fn(func, lambda: log.append("reset"))(rec.state)
    assert "reset" not in log and "restore" not in log


def test_torch_run_restores_and_reinitializes(hvd):
    """hvd.elastic.run with the real reset (shutdown + init) at size 1: the
    uncommitted step is rolled back, the runtime is a new one, callbacks ran."""
    from hora import basics
    from hora.exceptions import HoraMembershipError
    model, opt = _model_and_opt()
    state = hvd.elastic.TorchState(model, opt, epoch=0, batch=0)
    runtimes, events = [], []
    state.register_reset_callbacks([lambda: events.append(("callback", hvd.size()))])
    fail_at = {(1, 2)}  # (epoch, batch) where the job "loses a member" once

    @hvd.elastic.run(reset_limit=3)
    def train(state):
        runtimes.append(basics._runtime.value)
        while state.epoch < 2:
            while state.batch < 4:
                if (state.epoch, state.batch) in fail_at:
                    fail_at.clear()
                    events.append(("fail", state.epoch, state.batch))
                    _train_step(model, opt, 1000)  # uncommitted work, lost with the member
                    raise HoraMembershipError("simulated: rank 1 lost", 15)
                _train_step(model, opt, 10 * state.epoch + state.batch)
                state.batch += 1  # the commit records the next batch to run
                state.commit()
            state.epoch, state.batch = state.epoch + 1, 0
        return state.epoch, state.batch

    assert train(state) == (2, 0)
    assert events == [("fail", 1, 2), ("callback", 1)]
    assert len(runtimes) == 2 and hvd.is_initialized()

    # The same schedule without a failure gives the same model: the retry
    # resumed at the commit, with neither the failed step nor a skipped one.
    ref_model, ref_opt = _model_and_opt()
    hvd.broadcast_optimizer_state(ref_opt, root_rank=0)  # run()'s first sync does this step too
    for e in range(2):
        for b in range(4):
            _train_step(ref_model, ref_opt, 10 * e + b)
    _assert_same(ref_model.state_dict(), model.state_dict(), "model after recovery")


def test_check_host_updates_without_pending(hvd, monkeypatch):
    from hora import basics
    state = hvd.elastic.TorchState(epoch=1)
    monkeypatch.setattr(basics, "_membership_supported", lambda: True)
    monkeypatch.setattr(basics, "_membership_pending", lambda: False)
    state.commit()
    monkeypatch.setattr(basics, "_membership_pending", lambda: True)
    with pytest.raises(hvd.HostsUpdatedInterrupt):
        state.commit()


# ---------------------------------------------------------------- C calls (after the merge)

@pytest.mark.skipif(not _lib_has("hora_epoch"), reason="the loaded libhora has no hora_epoch yet")
def test_epoch_query(hvd):
    e = hvd.epoch()
    assert isinstance(e, int) and e >= 0


@pytest.mark.skipif(not _lib_has("hora_membership_pending"),
                    reason="the loaded libhora has no hora_membership_pending yet")
def test_membership_pending_outside_elastic_mode(hvd):
    from hora import basics
    assert basics._membership_pending() is False
    hvd.elastic.TorchState(epoch=0).commit()  # the real query: nothing waits, no interrupt


@pytest.mark.skipif(_lib_has("hora_epoch"), reason="the loaded libhora has hora_epoch")
def test_epoch_on_old_library_says_what_to_do(hvd):
    with pytest.raises(NotImplementedError, match="hora_epoch.*is older than this Python package.*HORA_LIBRARY"):
        hvd.epoch()


# ---------------------------------------------------------------- ElasticSampler

def _samplers(n, size, **kw):
    from hora.torch.elastic import ElasticSampler
    return [ElasticSampler(range(n), num_replicas=size, rank=r, **kw) for r in range(size)]


def _run_phase(samplers, batches, batch_size):
    """Every rank processes up to ``batches`` batches of its shard and records
    them; returns the samples processed (with repeats) and the new state_dict."""
    done = []
    for s in samplers:
        shard = list(iter(s))
        for b in range(batches):
            done.extend(shard[b * batch_size:(b + 1) * batch_size])
    for s in samplers:
        for b in range(batches):
            s.record_batch(b, batch_size)
    return done, samplers[0].state_dict()


def test_sampler_shards_cover_the_dataset():
    for n, size in [(10, 1), (10, 3), (12, 4), (2, 5), (0, 3)]:
        samplers = _samplers(n, size)
        shards = [list(iter(s)) for s in samplers]
        assert len({len(sh) for sh in shards}) == 1 and all(len(sh) == len(s) for sh, s in zip(shards, samplers))
        flat = [i for sh in shards for i in sh]
        assert set(flat) == set(range(n)), (n, size)
        pad = (-n) % size if n else 0
        assert len(flat) == n + pad, (n, size)


def test_sampler_epochs_shuffle_deterministically():
    a, b = _samplers(50, 2, seed=3), _samplers(50, 2, seed=3)
    assert list(iter(a[0])) == list(iter(b[0]))
    first = list(iter(a[0]))
    for s in a:
        s.record_batch(0, 5)
        s.set_epoch(1)
    assert a[0].processed_num == 0 and list(iter(a[0])) != first
    assert sorted(list(iter(a[0])) + list(iter(a[1]))) == list(range(50))
    plain = _samplers(6, 2, shuffle=False)
    assert list(iter(plain[0])) == [0, 2, 4] and list(iter(plain[1])) == [1, 3, 5]


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("sizes", [(4, 3), (2, 5), (4, 3, 5, 1), (3, 3), (1, 4, 2)])
def test_sampler_resharding_loses_and_repeats_nothing(shuffle, sizes):
    """One epoch over world sizes that change mid-epoch: each phase processes a
    few batches, commits (state_dict), and the next world loads the commit.
    Every sample is processed; the only repeats are the padding of a pass whose
    last round was processed (fewer samples left than ranks x batches), counted
    exactly."""
    n, batch_size = 103, 4
    state, done, padding = None, [], 0
    for phase, size in enumerate(sizes):
        samplers = _samplers(n, size, shuffle=shuffle, seed=7)
        if state is not None:
            for s in samplers:
                s.load_state_dict(state)
        left = len(samplers[0].remaining_indices)
        assert left == n - len(set(done)), "phase %d: %d left, %d processed" % (phase, left, len(set(done)))
        last = phase == len(sizes) - 1
        per_rank = len(samplers[0])
        batches = -(-per_rank // batch_size) if last else min(3, -(-per_rank // batch_size))
        got, state = _run_phase(samplers, batches, batch_size)
        assert not set(got) & set(done), "phase %d repeated a sample of an earlier phase" % phase
        padding += len(got) - min(len(got), left)
        done.extend(got)
    counts = collections.Counter(done)
    assert set(counts) == set(range(n)), "lost: %s" % sorted(set(range(n)) - set(counts))
    assert sum(c - 1 for c in counts.values()) == padding
    assert padding < max(sizes)


def test_sampler_record_indices_and_merge():
    """record_indices (each rank its own), merged as TorchState's sync merges
    them, then re-sharded over a new size; record_batch after it stays exact."""
    n = 40
    samplers = _samplers(n, 2, seed=1)
    shards = [list(iter(s)) for s in samplers]
    done = shards[0][:5] + shards[1][:3]  # uneven progress: a loader not in lockstep
    samplers[0].record_indices(shards[0][:5])
    samplers[1].record_indices(shards[1][:3])
    merged = sorted(set(samplers[0].processed_indices) | set(samplers[1].processed_indices))
    state = dict(samplers[0].state_dict(), processed_indices=merged)

    new = _samplers(n, 3, seed=1)
    for s in new:
        s.load_state_dict(state)
    got, state = _run_phase(new, 2, 2)
    assert not set(got) & set(done)
    done += got
    final = _samplers(n, 2, seed=1)
    for s in final:
        s.load_state_dict(state)
    rest = [i for s in final for i in iter(s)]
    assert not set(rest) & set(done) and set(rest) | set(done) == set(range(n))


def test_sampler_in_torch_state(hvd):
    from hora.torch.elastic import ElasticSampler
    sampler = ElasticSampler(range(20), seed=2)
    assert (sampler.num_replicas, sampler.rank) == (1, 0)  # from hora.size()/rank()
    state = hvd.elastic.TorchState(sampler=sampler, epoch=0)
    sampler.record_batch(0, 4)
    state.commit()
    sampler.record_batch(1, 4)
    sampler.record_indices([3])
    state.restore()
    assert sampler.processed_num == 4 and not sampler.processed_indices and len(sampler) == 16
    state.sync()
    assert sampler.processed_num == 4 and len(sampler) == 16


def test_sampler_arguments_checked():
    from hora.torch.elastic import ElasticSampler
    with pytest.raises(ValueError, match="both num_replicas and rank"):
        ElasticSampler(range(4), num_replicas=2)
    with pytest.raises(ValueError, match="rank 2 is not in"):
        ElasticSampler(range(4), num_replicas=2, rank=2)


# ---------------------------------------------------------------- size 2 (rank pool)

def _b_sync_from_rank0(rank, size):
    import torch
    import hora.torch as hvd
    from hora.torch.elastic import ElasticSampler
    torch.manual_seed(100 + rank)  # different models on each rank
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (rank + 1), momentum=0.9)
    x = torch.randn(4, 3)
    model(x).sum().backward()
    opt.step()
    sampler = ElasticSampler(range(30), seed=5)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=rank + 10)
    sampler.record_indices([rank, 10 + rank])  # each rank's own record, merged at sync
    state.sync()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()] +
                     [opt.state[p]["momentum_buffer"].reshape(-1) for p in model.parameters()])
    everyone = hvd.allgather(flat.unsqueeze(0))
    assert torch.equal(everyone[0], everyone[1]), "model/optimizer differ after sync"
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)
    assert state.epoch == 10
    assert sampler.processed_indices == {0, 1, 10, 11} and len(sampler) == 13
    shards = hvd.allgather_object(list(iter(sampler)), name="test_elastic.shards")
    assert sorted(shards[0] + shards[1]) == sorted(set(range(30)) - {0, 1, 10, 11})
    return True


def test_sync_broadcasts_rank0_state(pool2):
    assert pool2.run(_b_sync_from_rank0) == [True, True]


def _b_pending_join_agreed(rank, size):
    import hora.torch as hvd
    from hora import basics
    saved = basics._membership_supported, basics._membership_pending
    # Only rank 0 "sees" the waiting worker; the broadcast makes every rank leave.
    basics._membership_supported = lambda: True
    basics._membership_pending = lambda: rank == 0
    try:
        state = hvd.elastic.TorchState(step=rank)
        try:
            state.commit()
        except hvd.HostsUpdatedInterrupt as e:
            return ["interrupt", e.skip_sync]
        return ["no interrupt"]
    finally:
        basics._membership_supported, basics._membership_pending = saved


def test_pending_join_interrupts_every_rank(pool2):
    assert pool2.run(_b_pending_join_agreed) == [["interrupt", False], ["interrupt", False]]


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([os.path.abspath(__file__), "-q"]))
