"""The harness's wait/work split inside a real training run, per epoch."""

from __future__ import annotations

import logging
import time

import lightning as L
import torch

from cocodet.bench.harness import Measurement

log = logging.getLogger(__name__)


class LoaderTimingCallback(L.Callback):
    """Times the loader wait (until the batch leaves the DataLoader, stamped by the
    DataModule) and the work (transfer, restore and step), as ``mode=bench`` does.

    Reports through the bench's own :class:`Measurement` (same keys as ``mode=bench``), plus
    the host-to-device copy time measured on the device (``h2d_mean_ms``). The first batch of
    an epoch is its start-up (worker launch or wake-up), also reported as ``first_batch_s``.
    """

    def __init__(self):
        self.epochs: list[dict] = []
        self._m = Measurement()
        self._last_end = self._batch_start = 0.0
        self._first = True

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
        self._m.add(self._batch_start - self._last_end, now - self._batch_start, len(batch[0]), epoch_start=self._first)
        self._first = False
        self._last_end = now

    def on_train_epoch_end(self, trainer, pl_module):
        if not self._m.waits:
            return
        stats = {"epoch": trainer.current_epoch, **self._m.report()}
        timer = getattr(trainer.datamodule, "transfer_timer", None)
        if timer is not None:
            stats.update(timer.summary())
        self.epochs.append(stats)
        pl_module.log_dict({f"loader/{k}": float(v) for k, v in stats.items()
                            if k != "epoch" and isinstance(v, (int, float)) and not isinstance(v, bool)})
        log.info("loader epoch %d: %s", trainer.current_epoch, stats)

    def summary(self) -> dict:
        return self.epochs[-1] if self.epochs else {}
