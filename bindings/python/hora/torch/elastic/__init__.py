"""Elastic training for PyTorch, as ``horovod.torch.elastic`` (docs/elastic.md).

    import hora.torch as hvd
    hvd.init()
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)

    @hvd.elastic.run
    def train(state):
        ...  # collectives; state.commit() every few batches

    train(state)

A lost member makes a collective raise ``HoraMembershipError`` (a
``HorovodInternalError``): ``run`` restores the last commit, re-forms the job
(``shutdown(); init()``: the next membership epoch), calls the reset callbacks,
broadcasts the state from the new rank 0 and calls ``train`` again. A worker
waiting to join makes ``state.commit()`` raise ``HostsUpdatedInterrupt`` on
every rank: the same without the restore.

Process sets are removed by the reset; re-add them in a reset callback
(``state.register_reset_callbacks([...])``) on every rank, after checking they
fit the new ``size()``.
"""
from ... import basics
from ...elastic import ObjectState, State  # noqa: F401
from ...elastic import run_fn
from ...exceptions import (HoraMembershipError, HoraResetLimitError, HorovodInternalError,  # noqa: F401
                           HostsUpdatedInterrupt)
from .sampler import ElasticSampler  # noqa: F401
from .state import TorchState  # noqa: F401


def run(func=None, *, reset_limit=None):
    """Decorator running ``func(state, *args, **kwargs)`` with elastic retries
    (``hora.elastic.run_fn`` has the details). Use as ``@hvd.elastic.run`` or
    ``@hvd.elastic.run(reset_limit=N)``: give up with ``HoraResetLimitError``
    after N resets (default: ``HORA_ELASTIC_RESET_LIMIT``, else no limit).

    As in Horovod, ``func`` itself must not be called inside a collective, and
    all collectives of a step belong inside ``func``: a newcomer's first act is
    the state sync, which the others must meet there.
    """
    if func is None:
        return lambda f: run_fn(f, _reset, reset_limit)
    return run_fn(func, _reset, reset_limit)


def _reset():
    """Re-forms the job: shuts the (possibly broken) runtime down and starts the
    next one, which in elastic mode forms the next membership epoch with the
    workers alive (docs/elastic.md)."""
    try:
        basics.shutdown()
    except HorovodInternalError:
        # The runtime already failed (that is why we reset); its shutdown
        # may report the same failure. basics dropped the handle either way.
        pass
    basics.init()


__all__ = ["ElasticSampler", "ObjectState", "State", "TorchState", "run", "HostsUpdatedInterrupt",
           "HorovodInternalError"]
