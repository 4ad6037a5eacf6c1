"""Each listed object's count of GETs made by readers (the workers' misses, not the read-ahead),
in shared memory that a rank's forked workers inherit: a read-ahead fetch that finds the count
moved since it planned the fetch makes no GET (``ObjectCache.fetch``'s ``seen``).
"""

from __future__ import annotations

import multiprocessing

import numpy as np


class ReaderGets:
    """[len(urls)] int64 counts, in the order of ``urls``. One writer at a time per object: a
    reader counts while it holds the object's claim (a copy's writer, ``object_cache.py``)."""

    def __init__(self, urls):
        self._number = {url: i for i, url in enumerate(urls)}
        self._counts = np.frombuffer(multiprocessing.Array("q", max(1, len(self._number)), lock=False), np.int64)

    def snapshot(self) -> np.ndarray:
        """A copy of the counts now."""
        return self._counts.copy()

    def number(self, url: str) -> int:
        """The object's place in the counts."""
        return self._number[url]

    def add(self, url: str) -> None:
        """One more reader GET of the object."""
        self._counts[self._number[url]] += 1

    def moved(self, url: str, seen: int) -> bool:
        """Whether the object's count is no longer ``seen``."""
        return self._counts[self._number[url]] != seen
