"""Pipeline parallelism: a schedule runner for a model split into stages
(one stage per rank of a pipeline process set), GPipe or 1F1B.

Each rank builds its own stage (an ``nn.Module``) and calls
``Pipeline.train_step`` with the same ``num_microbatches`` on every stage:

* the first stage passes the batch, the last stage the targets and owns the
  loss function; the batch is cut into micro-batches along dimension 0;
* activations go forward and their gradients backward with hora's
  send/recv (``hora.torch.isend``/``irecv``), shapes and dtypes negotiated
  per message, so a stage may change them (and autocast's bf16 flows as is);
* ``schedule="gpipe"``: every forward, then every backward (all micro-batches'
  activations alive at once); ``"1f1b"``: stage s runs p-s-1 warm-up
  forwards, then alternates one forward and one backward, then drains, so at
  most p-s micro-batches are alive (PipeDream-flush / Megatron's schedule);
* each micro-batch's loss is divided by ``num_microbatches`` so the
  gradients equal those of the whole batch, and ``scale_loss`` (e.g. a
  GradScaler's ``scale``) is applied before backward;
* gradients accumulate in ``.grad`` over the micro-batches. Data parallel on
  top: wrap the stage's optimizer in ``hvd.DistributedOptimizer(...,
  process_set=<the stage's data-parallel set>, backward_passes_per_step=
  num_microbatches * accumulation_steps)``; the last micro-batch's backward
  then starts the allreduce and ``optimizer.step()`` waits for it.

Sends are asynchronous (waited for at the end of the step), receives block:
no schedule can deadlock on the send side. ``train_step`` returns a
``StepStats`` with the loss (last stage), time spent computing and waiting,
and the peak number of live micro-batches and bytes of saved activations,
which ``examples/pipeline_train.py`` compares against the GPipe bubble
formula (p-1)/(m+p-1).
"""
import time
from dataclasses import dataclass

import torch

from .. import p2p
from ...basics import global_process_set, synchronize

__all__ = ["Pipeline", "StepStats", "gpipe_bubble"]


def gpipe_bubble(stages, microbatches):
    """The idle fraction of a GPipe/1F1B pipeline with equal stage times: (p-1)/(m+p-1)."""
    return (stages - 1) / float(microbatches + stages - 1)


@dataclass
class StepStats:
    loss: float = None            # mean loss over the micro-batches (last stage only)
    total_s: float = 0.0          # wall time of the step on this stage
    compute_s: float = 0.0        # forward + backward compute
    wait_s: float = 0.0           # blocked in receives (the bubble, plus transfer time)
    peak_live: int = 0            # micro-batches whose activations were alive at once
    peak_activation_bytes: int = 0  # bytes of inputs+outputs kept for backward, at the peak

    @property
    def bubble(self):
        return self.wait_s / self.total_s if self.total_s > 0 else 0.0


