"""The read-ahead's planning: which objects a pass fetches now, in what order, and which copies
it evicts to make room (the rules are in ``read_ahead/fetcher.py``'s docstring). Positions are
indices into the planned reads: [M] dataset indices, consecutive epochs' reads concatenated.
"""

from __future__ import annotations

import numpy as np

NEVER = np.iinfo(np.int64).max  # the next read of an object read no more in the planned epochs


class FetchPlanner:
    """The planning half of :class:`~cocodet.read_ahead.fetcher.ReadAhead`: it reads the
    fetcher's state (``epochs``, ``consumed``, ``sizes``, ``plannable``, ``failed``,
    ``inflight``, the cache) and makes room through its ``_evict`` and ``_adopt_folder``
    (``read_ahead/held_copies.py``)."""

    def _reads_left(self) -> tuple[np.ndarray, int, int, int]:
        """(dataset indices still to be read, in order, from the consumed position; where in
        them the reads not yet handed to workers begin, ``lead`` samples on; where the reads the
        thread may fetch now end, ``ahead`` samples further; the absolute position of the
        first). Called under the lock: slices and one concatenation."""
        _, reads, offsets = self.epochs[0]
        c = min(self.consumed, len(offsets) - 1)
        at = int(offsets[c])
        future = np.concatenate([reads[at:]] + [r for _, r, _ in self.epochs[1:]])
        sample_offsets = [offsets[c:] - at] + [o for _, _, o in self.epochs[1:]]  # each epoch's, from here
        left = len(future) if self.end is None else max(0, self.end - self.consumed_total)  # samples the run has left
        return (
            future,
            read_at(sample_offsets, min(self.lead, left), len(future)),
            read_at(sample_offsets, min(self.lead + self.ahead, left), len(future)),
            self.base + at,
        )

    def _plan(
        self,
        future: np.ndarray,
        lead_at: int,
        ahead_at: int,
        start: int,
        held: np.ndarray,
        unpinned: np.ndarray,
        free_slots: int,
    ):
        """Yield (object, the absolute read it is fetched for) to fetch now, in order of that
        read (reads ``future[lead_at:ahead_at]``), making room for each as the fetcher's module
        says; stop at the first that cannot fit."""
        if free_slots <= 0 or lead_at >= ahead_at:
            return
        next_read = first_reads(future, len(self.paths))  # [N] first future read of each object
        beyond = first_reads(future[lead_at:ahead_at], len(self.paths), lead_at)  # ... not yet handed out
        wanted = np.flatnonzero((beyond < NEVER) & ~held & self.plannable & ~self._mask(self.failed))
        wanted = wanted[np.argsort(beyond[wanted], kind="stable")][:free_slots]
        if not len(wanted):
            return
        # Eviction candidates, needed latest first: copies not being fetched and past their pin.
        victims = np.flatnonzero(held & unpinned & ~self._mask(self.inflight))
        victims = victims[np.argsort(-next_read[victims], kind="stable")]
        taken = 0  # victims[:taken] are evicted
        for k in wanted.tolist():
            size, read = int(self.sizes[k]), int(beyond[k])
            while not self.cache.reserve(size):
                if taken >= len(victims) or next_read[victims[taken]] <= read:  # only copies needed sooner are left
                    self._adopt_folder()  # a worker's copy may be what fills the budget: known next pass
                    return
                self._evict(int(victims[taken]))
                taken += 1
            yield k, start + read

    def _mask(self, indices) -> np.ndarray:
        """[N] True at ``indices`` (dataset indices: the failed, the in-flight)."""
        mask = np.zeros(len(self.paths), dtype=bool)
        mask[list(indices)] = True
        return mask


def first_reads(reads: np.ndarray, n: int, offset: int = 0) -> np.ndarray:
    """[n] the position (``offset`` + index in ``reads``) of each object's first read; NEVER
    for an object not read."""
    first = np.full(n, NEVER, dtype=np.int64)
    np.minimum.at(first, reads, np.arange(offset, offset + len(reads), dtype=np.int64))
    return first


def read_at(sample_offsets: list[np.ndarray], samples: int, end: int) -> int:
    """Where, in the reads of consecutive epochs whose sample offsets (each from 0) are given,
    the reads of the sample ``samples`` on begin (``end`` past the last)."""
    shift = 0
    for o in sample_offsets:
        if samples < len(o) - 1:
            return shift + int(o[samples])
        samples -= len(o) - 1
        shift += int(o[-1])
    return end
