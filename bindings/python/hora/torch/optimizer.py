"""DistributedOptimizer: wraps any torch.optim optimizer so that gradients are
averaged over the ranks before each step (Horovod's design, over hora's core).

How a step works:

1. A hook on each parameter's gradient accumulator (``AccumulateGrad`` node)
   fires as soon as backward has accumulated that parameter's gradient; after
   ``backward_passes_per_step`` such calls it starts an in-place
   ``allreduce_async_`` of ``p.grad`` named after the parameter. hora's core
   negotiates by name and fuses what is ready, so communication overlaps the
   rest of backward.
2. ``step()`` (or an explicit ``synchronize()``) allreduces the parameters whose
   hook never fired on this rank (their gradient is zero-filled), so every rank
   submits every name and no rank waits for a tensor another never sends; it
   then waits for all handles, writes the (decompressed) results into
   ``p.grad`` and calls the wrapped optimizer's ``step``.

Gradients accumulate locally over ``backward_passes_per_step`` passes (torch
adds into ``p.grad``) and are averaged over ranks only, as in Horovod.

Sparse gradients (``nn.Embedding(sparse=True)``), as in Horovod: by default the
indices and values are allgathered (``sparse_allreduce_async``) and the result
stays sparse, so optimizers that need sparse gradients (SparseAdam) work; with
``sparse_as_dense=True`` they are allreduced densely and made sparse again
before the step.
"""
import os
import warnings
from contextlib import contextmanager

import torch

from ..basics import Adasum, Average, global_process_set, size
from .compression import Compression
from .mpi_ops import allreduce_async_, grouped_allreduce_async_, sparse_allreduce_async, synchronize


