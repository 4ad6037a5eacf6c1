"""The read-ahead of a remote root: one thread per rank, in the main process, that fetches what
this rank's train stream will read, in the order it will read it, into the node-local
:class:`~cocodet.read_ahead.object_cache.ObjectCache`, within a byte budget.

The order is known in advance: the sampler's keys for this epoch (from the stream's position)
and the next, each with the images its sample reads (``DetectionDataset.planned_reads``: the
primary and the mosaic partners, drawn from the same per-sample generator).

It never costs more GETs than reading directly (``dataset.remote.cache_bytes=0``), whatever the
budget:

- It fetches only for reads the workers have not been handed yet: those beyond the ``lead``,
  the samples in flight between the model and the sampler (workers x prefetch batches, plus
  the one the trainer holds). An object read in flight and not held is the workers' own miss;
  fetching it here could come after their read, a second GET for one read. And it fetches no
  further than ``ahead`` samples beyond the lead: a copy fetched earlier would only hold
  budget that a sooner read needs.
- It checks again when it makes the GET. A plan may be stale by the time a GET thread holds
  the object's claim: meanwhile the model consumed batches, the workers were handed the read,
  and a worker that read it first made its own GET without keeping a copy (the budget was
  full: this fetch's reservation fills it). At a tight budget that is common: each fetch waits
  for room until the model consumes, so its read sits at the lead's edge, and on two busy
  cores the GET threads start late. So each pass reads the objects' reader-GET counts
  (``ObjectCache.reader_gets``) before it plans, and a fetch whose object's count has moved
  by the time it holds the claim makes no GET (``ObjectCache.fetch``'s ``seen``); from the
  claim on, a worker that reads the object waits for this copy.
- A copy it fetches is kept until the read it was fetched for has been consumed (*pinned*), so
  it never evicts a copy before its use.
- To make room for an object whose next read is at position r, it evicts unpinned copies whose
  next read is after r, needed latest first (Belady's rule), and otherwise waits: every later
  candidate's read is later still. So each GET it makes serves at least one read that would
  otherwise have been a GET of its own. With ``cache_bytes`` at least the working set
  (:func:`~cocodet.read_ahead.working_set.working_set`), each object is fetched once per epoch.

A pass costs a few ms of numpy at COCO scale (``minimum.at`` over two epochs of reads), done
outside the lock that the training thread's :meth:`ReadAhead.advance` takes after each batch.
An object the listing lacks (the bucket lost it) is never planned: its reads fail as bad
samples in the workers. An object whose fetch failed is not fetched again by the read-ahead.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from cocodet.read_ahead.fetch_plan import FetchPlanner
from cocodet.read_ahead.held_copies import HeldCopies
from cocodet.read_ahead.object_cache import ObjectCache
from cocodet.read_ahead.working_set import fetch_ahead

log = logging.getLogger(__name__)


class ReadAhead(FetchPlanner, HeldCopies):
    """This rank's read-ahead: the main thread's side and the loop, which hands fetches to the GET
    threads (what a pass fetches and evicts: :class:`~cocodet.read_ahead.fetch_plan.FetchPlanner`;
    one fetch, and the copies found in the folder: :class:`~cocodet.read_ahead.held_copies.HeldCopies`).

    Args:
        cache: the copies (its ``objects`` give each URL's size and ETag).
        paths: [N] the split's URLs (the index's paths), by dataset index.
        plan_epoch: epoch -> ([M] dataset indices this rank reads that epoch, in order; [K + 1]
            offsets of each of its K samples' reads in them): :func:`epoch_reads`.
        budget: bytes the copies may take (this rank's share of ``cache_bytes``).
        concurrency: GETs in flight.
        lead: samples between the model and the sampler (handed to workers, not yet consumed).
        ahead: samples beyond the lead whose reads it fetches now (``working_set.fetch_ahead``).
        end: samples the run consumes from where it starts (None: unknown); nothing read after
            them is fetched (the last epoch's look-ahead would fetch for an epoch never run).
    """

    def __init__(
        self,
        cache: ObjectCache,
        paths,
        plan_epoch,
        budget: int,
        concurrency: int,
        lead: int = 0,
        ahead: int | None = None,
        end: int | None = None,
    ):
        self.cache, self.paths, self.plan_epoch = cache, [str(p) for p in paths], plan_epoch
        self.budget, self.concurrency, self.lead = int(budget), max(1, int(concurrency)), max(0, int(lead))
        self.ahead = fetch_ahead(self.lead) if ahead is None else int(ahead)
        self.end = end  # samples from the start to the stream's end (the run's last batch); None: unknown
        self.consumed_total = 0  # samples consumed since start()
        self.sizes = np.array([cache.objects.get(p, {}).get("size", 0) for p in self.paths], dtype=np.int64)
        # Objects the read-ahead plans: listed (a path the bucket lacks fails in the workers, as a bad sample).
        self.plannable = np.array([p in cache.objects for p in self.paths], dtype=bool)
        self.held_mask = np.zeros(len(self.paths), dtype=bool)  # a copy in the folder, or being fetched
        self.pinned_until = np.full(len(self.paths), -1, dtype=np.int64)  # absolute read it was fetched for
        self.inflight: set[int] = set()
        self.epochs: list[tuple[int, np.ndarray, np.ndarray]] = []  # (epoch, reads, offsets per sample)
        self.consumed = 0  # samples of the first listed epoch the model has consumed
        self.base = 0  # absolute position (reads since start) of the first listed epoch's first read
        self.peak_bytes = 0
        self.working_set = (0, 0)  # (objects, bytes): read_ahead/working_set.py, set by start_read_ahead
        self.failed: dict[int, str] = {}  # dataset index -> why its fetch failed (not fetched again)
        # [N] each dataset index's place in the cache's reader-GET counts (-1: not listed)
        self.numbers = np.array([cache.number(p) if p in cache.objects else -1 for p in self.paths], dtype=np.int64)
        self.dropped = 0  # fetches that made no GET: a worker had read the object itself since they were planned
        self._changed = threading.Condition()
        self._to_plan: list[int] = []  # epochs to expand with plan_epoch, by the thread
        self._stop = False
        self._thread: threading.Thread | None = None

    # -- the main thread's side -----------------------------------------------------------
    def start(self, epoch: int, skip_samples: int = 0, plans: list | None = None) -> None:
        """Begin at ``epoch`` after its first ``skip_samples`` samples (a resume); ``plans``:
        ``plan_epoch`` of this epoch and the next, when the caller has them already."""
        plans = plans or [self.plan_epoch(epoch), self.plan_epoch(epoch + 1)]
        self.epochs = [(epoch, *plans[0]), (epoch + 1, *plans[1])]
        self.consumed = int(skip_samples)
        self._adopt_existing()
        self._thread = threading.Thread(target=self._run, name="cocodet-prefetch", daemon=True)
        self._thread.start()

    def advance(self, samples: int) -> None:
        """The model consumed ``samples`` more samples (a batch): a counter, nothing planned here."""
        with self._changed:
            self.consumed += int(samples)
            self.consumed_total += int(samples)
            self._drop_finished_epochs()
            self._changed.notify_all()

    def _drop_finished_epochs(self) -> None:
        """Drop the epochs the model has finished; the epoch after the next is planned by the
        read-ahead thread, not here on the training thread (a pass over an epoch's keys)."""
        while len(self.epochs) > 1 and self.consumed >= len(self.epochs[0][2]) - 1:
            self.consumed -= len(self.epochs[0][2]) - 1
            self.base += len(self.epochs[0][1])
            self._to_plan.append(self.epochs.pop(0)[0] + 2)

    def stop(self) -> None:
        with self._changed:
            self._stop = True
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.cache.close()

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as e:  # noqa: BLE001 - training goes on without it; said once, not silently
            log.warning(
                "read-ahead stopped (%s: %s); the workers read each object themselves from here on "
                "(counted as misses in summary remote.misses)",
                type(e).__name__,
                e,
                exc_info=True,
            )

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
                        self._drop_finished_epochs()
                seen = self.cache.reader_gets()  # before the snapshot: a worker GET for a read it plans comes after
                with self._changed:
                    if self._stop:
                        return
                    future, lead_at, ahead_at, start = self._reads_left()
                    held, free_slots = self.held_mask.copy(), self.concurrency - len(self.inflight)
                    if not self.cache.writable():  # the copies' disk refuses: no fetch ahead until it may again
                        free_slots = 0
                    unpinned = self.pinned_until < start
                for k, read_at in self._plan(future, lead_at, ahead_at, start, held, unpinned, free_slots):  # unlocked
                    with self._changed:
                        if self._stop:
                            return
                        self.inflight.add(k)
                        self._hold(k, read_at)
                    try:
                        pool.submit(self._fetch, k, int(seen[self.numbers[k]]))
                    except RuntimeError:  # the interpreter is shutting down under a daemon thread
                        return
                with self._changed:
                    self.peak_bytes = max(self.peak_bytes, self.cache.held_bytes())
                    if not self._stop:
                        self._changed.wait(timeout=0.5)

    def summary(self) -> dict:
        """The read-ahead's record; ``held_bytes`` (the budget counted now) equals
        ``copies_bytes`` (the copies on disk) unless a reservation was lost."""
        try:
            copies = sum(
                p.stat().st_size
                for p in self.cache.folder.iterdir()
                if p.is_file() and not p.name.startswith(".") and not p.name.endswith(".part")
            )
        except OSError:
            copies = None
        return {
            "budget_bytes": self.budget,
            "peak_held_bytes": self.peak_bytes,
            "held_bytes": self.cache.held_bytes(),
            "copies_bytes": copies,
            "copies_writable": self.cache.writable(),
            "concurrency": self.concurrency,
            "lead_samples": self.lead,
            "failed_objects": len(self.failed),
            "dropped_fetches": self.dropped,
            "working_set_objects": self.working_set[0],
            "working_set_bytes": self.working_set[1],
        }
