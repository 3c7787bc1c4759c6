"""Local SGD and DiLoCo-style periodic averaging for hora.torch (issue 18).

Data parallel allreduces every gradient of every step. ``LocalSGD`` lets
each rank step its own optimizer on its own data for ``sync_every`` steps,
then synchronizes the parameters across the process set in one grouped
allreduce:

* plain local SGD / periodic model averaging (``outer_lr=1``,
  ``outer_momentum=0``, the defaults): the parameters become the average of
  the ranks' parameters;
* DiLoCo-style outer optimization (``outer_momentum`` > 0 and/or
  ``outer_lr`` != 1, ``nesterov``): each rank's delta from the last
  synchronized point (the "pseudo-gradient") is averaged, and an outer SGD
  with momentum steps the synchronized point by it; every rank ends the
  round on the same parameters.

With ``sync_every=1`` and plain averaging, SGD without momentum gives the
same parameters as ``hvd.DistributedOptimizer`` (averaging parameters after
one step from a shared start equals stepping with the averaged gradient).

Buffers (batch norm statistics) are averaged with the parameters when
``module=`` is given. ``bytes_communicated`` counts what this rank put on
the wire for synchronizations, against ``bytes_every_step`` for what
per-step gradient allreduce would have sent, which
``examples/local_sgd_train.py`` prints.

Elastic training: put the LocalSGD object in ``hvd.elastic.TorchState`` (as
the optimizer). A commit keeps its whole state (the inner optimizer's, the
step counters, the synchronized point and the outer momentum), a restore
rolls it back, and after the job re-forms every rank takes rank 0's
(``broadcast_state``), so the survivors go on from one synchronized point
and synchronize at the same steps.
"""
import torch

from .. import basics
from .mpi_ops import Average, broadcast_, grouped_allreduce_async_, synchronize

__all__ = ["LocalSGD"]


class LocalSGD:
    """Wraps ``optimizer`` (a torch.optim optimizer over this rank's full model)."""

    def __init__(self, optimizer, sync_every=4, outer_lr=1.0, outer_momentum=0.0, nesterov=False, module=None,
                 process_set=basics.global_process_set):
        if int(sync_every) < 1:
            raise ValueError("hora.torch.LocalSGD: sync_every must be >= 1, got %r" % (sync_every,))
        if outer_lr <= 0 or not 0.0 <= outer_momentum < 1.0:
            raise ValueError("hora.torch.LocalSGD: outer_lr must be > 0 and outer_momentum in [0, 1), got %r, %r"
                             % (outer_lr, outer_momentum))
        self.optimizer = optimizer
        self.sync_every = int(sync_every)
        self.outer_lr = float(outer_lr)
        self.outer_momentum = float(outer_momentum)
        self.nesterov = bool(nesterov)
        self.process_set = process_set
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.buffers = [b for b in module.buffers() if b.is_floating_point()] if module is not None else []
        self.steps = 0
        self.syncs = 0
        self.bytes_communicated = 0
        self.bytes_every_step = 0
        self._plain = self.outer_lr == 1.0 and self.outer_momentum == 0.0
        self.reset()

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def reset(self):
        """Takes the current parameters as the synchronized point (after a
        broadcast or a restore, every rank must call it)."""
        with torch.no_grad():
            self._anchor = [p.detach().clone() for p in self.params] if not self._plain else None
            self._momentum = [torch.zeros_like(p) for p in self.params] if self.outer_momentum > 0 else None

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        """One local step; every ``sync_every``-th also synchronizes (a collective:
        every rank of the set must call step() the same number of times)."""
        loss = self.optimizer.step(closure)
        self.steps += 1
        self.bytes_every_step += sum(p.numel() * p.element_size() for p in self.params if p.grad is not None)
        if self.steps % self.sync_every == 0:
            self.synchronize()
        return loss

    def synchronize(self):
        """Synchronizes now (also usable at the end of training)."""
        with torch.no_grad():
            if self._plain:
                tensors = [p.data for p in self.params] + [b.data for b in self.buffers]
                synchronize(grouped_allreduce_async_(tensors, op=Average, name=None,
                                                     process_set=self.process_set))
            else:
                deltas = [a - p.data for a, p in zip(self._anchor, self.params)]
                tensors = deltas + [b.data for b in self.buffers]
                synchronize(grouped_allreduce_async_(tensors, op=Average, name=None,
                                                     process_set=self.process_set))
                for i, (a, p, d) in enumerate(zip(self._anchor, self.params, deltas)):
                    if self._momentum is not None:
                        m = self._momentum[i]
                        m.mul_(self.outer_momentum).add_(d)
                        d = d.add(m, alpha=self.outer_momentum) if self.nesterov else m
                    a.sub_(d, alpha=self.outer_lr)
                    p.data.copy_(a)
            self.bytes_communicated += sum(t.numel() * t.element_size() for t in tensors)
            self.syncs += 1

    def broadcast_state(self, root_rank=0):
        """Makes every rank's state ``root_rank``'s (a global rank): the inner
        optimizer's state, the step counters, the synchronized point and the
        outer momentum. A collective over the process set."""
        from .functions import broadcast_object, broadcast_optimizer_state
        broadcast_optimizer_state(self.optimizer, root_rank=root_rank, process_set=self.process_set)
        self.steps, self.syncs = broadcast_object((self.steps, self.syncs), root_rank, name="local_sgd.counters",
                                                  process_set=self.process_set)
        with torch.no_grad():
            for i, t in enumerate((self._anchor or []) + (self._momentum or [])):
                broadcast_(t, root_rank, name="local_sgd.state.%d" % i, process_set=self.process_set)

    def state_dict(self):
        return {"optimizer": self.optimizer.state_dict(), "steps": self.steps, "syncs": self.syncs,
                "anchor": self._anchor, "momentum": self._momentum}

    def load_state_dict(self, state):
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps, self.syncs = state["steps"], state["syncs"]
        with torch.no_grad():
            if state.get("anchor") is not None and self._anchor is not None:
                for a, s in zip(self._anchor, state["anchor"]):
                    a.copy_(s)
            if state.get("momentum") is not None and self._momentum is not None:
                for m, s in zip(self._momentum, state["momentum"]):
                    m.copy_(s)
