"""Which images a rank reads in an epoch (torch-free: ``mode=plan`` uses it, and so does the
sampler that yields them, ``loader/epoch_sampler.py``).

The epoch's order is a permutation seeded by (seed, epoch); it is padded by wrapping to a
multiple of the world size, as torch's DistributedSampler pads, and rank r takes every
world-th position from r. So when the split does not divide by the world size, the first
``padding(size, world)`` images of each epoch's order are read by two ranks.
"""

from __future__ import annotations

import numpy as np


def epoch_order(size: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """[size] int64: the split's indices in ``epoch``'s order (all ranks)."""
    if shuffle:
        return np.random.default_rng((seed, epoch, 2**62)).permutation(size)
    return np.arange(size)


def per_rank(size: int, world_size: int) -> int:
    return -(-size // world_size)


def padding(size: int, world_size: int) -> int:
    """Images each epoch that two ranks read (the wrap-around padding)."""
    return per_rank(size, world_size) * world_size - size


def rank_indices(size: int, seed: int, epoch: int, rank: int, world_size: int, shuffle: bool = True) -> np.ndarray:
    """[per_rank] int64: rank ``rank``'s indices of ``epoch``, in the order it reads them."""
    order = np.resize(epoch_order(size, seed, epoch, shuffle), per_rank(size, world_size) * world_size)
    return order[rank::world_size]


class RankOrder:
    """One rank's epoch order as :func:`rank_indices` gives it, computed once per epoch in each
    process that asks (a worker, the main process): what window partners index into."""

    def __init__(self, size: int, seed: int, rank: int = 0, world_size: int = 1, shuffle: bool = True):
        self.size, self.seed, self.rank, self.world_size, self.shuffle = size, seed, rank, world_size, shuffle
        self._epoch, self._order = None, None

    def __call__(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            self._order = rank_indices(self.size, self.seed, epoch, self.rank, self.world_size, self.shuffle)
            self._epoch = epoch
        return self._order
