"""The wait/work split (DESIGN §6, the book's harness).

Every step is split into *wait* (blocked in ``next(iterator)``) and *work* (the consumer,
CUDA-synchronised before the clock is read). Warm-up batches are discarded; examples/s is
counted from the examples actually returned and is the verdict. The wait fraction only says
where to look: it also falls when the work merely got slower.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np
import psutil
import torch

from cocodet.loader.resources import shm_space


def _ms(x: float) -> float:
    return round(1000.0 * x, 3)


class PeakSampler:
    """Background sampler of peak RSS (main + all children) and peak /dev/shm bytes used."""

    def __init__(self, shm_path: str = "/dev/shm", interval_s: float = 0.05):
        self.shm_path, self.interval_s = shm_path, interval_s
        self.peak_rss = self.peak_shm = 0
        self.worker_rss: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._shm_base = self._shm_used()

    def _shm_used(self) -> int:
        total, free = shm_space(self.shm_path)
        return 0 if total is None else total - free

    def sample(self) -> None:
        me = psutil.Process()
        rss = me.memory_info().rss
        for child in me.children(recursive=True):
            try:
                r = child.memory_info().rss
            except psutil.Error:
                continue
            rss += r
            self.worker_rss[child.pid] = r
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_shm = max(self.peak_shm, self._shm_used() - self._shm_base)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> "PeakSampler":
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Measurement:
    """Per-batch wait/work/examples across epochs, each epoch's first wait also kept apart.

    The one implementation of the wait/work statistics: ``mode=bench`` and the training
    callback both report through :meth:`report`, with the same keys.
    """

    waits: list[float] = field(default_factory=list)
    works: list[float] = field(default_factory=list)
    examples: list[int] = field(default_factory=list)
    epoch_starts: list[float] = field(default_factory=list)  # first-batch wait of each epoch

    def add(self, wait: float, work: float, examples: int, epoch_start: bool = False) -> None:
        if epoch_start:
            self.epoch_starts.append(wait)
        self.waits.append(wait)
        self.works.append(work)
        self.examples.append(examples)

    def report(self, warmup: int = 0) -> dict:
        """Figures over every batch after the first ``warmup`` ones, epoch starts included:
        across epochs, a start-up is part of what the loader sustains (on a small dataset
        it is most of it). ``examples_per_s`` counts the examples actually returned."""
        waits, works = np.array(self.waits[warmup:]), np.array(self.works[warmup:])
        if len(waits) == 0:
            raise ValueError(f"no batches left after discarding {warmup} warm-up batches; "
                             f"measured {len(self.waits)} — raise bench.batches or lower bench.warmup")
        examples = int(np.sum(self.examples[warmup:]))
        total = float(waits.sum() + works.sum())
        return {
            "examples_per_s": round(examples / total, 3) if total > 0 else float("inf"),
            "wait_mean_ms": _ms(waits.mean()),
            "wait_p50_ms": _ms(np.percentile(waits, 50)),
            "wait_p95_ms": _ms(np.percentile(waits, 95)),
            "wait_max_ms": _ms(waits.max()),
            "work_mean_ms": _ms(works.mean()),
            "step_mean_ms": _ms((waits + works).mean()),
            "wait_fraction": round(float(waits.sum() / total), 4) if total > 0 else 0.0,
            "first_batch_s": round(self.epoch_starts[0], 4) if self.epoch_starts else None,
            "epoch_start_s": [round(x, 4) for x in self.epoch_starts],
            "batches": len(self.waits),
            "measured_batches": len(waits),
            "examples": examples,
        }


def measure(loader: Iterable, consume: Callable[[object], None], count: Callable[[object], int],
            max_batches: int | None = None, on_batch: Callable[[object], None] | None = None,
            sync_cuda: bool = False, into: Measurement | None = None) -> Measurement:
    """Iterate ``loader`` once (or for ``max_batches``), timing wait and work of every batch.

    The first batch's wait includes iterator start-up (worker launch or wake-up) and is
    recorded as this epoch's start. Pass ``into`` to accumulate epochs in one Measurement.
    """
    m = into if into is not None else Measurement()
    sync = torch.cuda.synchronize if sync_cuda and torch.cuda.is_available() else (lambda: None)
    taken = 0
    t0 = time.perf_counter()
    iterator = iter(loader)
    while max_batches is None or taken < max_batches:
        try:
            batch = next(iterator)
        except StopIteration:
            break
        t1 = time.perf_counter()
        if on_batch is not None:
            on_batch(batch)  # bookkeeping (digest, stage times) is not the consumer's work
        t1b = time.perf_counter()
        consume(batch)
        sync()
        t2 = time.perf_counter()
        m.add(t1 - t0, t2 - t1b, count(batch), epoch_start=taken == 0)
        taken += 1
        t0 = time.perf_counter()
    return m


def spin(iterations: int) -> int:
    """Fixed CPU work counted in iterations (not by the clock), so contention shows as time."""
    acc = 0
    for k in range(iterations):
        acc ^= k
    return acc


_SPIN_UNITS: dict[float, int] = {}


def calibrate_spin(target_ms: float = 1.0, repeats: int = 5) -> int:
    """Iterations of ``spin`` that take ``target_ms`` on an idle core (best of ``repeats``).

    Measured once per process: the jobs of a sweep (Hydra runs them one after another in one
    process) then spin the same amount of work, so their ratios do not carry the calibration's
    own noise (a neighbour busy during one job's calibration made its spin 30 % shorter).
    """
    if target_ms in _SPIN_UNITS:
        return _SPIN_UNITS[target_ms]
    n = 200_000
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        spin(n)
        best = min(best, time.perf_counter() - t0)
    _SPIN_UNITS[target_ms] = max(1, int(n * (target_ms / 1000.0) / best))
    return _SPIN_UNITS[target_ms]


def storages_in(batch, shared_only: bool = False) -> int:
    """Distinct tensor storages in a (nested) batch. Received from a worker, each shared one
    crossed the process boundary as its own segment: an fd and an mmap under torch's
    ``file_descriptor`` strategy."""
    seen = set()
    stack = [batch]
    while stack:
        x = stack.pop()
        if torch.is_tensor(x):
            storage = x.untyped_storage()
            if storage.is_shared() or not shared_only:
                seen.add(storage.data_ptr())
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
    return len(seen)


def worker_memory(loader) -> list:
    """psutil full memory info (rss, uss) of a loader's live workers (persistent ones survive
    epochs); empty without workers. Reads the DataLoader's private iterator: torch offers no
    public handle on its worker processes."""
    iterator = getattr(loader, "_iterator", None)
    out = []
    for w in getattr(iterator, "_workers", []) if iterator is not None else []:
        try:
            out.append(psutil.Process(w.pid).memory_full_info())
        except (psutil.Error, AttributeError, ValueError):
            continue
    return out
