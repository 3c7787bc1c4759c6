"""FullyShardedModule: parameter sharding (ZeRO stage 3, FSDP style) over
hora's allgather and reducescatter.

    model = hvd.FullyShardedModule(build_model())      # every rank, same model
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)  # over this rank's shards
    for x, y in data:
        opt.zero_grad()
        loss_fn(model(x), y).backward()               # gradients arrive reduce-scattered
        model.clip_grad_norm_(1.0)                    # optional, by the global norm
        opt.step()

Layout. The wrapped module is cut into units: walking its modules in
pre-order, the first module that holds parameters of its own (a Linear, a
Conv2d, an Embedding, a LayerNorm, a MultiheadAttention, ...) becomes a
unit with every parameter of its subtree that no earlier unit took. A
unit's parameters are flattened, per dtype and ``requires_grad``, into a
"flat" of ``numel`` elements padded to ``N * ceil(numel / N)`` (N = size of
``process_set``); set rank r keeps only the slice ``[r * shard, (r + 1) *
shard)`` as an ``nn.Parameter``. Those shards are all the parameters this
module has: ``parameters()`` yields them, an optimizer over them keeps 1/N
of the unsharded state, and the original parameters are removed from their
modules (an empty placeholder stands in outside forward).

A step, per unit:

1. Forward: the unit's flats are allgathered (in ``param_dtype`` when set)
   into full buffers, the parameters are shown to their modules as views of
   them, the unit's own forward runs, and the buffers are dropped again.
   While a unit runs forward, the next unit's gather (in the order recorded
   in the previous forward) is already in flight.
2. Tensors that autograd saves for backward and that are views of a
   gathered buffer (a Linear's weight, say) are not kept: a saved-tensor hook
   keeps only where they were, and in backward the first use gathers the
   flat again (starting the gather of the unit before it in forward order)
   and rebuilds the view. So between forward and backward only shards stay.
3. Once autograd has the whole gradient of a flat, it is reduce-scattered
   asynchronously (averaged over the set as DistributedOptimizer averages,
   with the same ``gradient_predivide_factor``), the gathered buffer is
   dropped, and backward goes on. At the end of backward every reduction is
   waited for, averaged over ``replicate_process_set`` when given, and
   added to the shard's ``.grad`` (so gradients accumulate across backward
   passes as usual: call ``optimizer.step()`` every k passes for
   accumulation).

Peak parameter memory is therefore about the shards plus the gathered units
in use (at most the current one and the one being prefetched), and
``max_gathered_bytes`` reports the most bytes of gathered buffers this
module held at once.

Hybrid shard: with ``replicate_process_set``, parameters are sharded within
``process_set`` (e.g. the ranks of one host) and the shard's gradient is
averaged again across ``replicate_process_set`` (the same shard on the
other hosts), as DeepSpeed's and FSDP's hybrid sharding do.

Every rank of the set must run the same units the same number of times per
forward and call backward as often (collectives are named after the flat
and a per-flat sequence number). Limits: parameters read outside the
forward of a module of their unit (e.g. ``F.linear(x, self.embed.weight)``
in a parent's forward) see the placeholder: make the tying module a
submodule or share the Parameter object instead; sparse gradients are not
supported; the optimizer sees one parameter per flat (no per-parameter
groups).
"""
import contextlib
import math

import torch

from ..basics import Max, Sum, global_process_set, poll
from .mpi_ops import allreduce_, allreduce_async_, broadcast_, synchronize
from .zero import _allgather_into, _reducescatter_into

__all__ = ["FullyShardedModule"]

_instances = {}  # "all" -> how many FullyShardedModules this process made (the default names)


def _storage_ptr(t):
    # torch >= 2.0 has untyped_storage(); 1.13 (Debian 12's) only storage()
    return t.untyped_storage().data_ptr() if hasattr(t, "untyped_storage") else t.storage().data_ptr()


def _root(process_set):
    return 0 if process_set.ranks is None else process_set.ranks[0]


