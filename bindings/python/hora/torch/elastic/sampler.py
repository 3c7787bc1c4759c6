"""ElasticSampler: shards a dataset across the current ranks and, after a reset,
re-shards only what this epoch has not processed yet (Horovod's semantics)."""
import itertools
import math
import random

import torch.utils.data

from ... import basics


class ElasticSampler(torch.utils.data.Sampler):
    """Like ``DistributedSampler``, but remembers which samples this epoch has
    processed, so that after a reset (the job shrank or grew) the rest of the
    epoch is spread over the new ranks: no sample of the epoch is processed twice
    or skipped (apart from the padding below).

    The epoch's order is a permutation of ``range(len(dataset))`` (shuffled with
    ``seed + epoch`` when ``shuffle``, the same on every rank). The samples not yet
    processed are dealt round-robin: rank r takes positions r, r + n, r + 2n ... of
    the remaining list (n = ``size()``), padded by repeating its start so every
    rank gets the same count, as ``DistributedSampler`` pads.

    Use it as Horovod documents:

    1. put it in the state: ``TorchState(model, optimizer, sampler=sampler)``;
    2. after each batch, ``sampler.record_batch(batch_idx, batch_size)`` on every
       rank (then ``state.commit()`` now and then);
    3. at the end of each epoch (not the start), ``sampler.set_epoch(epoch + 1)``.

    ``record_batch`` counts samples for the whole job (every rank processed
    ``batch_size`` of them), so every rank holds the same record and a lost rank
    loses nothing. ``record_indices`` records this rank's own indices instead
    (for loaders that do not consume the sampler's order batch by batch); ranks
    exchange them at the next sync, so what a lost rank recorded since is
    processed again after the reset.

    Args:
        dataset: the dataset (its length must not change).
        shuffle: shuffle the order every epoch (default True).
        seed: shuffle seed, the same on every rank (default 0).
        num_replicas, rank: fix the shard count and this shard instead of asking
            ``hora.size()``/``hora.rank()`` (tests, or use without ``hora.init()``).
            Not part of Horovod's signature.
    """

    def __init__(self, dataset, shuffle=True, seed=0, num_replicas=None, rank=None):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        if (num_replicas is None) != (rank is None):
            raise ValueError("hora ElasticSampler: give both num_replicas and rank, or neither (then "
                             "hora.size() and hora.rank() are used)")
        if num_replicas is not None and not 0 <= rank < num_replicas:
            raise ValueError("hora ElasticSampler: rank %r is not in [0, num_replicas=%r)" % (rank, num_replicas))
        self._fixed_world = None if num_replicas is None else (int(num_replicas), int(rank))

        self.epoch = 0
        # What this epoch has processed: the first ``processed_num`` samples of
        # the epoch's order (record_batch, Horovod's record), plus any index in
        # ``processed_indices`` (record_indices, or record_batch after them).
        self.processed_num = 0
        self.processed_indices = set()

        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.indices = []
        self._recorded = 0  # samples recorded by record_batch since the last reset()
        self.reset()

    def set_epoch(self, epoch):
        """Starts epoch ``epoch``: a new order (when shuffling) and nothing processed.
        Call it at the end of an epoch, so a reset mid-epoch keeps the record."""
        self.epoch = epoch
        self.processed_num = 0
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Records that every rank processed its next ``batch_size`` samples.
        Call it on every rank after each batch, in order; ``batch_idx`` is
        accepted for Horovod compatibility and not used (the batches are counted)."""
        step = int(batch_size) * self.num_replicas
        if not self.processed_indices:
            # The remaining samples are a suffix of the order: a count says it all.
            self.processed_num += step
        else:
            # The remaining list skips recorded indices, so name the samples:
            # positions [recorded, recorded + step) of it, which the ranks took
            # round-robin.
            self.processed_indices.update(self.remaining_indices[self._recorded:self._recorded + step])
        self._recorded += step

    def record_indices(self, indices):
        """Records dataset indices that this rank processed (see the class notes)."""
        self.processed_indices.update(int(i) for i in indices)

    def get_indices(self, batch_idx, batch_size):
        """This rank's indices of batch ``batch_idx`` of the current pass."""
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def state_dict(self):
        return dict(epoch=self.epoch, processed_num=self.processed_num,
                    processed_indices=sorted(self.processed_indices))

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.processed_indices = set(state_dict.get("processed_indices", ()))
        self.reset()

    def _world(self):
        if self._fixed_world is not None:
            return self._fixed_world
        return basics.size(), basics.rank()

    def _order(self):
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        return order

    def reset(self):
        """Re-reads the world size and rank and re-shards what this epoch has not
        processed. TorchState calls it (through load_state_dict) at every sync."""
        self.num_replicas, self.rank = self._world()
        remaining = self._order()[self.processed_num:]
        if self.processed_indices:
            remaining = [i for i in remaining if i not in self.processed_indices]
        self.remaining_indices = remaining
        self.num_samples = int(math.ceil(len(remaining) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas
        self._recorded = 0
        self.indices = self._shard()

    def _shard(self):
        pool = self.remaining_indices
        # Pad by cycling the list, so even fewer samples than ranks pad evenly.
        padded = list(itertools.islice(itertools.cycle(pool), self.total_size)) if pool else []
        return padded[self.rank:self.total_size:self.num_replicas]

    def __iter__(self):
        self.indices = self._shard()
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
