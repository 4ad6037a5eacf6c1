"""The epoch's keys for one rank: which samples a rank's loader asks for, in which order
(design §5). The batch sampler (``batch_sampler.py``) cuts these keys into batches."""

from __future__ import annotations

import torch.utils.data

from cocodet.loader.rank_share import per_rank, rank_indices
from cocodet.sample import SampleKey


class EpochSampler(torch.utils.data.Sampler):
    """Yields ``SampleKey(epoch, i)`` keys; shuffles with a generator seeded by (seed, epoch).

    With ``pool`` > 1 each key also carries its pool: the aligned run of ``pool`` keys of
    this rank's epoch order it belongs to (mosaic partners are drawn from it). With ``window``
    > 0 each key carries its position ``p`` in this rank's epoch order instead:
    partners come from the ``window`` positions before it (``data/dataset.py``), and the dataset
    computes the order itself (``rank_share.RankOrder``), once per epoch.

    Shards by rank for DDP (contiguous padding like DistributedSampler), so the stream of a
    rank depends only on (seed, epoch, rank, world size) — never on the worker count.
    Lightning calls ``set_epoch`` before each epoch. A resume or re-plan starts mid-epoch in
    the batch sampler (``EpochBatchSampler.start_at``), which skips whole batches of these keys.
    """

    def __init__(
        self,
        size: int,
        seed: int,
        shuffle: bool,
        rank: int = 0,
        world_size: int = 1,
        pool: int | None = 0,
        window: int = 0,
    ):
        self.size, self.seed, self.shuffle, self.pool, self.window = size, seed, shuffle, pool, window
        self.rank, self.world_size, self.epoch = rank, world_size, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch  # the epoch Lightning (or the bench) asks for next

    def __len__(self) -> int:
        return per_rank(self.size, self.world_size)

    def __iter__(self):
        return self.epoch_keys(self.epoch)

    def epoch_keys(self, epoch: int):
        """The keys of ``epoch`` for this rank."""
        mine = rank_indices(self.size, self.seed, epoch, self.rank, self.world_size, self.shuffle)  # padded by wrapping
        if self.window:
            for p, i in enumerate(mine):
                yield SampleKey(epoch, int(i), position=p)
            return
        if not self.pool or self.pool <= 1:  # no pool: partners come from the whole dataset
            for i in mine:
                yield SampleKey(epoch, int(i))
            return
        for p in range(-(-len(mine) // self.pool)):
            pool = tuple(int(j) for j in mine[p * self.pool : (p + 1) * self.pool])
            for i in pool:
                yield SampleKey(epoch, i, pool=pool)
