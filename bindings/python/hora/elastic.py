"""Elastic training, framework-agnostic part (Horovod's horovod.common.elastic).

The protocol below this module is docs/elastic.md: in elastic mode a collective
that loses a member fails with ``HoraMembershipError``; ``init()`` after
``shutdown()`` forms the next membership epoch with the workers that are alive
(survivors keep their order, so the old rank 0 stays rank 0 if it survived);
``hora_membership_pending`` tells rank 0 that a worker waits to join.

What this module adds on top, as Horovod does:

* ``State``: what is committed (``save``), rolled back (``restore``) and made
  equal on every rank (``sync``) around a reset; reset callbacks.
* ``ObjectState``: plain Python attributes, broadcast from rank 0 at ``sync``.
* ``run_fn(func, reset)``: the retry loop behind ``hvd.elastic.run``.

The framework modules (``hora.torch.elastic``) supply the broadcast and the
reset (``shutdown(); init()``).
"""
import copy
import functools
import logging
import os

from . import basics
from .exceptions import HoraMismatchError, HoraResetLimitError, HorovodInternalError, HostsUpdatedInterrupt

_log = logging.getLogger("hora.elastic")

RESET_LIMIT_ENV = "HORA_ELASTIC_RESET_LIMIT"
# Re-formations that fail one after another before run() gives up.
_MAX_FAILED_RESETS = 3


