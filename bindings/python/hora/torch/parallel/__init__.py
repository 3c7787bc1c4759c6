"""hora.torch.parallel: building blocks for model-parallel layouts, in pure
Python over hora.torch's collectives, process sets and send/recv.

  grid(tp, pp, cp, dp, order)    the DP x PP x CP x TP process grid (Grid): this
                                 rank's coordinates and the process sets of its
                                 groups (grid.py)
  Pipeline(stage, ...)           pipeline parallelism: GPipe and 1F1B schedules,
                                 activations and gradients over send/recv
                                 (pipeline.py); give it process_set=grid.pp_group
  tensor parallelism             Megatron-style conjugate collectives and layers:
                                 ColumnParallelLinear, RowParallelLinear,
                                 VocabParallelEmbedding, vocab_parallel_cross_entropy
                                 (tensor_parallel.py)
  context parallelism            attention over a sequence split across ranks:
                                 context_parallel_attention,
                                 ContextParallelSelfAttention, split_sequence,
                                 gather_sequence (context_parallel.py)

Every collective function takes a ``group`` (a hora.torch ProcessSet, e.g.
``grid.tp_group``; None = the global set). Reductions are SUMs, exact
derivatives of the sum of the ranks' losses; groups of one rank cost nothing.
"""
from ._comm import all_gather, all_reduce, reduce_scatter, split
from .context_parallel import (ContextParallelSelfAttention, context_parallel_attention, gather_sequence,
                               sequence_offset, split_sequence)
from .grid import Grid, grid, layout
from .pipeline import Pipeline, StepStats, gpipe_bubble
from .tensor_parallel import (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
                              copy_to_region, gather_from_region, reduce_from_region, scatter_to_region,
                              vocab_parallel_cross_entropy)

__all__ = ["grid", "layout", "Grid", "Pipeline", "StepStats", "gpipe_bubble",
           "copy_to_region", "reduce_from_region", "scatter_to_region", "gather_from_region",
           "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding", "vocab_parallel_cross_entropy",
           "context_parallel_attention", "ContextParallelSelfAttention", "split_sequence", "gather_sequence",
           "sequence_offset", "all_gather", "all_reduce", "reduce_scatter", "split"]
