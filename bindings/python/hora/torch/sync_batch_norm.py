"""SyncBatchNorm: batch normalization with statistics over every rank's batch.

In training, each rank sums x and x*x per channel plus its element count, one
differentiable allreduce (Sum) combines them, and the layer normalizes with
the global mean and (biased) variance. Because allreduce's backward is the
allreduce of the gradient, autograd produces the gradient of the sum of every
rank's loss with no hand-written backward. Every rank must therefore run the
same forward and backward passes through this layer. Running statistics use
the unbiased global variance, like torch.nn.BatchNorm. Evaluation, and a job
of one rank, use plain batch_norm.
"""
import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from ..basics import Sum, global_process_set
from .mpi_ops import allreduce


class SyncBatchNorm(_BatchNorm):
    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got {}D input)".format(input.dim()))

    def forward(self, input):
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        if not self.training or self.process_set.size() == 1:
            use_batch = self.training or not self.track_running_stats
            return F.batch_norm(input, self.running_mean if not self.training or self.track_running_stats else None,
                                self.running_var if not self.training or self.track_running_stats else None,
                                self.weight, self.bias, use_batch, factor, self.eps)
        c = input.shape[1]
        dims = [0] + list(range(2, input.dim()))
        x = input.to(torch.float32) if input.dtype in (torch.float16, torch.bfloat16) else input
        count = torch.tensor([x.numel() // c], dtype=x.dtype)
        stats = torch.cat([x.sum(dims), (x * x).sum(dims), count])
        stats = allreduce(stats, op=Sum, process_set=self.process_set)
        total = stats[2 * c]
        mean = stats[:c] / total
        var = (stats[c:2 * c] / total - mean * mean).clamp_min(0)
        shape = [1, c] + [1] * (input.dim() - 2)
        out = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        if self.track_running_stats:
            with torch.no_grad():
                n = float(total)
                unbiased = var.detach() * (n / max(n - 1.0, 1.0))
                self.running_mean.mul_(1 - factor).add_(mean.detach().to(self.running_mean.dtype), alpha=factor)
                self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype), alpha=factor)
        return out.to(input.dtype)
