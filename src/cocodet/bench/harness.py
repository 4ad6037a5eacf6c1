"""The bench harness (design §10): the timed loop over a loader, peaks of RSS and /dev/shm,
and controlled CPU work (``spin``). The wait/work statistics are ``timing.measurement``'s."""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterable

import psutil
import torch

from cocodet.loader.plan.resources import shm_space
from cocodet.timing.measurement import Measurement


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


def measure(
    loader: Iterable,
    consume: Callable[[object], None],
    count: Callable[[object], int],
    max_batches: int | None = None,
    on_batch: Callable[[object], None] | None = None,
    sync_cuda: bool = False,
    into: Measurement | None = None,
) -> Measurement:
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
