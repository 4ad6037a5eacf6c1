"""The harness's wait/work split inside a real training run, per epoch."""

from __future__ import annotations

import logging
import time

import lightning as L
import numpy as np
import torch

log = logging.getLogger(__name__)


class LoaderTimingCallback(L.Callback):
    """Times the gap between batches (wait: fetch + transfer) and the step (work).

    The first batch of an epoch is start-up (worker launch or wake-up) and is reported alone
    as ``first_batch_s``, not mixed into the wait percentiles.
    """

    def __init__(self):
        self.epochs: list[dict] = []
        self._reset()

    def _reset(self) -> None:
        self._waits, self._works, self._examples = [], [], 0
        self._epoch_start = self._last_end = self._batch_start = None
        self._first_batch_s = None

    def on_train_epoch_start(self, trainer, pl_module):
        self._reset()
        self._epoch_start = self._last_end = time.perf_counter()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        now = time.perf_counter()
        if self._first_batch_s is None:
            self._first_batch_s = now - self._epoch_start
        else:
            self._waits.append(now - self._last_end)
        self._batch_start = now

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        now = time.perf_counter()
        self._works.append(now - self._batch_start)
        self._examples += len(batch[0])
        self._last_end = now

    def on_train_epoch_end(self, trainer, pl_module):
        if not self._works:
            return
        waits, works = np.array(self._waits or [0.0]), np.array(self._works)
        total = float(np.sum(self._waits) + works.sum())
        stats = {
            "epoch": trainer.current_epoch,
            "examples_per_s": round(self._examples / total, 2) if total else 0.0,
            "wait_mean_ms": round(1000 * float(waits.mean()), 2),
            "wait_p50_ms": round(1000 * float(np.percentile(waits, 50)), 2),
            "wait_p95_ms": round(1000 * float(np.percentile(waits, 95)), 2),
            "work_mean_ms": round(1000 * float(works.mean()), 2),
            "wait_fraction": round(float(np.sum(self._waits)) / total, 4) if total else 0.0,
            "first_batch_s": round(self._first_batch_s or 0.0, 3),
        }
        self.epochs.append(stats)
        pl_module.log_dict({f"loader/{k}": float(v) for k, v in stats.items() if k != "epoch"})
        log.info("loader epoch %d: %s", trainer.current_epoch, stats)

    def summary(self) -> dict:
        return self.epochs[-1] if self.epochs else {}
