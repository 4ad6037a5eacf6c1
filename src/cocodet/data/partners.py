"""Where a mosaic's partners come from (``augment.partners``, design §5): one source per kind.

Each source owns both the draws a sample makes (:meth:`draw`, while the sample is built) and
the object reads those draws plan (:meth:`planned`, for the read-ahead), from one code path:
the plan replays the same draws from the same generator, so the two cannot drift.

- :class:`WindowPartners`: a sample at position p of its rank's epoch order draws each partner
  from the W = ``partner_window`` positions before p; at the epoch's start (p < W), from the
  first W + 1 positions other than p. Those images were decoded moments ago by the samples at
  those positions, and the window cache (``data/window_cache.py``) shares their pixels between
  the workers, so a sample costs about one decode.
- :class:`PoolPartners`: the aligned run of ``partner_pool`` consecutive samples of the epoch
  order. The DataLoader hands a worker a whole batch (or part) at once, so each pool member is
  decoded once and serves as a primary and as the partners that drew it.
- :class:`DatasetPartners`: any image, up to four decodes per sample.

None of them depends on the batch size, how a batch is split into parts, the worker count or
a cache. A draw is ``(dataset index, position in the rank's order or None)``; ``None`` instead
of a draw means the sample's own image stands in (an order of one position; a pool whose
other members are all bad).
"""

from __future__ import annotations

import numpy as np

from cocodet.sample import SampleKey

Draw = tuple[int, "int | None"]


class DatasetPartners:
    def __init__(self, size: int):
        self.size = size

    def draw(self, key: SampleKey, rng: np.random.Generator, bad: set[int]) -> Draw | None:
        return int(rng.integers(self.size)), None  # a bad image may be drawn again: it fails fast (remembered)

    def planned(self, key: SampleKey, rng: np.random.Generator, wanted: int) -> list[int]:
        return [self.draw(key, rng, set())[0] for _ in range(wanted)]


class PoolPartners:
    def draw(self, key: SampleKey, rng: np.random.Generator, bad: set[int]) -> Draw | None:
        # The pool without the sample itself (itself only when the pool has no other member),
        # without the members found bad for this sample (a pool of one would never end).
        others = [j for j in ([j for j in key.pool if j != key.index] or [key.index]) if j not in bad]
        if not others:
            return None
        return int(others[rng.integers(len(others))]), None

    def planned(self, key: SampleKey, rng: np.random.Generator, wanted: int) -> list[int]:
        return [self.draw(key, rng, set())[0] for _ in range(wanted)]


class WindowPartners:
    """``rank_order(epoch)``: this rank's epoch order (``loader/rank_share.RankOrder``);
    ``cached``: a window cache serves the partners at or before a sample's position, so they
    are no object reads."""

    def __init__(self, rank_order, window: int, cached: bool):
        self.rank_order, self.window, self.cached = rank_order, window, cached

    def draw(self, key: SampleKey, rng: np.random.Generator, bad: set[int]) -> Draw | None:
        order = self.rank_order(key.epoch)
        q = window_position(key.position, len(order), self.window, rng)
        return None if q is None else (int(order[q]), q)

    def planned(self, key: SampleKey, rng: np.random.Generator, wanted: int) -> list[int]:
        draws = [self.draw(key, rng, set()) for _ in range(wanted)]
        return [k for k, q in filter(None, draws) if q > key.position or not self.cached]


def window_position(p: int, n: int, window: int, rng: np.random.Generator) -> int | None:
    """A window partner's position in a rank's epoch order of ``n`` positions: one of the
    ``window`` positions before ``p``; at the epoch's start (p < window), one of the first
    window + 1 positions other than ``p``. One draw from ``rng``; None when the order holds
    ``p`` alone."""
    w = min(window, n - 1)
    if w <= 0:
        return None
    r = int(rng.integers(w))
    return p - 1 - r if p >= w else r + (r >= p)
