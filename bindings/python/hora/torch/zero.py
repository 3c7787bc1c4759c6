"""ZeroOptimizer: a sharded optimizer (ZeRO stages 1 and 2) over hora's
collectives, for any ``torch.optim`` optimizer.

    opt = hvd.ZeroOptimizer(model.named_parameters(), torch.optim.Adam, stage=2, lr=1e-3)
    for x, y in data:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.clip_grad_norm_(1.0)          # optional, by the global norm
        opt.step()

Layout. The parameters that require a gradient are flattened, per parameter
group and dtype and in their order, into buckets of at most ``bucket_bytes``
(a larger parameter is a bucket of its own). A bucket of ``numel`` elements
is padded to ``N * ceil(numel / N)`` (N = size of the process set) and set
rank r owns the contiguous slice ``[r * shard, (r + 1) * shard)``. The inner
optimizer is built over one "master" tensor per bucket holding only this
rank's slice (float32 when the parameters are float16/bfloat16, else the
parameters' dtype), so its state (momentum, Adam's moments) is 1/N of the
unsharded optimizer's.

A step:

1. A hook on each parameter's gradient accumulator counts the backward
   passes; on the last of ``backward_passes_per_step`` (gradients accumulate
   locally in ``p.grad`` before that, as with DistributedOptimizer) it copies
   ``p.grad`` into its bucket's flat buffer. Once every parameter of a bucket
   is in, the bucket's reduction starts asynchronously, during the rest of
   backward: stage 1 an allreduce of the whole bucket (``p.grad`` then holds
   the averaged gradient after ``step()``, as with DistributedOptimizer);
   stage 2 a reducescatter whose output is this rank's slice only, and
   ``p.grad`` is released (set to None) as soon as it is copied, so no rank
   holds the full reduced gradient.
2. ``step()`` starts the buckets whose parameters got no gradient on this
   rank (zeros, so that every rank submits every bucket), waits for the
   reductions, steps the inner optimizer on the slices and allgathers the
   updated slices (in the parameters' dtype) back into the parameters.

Buffers. At the first step each bucket's parameters are moved into one flat
buffer (``p.data`` becomes a view of it) that the allgather writes in place;
a parameter whose storage was replaced since is updated by a copy. Stage 1
keeps its flat gradient buffer (``p.grad`` views it after a step); stage 2
takes one for the step in flight only, gives it back to a pool as soon as
the bucket's reducescatter is seen finished (checked whenever a later
bucket starts; on a 6-layer 512-wide MLP with 1 MiB buckets 7 to 10 of 11
buckets were back before backward ended), where later buckets reuse it,
and keeps just the slice-sized reducescatter output. The pool holds as many
buffers as were ever in flight at once (``pooled_bytes()``; a full
gradient's worth when every gradient is ready at the same moment): resting
memory, not more peak. Outputs go into these kept tensors because fresh
large torch CPU allocations page-fault on first touch, which cost more than
the collectives themselves on the test machine.

Gradients are averaged over the process set exactly as DistributedOptimizer
averages them (a sum scaled by ``1/size``, with the same
``gradient_predivide_factor`` pre- and post-scaling), so with the same data
the parameters follow DistributedOptimizer's.

Checkpoints: ``state_dict()`` is the consolidated state in torch's format
(keys and shapes as the unsharded optimizer's, loadable into it) and
``load_state_dict()`` takes such a dict; ``sharded_state_dict()`` is this
rank's part only, and ``load_sharded_state_dict(shards)`` takes the parts of
every rank of a run at any world size (dicts or file paths) and re-shards.
"""
import itertools

import torch

from .. import basics
from ..basics import Average, Sum, global_process_set, poll
from .mpi_ops import _Allocator, _ref, allgather_async, allreduce_, allreduce_async_, synchronize

_instances = {}  # process set id -> how many ZeroOptimizers were made over it (the default names)
_LOW_PRECISION = (torch.float16, torch.bfloat16)
FORMAT_VERSION = 1


