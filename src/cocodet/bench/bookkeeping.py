"""What mode=bench books outside the timed work: per batch, the digest of the first batches,
the stage times and padding per sample and the bad samples (``Bookkeeping``); per epoch, its
start-up, throughput and the workers' memory (``epoch_row``)."""

from __future__ import annotations

import hashlib

import numpy as np

from cocodet.loader.flat_batch import FlatBatch, update_digest
from cocodet.loader.plan.flat_layout import STATS_COLUMNS
from cocodet.timing.measurement import Measurement


class Bookkeeping:
    """Per batch, outside the timed work: the digest of the first batches, the stage times per
    sample, and (for the dataset producer) the same bad-sample accounting as training."""

    def __init__(self, digest_batches: int, bad_samples):
        self.digest, self.digest_batches, self.digested = hashlib.sha256(), digest_batches, 0
        self.stats_sum, self.stats_n = np.zeros(len(STATS_COLUMNS)), 0
        self.bad_samples, self.skipped, self.epoch = bad_samples, 0, 0
        self.covered = self.batch_pixels = 0.0  # pixels some image covers / all pixels of the batch tensors

    def on_batch(self, batch: FlatBatch) -> None:
        if self.digested < self.digest_batches:
            update_digest(self.digest, batch)
            self.digested += 1
        stats = batch.sample_stats.cpu().numpy()
        self.stats_sum += stats.sum(0)
        # batch_pad_share: what the model computes on but no image covers: padding to the batch's
        # largest image (rounded to 32) plus each image's own (letterbox, zoom-out, lsj canvas).
        hw = batch.image_sizes.cpu().numpy().astype(np.float64)
        own = stats[:, STATS_COLUMNS.index("pad_share")]
        self.covered += float((hw[:, 0] * hw[:, 1] * (1.0 - own)).sum())
        self.batch_pixels += float(np.prod(batch.images.shape[:1] + batch.images.shape[2:]))
        self.stats_n += batch.images.shape[0]
        if self.bad_samples is not None:  # bad_samples.jsonl, as in training
            self.skipped += self.bad_samples.record(batch.skipped, batch.images.shape[0], "train", self.epoch)

    @property
    def stats(self) -> dict:
        return {c: v / max(1, self.stats_n) for c, v in zip(STATS_COLUMNS, self.stats_sum)}

    def summary(self) -> dict:
        stats = self.stats
        return {
            "batch_digest": self.digest.hexdigest() if self.digested else None,
            "digest_batches": self.digested,
            "stage_ms_per_sample": stage_ms(stats),
            "pad_share": round(stats["pad_share"], 4),
            "batch_pad_share": round(1.0 - self.covered / self.batch_pixels, 4) if self.batch_pixels else None,
            "decodes_per_sample": round(stats["decodes"], 3),
            "skipped_samples": self.skipped,
            # dataset.verify's exclusions beside the reading skips: seen + both = the split (whole epochs)
            "excluded_by_verify": self.bad_samples.excluded["train"] if self.bad_samples is not None else 0,
            "bad_samples": self.bad_samples.summary() if self.bad_samples is not None else None,
        }


def stage_ms(stats: dict) -> dict:
    """Milliseconds per sample of each stage: read, decode, augment (the recipe's whole time,
    geometry + colour), geometry, colour and collate."""
    ms = {c[:-2]: round(1000 * stats[c], 3) for c in STATS_COLUMNS if c.endswith("_s")}
    return {
        "read": ms["read"],
        "decode": ms["decode"],
        "augment": round(ms["geometry"] + ms["colour"], 3),
        "geometry": ms["geometry"],
        "colour": ms["colour"],
        "collate": ms["collate"],
    }


def epoch_row(epoch: int, m: Measurement, before: int, workers: list) -> dict:
    """One epoch's line: its start-up, batches and the workers' memory. USS (pages only this
    worker holds) is what each extra worker really costs: the number for loader.worker_footprint_mb."""
    seconds = float(np.sum(m.waits[before:]) + np.sum(m.works[before:]))
    return {
        "epoch": epoch,
        "start_s": round(m.epoch_starts[-1], 4),
        "batches": len(m.waits) - before,
        "examples_per_s": round(float(np.sum(m.examples[before:])) / seconds, 3) if seconds > 0 else None,
        "worker_rss_mb": round(np.mean([mem.rss for mem in workers]) / 2**20, 1) if workers else None,
        "worker_uss_mb": round(np.mean([mem.uss for mem in workers]) / 2**20, 1) if workers else None,
    }
