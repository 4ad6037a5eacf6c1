"""The harness's wait/work split inside a real training run, per epoch, with two alarms."""

from __future__ import annotations

import logging
import time

import lightning as L
import numpy as np
import torch

from cocodet.timing.measurement import Measurement
from cocodet.timing.workers import worker_memory

log = logging.getLogger(__name__)
WARMUP_STEPS = 5  # waits before this step are start-up, not stalls


class LoaderTimingCallback(L.Callback):
    """Times the loader wait (until the batch leaves the DataLoader, stamped by the
    DataModule) and the work (transfer, restore and step), as ``mode=bench`` does.

    Reports through the same :class:`Measurement` as the bench (same keys as ``mode=bench``), plus
    the host-to-device copy time measured on the device (``h2d_mean_ms``). The first batch of
    an epoch is its start-up (worker launch or wake-up), also reported as ``first_batch_s``.

    Alarms, each logged once: a wait after warm-up longer than ``slow_wait_s`` (the step sat
    idle for data), and worker RSS growing more than ``rss_growth_warn`` from one epoch to
    the next (a leak, or copy-on-read of a Python object graph).
    """

    def __init__(self, slow_wait_s: float = 1.0, rss_growth_warn: float = 0.2):
        self.slow_wait_s, self.rss_growth_warn = slow_wait_s, rss_growth_warn
        self.epochs: list[dict] = []
        self.alarms: list[str] = []
        self._alarmed: set[str] = set()
        self._m = Measurement()
        self._last_end = self._batch_start = 0.0
        self._first = True
        self._worker_rss: float | None = None

    def on_train_start(self, trainer, pl_module):
        # A run resumed mid-epoch starts without on_train_epoch_start for that epoch.
        self._m, self._first = Measurement(), True
        self._last_end = time.perf_counter()

    def on_train_epoch_start(self, trainer, pl_module):
        self._m, self._first = Measurement(), True
        self._last_end = time.perf_counter()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        fetched = getattr(trainer.datamodule, "fetched_at", None)
        self._batch_start = fetched if fetched and fetched >= self._last_end else time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        now = time.perf_counter()
        wait = self._batch_start - self._last_end
        self._m.add(wait, now - self._batch_start, len(batch[0]), epoch_start=self._first)
        if not self._first and trainer.global_step > WARMUP_STEPS and wait > self.slow_wait_s:
            self._alarm(
                "slow_wait",
                f"the training step waited {wait:.2f} s for a batch at step {trainer.global_step} "
                f"(epoch {trainer.current_epoch}; threshold {self.slow_wait_s} s): the loader is behind. "
                "Measure it with mode=bench and compare loader.num_workers in a sweep",
            )
        self._first = False
        self._last_end = now

    def on_train_epoch_end(self, trainer, pl_module):
        if not self._m.waits:
            return
        stats = {"epoch": trainer.current_epoch, **self._m.report()}
        timer = getattr(trainer.datamodule, "transfer_timer", None)
        if timer is not None:
            stats.update(timer.summary())
        workers = worker_memory(trainer.train_dataloader)
        if workers:
            rss = float(np.mean([m.rss for m in workers])) / 2**20
            stats["worker_rss_mb"] = round(rss, 1)
            growth = rss_growth(self._worker_rss, rss)
            if growth is not None and growth > self.rss_growth_warn:
                self._alarm(
                    "rss_growth",
                    f"DataLoader worker RSS grew {100 * growth:.0f} % in epoch {trainer.current_epoch} "
                    f"({self._worker_rss:.0f} -> {rss:.0f} MiB; threshold {100 * self.rss_growth_warn:.0f} %): "
                    "a leak or copy-on-read in the dataset; mode=bench bench.epochs=N shows it per epoch",
                )
            self._worker_rss = rss
        self.epochs.append(stats)
        # Across ranks the logged value is the ranks' mean; the log line and summary are this rank's.
        pl_module.log_dict(
            {
                f"loader/{k}": float(v)
                for k, v in stats.items()
                if k != "epoch" and isinstance(v, (int, float)) and not isinstance(v, bool)
            },
            sync_dist=trainer.world_size > 1,
        )
        log.info("loader epoch %d: %s", trainer.current_epoch, stats)

    def _alarm(self, kind: str, text: str) -> None:
        if kind not in self._alarmed:
            self._alarmed.add(kind)
            self.alarms.append(text)
            log.warning("loader: %s", text)

    def summary(self) -> dict:
        return {**(self.epochs[-1] if self.epochs else {}), "alarms": list(self.alarms)}


def rss_growth(previous_mb: float | None, now_mb: float) -> float | None:
    """Relative growth of worker RSS since the previous epoch (None for the first epoch)."""
    return None if not previous_mb else now_mb / previous_mb - 1.0
