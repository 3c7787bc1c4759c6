"""Model/optimizer state helpers: broadcast_parameters, broadcast_optimizer_state,
broadcast_object, allgather_object (Horovod's horovod.torch.functions)."""
import io
import pickle

import torch

from .. import basics
from ..basics import global_process_set
from .mpi_ops import _root_in_set, allgather, broadcast_, broadcast_async_, synchronize

try:  # cloudpickle handles lambdas and local classes; plain pickle otherwise
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - depends on the machine
    _pickler = pickle


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Broadcasts parameters (``model.state_dict()``, ``model.named_parameters()``
    or a list of tensors) from ``root_rank`` in place, as Horovod does: a dict is
    taken in sorted key order, names are the keys. ``root_rank`` is a global rank
    (a member of ``process_set``), as in horovod.torch. Entries that are None
    (e.g. a module's unset optional buffer) are skipped on every rank."""
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        items = list(params)
        if items and not isinstance(items[0], tuple):
            items = [(None, p) for p in items]
    handles = []
    for name, p in items:
        if p is None:
            continue
        t = p.data if isinstance(p, torch.nn.Parameter) else p
        if not isinstance(t, torch.Tensor):
            raise ValueError("hora: broadcast_parameters got a %s for %r; expected tensors" % (type(p).__name__, name))
        handles.append(broadcast_async_(t.detach(), root_rank, name=name, process_set=process_set))
    for h in handles:
        synchronize(h)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Pickles ``obj`` on global rank ``root_rank`` (a member of ``process_set``)
    and returns it on every rank of the set."""
    name = name or type(obj).__name__
    _root_in_set(root_rank, process_set, "broadcast_object")  # refuses a non-member root on every rank
    if basics.rank() == root_rank:
        buf = io.BytesIO()
        _pickler.dump(obj, buf)
        payload = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        sz = torch.tensor([payload.numel()], dtype=torch.int64)
        broadcast_(sz, root_rank, name + ".sz", process_set)
        broadcast_(payload, root_rank, name + ".t", process_set)
        return obj
    sz = torch.zeros(1, dtype=torch.int64)
    broadcast_(sz, root_rank, name + ".sz", process_set)
    payload = torch.empty(int(sz.item()), dtype=torch.uint8)
    broadcast_(payload, root_rank, name + ".t", process_set)
    return pickle.loads(payload.numpy().tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of every rank's ``obj`` (in rank order within the set)."""
    name = name or type(obj).__name__
    buf = io.BytesIO()
    _pickler.dump(obj, buf)
    payload = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    sizes = allgather(torch.tensor([payload.numel()], dtype=torch.int64), name=name + ".sz",
                      process_set=process_set).tolist()
    gathered = allgather(payload, name=name + ".t", process_set=process_set).numpy()
    out, start = [], 0
    for n in sizes:
        out.append(pickle.loads(gathered[start:start + n].tobytes()))
        start += n
    return out


def _sparse_param_ids(model):
    """ids of the parameters of ``model``'s sparse embeddings (their gradients are sparse)."""
    ids = set()
    if model is not None:
        for m in model.modules():
            if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse:
                ids.update(id(p) for p in m.parameters())
    return ids


def broadcast_optimizer_state(optimizer, root_rank, model=None, process_set=global_process_set):
    """Makes every rank's optimizer state (buffers such as momentum, step counts,
    and hyper-parameters such as lr) equal to the root's. ``root_rank`` is a
    global rank (a member of ``process_set``), as in horovod.torch.

    An optimizer without state yet gets it by one step on zero gradients (as
    Horovod does): parameters that do not require a gradient are left out (no
    state, nothing broadcast, their ``grad`` stays None); the others keep a zero
    gradient where they had none, as in Horovod (None if it was a sparse one),
    and their own gradient otherwise. Parameters are restored afterwards, so weight decay cannot move
    them. Zero gradients are sparse for torch.optim.SparseAdam and, when
    ``model`` is given, for the parameters of its sparse embeddings (as Horovod
    does), since those optimizers refuse dense gradients there."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    _root_in_set(root_rank, process_set, "broadcast_optimizer_state")
    state_dict = optimizer.state_dict()
    if len(state_dict["state"]) == 0:
        sparse_ids = _sparse_param_ids(model)
        all_sparse = isinstance(optimizer, torch.optim.SparseAdam)
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        saved = [(p, p.data.clone(), p.grad) for p in params]
        for p in params:
            zero = torch.zeros_like(p.data)
            p.grad = zero.to_sparse() if all_sparse or id(p) in sparse_ids else zero
        step = getattr(optimizer, "_hora_inner_step", None)
        (step or optimizer.step)()
        for p, data, grad in saved:
            p.data.copy_(data)
            # A parameter without a gradient keeps the dense zero one, as in
            # Horovod. A sparse zero goes back to None: its layout (all dims
            # sparse, which SparseAdam needs for an empty gradient) differs from
            # an embedding's gradients (rows sparse), which could not be added
            # to it by the next backward.
            if grad is not None or p.grad.is_sparse:
                p.grad = grad
        state_dict = optimizer.state_dict()

    # Hyper-parameters and non-tensor state go as one pickled object.
    groups = [{k: v for k, v in g.items() if k != "params"} for g in state_dict["param_groups"]]
    scalars = {pid: {k: v for k, v in st.items() if not torch.is_tensor(v)}
               for pid, st in state_dict["state"].items()}
    groups, scalars = broadcast_object((groups, scalars), root_rank, name="optimizer_state.scalars",
                                       process_set=process_set)
    for g, src in zip(optimizer.param_groups, groups):
        g.update(src)
    # state_dict()["state"] holds the optimizer's own per-parameter dicts, so the
    # tensors broadcast in place here are the live state.
    index_to_param = {i: p for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
    handles = []
    for pid in sorted(state_dict["state"]):
        st = state_dict["state"][pid]
        for k in sorted(st):
            v = st[k]
            if torch.is_tensor(v):
                handles.append(broadcast_async_(v, root_rank, name="optimizer_state.%s.%s" % (pid, k),
                                                process_set=process_set))
        live = optimizer.state[index_to_param[pid]]
        for k, v in scalars.get(pid, {}).items():
            live[k] = v
    for h in handles:
        synchronize(h)