class State:
    """State tracked across workers: committed, rolled back and synchronized
    around reset events (a member lost, a worker joining).

    Args:
        bcast_object: ``bcast_object(obj)`` returns rank 0's ``obj`` on every rank.
        get_rank: returns this worker's current rank (it changes at resets).
    """

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Adds functions called (no arguments, in order) after every reset, once
        the new job is formed and before the state is synchronized: e.g. rescale
        the learning rate to the new ``size()``, or re-add process sets, which
        a reset removes (``hvd.add_process_set`` again, on every rank)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state (the point a failure rolls back to), then checks for
        workers waiting to join (may raise ``HostsUpdatedInterrupt``). Every rank
        must call it at the same point: it runs a broadcast. Saving copies the
        state to host memory, so commit every few batches rather than every one:
        the gap is what a failure costs in recomputed steps."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises ``HostsUpdatedInterrupt`` on every rank when a worker waits to
        join the job. Collective: rank 0 asks the runtime and broadcasts the
        answer, since ranks may learn of an arrival at different moments and must
        all leave at the same commit."""
        pending = False
        # A libhora without the elastic calls cannot form a new epoch, so no
        # worker can be waiting; every rank loads the same library, so they all
        # take this branch or none does, and the broadcast stays collective.
        if self._rank() == 0 and basics._membership_supported():
            pending = basics._membership_pending()
        # One cached, one-element collective per commit (rank 0's answer is
        # the maximum), not an object broadcast (size, then bytes).
        import numpy as np
        from . import numpy as hnp
        flag = np.array([1 if pending else 0], dtype=np.int32)
        if int(hnp.allreduce(flag, op=basics.Max, name="hora.elastic.host_updates")[0]):
            raise HostsUpdatedInterrupt(skip_sync=False)

    def save(self):
        """Saves the state to host memory."""
        raise NotImplementedError("%s must implement save()" % type(self).__name__)

    def restore(self):
        """Restores the last committed state, undoing uncommitted changes."""
        raise NotImplementedError("%s must implement restore()" % type(self).__name__)

    def sync(self):
        """Makes every rank's state equal to rank 0's (collective)."""
        raise NotImplementedError("%s must implement sync()" % type(self).__name__)

    def reset(self):
        """Called after a reset, before the callbacks and ``sync``."""
        pass


class ObjectState(State):
    """State of plain Python objects, given as keyword arguments and exposed as
    attributes (``state.epoch``, ``state.batch``). ``save`` records a deep copy
    of each attribute's value, ``restore`` puts copies of them back, ``sync``
    broadcasts the saved values from rank 0. Horovod saves references, so a list
    mutated in place (``state.losses.append(x)``) would not roll back; hora
    copies. A value that cannot be deep-copied (a lock, an open file) is kept by
    reference, as Horovod keeps it.

    Args:
        bcast_object: ``bcast_object(obj)`` returns rank 0's ``obj`` on every rank.
        get_rank: returns this worker's current rank.
        kwargs: the attributes and their initial values.
    """

    def __init__(self, bcast_object, get_rank, **kwargs):
        self._bcast_object = bcast_object
        for attr, value in kwargs.items():
            setattr(self, attr, value)  # the objects given, as Horovod
        self._saved_state = {attr: _copy_or_same(value) for attr, value in kwargs.items()}
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {attr: _copy_or_same(getattr(self, attr)) for attr in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            # Not self.restore(): a subclass's restore also rolls back what it
            # handles (TorchState: models), which sync just broadcast.
            self._set_attrs()

    def _set_attrs(self):
        # Copies, so changes after this call cannot reach the saved state.
        for attr, value in self._saved_state.items():
            setattr(self, attr, _copy_or_same(value))


def _copy_or_same(value):
    try:
        return copy.deepcopy(value)
    except Exception:  # not copyable (locks, files, C handles): keep the reference
        return value


def _resolve_reset_limit(reset_limit):
    if reset_limit is not None:
        limit, source = reset_limit, "reset_limit=%r" % (reset_limit,)
    else:
        raw = os.environ.get(RESET_LIMIT_ENV, "").strip()
        if not raw:
            return None, None  # unlimited, as Horovod's default
        limit, source = raw, "%s=%s" % (RESET_LIMIT_ENV, raw)
    try:
        limit = int(limit)
    except (TypeError, ValueError):
        limit = -2
    if limit == -1 and reset_limit is None:
        return None, None  # the registry's default (docs/params.md): no limit
    if limit < 0:
        raise ValueError("hora.elastic.run: %s is not a reset count; give a whole number >= 0 "
                         "(0: fail at the first reset), or unset it for no limit" % source)
    return limit, source


def run_fn(func, reset, reset_limit=None):
    """Wraps ``func(state, *args, **kwargs)`` in the elastic retry loop.

    Each attempt first synchronizes ``state`` (rank 0's state to every rank,
    newcomers included), then calls ``func``. When ``func`` raises

    * ``HorovodInternalError`` (a lost member: ``HoraMembershipError``; or a
      peer, stall or shutdown error, as Horovod retries every internal error):
      ``state.restore()`` rolls back to the last commit;
    * ``HostsUpdatedInterrupt`` (raised by ``state.commit()`` on every rank when
      a worker waits to join): nothing is rolled back, the state is the commit;

    then ``reset()`` re-forms the job (the next membership epoch), the reset
    callbacks run (``state.on_reset()``), and the loop starts over with a sync.

    ``HoraMismatchError`` is not retried, unlike Horovod: ranks that submitted
    different shapes or ops would do so again after a reset, so retrying would
    loop. ``reset_limit`` (or ``HORA_ELASTIC_RESET_LIMIT``): the most resets
    this call may do (counted over the whole call, as Horovod's
    ``--reset-limit``); one more raises ``HoraResetLimitError`` chained to the
    last failure. None and unset: no limit.
    """
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        limit, source = _resolve_reset_limit(reset_limit)
        resets = 0
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HoraMismatchError:
                raise
            except HorovodInternalError as e:
                cause = e
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as e:
                cause = e
                skip_sync = e.skip_sync
            failed_resets = 0
            while True:
                resets += 1
                if limit is not None and resets > limit:
                    raise HoraResetLimitError(
                        "hora.elastic.run: giving up after %d reset(s), the limit set by %s; the last failure "
                        "was %s: %s. Look for its cause in the ranks' logs, or raise the limit "
                        "(@hvd.elastic.run(reset_limit=N) or %s=N)." % (resets - 1, source, type(cause).__name__,
                                                                       cause, RESET_LIMIT_ENV)) from cause
                # One line per reset, so a job that keeps resetting says why.
                _log.warning("hora.elastic: reset %d%s after %s: %s", resets,
                             "" if limit is None else " of at most %d" % limit, type(cause).__name__, cause)
                try:
                    reset()
                    break
                except HoraMismatchError:
                    raise
                except HorovodInternalError as e:
                    # A second failure while re-forming (a member that
                    # arrived died before the new epoch started): form the
                    # next one, a few times at most, since a re-formation
                    # that keeps failing (too few workers after the elastic
                    # timeout) will fail again. Refusals (another version)
                    # are not internal errors and end run() at once.
                    failed_resets += 1
                    if failed_resets >= _MAX_FAILED_RESETS:
                        raise
                    cause = e
                    skip_sync = False
            state.on_reset()
    return wrapper
