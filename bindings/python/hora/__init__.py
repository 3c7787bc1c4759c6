"""hora: collective communication for distributed training, over libhora's C ABI.

The package loads ``libhora`` with ctypes (``hora._lib``: ``HORA_LIBRARY``,
then a wheel's ``hora/lib/``, the build tree, install prefixes, the system)
and hands tensors over as DLPack, so it
is not compiled against any framework version.

* ``hora``: lifecycle, identity, process sets, exceptions (framework-agnostic).
* ``hora.numpy``: every collective on NumPy arrays or any ``__dlpack__`` object.
* ``hora.torch``: a drop-in for ``horovod.torch`` (``import hora.torch as hvd``).

``hora.init()`` reads the HORA_* environment (rank, size, store address,
secret), the same contract as the C library (README).
"""
from .basics import (Adasum, Average, Max, Min, Product, ProcessSet, Sum, add_process_set, barrier,  # noqa: F401
                     cross_rank, cross_size, dump_flight_recorder, epoch, global_process_set, init, is_initialized,
                     join, library_info, local_rank, local_size, metrics, poll, rank, remove_process_set, shutdown,
                     size, synchronize)
from .exceptions import (HoraError, HoraInternalError, HoraInvalidArgumentError, HoraInvalidUsageError,  # noqa: F401
                         HoraMembershipError, HoraMismatchError, HoraNotInitializedError, HoraNotSupportedError,
                         HoraRemoteError, HoraResetLimitError, HoraShutDownError, HoraTimeoutError,
                         HorovodInternalError, HostsUpdatedInterrupt)

__version__ = "0.5.1"  # the version of libhora it is released with (CMakeLists.txt)