class _GroupResults:
    """One grouped allreduce's outputs, waited for once; member(i) is a callable
    returning the i-th (synchronize() calls a callable handle)."""

    def __init__(self, handle):
        self.handle = handle
        self.outputs = None
        self.error = None

    def member(self, i):
        def get():
            if self.outputs is None and self.error is None:
                try:
                    self.outputs = synchronize(self.handle)
                except Exception as e:  # every member reports the group's failure
                    self.error = e
            if self.error is not None:
                raise self.error
            return self.outputs[i]
        return get


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1, op=Average,
                 gradient_predivide_factor=1.0, groups=None, sparse_as_dense=False,
                 process_set=global_process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [("noname.%s.%s" % (i, j), v) for i, group in enumerate(self.param_groups)
                                for j, v in enumerate(group["params"])]
        if any(not isinstance(p, tuple) for p in named_parameters):
            raise ValueError("named_parameters should be a sequence of tuples (name, parameter), usually "
                             "produced by model.named_parameters().")
        names = [k for k, _ in named_parameters]
        dups = sorted({k for k in names if names.count(k) > 1})
        if dups:
            raise ValueError("Parameter names in named_parameters must be unique. Found duplicates: %s"
                             % ", ".join(dups))
        all_ids = {id(v) for group in self.param_groups for v in group["params"]}
        unnamed = all_ids - {id(v) for _, v in named_parameters}
        if unnamed:
            raise ValueError("named_parameters was specified, but one or more model parameters were not named. "
                             "Python object ids: %s" % ", ".join(str(i) for i in unnamed))
        self._parameter_names = {v: k for k, v in sorted(named_parameters, key=lambda kv: kv[0])}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for _, v in named_parameters}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._groups = groups  # accepted for compatibility; the core fuses ready tensors by itself
        self._handles = {}
        self._grad_accs = []
        self._requires_update = set()
        # Parameters seen with a sparse gradient: one without a gradient on this
        # rank then contributes an empty sparse gradient, so it takes the same
        # allgather path (and names) as the ranks that have one.
        self._sparse_params = {}  # parameter -> sparse_dim of its gradient
        self._synchronized = False
        self._should_synchronize = True
        # As Horovod: hooks only with more than one rank (or elastic); at one
        # rank every gradient is reduced in step(), the dense ones as one grouped
        # allreduce (_reduce_grouped). Hooks at one rank were tried: their Python
        # work runs on the autograd thread, between backward's kernel launches
        # (bench/results/2026-11-28-gpu-h200.md).
        if self.process_set.included() and (size() > 1 or os.environ.get("HOROVOD_ELASTIC") == "1"):
            self._register_hooks()

    def load_state_dict(self, *args, **kwargs):
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        super(self.__class__, self).load_state_dict(*args, **kwargs)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _register_hooks(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    self._requires_update.add(p)
                    grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
                    grad_acc.register_hook(self._make_hook(p))
                    self._grad_accs.append(grad_acc)

    def _allreduce_grad_async(self, p):
        """Starts the reduction of p.grad; returns (handle, compression ctx). The
        handle is an int, or for a sparse gradient reduced by allgather a
        callable returning the result (as in Horovod)."""
        if p.grad is None:
            # No gradient on this rank (the parameter was unused), but other ranks
            # may have one: submit zeros so the name completes everywhere, sparse
            # where the gradient is known to be sparse (SparseAdam takes nothing
            # else; or seen sparse before) so that every rank takes the same
            # path. Otherwise dense, as in Horovod: nothing tells a gradient's
            # sparsity before backward produced one.
            p.grad = p.data.new(p.size()).zero_()
            if p in self._sparse_params or isinstance(self, torch.optim.SparseAdam):
                # an embedding's gradient has one sparse dim (rows); the
                # allgathered indices must have the same width on every rank
                p.grad = p.grad.to_sparse(self._sparse_params.get(p, min(1, p.dim())))
        name = self._parameter_names.get(p)
        tensor = p.grad
        if tensor.is_sparse:
            self._sparse_params[p] = tensor.sparse_dim()
            if not self.sparse_as_dense:
                return sparse_allreduce_async(tensor, name=name, op=self.op, process_set=self.process_set), None
            tensor = tensor.to_dense()
        compressed, ctx = self._compression.compress(tensor)
        prescale, postscale = self._scales()
        handle = allreduce_async_(compressed, name=name, op=self.op, prescale_factor=prescale,
                                  postscale_factor=postscale, process_set=self.process_set)
        return handle, ctx

    def _scales(self):
        """(prescale, postscale) of a gradient's reduction: gradient_predivide_factor
        splits an average's division around the sum."""
        if self.op == Average:
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _reduce_grouped(self, params):
        """Starts the reduction of every gradient in `params` at once: the dense
        ones as one grouped allreduce per dtype and device (one call, one ready
        event, instead of a submission per tensor: at one rank, where there
        are no hooks, that per-tensor work was the step's whole overhead), the
        rest one by one."""
        buckets = {}
        for p in params:
            if p.grad is None or p.grad.is_sparse or p in self._sparse_params or \
                    isinstance(self, torch.optim.SparseAdam):
                self._handles[p] = self._allreduce_grad_async(p)
                continue
            buckets.setdefault((p.grad.dtype, p.grad.device), []).append(p)
        prescale, postscale = self._scales()
        for k, members in enumerate(buckets.values()):
            compressed = [self._compression.compress(p.grad) for p in members]
            handle = grouped_allreduce_async_([t for t, _ in compressed], name="DistributedOptimizer.grouped.%d" % k,
                                              op=self.op, prescale_factor=prescale, postscale_factor=postscale,
                                              process_set=self.process_set)
            results = _GroupResults(handle)
            for i, (p, (_, ctx)) in enumerate(zip(members, compressed)):
                self._handles[p] = (results.member(i), ctx)

    def _make_hook(self, p):
        def hook(*ignore):
            if p in self._handles and self._handles[p][0] is not None:
                if self._allreduce_delay[p] <= 0:
                    raise AssertionError(
                        "Gradients were computed more than backward_passes_per_step times before call to step(). "
                        "Increase backward_passes_per_step to accumulate gradients locally.")
            assert not p.grad.requires_grad
            assert self._allreduce_delay[p] > 0
            handle, ctx = None, None
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    def synchronize(self):
        """Waits for every gradient's allreduce (starting those not started yet)
        and writes the averaged gradients into p.grad."""
        if not self.process_set.included():
            self._synchronized = True
            return
        for p in self._requires_update - set(self._handles):
            self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:
                self._handles[p] = self._allreduce_grad_async(p)
        if not self._requires_update:  # hooks not registered (one rank): reduce every gradient here
            self._reduce_grouped([p for group in self.param_groups for p in group["params"]
                                  if p.requires_grad and p not in self._handles])
        handles, self._handles = self._handles, {}
        error = None
        for p, (handle, ctx) in handles.items():
            # Counted down again from here even if this allreduce fails: a step
            # that failed (elastic reset) is abandoned, and the next backward
            # must start a fresh accumulation.
            self._allreduce_delay[p] = self.backward_passes_per_step
            try:
                output = handle() if callable(handle) else synchronize(handle)
            except Exception as e:  # wait for the others too, then report the first failure
                error = error or e
                continue
            if p.grad.is_sparse:
                # Sparse tensors have no set_; the result (dense with
                # sparse_as_dense) goes back sparse, as the optimizer expects.
                aggregated = output if ctx is None else self._compression.decompress(output, ctx)
                p.grad = aggregated if aggregated.is_sparse else aggregated.to_sparse()
            else:
                p.grad.set_(self._compression.decompress(output, ctx))
        if error is not None:
            raise error
        self._synchronized = True

    @contextmanager
    def skip_synchronize(self):
        """Inside this context step() does not synchronize (call synchronize() yourself
        before, e.g. to clip the averaged gradients)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training slowdown. You may want to "
                              "consider using optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def _hora_inner_step(self):
        """The wrapped optimizer's step without synchronizing (broadcast_optimizer_state)."""
        return super(self.__class__, self).step()

    def _abandon_step(self):
        """Forgets the step in flight after an elastic reset (hora.torch.elastic):
        its allreduces belonged to the runtime that was shut down, which completed
        them with an error; collect them, so the next backward and zero_grad start
        clean."""
        handles, self._handles = self._handles, {}
        for handle, _ in handles.values():
            if handle is not None:
                try:
                    handle() if callable(handle) else synchronize(handle)
                except Exception:  # the old runtime's failure, already handled by the reset
                    pass
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._synchronized = False

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                                 "cause a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=global_process_set):
    """Wraps ``optimizer`` (any torch.optim.Optimizer) so that step() uses gradients
    averaged (``op``) over the ranks of ``process_set``.

    named_parameters: ``model.named_parameters()``; names must match across ranks.
    compression: Compression.none or Compression.fp16 (gradients travel as float16).
    backward_passes_per_step: local accumulation passes before each allreduce.
    gradient_predivide_factor: with op=Average, gradients are multiplied by
    1/factor before the sum and by factor/size after it.
    num_groups / groups: accepted for compatibility and ignored: hora's core
    already fuses every gradient that is ready into one buffer.
    sparse_as_dense: reduce sparse gradients densely (allreduce) instead of by
    allgather of their indices and values; they are sparse again before the step.
    """
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if op == Adasum:
        raise NotImplementedError("hora does not implement the Adasum optimizer; use op=Average")
    if num_groups:
        warnings.warn("num_groups is deprecated and ignored by hora (the core fuses ready tensors)")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, groups, sparse_as_dense, process_set)