class Pipeline:
    """Runs one stage of a pipeline.

    ``stage``: this rank's part of the model. ``ranks``: the global ranks of
    the pipeline in stage order (default: the whole world), or pass
    ``process_set`` (a hora ProcessSet whose ranks, sorted, are the stages).
    ``loss_fn(output, target)``: needed on the last stage.
    """

    def __init__(self, stage, ranks=None, process_set=None, loss_fn=None, schedule="1f1b"):
        from ... import basics
        if schedule not in ("1f1b", "gpipe"):
            raise ValueError("hora.torch.parallel.Pipeline: schedule must be '1f1b' or 'gpipe', got %r" % (schedule,))
        if process_set is not None:
            if process_set.ranks is None:
                ranks = list(range(basics.size()))
            else:
                ranks = list(process_set.ranks)
        elif ranks is None:
            ranks = list(range(basics.size()))
            process_set = global_process_set
        else:
            ranks = [int(r) for r in ranks]
            if ranks != list(range(basics.size())):
                raise ValueError("hora.torch.parallel.Pipeline: pass process_set= for a pipeline that is not the "
                                 "whole world in rank order (got ranks %s); hora.torch.parallel.grid builds them"
                                 % (ranks,))
            process_set = global_process_set
        me = basics.rank()
        if me not in ranks:
            raise ValueError("hora.torch.parallel.Pipeline: rank %d is not a stage of the pipeline %s" % (me, ranks))
        self.stage = stage
        self.ranks = ranks
        self.process_set = process_set
        self.index = ranks.index(me)
        self.num_stages = len(ranks)
        self.loss_fn = loss_fn
        self.schedule = schedule
        if self.is_last and loss_fn is None:
            raise ValueError("hora.torch.parallel.Pipeline: the last stage (rank %d) needs loss_fn" % me)

    @property
    def is_first(self):
        return self.index == 0

    @property
    def is_last(self):
        return self.index == self.num_stages - 1

    # -- one micro-batch --
    def _recv(self, src, tag, stats):
        t0 = time.perf_counter()
        x = p2p.recv(None, src=src, tag=tag, process_set=self.process_set)
        stats.wait_s += time.perf_counter() - t0
        return x

    def _forward(self, i, inputs, targets, m, live, sends, stats):
        tag = 2 * i
        if self.is_first:
            x = inputs[i]
        else:
            x = self._recv(self.ranks[self.index - 1], tag, stats).requires_grad_(True)
        t0 = time.perf_counter()
        y = self.stage(x)
        if self.is_last:
            loss = self.loss_fn(y, targets[i]) / m
            out = loss
        else:
            out = y
        stats.compute_s += time.perf_counter() - t0
        if not self.is_last:
            sends.append(p2p.isend(y.detach(), self.ranks[self.index + 1], tag=tag, process_set=self.process_set))
        live[i] = (x, out)
        nbytes = sum(t.numel() * t.element_size() for pair in live.values() for t in pair if t is not None)
        stats.peak_live = max(stats.peak_live, len(live))
        stats.peak_activation_bytes = max(stats.peak_activation_bytes, nbytes)
        return out

    def _backward(self, i, live, sends, stats, scale_loss):
        tag = 2 * i + 1
        x, out = live.pop(i)
        if self.is_last:
            t0 = time.perf_counter()
            (scale_loss(out) if scale_loss is not None else out).backward()
        else:
            grad = self._recv(self.ranks[self.index + 1], tag, stats)
            t0 = time.perf_counter()
            torch.autograd.backward(out, grad_tensors=grad.to(out.dtype))
        stats.compute_s += time.perf_counter() - t0
        if not self.is_first:
            g = x.grad if x.grad is not None else torch.zeros_like(x)
            sends.append(p2p.isend(g, self.ranks[self.index - 1], tag=tag, process_set=self.process_set))

    def train_step(self, inputs=None, targets=None, num_microbatches=1, scale_loss=None):
        """Runs forward and backward of every micro-batch on this stage.

        ``inputs``: the batch (first stage); ``targets``: the targets (last
        stage); both split into ``num_microbatches`` chunks along dimension 0
        (the batch must divide evenly, so the micro-batch losses average to
        the batch's). Gradients are left in ``.grad``; the caller steps its
        optimizer. Returns a StepStats."""
        m = int(num_microbatches)
        if m < 1:
            raise ValueError("hora.torch.parallel.Pipeline: num_microbatches must be >= 1, got %r" % (num_microbatches,))

        def split(t, what):
            if t is None:
                raise ValueError("hora.torch.parallel.Pipeline: stage %d needs %s" % (self.index, what))
            if t.shape[0] % m != 0:
                raise ValueError("hora.torch.parallel.Pipeline: %s has %d rows, which %d micro-batches do not divide"
                                 % (what, t.shape[0], m))
            return list(torch.chunk(t, m, dim=0))
        ins = split(inputs, "inputs") if self.is_first else None
        tgts = split(targets, "targets") if self.is_last else None
        stats = StepStats()
        live, sends, losses = {}, [], []
        t_start = time.perf_counter()
        p, s = self.num_stages, self.index
        if self.schedule == "gpipe":
            for i in range(m):
                losses.append(self._forward(i, ins, tgts, m, live, sends, stats))
            for i in range(m):
                self._backward(i, live, sends, stats, scale_loss)
        else:
            warmup = min(p - s - 1, m)
            f = b = 0
            for _ in range(warmup):
                losses.append(self._forward(f, ins, tgts, m, live, sends, stats))
                f += 1
            while f < m:
                losses.append(self._forward(f, ins, tgts, m, live, sends, stats))
                f += 1
                self._backward(b, live, sends, stats, scale_loss)
                b += 1
            while b < m:
                self._backward(b, live, sends, stats, scale_loss)
                b += 1
        t0 = time.perf_counter()
        for h in sends:
            synchronize(h)
        stats.wait_s += time.perf_counter() - t0
        stats.total_s = time.perf_counter() - t_start
        if self.is_last:
            stats.loss = float(sum(float(l.detach()) for l in losses))
        return stats
