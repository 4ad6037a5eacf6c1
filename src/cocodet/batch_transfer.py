"""A batch's way from the loader to the model, as the datamodule's Lightning hooks: what is
recorded on the host copy (bad samples, the train stream, the read-ahead's progress), the copy
to the device (timed, with a check that pinned memory arrived pinned), and the restore of the
FlatBatch into images and targets on the device."""

from __future__ import annotations

import logging
import time

import torch

from cocodet.loader.flat_batch import FlatBatch, restore, to_device

log = logging.getLogger(__name__)


class BatchTransfer:
    """Lightning's batch-transfer hooks for :class:`~cocodet.datamodule.CocoDataModule`, which
    provides what they read: ``trainer``, ``plan``, ``bad_samples``, ``stream``, ``read_ahead``
    and ``transfer_timer``; they set ``fetched_at``, ``samples_consumed`` and ``first_batch_pinned``."""

    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        """Bookkeeping on the host copy: reading device tensors back after the transfer would
        make every step wait for the GPU to finish the previous one."""
        self.fetched_at = time.perf_counter()
        if isinstance(batch, FlatBatch):
            training = self.trainer is None or self.trainer.training
            epoch = self.trainer.current_epoch if self.trainer else 0
            self.bad_samples.record(batch.skipped, batch.images.shape[0], "train" if training else "val", epoch)
            if training:
                self.stream.consume(batch, epoch)
                self.note_consumed(batch)
        return batch

    def note_consumed(self, batch: FlatBatch) -> None:
        """A train batch reached the model: the read-ahead may move on (training; the bench)."""
        self.samples_consumed += batch.images.shape[0]
        if self.read_ahead is not None:
            self.read_ahead.advance(batch.images.shape[0])

    def transfer_batch_to_device(self, batch, device: torch.device, dataloader_idx: int):
        if not isinstance(batch, FlatBatch):
            return super().transfer_batch_to_device(batch, device, dataloader_idx)
        if device.type == "cuda" and self.first_batch_pinned is None:
            self.first_batch_pinned = bool(batch.images.is_pinned())  # summary.json; scripts/gpu_check.sh asserts it
            if self.plan.pin_memory and not self.first_batch_pinned:
                log.warning(
                    "loader.pin_memory is on but batches arrive unpinned: copies to %s cannot overlap "
                    "compute. Check that nothing between the DataLoader and the Trainer copies them",
                    device,
                )
        if self.trainer is not None and not self.trainer.training:
            return to_device(batch, device)
        with self.transfer_timer.timing(device):
            return to_device(batch, device)

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        return restore(batch) if isinstance(batch, FlatBatch) else batch
