"""The read-ahead of a remote root: one thread per rank, in the main process, that fetches what
this rank's train stream will read, in the order it will read it, into the node-local
:class:`~cocodet.storage.object_cache.ObjectCache`, within a byte budget.

The order is known in advance: the sampler's keys for this epoch (from the stream's position)
and the next, each with the images its sample reads (``DetectionDataset.planned_reads``: the
primary and the mosaic partners, drawn from the same per-sample generator). The *window* is
the longest run of that order, from the position the model has consumed, whose distinct
objects fit in ``budget``; the thread keeps the window's objects on disk, fetching in order
with ``concurrency`` GETs at a time, and makes room by evicting the copies needed again
latest (Belady's rule: everything outside the window is needed later than everything inside
it). Workers read the copies; one the thread has not fetched yet is a miss, fetched by the
worker itself and counted (``storage.counts()``).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from cocodet.storage import store as storage
from cocodet.storage.object_cache import ObjectCache

log = logging.getLogger(__name__)


class Prefetcher:
    """This rank's read-ahead.

    Args:
        cache: the copies (its ``objects`` give each URL's size and ETag).
        paths: [N] the split's URLs (the index's paths), by dataset index.
        plan_epoch: epoch -> ([M] dataset indices this rank reads that epoch, in order; [K + 1]
            offsets of each of its K samples' reads in them): :func:`epoch_reads`.
        budget: bytes the copies may take (this rank's share of ``cache_bytes``).
        concurrency: GETs in flight.
    """

    def __init__(self, cache: ObjectCache, paths, plan_epoch, budget: int, concurrency: int):
        self.cache, self.paths, self.plan_epoch = cache, [str(p) for p in paths], plan_epoch
        self.budget, self.concurrency = int(budget), max(1, int(concurrency))
        self.sizes = np.array([cache.objects.get(p, {}).get("size", 0) for p in self.paths], dtype=np.int64)
        self.held: dict[int, int] = {}  # dataset index -> bytes of a copy in the folder (or being fetched)
        self.held_mask = np.zeros(len(self.paths), dtype=bool)  # the same, for numpy: a pass costs a few ms at most
        self.inflight: set[int] = set()
        self.epochs: list[tuple[int, np.ndarray, np.ndarray]] = []  # (epoch, reads, offsets per sample)
        self.consumed = 0  # samples of the first listed epoch the model has consumed
        self.peak_bytes = 0
        self.failed: BaseException | None = None
        self._changed = threading.Condition()
        self._to_plan: list[int] = []  # epochs to expand with plan_epoch, by the thread
        self._stop = False
        self._thread: threading.Thread | None = None

    # -- the main thread's side -----------------------------------------------------------
    def start(self, epoch: int, skip_samples: int = 0) -> None:
        """Begin at ``epoch`` after its first ``skip_samples`` samples (a resume)."""
        self.epochs = [(epoch, *self.plan_epoch(epoch)), (epoch + 1, *self.plan_epoch(epoch + 1))]
        self.consumed = int(skip_samples)
        self._adopt_existing()
        self._thread = threading.Thread(target=self._run, name="cocodet-prefetch", daemon=True)
        self._thread.start()

    def advance(self, samples: int) -> None:
        """The model consumed ``samples`` more samples (a batch)."""
        with self._changed:
            self.consumed += int(samples)
            self._roll()
            self._changed.notify_all()

    def _roll(self) -> None:
        """Drop the epochs the model has finished; the epoch after the next is planned by the
        read-ahead thread, not here on the training thread (a pass over an epoch's keys)."""
        while len(self.epochs) > 1 and self.consumed >= len(self.epochs[0][2]) - 1:
            self.consumed -= len(self.epochs[0][2]) - 1
            self._to_plan.append(self.epochs.pop(0)[0] + 2)

    def stop(self) -> None:
        with self._changed:
            self._stop = True
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # -- the thread -----------------------------------------------------------------------
    def _future(self) -> np.ndarray:
        """Dataset indices still to be read, in order, from the consumed position."""
        first_epoch, reads, offsets = self.epochs[0]
        rest = [reads[offsets[min(self.consumed, len(offsets) - 1)]:]] + [r for _, r, _ in self.epochs[1:]]
        return np.concatenate(rest)

    def _window(self, future: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(the window's objects in order of first use; every future object in that order, and
        the position of its first use). Numpy only: it runs after every batch."""
        objects, first = np.unique(future, return_index=True)
        order = np.argsort(first, kind="stable")
        objects, first = objects[order], first[order]
        fits = np.cumsum(self.sizes[objects]) <= self.budget
        count = int(np.argmin(fits)) if not fits.all() else len(objects)
        return objects[:count], objects, first

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as e:  # noqa: BLE001 - training goes on without it; said once, not silently
            self.failed = e
            log.warning("read-ahead stopped (%s: %s); the workers read each object themselves from here on "
                        "(counted as misses in summary remote.misses)", type(e).__name__, e, exc_info=True)

    def _loop(self) -> None:
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="cocodet-get") as pool:
            while True:
                with self._changed:
                    pending = list(self._to_plan)
                for epoch in pending:  # outside the lock: the training thread never waits on a plan
                    planned = (epoch, *self.plan_epoch(epoch))
                    with self._changed:
                        self.epochs.append(planned)
                        self._to_plan.remove(epoch)
                        self._roll()
                with self._changed:
                    if self._stop:
                        return
                    window, objects, first = self._window(self._future())
                    for k in window[~self.held_mask[window]].tolist():  # usually none once the window is held
                        if len(self.inflight) >= self.concurrency:
                            break
                        if self.cache.held(self.paths[k]):  # a worker's miss, published (and counted) by it
                            self._hold(k)
                            continue
                        if not self._make_room(int(self.sizes[k]), window, objects, first):
                            break
                        self.inflight.add(k)
                        self._hold(k)
                        try:
                            pool.submit(self._fetch, k)
                        except RuntimeError:  # the interpreter is shutting down under a daemon thread
                            return
                    self.peak_bytes = max(self.peak_bytes, self.cache.held_bytes())
                    self._changed.wait(timeout=0.5)

    def _hold(self, k: int) -> None:
        self.held[k] = int(self.sizes[k])
        self.held_mask[k] = True

    def _release(self, k: int) -> None:
        self.held.pop(k, None)
        self.held_mask[k] = False

    def _make_room(self, size: int, window: np.ndarray, objects: np.ndarray, first: np.ndarray) -> bool:
        """Reserve ``size`` bytes, evicting copies outside the window, needed again latest
        first (the workers' own copies found in the folder included); False if they do not fit."""
        if self.cache.reserve(size):
            return True
        wanted = set(window.tolist())
        next_use = dict(zip(objects.tolist(), first.tolist()))
        for attempt in range(2):
            victims = sorted((k for k in self.held if k not in wanted and k not in self.inflight),
                             key=lambda k: -next_use.get(k, 1 << 62))
            while not self.cache.reserve(size):
                if not victims:
                    break
                k = victims.pop(0)
                self.cache.evict(self.paths[k])
                self._release(k)
            else:
                return True
            if attempt == 0:
                self._adopt_folder()
        return False

    def _fetch(self, k: int) -> None:
        url = self.paths[k]
        try:
            self.cache.fetch(url, reserved=True)
        except BaseException as e:  # noqa: BLE001 - the workers meet the same failure and end the run with it
            log.warning("read-ahead: %s not fetched (%s); workers will read it directly", url, e)
            with self._changed:
                self._release(k)
                self.cache.release(int(self.sizes[k]))
                self.failed = e
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
            if k is not None and k not in self.held:
                self._hold(k)

    def _adopt_existing(self) -> None:
        """Count the copies an earlier run left against the budget (evicting down to it, needed
        latest first), so the folder never holds more than the budget."""
        self._adopt_folder()
        self.cache.release(-sum(self.held.values()))  # counted now: they are on disk
        self._make_room(0, *self._window(self._future()))

    def summary(self) -> dict:
        return {"budget_bytes": self.budget, "peak_held_bytes": self.peak_bytes, "concurrency": self.concurrency}


def epoch_reads(sampler, dataset, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """(this rank's reads of ``epoch`` in order, offsets of each sample's reads): the sampler's
    keys, each with ``dataset.planned_reads``."""
    reads = [dataset.planned_reads(key) for key in sampler.epoch_keys(epoch)]
    offsets = np.cumsum([0] + [len(r) for r in reads])
    return (np.concatenate(reads).astype(np.int64) if reads else np.zeros(0, np.int64)), offsets


AUTO_CACHE_BYTES = 4 * 2**30  # cache_bytes=auto's ceiling (the fixed default before auto): ~25k COCO images' window


def read_ahead_budget(folder, cache_bytes: int | str, local_ranks: int, objects: dict[str, dict],
                      concurrency: int) -> dict:
    """This rank's share of ``dataset.remote.cache_bytes`` and what the read-ahead holds in
    memory. ``auto`` is half of what the folder's disk can give (free space plus the copies
    already there), at most :data:`AUTO_CACHE_BYTES`, so a small disk gets a small window, not
    a refusal; a number the disk cannot hold is refused with the numbers."""
    import os
    import shutil
    from pathlib import Path

    from cocodet.storage.cache_files import ensure_folder
    from cocodet.errors import UserError

    folder = Path(os.path.expanduser(str(folder)))
    ensure_folder(folder)
    # the copies of an earlier run (local-rank-N/) are replaced, not added to: they count as free
    free = shutil.disk_usage(folder).free + sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    auto = cache_bytes == "auto"
    cache_bytes = min(AUTO_CACHE_BYTES, free // 2) if auto else int(cache_bytes)
    if cache_bytes > free:
        raise UserError(f"dataset.remote.cache_bytes={cache_bytes} ({cache_bytes / 2**30:.1f} GiB) does not fit "
                        f"in {folder}: {free / 2**30:.1f} GiB free there; lower it (or use auto: half the free "
                        "space), or point dataset.remote.cache_dir at a larger local disk")
    largest = max((o["size"] for o in objects.values()), default=0)
    total = sum(o["size"] for o in objects.values())
    return {"cache_dir": str(folder), "cache_bytes": cache_bytes, "auto": auto, "free_bytes": int(free),
            "rank_budget_bytes": int(cache_bytes // local_ranks),
            "split_bytes": int(total), "holds_the_split": bool(cache_bytes // local_ranks >= total),
            "memory_bytes": int(concurrency * largest), "concurrency": int(concurrency)}


def budget_origin(budget: dict) -> str:
    """Where an automatic budget came from, for the log line; empty for a number the user set."""
    return (f" (auto: half of the {budget['free_bytes'] / 2**30:.1f} GiB free there, at most "
            f"{AUTO_CACHE_BYTES / 2**30:.0f} GiB)" if budget["auto"] else "")


def read_ahead_folder(remote: dict, cache_dir: str | None) -> str | None:
    """``dataset.remote.cache_dir``, else ``<dataset.cache_dir>/objects``; None when both are null."""
    import os

    return remote.get("cache_dir") or (os.path.join(os.path.expanduser(cache_dir), "objects") if cache_dir else None)


def start_read_ahead(root: str, images: str, remote: dict, cache_dir: str | None, dataset, sampler, epoch: int,
                     skip_samples: int, local_rank: int, local_ranks: int) -> Prefetcher | None:
    """The read-ahead of a remote train split, started, or None where there is none: a local
    root, no folder (``dataset.remote.cache_dir`` and ``dataset.cache_dir`` null),
    ``cache_bytes=0``, or a pixel cache (which reads each object once, at its build)."""
    import os
    from functools import partial

    folder = read_ahead_folder(remote, cache_dir)
    cache_bytes, concurrency = remote.get("cache_bytes", "auto"), int(remote.get("concurrency") or 16)
    if not storage.is_remote(root) or not folder or not cache_bytes or dataset.pixel_cache is not None:
        return None
    objects = storage.listing(storage.join(root, images))
    budget = read_ahead_budget(folder, cache_bytes, local_ranks, objects, concurrency)
    cache = ObjectCache(os.path.join(os.path.expanduser(folder), f"local-rank-{local_rank}"), objects,
                        budget["rank_budget_bytes"])
    storage.use_object_cache(cache)  # before the workers fork: they read the copies
    prefetcher = Prefetcher(cache, dataset.index.paths, partial(epoch_reads, sampler, dataset),
                            budget["rank_budget_bytes"], concurrency)
    prefetcher.start(epoch, skip_samples)
    log.info("read-ahead: %s, %.0f MiB for this rank%s (%s the %.0f MiB split), %d GETs in flight (about %.0f MiB of "
             "memory)", folder, budget["rank_budget_bytes"] / 2**20, budget_origin(budget),
             "holds" if budget["holds_the_split"] else "a window of", budget["split_bytes"] / 2**20, concurrency,
             budget["memory_bytes"] / 2**20)
    return prefetcher
