"""mode=bench: the configured loader (or a controlled producer) through the harness."""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Callable

import numpy as np
import torch

from cocodet.bench.harness import PeakSampler, calibrate_spin, measure
from cocodet.bench.producers import CostDataset, make_consumer
from cocodet.data.coco import load_raw
from cocodet.data.datamodule import CocoDataModule
from cocodet.data.dataset import EpochSampler
from cocodet.data.flat_batch import FlatBatch, flatten, update_digest
from cocodet.loader.policy import LoaderPlan
from cocodet.loader.worker import worker_init_fn

log = logging.getLogger(__name__)
STAGES = ("read", "decode", "augment", "collate")


def decode_bound(datamodule: CocoDataModule, images: int, cpus: int) -> float | None:
    """Samples/s that JPEG read+decode alone allows on ``cpus`` cores for this recipe."""
    index = datamodule.train_index
    n = min(images, len(index))
    if n == 0:
        return None
    t0 = time.perf_counter()
    for k in range(n):
        try:
            load_raw(index, k)
        except Exception:  # a bad image costs nothing to decode; the bound ignores it
            pass
    per_image = (time.perf_counter() - t0) / n
    decodes_per_sample = 1 + datamodule.train_set.recipe.partners
    return round(cpus / (per_image * decodes_per_sample), 1)


def run_bench(datamodule: CocoDataModule, plan: LoaderPlan, *, consumer: str, work_ms: float, batches: int | None,
              warmup: int, epochs: int, digest_batches: int, producer: str, producer_ms: float,
              producer_samples: int, decode_probe: int, shm_path: str = "/dev/shm",
              train_step: Callable | None = None, cuda: bool = False) -> dict:
    iters_per_ms = calibrate_spin(1.0) if "spin" in (consumer, producer) else 0
    if producer == "dataset":
        loader = datamodule.train_dataloader()
    else:
        dataset = CostDataset(producer_samples, producer, producer_ms, iters_per_ms)
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=plan.batch_size, sampler=EpochSampler(len(dataset), 0, False), collate_fn=flatten,
            worker_init_fn=worker_init_fn, **plan.dataloader_kwargs())
    consume = make_consumer(consumer, work_ms, iters_per_ms, train_step)
    digest = hashlib.sha256()
    stage_sum = np.zeros(4)
    stage_n = 0
    digested = 0
    skipped = 0

    def on_batch(batch: FlatBatch) -> None:
        nonlocal stage_n, digested, skipped
        if digested < digest_batches:
            update_digest(digest, batch)
            digested += 1
        stage_sum[:] += batch.stage_s.sum(0).numpy()
        stage_n += batch.images.shape[0]
        skipped += sum(1 for r in batch.skipped if r["role"] == "sample")

    per_epoch = []
    with PeakSampler(shm_path) as peaks:
        for epoch in range(epochs):
            loader.sampler.set_epoch(epoch)
            m = measure(loader, consume, count=lambda b: b.images.shape[0], max_batches=batches,
                        on_batch=on_batch if epoch == 0 else None, sync_cuda=cuda)
            report = m.report(min(warmup, max(0, len(m.waits) - 1)))
            peaks.sample()
            workers = _worker_memory(loader)
            report["worker_rss_mb"] = round(np.mean([mem.rss for mem in workers]) / 2**20, 1) if workers else None
            # USS (pages only this worker holds) is what each extra worker really costs; it is
            # the number to give loader.worker_footprint_mb.
            report["worker_uss_mb"] = round(np.mean([mem.uss for mem in workers]) / 2**20, 1) if workers else None
            per_epoch.append(report)
            log.info("bench epoch %d: %s", epoch, report)
    summary = {"mode": "bench", **per_epoch[0]}
    summary.update(
        batch_digest=digest.hexdigest() if digested else None,
        digest_batches=digested,
        consumer=consumer, producer=producer,
        stage_ms_per_sample={s: round(1000 * v / max(1, stage_n), 3) for s, v in zip(STAGES, stage_sum)},
        peak_rss_mb=round(peaks.peak_rss / 2**20, 1), peak_shm_mb=round(peaks.peak_shm / 2**20, 1),
        skipped_samples=skipped,
        epochs=[{k: e[k] for k in ("examples_per_s", "first_batch_s", "wait_mean_ms", "worker_rss_mb", "worker_uss_mb")} for e in per_epoch],
    )
    if len(per_epoch) > 1 and per_epoch[0]["worker_rss_mb"]:
        summary["worker_rss_growth"] = round(per_epoch[-1]["worker_rss_mb"] / per_epoch[0]["worker_rss_mb"] - 1, 4)
        summary["worker_uss_mb"] = per_epoch[-1]["worker_uss_mb"]
    if producer == "dataset" and decode_probe > 0:
        summary["decode_bound"] = decode_bound(datamodule, decode_probe, plan.usable_cpus)
    summary.update({k: v for k, v in plan.summary().items() if k not in summary})
    return summary


def _worker_memory(loader) -> list:
    """psutil full memory info (rss, uss) of the loader's live workers (persistent ones survive epochs)."""
    import psutil

    iterator = getattr(loader, "_iterator", None)
    out = []
    for w in getattr(iterator, "_workers", []) if iterator is not None else []:
        try:
            out.append(psutil.Process(w.pid).memory_full_info())
        except (psutil.Error, AttributeError, ValueError):
            continue
    return out
