"""Python exceptions for hora status codes (docs/errors.md).

Every exception carries the core's one-line message (captured with
``hora_last_error_message()`` on the failing thread) and the status code.

* ``HoraError``: base of everything raised for a non-zero status.
* ``HorovodInternalError`` (also ``HoraInternalError``): a ``RuntimeError``
  for failures of the job rather than of the call: lost or failed peer
  (``HoraRemoteError``), shutdown (``HoraShutDownError``), deadlines and stalls
  (``HoraTimeoutError``), ranks that disagree (``HoraMismatchError``), Gloo,
  OS, protocol, auth and internal errors. Horovod scripts that catch
  ``HorovodInternalError`` keep working.
* ``HoraInvalidArgumentError`` / ``HoraInvalidUsageError``: ``ValueError``;
  nothing was submitted. ``HoraInvalidUsageError`` is also a ``RuntimeError``:
  raised by ``synchronize`` for collectives that cannot run with a joined rank.
* ``HoraNotInitializedError``: ``ValueError`` (Horovod raises ValueError when
  ``init()`` was not called).
* ``HoraNotSupportedError``: ``NotImplementedError`` (e.g. GPU memory).
* ``HoraMembershipError``: a ``HorovodInternalError`` for elastic mode's
  "a member was lost, restore the last commit and re-form" (HORA_ERR_MEMBERSHIP);
  ``hvd.elastic.run`` catches it and resets (docs/elastic.md).
* ``HostsUpdatedInterrupt``: raised by ``state.commit()`` /
  ``state.check_host_updates()`` on every rank when a worker waits to join;
  ``hvd.elastic.run`` re-forms the job without restoring (Horovod's class).
* ``HoraResetLimitError``: ``hvd.elastic.run`` gave up after its reset limit.
"""


class HoraError(Exception):
    """A hora call failed; ``status`` is the hora_status_t, ``message`` the core's text."""

    def __init__(self, message, status=None, status_name=None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.status_name = status_name


class HorovodInternalError(HoraError, RuntimeError):
    """The job failed (peer lost, shutdown, stall, mismatch, backend): Horovod's name."""


HoraInternalError = HorovodInternalError


class HoraRemoteError(HorovodInternalError):
    """A peer rank crashed, stalled or failed (HORA_ERR_REMOTE)."""


class HoraShutDownError(HorovodInternalError):
    """The runtime, or a peer's, shut down (HORA_ERR_SHUT_DOWN)."""


class HoraTimeoutError(HorovodInternalError):
    """A deadline passed or a tensor stalled (HORA_ERR_TIMEOUT)."""


class HoraMismatchError(HorovodInternalError):
    """Ranks submitted the same name with different shape/dtype/op (HORA_ERR_MISMATCH)."""


class HoraMembershipError(HorovodInternalError):
    """Elastic mode: a member was lost or the membership changes; restore the
    last commit and re-form (HORA_ERR_MEMBERSHIP). hvd.elastic.run does both."""


class HostsUpdatedInterrupt(RuntimeError):
    """A worker waits to join the job (elastic mode). Raised on every rank at the
    same commit, so the job re-forms in step; the state is the one just committed,
    so no restore is needed. ``skip_sync``: True when the re-formed job needs no
    state broadcast (Horovod sets it when hosts were only removed; hora raises
    this only for joins, so it is False)."""

    def __init__(self, skip_sync=False):
        super().__init__("hora: a worker waits to join; the job re-forms at this commit")
        self.skip_sync = skip_sync


class HoraResetLimitError(HoraError, RuntimeError):
    """hvd.elastic.run reset the job more often than its reset limit allows; the
    last failure is chained as __cause__. Not a HorovodInternalError, so an outer
    elastic loop does not retry it."""


class HoraInvalidArgumentError(HoraError, ValueError):
    """A bad argument (HORA_ERR_INVALID_ARGUMENT); nothing was submitted."""


class HoraInvalidUsageError(HoraError, ValueError, RuntimeError):
    """Wrong moment (HORA_ERR_INVALID_USAGE): at submission, a duplicate name in flight
    (Horovod raises ValueError); when the request completes, a broadcast from a root that
    joined or an alltoall while a rank joined (Horovod raises RuntimeError there, so this is
    both). Not a HorovodInternalError: an elastic loop does not reset on it."""


class HoraNotInitializedError(HoraError, ValueError):
    """hora.init() was not called (or shutdown() was)."""


class HoraNotSupportedError(HoraError, NotImplementedError):
    """Not supported by this libhora, e.g. GPU memory (HORA_ERR_NOT_SUPPORTED)."""


_BY_STATUS = {
    1: HoraInvalidArgumentError,
    2: HoraInvalidUsageError,
    3: HoraNotInitializedError,
    4: HoraShutDownError,
    7: HoraRemoteError,
    8: HoraTimeoutError,
    10: HoraNotSupportedError,
    11: HoraMismatchError,
    15: HoraMembershipError,
}


def error_from_status(status, message, status_name=None):
    cls = _BY_STATUS.get(status, HorovodInternalError)
    return cls(message, status, status_name)
