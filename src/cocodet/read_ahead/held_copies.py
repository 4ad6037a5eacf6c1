"""The copies half of the read-ahead (``read_ahead/fetcher.py:ReadAhead``): one object's fetch,
made on a GET thread, and the copies already in the folder (the workers' misses, an earlier
run's), known by name, counted against the budget and evicted down to it.
"""

from __future__ import annotations

import logging

import numpy as np

from cocodet.read_ahead.fetch_plan import first_reads

log = logging.getLogger(__name__)


class HeldCopies:
    """What :class:`~cocodet.read_ahead.fetcher.ReadAhead` holds: it reads and updates the
    fetcher's state (``held_mask``, ``pinned_until``, ``sizes``, ``failed``, ``inflight``,
    ``dropped``, the cache) under its lock (``_changed``), and plans through
    :class:`~cocodet.read_ahead.fetch_plan.FetchPlanner`'s ``_reads_left``."""

    def _hold(self, k: int, read_at: int = -1) -> None:
        self.held_mask[k] = True
        self.pinned_until[k] = read_at

    def _evict(self, k: int) -> None:
        with self._changed:
            self.cache.evict(self.paths[k])
            self.held_mask[k] = False

    def _fetch(self, k: int, seen: int) -> None:
        """Fetch object k, unless a worker has made a GET of it since its count was ``seen``."""
        url = self.paths[k]
        try:
            data = self.cache.fetch(url, reserved=True, seen=seen)
            if data is None or not self.cache.held(url):  # dropped, or the disk refused the copy: nothing kept
                with self._changed:  # (the reservation was given back)
                    self.held_mask[k] = False
                    self.pinned_until[k] = -1
                    self.dropped += data is None
        except BaseException as e:  # noqa: BLE001 - the workers meet the same failure and end the run with it
            log.warning(
                "read-ahead: %s not fetched (%s); not fetched again by the read-ahead, workers read it directly", url, e
            )
            with self._changed:
                self.held_mask[k] = False
                self.cache.release(int(self.sizes[k]))
                self.failed[k] = f"{type(e).__name__}: {e}"
        finally:
            with self._changed:
                self.inflight.discard(k)
                self._changed.notify_all()

    def _adopt_folder(self) -> None:
        """Know every copy in the folder (the workers' misses, an earlier run's): by name."""
        if not hasattr(self, "_index_of"):
            self._index_of = {self.cache.path(p).name: k for k, p in enumerate(self.paths) if p in self.cache.objects}
        for entry in self.cache.folder.iterdir():
            k = self._index_of.get(entry.name)
            if k is not None and not self.held_mask[k]:
                with self._changed:
                    self.held_mask[k] = True

    def _adopt_existing(self) -> None:
        """Count the copies an earlier run left against the budget, evicting down to it,
        needed latest first, so the folder never holds more than the budget."""
        self._adopt_folder()
        held = np.flatnonzero(self.held_mask)
        self.cache.release(-int(self.sizes[held].sum()))  # counted now: they are on disk
        next_read = first_reads(self._reads_left()[0], len(self.paths))
        for k in held[np.argsort(-next_read[held], kind="stable")].tolist():
            if self.cache.held_bytes() <= self.budget:
                break
            self._evict(k)
