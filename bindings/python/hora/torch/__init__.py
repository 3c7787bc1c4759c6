"""hora.torch: a drop-in for horovod.torch over libhora (``import hora.torch as hvd``).

No extension is compiled against torch: collectives go through libhora's C
ABI with tensors passed by DLPack, so the same install works with any torch
that exports DLPack. CPU tensors only in this release (GPU tensors get
HoraNotSupportedError from the core).
"""
from ..basics import (Adasum, Average, Max, Min, Product, ProcessSet, Sum, add_process_set, ccl_built,  # noqa: F401
                      cross_rank, cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled, global_process_set,
                      init, is_homogeneous, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
                      mpi_threads_supported, nccl_built, poll, rank, remove_process_set, rocm_built, shutdown, size,
                      synchronize)
from ..basics import dump_flight_recorder, epoch, metrics  # noqa: F401
from ..exceptions import (HoraError, HoraInternalError, HoraInvalidArgumentError, HoraMembershipError,  # noqa: F401
                          HoraMismatchError, HoraRemoteError, HoraShutDownError, HoraTimeoutError,
                          HorovodInternalError, HostsUpdatedInterrupt)
from .compression import Compression, Compressor  # noqa: F401
from .functions import (allgather_object, broadcast_object, broadcast_optimizer_state,  # noqa: F401
                        broadcast_parameters)
from .mpi_ops import (allgather, allgather_async, allreduce, allreduce_, allreduce_async,  # noqa: F401
                      allreduce_async_, alltoall, alltoall_async, barrier, broadcast, broadcast_, broadcast_async,
                      broadcast_async_, grouped_allgather, grouped_allgather_async, grouped_allreduce,
                      grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_, grouped_reducescatter,
                      grouped_reducescatter_async, join, reducescatter, reducescatter_async,
                      sparse_allreduce_async)
from .optimizer import DistributedOptimizer  # noqa: F401
from .zero import ZeroOptimizer  # noqa: F401
from .fully_sharded import FullyShardedModule  # noqa: F401
from .local_sgd import LocalSGD  # noqa: F401
from .p2p import P2POp, batch_isend_irecv, irecv, isend, recv, send  # noqa: F401
from .sync_batch_norm import SyncBatchNorm  # noqa: F401
from . import elastic  # noqa: F401,E402  (hvd.elastic.run, hvd.elastic.TorchState; needs the names above)
from . import parallel  # noqa: F401,E402  (model-parallel layouts: hvd.parallel.grid, tensor/context parallel)
from .. import __version__ as _hora_version  # noqa: E402

# horovod.torch has no __version__ (horovod.__version__ is Horovod's); this one
# says hora, with a PEP 440 local label so version parsers still read it.
__version__ = _hora_version + "+hora"


def start_timeline(file_path, mark_cycles=False):
    """Records a timeline of every rank into ``file_path`` (Chrome trace JSON: open it in
    ui.perfetto.dev or chrome://tracing). Call it on every rank, as with Horovod."""
    from ..basics import start_timeline as _start
    _start(file_path, mark_cycles)


def stop_timeline():
    """Writes what is buffered and stops the timeline."""
    from ..basics import stop_timeline as _stop
    _stop()
