"""The reads a sample will make, known before it is built: the read-ahead's plan.

A mixin of ``data/dataset.py:DetectionDataset``: it replays the sample's own draws (its key's
generator, its partner source), so the plan cannot drift from what ``__getitems__`` reads.
"""

from __future__ import annotations

import numpy as np

from cocodet.sample import SampleKey


class ReadPlan:
    """Needs the dataset's ``seed``, ``recipe``, ``reader`` and ``partners_of``."""

    def planned_reads(self, key) -> list[int]:
        """The dataset indices sample ``key`` reads when every image is good, in the order it
        reads them: its own, then its partners' planned by their source (the read-ahead's plan,
        ``read_ahead/fetcher.py``). With the window cache, a window partner at or before the
        sample's position is a cache read, not an object read, and is left out; among the
        epoch's first W + 1 positions the sample's own image may be in the cache already (an
        earlier sample drew it ahead of itself), so there the plan is an upper bound."""
        key = SampleKey.of(key)
        rng = np.random.default_rng((self.seed, key.epoch, key.index))
        return [key.index] + self.partners_of(key).planned(key, rng, self.recipe.partners(rng))

    def planned_epoch_reads(self, keys) -> list[list[int]]:
        """:meth:`planned_reads` of an epoch's keys, in order. With the window cache, an image is
        read from the store once per epoch (read in order, the plan is the reads exactly)."""
        reads = [self.planned_reads(key) for key in keys]
        if self.reader.window_cache is None or not self.recipe.partner_window:
            return reads
        seen: set[int] = set()
        return [[k for k in r if not (k in seen or seen.add(k))] for r in reads]