class _Bucket:
    """A run of parameters of one group and dtype, flattened; this rank owns
    ``[lo, hi)`` of the padded flat range."""

    def __init__(self, index, group, params, n, r):
        self.index = index
        self.group = group
        self.params = params
        self.dtype = params[0].dtype
        self.offsets = list(itertools.accumulate([0] + [p.numel() for p in params]))
        self.numel = self.offsets[-1]
        self.shard = -(-self.numel // n)
        self.padded = self.shard * n
        self.lo, self.hi = r * self.shard, (r + 1) * self.shard
        self.master = None   # this rank's slice, the inner optimizer's parameter
        self.flat = None     # the flat gradient buffer (stage 1: kept; stage 2: only while a step is in flight)
        self.flat_base = None  # the (pooled) tensor ``flat`` is the start of
        self.gshard = None   # stage 2: the reducescatter's output, this rank's slice (kept)
        self.gmaster = None  # the master's gradient (kept; float32 for float16/bfloat16 parameters)
        self.pflat = None    # the parameters' flat buffer, the allgather's output (the parameters view it)
        self.ready = 0       # parameters whose gradient is in ``flat``
        self.handle = None
        self.collected = False  # this step's reduction was waited for (stage 2 collects early)
        self.rep = None      # hybrid: (handle, output) of the average over the replicas in flight

    def overlaps(self):
        """(param index in bucket, start in param, start in shard, length) for the
        parameters that overlap this rank's slice."""
        for i, p in enumerate(self.params):
            a, b = max(self.offsets[i], self.lo), min(self.offsets[i + 1], self.hi)
            if a < b:
                yield i, a - self.offsets[i], a - self.lo, b - a


class _Into(_Allocator):
    """The output of a reducescatter or allgather written into a tensor we
    keep (hora asks for the output's memory once it knows the shape): torch
    would otherwise allocate a fresh tensor per call, and large fresh CPU
    allocations page-fault on first touch (measured ~10 ms per 3 MB here)."""
    __slots__ = ("into",)

    def __init__(self, tensor):
        self.into = tensor
        super().__init__()

    def _make(self, dims, _dl_dtype):
        if dims != list(self.into.shape):
            raise RuntimeError("ZeroOptimizer: collective output of shape %s, expected %s"
                               % (dims, list(self.into.shape)))
        return self.into

    def result(self, _pending=None):
        return self.into


def _reducescatter_into(tensor, out, name, prescale, postscale, process_set):
    into = _Into(out)
    p = basics.submit_reducescatter(_ref(tensor), name, Sum, prescale, postscale, process_set,
                                    finish=into.result, keep=into, alloc=into)
    p.cause = into.cause
    return basics.register(p)


def _allgather_into(tensor, out, name, process_set):
    into = _Into(out)
    p = basics.submit_allgather(_ref(tensor), name, process_set, finish=into.result, keep=into, alloc=into)
    p.cause = into.cause
    return basics.register(p)


def _state_bytes(optimizer):
    return sum(v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values()
               if torch.is_tensor(v))


class ZeroOptimizer:
    """Sharded optimizer (ZeRO stage 1 or 2) over ``process_set``.

    ``ZeroOptimizer(params, optimizer_cls=torch.optim.SGD, stage=1, process_set=global_process_set,
    backward_passes_per_step=1, bucket_bytes=25 MiB, gradient_predivide_factor=1.0, **optimizer_kwargs)``

    params: ``model.parameters()``, ``model.named_parameters()`` (the names
    only serve error messages) or a list of param-group dicts as torch takes
    them (per-group options override ``optimizer_kwargs``). Every rank must
    pass the same parameters, shapes and order, with the same values (e.g.
    after ``hvd.broadcast_parameters``; the master copies are taken from the
    parameters at the first ``step()``).
    optimizer_cls: any ``torch.optim.Optimizer`` subclass; it is built over
    this rank's slices with ``optimizer_kwargs`` (``lr=...``, ...).
    stage: 1 (gradients allreduced, each rank uses its slice) or 2
    (gradients reduce-scattered into each rank's slice).
    backward_passes_per_step: local accumulation passes before the reduction.
    bucket_bytes: the most bytes of gradient per collective.
    gradient_predivide_factor: as DistributedOptimizer's (gradients times
    1/factor before the sum, times factor/size after it).
    replicate_process_set: hybrid shard. State is sharded within
    ``process_set`` (e.g. one host's ranks) and replicated over this set (the
    ranks holding the same shard on the other hosts): gradients are averaged
    within ``process_set`` (reducescatter or allreduce) and then across it.
    name: prefix of the collectives' names. By default "zero.<set id>.<k>"
    for the k-th ZeroOptimizer over that set on this rank, so every rank of
    the set must make its ZeroOptimizers over the set in the same order (or
    pass the same ``name``).

    ``param_groups`` are the inner optimizer's (``lr`` etc. can be changed
    there); an LR scheduler takes the inner optimizer, ``opt.optimizer``.

    Every method that communicates (``step``, ``synchronize``,
    ``clip_grad_norm_``, ``state_dict``, ``load_state_dict``,
    ``load_sharded_state_dict``) must be called on every rank of the set.
    Not supported: sparse gradients, closures that need the reduced
    gradients before they return.
    """

    def __init__(self, params, optimizer_cls=torch.optim.SGD, stage=1, process_set=global_process_set,
                 backward_passes_per_step=1, bucket_bytes=25 * 1024 * 1024, gradient_predivide_factor=1.0,
                 name=None, replicate_process_set=None, **optimizer_kwargs):
        if stage not in (1, 2):
            raise ValueError("ZeroOptimizer: stage must be 1 or 2 (got %r)" % (stage,))
        if isinstance(optimizer_cls, torch.optim.Optimizer) or not (
                isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)):
            raise TypeError("ZeroOptimizer: optimizer_cls must be a torch.optim.Optimizer subclass, e.g. "
                            "torch.optim.Adam (its options go as keyword arguments)")
        if process_set is None:
            process_set = global_process_set
        if not process_set.included():
            raise ValueError("ZeroOptimizer: this rank is not a member of %r" % (process_set,))
        if replicate_process_set is not None and not replicate_process_set.included():
            raise ValueError("ZeroOptimizer: this rank is not a member of replicate_process_set %r"
                             % (replicate_process_set,))
        if replicate_process_set is not None and replicate_process_set.size() == 1:
            replicate_process_set = None
        self.replicate_process_set = replicate_process_set
        self.stage = stage
        self.process_set = process_set
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.bucket_bytes = int(bucket_bytes)
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self.optimizer_cls = optimizer_cls
        self._size, self._rank = process_set.size(), process_set.rank()
        if name is None:
            # hybrid: the ranks of a replicate set are in different shard sets
            # yet name their collectives alike, so count hybrid ones apart
            key = "hybrid" if replicate_process_set is not None else process_set.process_set_id
            count = _instances.get(key, 0)
            _instances[key] = count + 1
            name = "zero.%s.%d" % (key, count)
        self._prefix = name

        groups, self._names = self._parse_params(params)
        # torch's numbering of the parameters (state_dict keys): in group order
        self._all_params = [p for g in groups for p in g["params"]]
        self._param_index = {id(p): i for i, p in enumerate(self._all_params)}
        self._param_group_index = {id(p): gi for gi, g in enumerate(groups) for p in g["params"]}
        self.buckets = []
        inner_groups = []
        for gi, g in enumerate(groups):
            opts = {k: v for k, v in g.items() if k != "params"}
            trainable = [p for p in g["params"] if p.requires_grad]
            masters = []
            for dtype in sorted({p.dtype for p in trainable}, key=str):
                run, run_bytes = [], 0
                for p in (q for q in trainable if q.dtype == dtype):
                    nbytes = p.numel() * p.element_size()
                    if run and run_bytes + nbytes > self.bucket_bytes:
                        masters.append(self._add_bucket(gi, run))
                        run, run_bytes = [], 0
                    run.append(p)
                    run_bytes += nbytes
                if run:
                    masters.append(self._add_bucket(gi, run))
            inner_groups.append(dict(opts, params=masters))
        self.optimizer = optimizer_cls(inner_groups, **optimizer_kwargs)
        self._bucket_of = {p: b for b in self.buckets for p in b.params}
        self._slot = {p: i for b in self.buckets for i, p in enumerate(b.params)}
        self._delay = {p: self.backward_passes_per_step for p in self._bucket_of}
        self._free_buffers = []     # stage 2: bucket buffers whose reducescatter finished, for reuse
        self._done = set()          # parameters whose gradient is in their bucket this step
        self._masters_fresh = False
        self._synchronized = False
        self._error = None          # a reduction's failure, raised by synchronize()
        self._grad_accs = []
        for p in self._bucket_of:
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            acc.register_hook(self._make_hook(p))
            self._grad_accs.append(acc)

    # ------------------------------------------------------------ set-up
    @staticmethod
    def _parse_params(params):
        params = list(params)
        if not params:
            raise ValueError("ZeroOptimizer: got an empty parameter list")
        names = {}
        if isinstance(params[0], dict):
            groups = [dict(g, params=list(g["params"])) for g in params]
        else:
            if all(isinstance(p, tuple) for p in params):
                names = {p: n for n, p in params}
                params = [p for _, p in params]
            groups = [{"params": params}]
        for g in groups:
            for p in g["params"]:
                if not isinstance(p, torch.Tensor) or not p.is_leaf:
                    raise TypeError("ZeroOptimizer: parameters must be leaf tensors")
                if p.device.type != "cpu":
                    raise NotImplementedError("ZeroOptimizer: CPU tensors only in this release "
                                              "(reducescatter/allgather take CPU tensors)")
        return groups, names

    def _add_bucket(self, gi, params):
        b = _Bucket(len(self.buckets), gi, params, self._size, self._rank)
        mdtype = torch.float32 if b.dtype in _LOW_PRECISION else b.dtype
        b.master = torch.zeros(b.shard, dtype=mdtype, requires_grad=True)
        self.buckets.append(b)
        return b.master

    def _refresh_masters(self):
        """Copies the parameters' values into this rank's slices: at the first
        step (and after load_state_dict) for float16/bfloat16 parameters, whose
        master keeps more precision than they do; at every step otherwise (then
        the master is an exact copy, and parameters changed by the user, e.g.
        broadcast after construction, are taken)."""
        with torch.no_grad():
            for b in self.buckets:
                if self._masters_fresh and b.master.dtype != b.dtype:
                    continue
                for i, at, to, n in b.overlaps():
                    b.master[to:to + n].copy_(b.params[i].detach().reshape(-1)[at:at + n])
        self._masters_fresh = True

    # ------------------------------------------------------------ reduction
    def _make_hook(self, p):
        def hook(*_):
            if self._delay[p] <= 0:
                raise AssertionError("Gradients were computed more than backward_passes_per_step times before "
                                     "call to step(). Increase backward_passes_per_step to accumulate gradients "
                                     "locally.")
            self._delay[p] -= 1
            if self._delay[p] == 0:
                self._gradient_in(p)
        return hook

    def _gradient_in(self, p):
        """Copies p's accumulated gradient into its bucket; starts the bucket
        once complete."""
        b = self._bucket_of[p]
        if b.flat is None:
            self._take_buffer(b)
        i = self._slot[p]
        dst = b.flat[b.offsets[i]:b.offsets[i + 1]]
        if p.grad is None:
            dst.zero_()  # (stage 1 reuses the buffer)
        else:
            if p.grad.is_sparse:
                raise NotImplementedError("ZeroOptimizer: sparse gradients are not supported (parameter %s)"
                                          % self._names.get(p, "#%d" % self._param_index[id(p)]))
            if p.grad.data_ptr() != dst.data_ptr():  # stage 1: p.grad is usually this very view
                dst.copy_(p.grad.reshape(-1))
            if self.stage == 2:
                p.grad = None  # the local gradient is in the bucket; stage 2 keeps no full gradient
        self._done.add(p)
        b.ready += 1
        if b.ready == len(b.params):
            self._launch(b)

    def _take_buffer(self, b):
        """Stage 1: the bucket's own flat buffer, kept. Stage 2: the smallest
        pooled buffer that fits (a bucket's input is back in the pool once its
        reducescatter finished), else a new one. The pool stops backward from
        allocating, and page-faulting, every bucket anew each step (measured
        ~31 ms per step for 14.7M float32 here), while holding only as many
        buffers as were ever in flight at once, not a full gradient's worth."""
        base = None
        if self.stage == 2:
            fits = [t for t in self._free_buffers if t.dtype == b.dtype and t.numel() >= b.padded]
            if fits:
                base = min(fits, key=lambda t: t.numel())
                # by identity (list.remove would compare tensors elementwise)
                del self._free_buffers[next(i for i, t in enumerate(self._free_buffers) if t is base)]
        if base is None:
            base = torch.empty(b.padded, dtype=b.dtype)
        b.flat_base = base
        b.flat = base[:b.padded]
        b.flat[b.numel:].zero_()  # the padding reaches the last rank's slice (and the gradient norm)

    def pooled_bytes(self):
        """Bytes of stage 2's pooled gradient buffers (kept between steps)."""
        return sum(t.numel() * t.element_size() for t in self._free_buffers)

    def _launch(self, b):
        pre, post = 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        name = "%s.grad.%d" % (self._prefix, b.index)
        if self.stage == 1:
            b.handle = allreduce_async_(b.flat, name=name, op=Average, prescale_factor=pre, postscale_factor=post,
                                        process_set=self.process_set)
        else:
            # DistributedOptimizer's Average is a Sum scaled by 1/size (mpi_ops._horovod_average): the same here
            if b.gshard is None:
                b.gshard = torch.empty(b.shard, dtype=b.dtype)
            b.handle = _reducescatter_into(b.flat, b.gshard, name, pre, post / self._size, self.process_set)
            # buckets whose reducescatter already finished give back their bucket-sized input now, so
            # that stage 2's peak is the buckets in flight rather than the whole gradient
            for other in self.buckets:
                if other is not b and other.handle is not None and poll(other.handle):
                    self._collect(other)

    def _collect(self, b):
        """Waits for bucket b's reduction and puts this rank's slice of the
        averaged gradient into its master's ``.grad``; a failure is kept for
        synchronize() to raise."""
        try:
            out = synchronize(b.handle)
        except Exception as e:
            self._error = self._error or e
            out = None
        b.handle, b.ready, b.collected = None, 0, True
        if self.stage == 2 and b.flat is not None:
            # the buffer goes back to the pool: a later bucket (this step or the next) reuses it
            self._free_buffers.append(b.flat_base)
            b.flat = b.flat_base = None
        if out is None:
            return
        if self.replicate_process_set is not None:
            # hybrid shard: the shard set's average, averaged again over the
            # replicas of this shard (stage 1: the whole bucket, as p.grad
            # shows it). Asynchronous: ranks collect buckets in different
            # orders (polling), and a blocking wait here could wait on a rank
            # that is itself blocked on another bucket. synchronize() finishes it.
            try:
                b.rep = (allreduce_async_(out, name="%s.rep.%d" % (self._prefix, b.index), op=Average,
                                          process_set=self.replicate_process_set), out)
            except Exception as e:
                self._error = self._error or e
            return
        self._assign(b, out)

    def _assign(self, b, out):
        """Puts this rank's slice of the bucket's averaged gradient ``out`` into
        the master's ``.grad`` (stage 1 also into the parameters' ``.grad``)."""
        if self.stage == 1:
            shard = out[b.lo:b.hi]
            for i, p in enumerate(b.params):  # the averaged gradient, viewing the kept buffer
                if p.grad is None or p.grad.data_ptr() != out[b.offsets[i]:].data_ptr():
                    p.grad = out[b.offsets[i]:b.offsets[i + 1]].view_as(p)
        else:
            shard = out
        if self.stage == 2 and shard.dtype == b.master.dtype:
            b.master.grad = shard  # the kept reducescatter output, overwritten next step
        else:  # a copy (and cast): stage 1's shard is a view of p.grad, which clipping scales itself
            if b.gmaster is None:
                b.gmaster = torch.empty(b.shard, dtype=b.master.dtype)
            b.master.grad = b.gmaster.copy_(shard)

    def synchronize(self):
        """Finishes the gradient reduction of this step: starts the buckets not
        started (zeros for parameters without a gradient on this rank), waits,
        and puts this rank's slice of the averaged gradient into the masters'
        ``.grad`` (stage 1 also writes the averaged gradients into ``p.grad``)."""
        if self._synchronized:
            return
        for b in self.buckets:
            if b.handle is None and not b.collected:
                for p in b.params:
                    if p not in self._done:
                        self._gradient_in(p)
        for b in self.buckets:  # wait for every bucket, then report the first failure
            if not b.collected:
                self._collect(b)
            b.collected = False
        for b in self.buckets:  # hybrid: the averages over the replicas
            if b.rep is not None:
                handle, out = b.rep
                b.rep = None
                try:
                    synchronize(handle)
                    self._assign(b, out)
                except Exception as e:
                    self._error = self._error or e
        self._done.clear()
        for p in self._delay:
            self._delay[p] = self.backward_passes_per_step
        error, self._error = self._error, None
        if error is not None:
            raise error
        self._synchronized = True

    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """Clips the averaged gradients by their global norm (an allreduce of the
        ranks' sums of squares of their slices), as torch.nn.utils.clip_grad_norm_
        would on the whole averaged gradient; returns the total norm. Call it
        after backward and before step()."""
        if float(norm_type) != 2.0:
            raise NotImplementedError("ZeroOptimizer.clip_grad_norm_: norm_type 2 only")
        self.synchronize()
        sq = torch.zeros(1, dtype=torch.float64)
        for b in self.buckets:
            sq += b.master.grad.double().pow(2).sum()
        allreduce_(sq, op=Sum, name="%s.gradnorm" % self._prefix, process_set=self.process_set)
        total = sq.sqrt().to(torch.float32)[0]
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for b in self.buckets:
            b.master.grad.mul_(coef.to(b.master.grad.dtype))
        if self.stage == 1:  # keep p.grad (the averaged gradient) consistent with what is stepped
            for b in self.buckets:
                for p in b.params:
                    if p.grad is not None:
                        p.grad.mul_(coef.to(p.grad.dtype))
        return total

    # ------------------------------------------------------------ step
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.synchronize()
        self._refresh_masters()
        self.optimizer.step()
        self._synchronized = False
        handles = []
        for b in self.buckets:
            if b.pflat is None:
                self._make_flat_params(b)
            send = b.master.detach().to(b.dtype) if b.master.dtype != b.dtype else b.master.detach()
            handles.append(_allgather_into(send, b.pflat, "%s.param.%d" % (self._prefix, b.index), self.process_set))
        error = None
        for b, h in zip(self.buckets, handles):
            try:
                synchronize(h)
            except Exception as e:  # wait for every bucket, then report the first failure
                error = error or e
                continue
            with torch.no_grad():
                for i, p in enumerate(b.params):
                    view = b.pflat[b.offsets[i]:b.offsets[i + 1]]
                    if p.data_ptr() != view.data_ptr():  # moved by the user since: copy
                        p.copy_(view.view_as(p))
        if error is not None:
            raise error
        return loss

    @staticmethod
    def _make_flat_params(b):
        """Moves a bucket's parameters into one flat buffer (they become views of
        it), so that the allgather writes them in place."""
        b.pflat = torch.zeros(b.padded, dtype=b.dtype)
        with torch.no_grad():
            for i, p in enumerate(b.params):
                view = b.pflat[b.offsets[i]:b.offsets[i + 1]]
                view.copy_(p.detach().reshape(-1))
                if p.is_contiguous():
                    p.data = view.view_as(p)

    def zero_grad(self, set_to_none=False):
        if self._done:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize().")
        for p in self._all_params:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    if p.grad.grad_fn is not None:
                        p.grad.detach_()
                    else:
                        p.grad.requires_grad_(False)
                    p.grad.zero_()
        for b in self.buckets:
            b.master.grad = None

    @property
    def param_groups(self):
        """The inner optimizer's groups (over this rank's slices): set ``lr`` etc. here."""
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def state_bytes(self):
        """Bytes of this rank's optimizer state tensors (masters not counted)."""
        return _state_bytes(self.optimizer)

    def master_bytes(self):
        """Bytes of the float32 master slices kept for float16/bfloat16 parameters."""
        return sum(b.master.numel() * b.master.element_size() for b in self.buckets if b.master.dtype != b.dtype)

    # ------------------------------------------------------------ checkpoints
    def _shard_state(self, b):
        return self.optimizer.state.get(b.master, {})

    def _gather_full(self, b, shard, name):
        """The whole (unpadded) flat tensor of a bucket from every rank's slice."""
        h = allgather_async(shard.detach().contiguous(), name=name, process_set=self.process_set)
        return synchronize(h)[:b.numel]

    def state_dict(self):
        """The consolidated state (collective: call on every rank; every rank
        gets it): torch's format, keys and shapes as the unsharded optimizer's
        over the parameters passed in, plus ``"zero_master"`` (the float32
        master copies of float16/bfloat16 parameters, by parameter index), which
        torch's load_state_dict ignores."""
        state = {}
        masters = {}
        for b in self.buckets:
            shard_state = self._shard_state(b)
            keys = sorted(shard_state)
            per_param = [dict() for _ in b.params]
            for k in keys:
                v = shard_state[k]
                if torch.is_tensor(v) and v.dim() == 1 and v.numel() == b.shard:
                    full = self._gather_full(b, v, "%s.sd.%d.%s" % (self._prefix, b.index, k))
                    for i, p in enumerate(b.params):
                        per_param[i][k] = full[b.offsets[i]:b.offsets[i + 1]].view_as(p).clone()
                else:
                    for d in per_param:
                        d[k] = v.clone() if torch.is_tensor(v) else v
            if b.master.dtype != b.dtype:
                full = self._gather_full(b, b.master, "%s.sd.%d.master" % (self._prefix, b.index))
                for i, p in enumerate(b.params):
                    masters[self._param_index[id(p)]] = full[b.offsets[i]:b.offsets[i + 1]].view_as(p).clone()
            if keys:
                for i, p in enumerate(b.params):
                    state[self._param_index[id(p)]] = per_param[i]
        groups, start = [], 0
        for inner_g in self.optimizer.param_groups:
            opts = {k: v for k, v in inner_g.items() if k != "params"}
            n = sum(1 for p in self._all_params if self._param_group_index[id(p)] == len(groups))
            groups.append(dict(opts, params=list(range(start, start + n))))
            start += n
        out = {"state": state, "param_groups": groups}
        if masters:
            out["zero_master"] = masters
        return out

    def load_state_dict(self, state_dict):
        """Loads a consolidated state dict (this class's ``state_dict()`` or
        the unsharded torch optimizer's over the same parameters): every rank
        keeps its slice."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.optimizer.param_groups):
            raise ValueError("ZeroOptimizer.load_state_dict: %d param groups, expected %d"
                             % (len(groups), len(self.optimizer.param_groups)))
        # the dict's parameter ids, in order, map onto ours in order (as torch maps them)
        ids = [i for g in groups for i in g["params"]]
        if len(ids) != len(self._all_params):
            raise ValueError("ZeroOptimizer.load_state_dict: %d parameters, expected %d"
                             % (len(ids), len(self._all_params)))
        saved = state_dict["state"]
        masters = state_dict.get("zero_master", {})
        inner_state = {}
        for b in self.buckets:
            dict_ids = [ids[self._param_index[id(p)]] for p in b.params]
            present = [saved.get(k) for k in dict_ids]
            if all(s is None for s in present):
                continue
            if any(s is None for s in present):
                raise ValueError("ZeroOptimizer.load_state_dict: parameters of one bucket have state and "
                                 "others not; step once with every parameter before saving")
            st = {}
            for k, v in present[0].items():
                if torch.is_tensor(v) and v.shape == b.params[0].shape and v.dim() > 0:
                    st[k] = self._slice_of(b, [s[k] for s in present], b.master.dtype)
                else:
                    st[k] = v.clone() if torch.is_tensor(v) else v
            inner_state[b.master] = st
        with torch.no_grad():
            for b in self.buckets:
                dict_ids = [ids[self._param_index[id(p)]] for p in b.params]
                if b.master.dtype != b.dtype and all(k in masters for k in dict_ids):
                    b.master.copy_(self._slice_of(b, [masters[k] for k in dict_ids], b.master.dtype))
                else:
                    for i, at, to, n in b.overlaps():
                        b.master[to:to + n].copy_(b.params[i].detach().reshape(-1)[at:at + n])
        self._masters_fresh = True
        # the inner optimizer's own load_state_dict does the hyper-parameters and dtype casts
        inner_ids = {m: i for i, m in enumerate(m for g in self.optimizer.param_groups for m in g["params"])}
        inner_groups = []
        for g, mine in zip(groups, self.optimizer.param_groups):
            opts = {k: v for k, v in g.items() if k != "params"}
            inner_groups.append(dict(opts, params=[inner_ids[m] for m in mine["params"]]))
        self.optimizer.load_state_dict({"state": {inner_ids[m]: s for m, s in inner_state.items()},
                                        "param_groups": inner_groups})

    def _slice_of(self, b, tensors, dtype):
        """This rank's slice of the flat concatenation of ``tensors`` (one per
        bucket parameter), padded with zeros."""
        out = torch.zeros(b.shard, dtype=dtype)
        for i, at, to, n in b.overlaps():
            out[to:to + n].copy_(tensors[i].reshape(-1)[at:at + n])
        return out

    def sharded_state_dict(self):
        """This rank's part of the state, no communication: per bucket, the
        layout (parameter indices and shapes, unpadded size) and the slices of
        the per-element state, the scalar state, the float32 masters; the param
        groups' options. ``load_sharded_state_dict`` takes the parts of all ranks."""
        buckets = []
        for b in self.buckets:
            st = self._shard_state(b)
            buckets.append({
                "params": [self._param_index[id(p)] for p in b.params],
                "shapes": [tuple(p.shape) for p in b.params],
                "numel": b.numel, "shard": b.shard,
                "state": {k: (v.clone() if torch.is_tensor(v) else v) for k, v in st.items()},
                "master": b.master.detach().clone() if b.master.dtype != b.dtype else None,
            })
        groups = []
        for gi, g in enumerate(self.optimizer.param_groups):
            opts = {k: v for k, v in g.items() if k != "params"}
            groups.append(dict(opts, params=[i for i, p in enumerate(self._all_params)
                                             if self._param_group_index[id(p)] == gi]))
        return {"zero_format": FORMAT_VERSION, "rank": self._rank, "size": self._size, "stage": self.stage,
                "num_params": len(self._all_params), "buckets": buckets, "param_groups": groups}

    @staticmethod
    def consolidate_sharded(shards):
        """A consolidated state dict (torch's format) from every rank's
        ``sharded_state_dict()`` (dicts or paths of ``torch.save`` files), at any
        world size; no communication."""
        shards = [torch.load(s) if isinstance(s, str) else s for s in shards]
        shards = sorted(shards, key=lambda s: s["rank"])
        n = shards[0]["size"]
        if [s["rank"] for s in shards] != list(range(n)) or any(s["size"] != n for s in shards):
            raise ValueError("ZeroOptimizer: need the sharded state of every rank 0..%d, got ranks %s"
                             % (n - 1, [s["rank"] for s in shards]))
        state, masters = {}, {}
        for bi, b in enumerate(shards[0]["buckets"]):
            parts = [s["buckets"][bi] for s in shards]
            offsets = list(itertools.accumulate([0] + [int(torch.Size(sh).numel()) for sh in b["shapes"]]))
            per_param = [dict() for _ in b["params"]]
            for k, v in b["state"].items():
                if torch.is_tensor(v) and v.dim() == 1 and v.numel() == b["shard"]:
                    full = torch.cat([p["state"][k] for p in parts])[:b["numel"]]
                    for i, sh in enumerate(b["shapes"]):
                        per_param[i][k] = full[offsets[i]:offsets[i + 1]].reshape(sh).clone()
                else:
                    for d in per_param:
                        d[k] = v.clone() if torch.is_tensor(v) else v
            if b["state"]:
                for i, idx in enumerate(b["params"]):
                    state[idx] = per_param[i]
            if b["master"] is not None:
                full = torch.cat([p["master"] for p in parts])[:b["numel"]]
                for i, (idx, sh) in enumerate(zip(b["params"], b["shapes"])):
                    masters[idx] = full[offsets[i]:offsets[i + 1]].reshape(sh).clone()
        out = {"state": state, "param_groups": shards[0]["param_groups"]}
        if masters:
            out["zero_master"] = masters
        return out

    def load_sharded_state_dict(self, shards):
        """Loads the sharded state of every rank of a run (dicts or paths), saved
        at any world size and bucket size: consolidated here, then re-sharded
        (each rank keeps its slice)."""
        self.load_state_dict(self.consolidate_sharded(shards))