class _Flat:
    """The parameters of one unit with one dtype and requires_grad, flattened."""

    def __init__(self, index, named, n, r, compute_dtype):
        self.index = index
        self.names = [name for name, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.numels = [p.numel() for _, p in named]
        self.offsets = [0]
        for k in self.numels:
            self.offsets.append(self.offsets[-1] + k)
        self.numel = self.offsets[-1]
        self.shard_numel = max(1, math.ceil(self.numel / n))
        self.full_numel = n * self.shard_numel
        self.dtype = named[0][1].dtype
        self.requires_grad = named[0][1].requires_grad
        self.compute_dtype = compute_dtype if self.dtype.is_floating_point and compute_dtype else self.dtype
        self.refs = [[] for _ in named]  # per parameter: the (module, attribute) pairs that show it
        with torch.no_grad():
            full = torch.zeros(self.full_numel, dtype=self.dtype)
            for (_, p), off, k in zip(named, self.offsets, self.numels):
                full[off:off + k].copy_(p.detach().reshape(-1))
        self.init_full = full  # until the initial broadcast made it the set's; then dropped
        self.rank = r
        self.shard = None
        self.pending = None     # an allgather in flight: (handle, output, shard version at issue)
        self.fwd_full = None    # the gathered buffer while a forward uses the unit
        self.bwd_full = None    # the gathered buffer while backward uses the unit
        self.depth = 0          # nested forwards using it
        self.marked = False     # backward still has saved tensors that view it
        self.reduced = False    # its gradient was reduced in the backward under way
        self.ag_seq = 0
        self.rs_seq = 0

    def nbytes(self):
        return self.full_numel * torch.empty((), dtype=self.compute_dtype).element_size()


class _Saved:
    """Where a saved tensor was in a gathered buffer (instead of the tensor)."""
    __slots__ = ("flat", "offset", "size", "stride")

    def __init__(self, flat, t):
        self.flat, self.offset, self.size, self.stride = flat, t.storage_offset(), t.size(), t.stride()


class _GatherFn(torch.autograd.Function):
    """Forward: the flat's gathered buffer (its gather already started).
    Backward: the buffer's gradient, reduce-scattered into the shard's."""

    @staticmethod
    def forward(ctx, shard, owner, flat):
        ctx.owner, ctx.flat = owner, flat
        return owner._finish_gather(flat)

    @staticmethod
    def backward(ctx, grad):
        ctx.owner._reduce_grad(ctx.flat, grad)
        return None, None, None


class FullyShardedModule(torch.nn.Module):
    """Shards ``module``'s parameters over ``process_set`` (ZeRO stage 3).

    ``FullyShardedModule(module, process_set=global_process_set, replicate_process_set=None,
    param_dtype=None, reduce_dtype=None, prefetch=True, sync_module_states=True,
    gradient_predivide_factor=1.0, name=None)``

    param_dtype: the dtype parameters are gathered and computed in (e.g.
    torch.bfloat16; the shards, their gradients and the optimizer stay in the
    parameters' dtype); inputs must then be of that dtype too, or use autocast.
    reduce_dtype: the dtype gradients are reduced in (default param_dtype).
    sync_module_states: broadcast parameters and buffers from the set's
    lowest rank first, so ranks may start from different initializations.
    name: prefix of the collectives' names; by default "fsdp.<k>" for the
    k-th FullyShardedModule made on this rank (so make them in the same order
    on every rank, or pass the same ``name``).
    Construction, forward, backward, ``state_dict``, ``load_state_dict`` and
    ``clip_grad_norm_`` communicate: call them on every rank of the set.
    """

    def __init__(self, module, process_set=global_process_set, replicate_process_set=None, param_dtype=None,
                 reduce_dtype=None, prefetch=True, sync_module_states=True, gradient_predivide_factor=1.0,
                 name=None):
        super().__init__()
        if not isinstance(module, torch.nn.Module):
            raise TypeError("FullyShardedModule: expected a torch.nn.Module, got %s" % type(module).__name__)
        process_set = process_set or global_process_set
        if not process_set.included():
            raise ValueError("FullyShardedModule: this rank is not a member of %r" % (process_set,))
        if replicate_process_set is not None and not replicate_process_set.included():
            raise ValueError("FullyShardedModule: this rank is not a member of replicate_process_set %r"
                             % (replicate_process_set,))
        for p in module.parameters():
            if p.device.type != "cpu":
                raise ValueError("FullyShardedModule: parameters must be on the CPU in this release (got %s)"
                                 % p.device)
        self.module = module
        self.process_set = process_set
        self.replicate_process_set = replicate_process_set
        self.param_dtype = param_dtype
        self.reduce_dtype = reduce_dtype or param_dtype
        self.prefetch = bool(prefetch)
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self._n, self._r = process_set.size(), process_set.rank()
        if name is None:
            # counted over every set: the ranks sharing a replicate set are in
            # different shard sets, yet must name their collectives alike
            count = _instances.get("all", 0)
            _instances["all"] = count + 1
            name = "fsdp.%d" % count
        self._prefix = name
        self.flats = []
        self._units = []             # (module, [flats it needs])
        self._live = {}              # storage address of a gathered buffer -> its flat
        self._fwd_order, self._next, self._order_closed = [], {}, False
        self._rep_seq = 0
        self._pending_grads = []     # reductions in flight: (flat, handle, output, input)
        self._reduced = []           # finished ones: (flat, output), added to .grad at the end of backward
        self._callback_queued = False
        self.gathered_bytes = 0
        self.max_gathered_bytes = 0
        self._keys = list(module.state_dict().keys())  # torch's order, for state_dict()
        self._paths = {m: (p + "." if p else "") for p, m in module.named_modules()}  # module -> key prefix
        self._build_units()
        if sync_module_states:
            self._sync_states()
        self.shards = torch.nn.ParameterList()
        for f in self.flats:
            f.shard = torch.nn.Parameter(f.init_full[self._r * f.shard_numel:(self._r + 1) * f.shard_numel].clone(),
                                         requires_grad=f.requires_grad)
            f.init_full = None
            self.shards.append(f.shard)
        for unit, needs in self._units:
            self._wrap(unit, needs)

    # ------------------------------------------------------------ set-up
    def _build_units(self):
        flat_of = {}     # id(parameter) -> (flat, index in it)
        claimed = set()  # modules inside a unit
        for path, m in self.module.named_modules():
            if m in claimed or not any(True for _ in m.parameters(recurse=False)):
                continue
            subtree = list(m.named_modules(prefix=path))
            claimed.update(s for _, s in subtree)
            own = {}  # (dtype, requires_grad) -> [(name, parameter)], in registration order
            for sub_path, s in subtree:
                for attr, p in s.named_parameters(recurse=False):
                    if id(p) in flat_of or any(p is q for group in own.values() for _, q in group):
                        continue
                    if p.is_sparse:
                        raise ValueError("FullyShardedModule: sparse parameter %s is not supported" % attr)
                    full_name = (sub_path + "." if sub_path else "") + attr
                    own.setdefault((p.dtype, p.requires_grad), []).append((full_name, p))
            for key in sorted(own, key=str):
                flat = _Flat(len(self.flats), own[key], self._n, self._r, self.param_dtype)
                for i, (_, p) in enumerate(own[key]):
                    flat_of[id(p)] = (flat, i)
                self.flats.append(flat)
            needs = []
            for _, s in subtree:
                for attr, p in list(s.named_parameters(recurse=False)):
                    flat, i = flat_of[id(p)]
                    flat.refs[i].append((s, attr))
                    if flat not in needs:
                        needs.append(flat)
            self._units.append((m, needs))
        # Parameters leave their modules; an empty placeholder of the right
        # dtype stands in outside forward (so "bias is not None" still holds).
        for flat in self.flats:
            for i, refs in enumerate(flat.refs):
                for s, attr in refs:
                    if attr in s._parameters:
                        del s._parameters[attr]
                    setattr(s, attr, torch.empty(0, dtype=flat.compute_dtype))

    def _sync_states(self):
        with torch.no_grad():
            sets = [self.process_set] + ([self.replicate_process_set] if self.replicate_process_set else [])
            for ps in sets:
                if ps.size() == 1:
                    continue
                for f in self.flats:
                    broadcast_(f.init_full, _root(ps), name="%s.init.f%d" % (self._prefix, f.index), process_set=ps)
                for k, (bname, b) in enumerate(self.module.named_buffers()):
                    if b.numel():
                        broadcast_(b, _root(ps), name="%s.init.b%d" % (self._prefix, k), process_set=ps)

    def _wrap(self, unit, needs):
        inner = unit.forward

        def forward(*args, **kwargs):
            return self._run_unit(inner, needs, args, kwargs)

        unit.forward = forward

    # ------------------------------------------------------------ gathers
    def _account(self, delta):
        self.gathered_bytes += delta
        self.max_gathered_bytes = max(self.max_gathered_bytes, self.gathered_bytes)

    def _start_gather(self, flat):
        if flat.pending is not None:
            return
        src = flat.shard.detach()
        if flat.compute_dtype != flat.dtype:
            src = src.to(flat.compute_dtype)
        out = torch.empty(flat.full_numel, dtype=flat.compute_dtype)
        self._account(flat.nbytes())
        name = "%s.f%d.ag%d" % (self._prefix, flat.index, flat.ag_seq)
        flat.ag_seq += 1
        flat.pending = (_allgather_into(src, out, name, self.process_set), out, flat.shard._version)

    def _finish_gather(self, flat):
        """The flat's gathered buffer, from the gather in flight (started now if none).
        A prefetch issued before the shard changed (an optimizer step) is stale: gathered again."""
        if flat.pending is None:
            self._start_gather(flat)
        handle, out, version = flat.pending
        flat.pending = None
        synchronize(handle)
        if version != flat.shard._version:
            self._account(-flat.nbytes())
            return self._finish_gather(flat)
        return out

    def _drop(self, flat, which):
        if getattr(flat, which) is not None:
            setattr(flat, which, None)
            self._account(-flat.nbytes())

    def _drain(self):
        """Waits for and drops prefetches nobody used (e.g. a unit skipped this step)."""
        for flat in self.flats:
            if flat.pending is not None:
                synchronize(flat.pending[0])
                flat.pending = None
                self._account(-flat.nbytes())

    # ------------------------------------------------------------ forward
    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _show(self, flat, full):
        # One split, not a slice per parameter: in backward, autograd turns
        # each slice's gradient into a zero-filled tensor of the whole flat and
        # adds them up (three unit-sized temporaries for a weight and a bias),
        # while a split's backward concatenates the pieces once.
        sizes = list(flat.numels) + ([flat.full_numel - flat.numel] if flat.full_numel > flat.numel else [])
        pieces = torch.split(full, sizes)
        for i, refs in enumerate(flat.refs):
            view = pieces[i].view(flat.shapes[i])
            for s, attr in refs:
                setattr(s, attr, view)

    def _hide(self, flat):
        placeholder = torch.empty(0, dtype=flat.compute_dtype)
        for refs in flat.refs:
            for s, attr in refs:
                setattr(s, attr, placeholder)

    def _run_unit(self, inner, needs, args, kwargs):
        grad = torch.is_grad_enabled()
        acquired = []
        try:
            for flat in needs:
                if flat.depth == 0:
                    self._start_gather(flat)
                    if grad and flat.requires_grad:
                        full = _GatherFn.apply(flat.shard, self, flat)
                    else:
                        full = self._finish_gather(flat)
                    flat.fwd_full = full
                    self._live[_storage_ptr(full)] = flat
                    self._show(flat, full)
                    if grad:
                        self._record(flat)
                flat.depth += 1
                acquired.append(flat)
            if grad and self.prefetch:
                nxt = self._next.get(needs[-1]) if needs else None
                if nxt is not None and nxt.depth == 0:
                    self._start_gather(nxt)
            hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack) if grad else \
                contextlib.nullcontext()
            with hooks:
                return inner(*args, **kwargs)
        finally:
            for flat in acquired:
                flat.depth -= 1
                if flat.depth == 0:
                    self._hide(flat)
                    self._live.pop(_storage_ptr(flat.fwd_full), None)
                    self._drop(flat, "fwd_full")

    def _record(self, flat):
        # The order in which this step's forward first gathered each flat:
        # the next step's forward prefetches by it, this step's backward
        # in reverse. A finished backward starts a new step.
        if self._order_closed:
            self._fwd_order, self._order_closed = [], False
        if flat not in self._fwd_order:
            if self._fwd_order:
                self._next[self._fwd_order[-1]] = flat
            self._fwd_order.append(flat)

    # ------------------------------------------------------------ backward
    def _pack(self, t):
        try:
            flat = self._live.get(_storage_ptr(t))
        except (RuntimeError, NotImplementedError):
            return t
        if flat is None or t.dtype != flat.compute_dtype:
            return t
        flat.marked = True
        return _Saved(flat, t)

    def _unpack(self, saved):
        if not isinstance(saved, _Saved):
            return saved
        flat = saved.flat
        if flat.depth > 0:  # still in its forward (e.g. activation checkpointing's recompute)
            full = flat.fwd_full
        else:
            if flat.bwd_full is None:
                flat.bwd_full = self._finish_gather(flat)
                if self.prefetch:
                    self._prefetch_backward(flat)
            full = flat.bwd_full
        return full.as_strided(saved.size, saved.stride, saved.offset)

    def _prefetch_backward(self, flat):
        # Backward runs units in about the reverse forward order: the next one
        # to need a gather is the closest earlier flat with saved views left.
        if flat not in self._fwd_order:
            return
        for prev in reversed(self._fwd_order[:self._fwd_order.index(flat)]):
            if prev.marked and prev.bwd_full is None and prev.depth == 0:
                self._start_gather(prev)
                return

    def _reduce_grad(self, flat, grad):
        flat.marked = False
        self._drop(flat, "bwd_full")
        if not self._callback_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
            self._callback_queued = True
        self._submit_reduction(flat, grad)

    def _submit_reduction(self, flat, grad):
        rdtype = self.reduce_dtype or flat.compute_dtype
        g = grad.to(rdtype) if grad.dtype != rdtype else grad
        g = g.contiguous()
        out = torch.empty(flat.shard_numel, dtype=rdtype)
        f = self.gradient_predivide_factor
        name = "%s.f%d.rs%d" % (self._prefix, flat.index, flat.rs_seq)
        flat.rs_seq += 1
        flat.reduced = True
        handle = _reducescatter_into(g, out, name, 1.0 / f, f / self._n, self.process_set)
        self._pending_grads.append((flat, handle, out, g))
        self._reap()

    def _reap(self):
        """Collects the reductions already finished, dropping their unit-sized
        gradient inputs: kept until the end of backward, they would add up to
        a full gradient (measured: +59 MB of peak on a 59 MB model)."""
        still = []
        for entry in self._pending_grads:
            if poll(entry[1]):
                synchronize(entry[1])
                self._reduced.append((entry[0], entry[2]))
            else:
                still.append(entry)
        self._pending_grads = still

    def _finish_backward(self):
        self._callback_queued = False
        try:
            # A flat whose gradient did not reach autograd on this rank still
            # takes part (zeros), since other ranks may reduce it.
            for flat in self.flats:
                if flat.requires_grad and not flat.reduced:
                    self._submit_reduction(flat, torch.zeros(flat.full_numel, dtype=flat.compute_dtype))
            outs = self._reduced
            for flat, handle, out, _ in self._pending_grads:
                synchronize(handle)
                outs.append((flat, out))
            self._pending_grads = []
            if self.replicate_process_set is not None and self.replicate_process_set.size() > 1:
                handles = []
                for flat, out in outs:
                    handles.append(allreduce_async_(out, name="%s.rep%d" % (self._prefix, self._rep_seq),
                                                    process_set=self.replicate_process_set))
                    self._rep_seq += 1
                for h in handles:
                    synchronize(h)
            with torch.no_grad():
                for flat, out in outs:
                    g = out.to(flat.dtype)
                    if flat.shard.grad is None:
                        flat.shard.grad = g
                    else:
                        flat.shard.grad.add_(g)
        finally:
            self._pending_grads, self._reduced = [], []
            self._order_closed = True
            for flat in self.flats:
                flat.reduced = flat.marked = False
                self._drop(flat, "bwd_full")
            self._drain()

    # ------------------------------------------------------------ utilities
    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """Clips the shards' gradients by the norm of the whole (unsharded)
        gradient; returns that norm. A collective over the set."""
        norm_type = float(norm_type)
        grads = [f.shard.grad for f in self.flats if f.shard.grad is not None]
        with torch.no_grad():
            if norm_type == math.inf:
                local = max((g.detach().abs().max().double() for g in grads), default=torch.zeros((),
                                                                                              dtype=torch.float64))
                total = allreduce_(local.reshape(1).clone(), op=Max, name="%s.norm" % self._prefix,
                                   process_set=self.process_set)[0]
            else:
                local = sum((g.detach().double().abs().pow(norm_type).sum() for g in grads),
                            torch.zeros((), dtype=torch.float64))
                total = allreduce_(local.reshape(1).clone(), op=Sum, name="%s.norm" % self._prefix,
                                   process_set=self.process_set)[0] ** (1.0 / norm_type)
            coef = float(max_norm) / (float(total) + 1e-6)
            if coef < 1.0:
                for g in grads:
                    g.mul_(coef)
        return total

    def state_dict(self, *args, **kwargs):
        """The unsharded module's state dict (same keys, full tensors, on every
        rank), loadable into the module without hora. A collective."""
        sd = {}
        for flat in self.flats:
            full = self._gather_exact(flat)
            for i, refs in enumerate(flat.refs):
                t = full[flat.offsets[i]:flat.offsets[i + 1]].view(flat.shapes[i]).clone()
                for s, attr in refs:
                    sd[self._path(s) + attr] = t
        for bname, b in self.module.named_buffers():
            sd[bname] = b.detach().clone()
        ordered = {k: sd.pop(k) for k in self._keys if k in sd}
        ordered.update(sd)
        return ordered

    def _gather_exact(self, flat):
        """The shard in its own dtype (not param_dtype), gathered for a checkpoint."""
        out = torch.empty(flat.full_numel, dtype=flat.dtype)
        name = "%s.f%d.ckpt%d" % (self._prefix, flat.index, flat.ag_seq)
        flat.ag_seq += 1
        synchronize(_allgather_into(flat.shard.detach(), out, name, self.process_set))
        return out

    def load_state_dict(self, state_dict, strict=True):
        """Takes an unsharded state dict (as ``state_dict()`` returns or the
        plain module's) and keeps this rank's slices. Needs no communication."""
        missing = []
        with torch.no_grad():
            for flat in self.flats:
                full = torch.zeros(flat.full_numel, dtype=flat.dtype)
                for i, refs in enumerate(flat.refs):
                    key = self._path(refs[0][0]) + refs[0][1]
                    if key not in state_dict:
                        missing.append(key)
                        continue
                    v = state_dict[key]
                    if tuple(v.shape) != tuple(flat.shapes[i]):
                        raise ValueError("FullyShardedModule.load_state_dict: %s has shape %s, the module's is %s"
                                         % (key, tuple(v.shape), tuple(flat.shapes[i])))
                    full[flat.offsets[i]:flat.offsets[i + 1]].copy_(v.reshape(-1))
                if any(self._path(refs[0][0]) + refs[0][1] in missing for refs in flat.refs):
                    continue
                flat.shard.copy_(full[self._r * flat.shard_numel:(self._r + 1) * flat.shard_numel])
            for bname, b in self.module.named_buffers():
                if bname in state_dict:
                    b.copy_(state_dict[bname])
                else:
                    missing.append(bname)
        if strict and missing:
            raise KeyError("FullyShardedModule.load_state_dict: missing keys %s" % missing)
        return missing

    def _path(self, module):
        return self._paths[module]

    def shard_bytes(self):
        """Bytes of this rank's parameter shards."""
        return sum(f.shard.numel() * f.shard.element_size() for f in self.flats)

    def full_bytes(self):
        """Bytes of the unsharded parameters."""
        return sum(f.numel * torch.empty((), dtype=f.dtype).element_size() for f in self.flats)
