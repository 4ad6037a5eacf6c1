"""mode=bench: the configured loader (or a controlled producer) through the harness; the one
place that imports ``cocodet.bench`` (its harness, producers, decode cost, model step and
padding)."""

from __future__ import annotations

import hashlib
import logging
from contextlib import contextmanager
from typing import Callable

import numpy as np
import torch

from cocodet.bench.decode_cost import decode_bounds, decode_probe
from cocodet.bench.harness import PeakSampler, calibrate_spin, measure
from cocodet.bench.model_step import model_step, preloaded
from cocodet.bench.producers import CostDataset, make_consumer
from cocodet.datamodule import CocoDataModule
from cocodet.loader.build import build_loader
from cocodet.loader.epoch_sampler import EpochSampler
from cocodet.loader.flat_batch import STATS_COLUMNS, FlatBatch, to_device, update_digest
from cocodet.loader.plan.records import LoaderPlan
from cocodet.modes.wiring import build_datamodule, build_module
from cocodet.run_spec.records import RunSpec
from cocodet.timing.measurement import Measurement
from cocodet.timing.transfer import TransferTimer
from cocodet.timing.workers import worker_memory

log = logging.getLogger(__name__)


def run_bench(datamodule: CocoDataModule, plan: LoaderPlan, *, consumer: str, work_ms: float, batches: int | None,
              warmup: int, epochs: int, digest_batches: int, producer: str, producer_ms: float,
              producer_samples: int, decode_probe_images: int, shm_path: str = "/dev/shm",
              train_step: Callable | None = None, device: torch.device = torch.device("cpu"),
              preload: bool = False) -> dict:
    """Measure the train loader across epochs until ``batches`` batches after warm-up exist.

    Warm-up (``warmup`` batches) is discarded once, at the start; each epoch's first-batch
    wait (its start-up) is also reported apart (``epoch_start_s``). ``batches=None`` measures
    whole epochs, ``epochs`` of them; otherwise ``epochs`` is the minimum number of epochs.
    """
    # Probed first, while no worker runs: after the run, workers streaming into the next epoch
    # would still be filling their queues and share the cores with the probe.
    decode_ms = decode_probe(datamodule, decode_probe_images) if producer == "dataset" and decode_probe_images > 0 else None
    iters_per_ms = calibrate_spin(1.0) if "spin" in (consumer, producer) else 0
    if batches is not None:  # workers and the read-ahead read nothing for batches the bench will not take
        datamodule.stream_batches = (warmup + batches, epochs)
    loader = _bench_loader(datamodule, plan, producer, producer_ms, producer_samples, iters_per_ms)
    timer = TransferTimer()
    consume = _timed_transfer(make_consumer(consumer, work_ms, iters_per_ms, train_step), device, timer, preload)
    if preload:
        loader = preloaded(loader, device, warmup + (batches or len(loader)))
    books = _Bookkeeping(digest_batches, datamodule.bad_samples if producer == "dataset" else None)
    m = Measurement()
    per_epoch = []
    with PeakSampler(shm_path) as peaks:
        while books.epoch < epochs or (batches is not None and len(m.waits) < warmup + batches):
            loader.set_epoch(books.epoch)
            wanted = None if batches is None else max(1, warmup + batches - len(m.waits))
            before = len(m.waits)
            measure(loader, consume, count=lambda b: b.images.shape[0], max_batches=wanted,
                    on_batch=lambda b: (books.on_batch(b), datamodule.note_consumed(b)),
                    sync_cuda=device.type == "cuda", into=m)
            peaks.sample()
            per_epoch.append(_epoch_row(books.epoch, m, before, worker_memory(loader)))
            log.info("bench epoch %d: %s", books.epoch, per_epoch[-1])
            books.epoch += 1
    summary = {"mode": "bench", **m.report(min(warmup, max(0, len(m.waits) - 1))), **books.summary(),
               "consumer": consumer, "producer": producer, "peak_rss_mb": round(peaks.peak_rss / 2**20, 1),
               "peak_shm_mb": round(peaks.peak_shm / 2**20, 1), "epochs": per_epoch, "preloaded": preload,
               **timer.summary()}
    if len(per_epoch) > 1 and per_epoch[0]["worker_rss_mb"]:
        summary["worker_rss_growth"] = round(per_epoch[-1]["worker_rss_mb"] / per_epoch[0]["worker_rss_mb"] - 1, 4)
        summary["worker_uss_mb"] = per_epoch[-1]["worker_uss_mb"]
    if decode_ms:
        summary.update(decode_bounds(decode_ms, plan.usable_cpus, books.stats["decodes"]))
        summary["augment_vs_decode"] = round(summary["stage_ms_per_sample"]["augment"] / decode_ms, 3)
    summary.update({k: v for k, v in plan.summary().items() if k not in summary})
    if producer == "dataset" and datamodule.remote_summary() is not None:
        summary["remote"] = datamodule.remote_summary()
    return summary


def _bench_loader(datamodule: CocoDataModule, plan: LoaderPlan, producer: str, producer_ms: float,
                  producer_samples: int, iters_per_ms: int):
    """The train loader, or the same loader over a controlled producer (sleep or spin)."""
    if producer == "dataset":
        return datamodule.train_dataloader()
    dataset = CostDataset(producer_samples, producer, producer_ms, iters_per_ms)
    return build_loader(dataset, EpochSampler(len(dataset), 0, False), plan.batch_size, plan)


def _timed_transfer(step: Callable, device: torch.device, timer: TransferTimer, preload: bool) -> Callable:
    """On CUDA (batches not preloaded), each batch's copy to the device timed, then ``step``."""
    if device.type != "cuda" or preload:
        return step

    def consume(batch) -> None:
        with timer.timing(device):
            batch = to_device(batch, device)
        step(batch)

    return consume


class _Bookkeeping:
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
        return {"batch_digest": self.digest.hexdigest() if self.digested else None, "digest_batches": self.digested,
                "stage_ms_per_sample": stage_ms(stats),
                "pad_share": round(stats["pad_share"], 4),
                "batch_pad_share": round(1.0 - self.covered / self.batch_pixels, 4) if self.batch_pixels else None,
                "decodes_per_sample": round(stats["decodes"], 3),
                "skipped_samples": self.skipped,
                # dataset.verify's exclusions beside the reading skips: seen + both = the split (whole epochs)
                "excluded_by_verify": self.bad_samples.excluded["train"] if self.bad_samples is not None else 0,
                "bad_samples": self.bad_samples.summary() if self.bad_samples is not None else None}


def stage_ms(stats: dict) -> dict:
    """Milliseconds per sample of each stage: read, decode, augment (the recipe's whole time,
    geometry + colour), geometry, colour and collate."""
    ms = {c[:-2]: round(1000 * stats[c], 3) for c in STATS_COLUMNS if c.endswith("_s")}
    return {"read": ms["read"], "decode": ms["decode"], "augment": round(ms["geometry"] + ms["colour"], 3),
            "geometry": ms["geometry"], "colour": ms["colour"], "collate": ms["collate"]}


def _epoch_row(epoch: int, m: Measurement, before: int, workers: list) -> dict:
    """One epoch's line: its start-up, batches and the workers' memory. USS (pages only this
    worker holds) is what each extra worker really costs: the number for loader.worker_footprint_mb."""
    seconds = float(np.sum(m.waits[before:]) + np.sum(m.works[before:]))
    return {"epoch": epoch, "start_s": round(m.epoch_starts[-1], 4), "batches": len(m.waits) - before,
            "examples_per_s": round(float(np.sum(m.examples[before:])) / seconds, 3) if seconds > 0 else None,
            "worker_rss_mb": round(np.mean([mem.rss for mem in workers]) / 2**20, 1) if workers else None,
            "worker_uss_mb": round(np.mean([mem.uss for mem in workers]) / 2**20, 1) if workers else None}


@contextmanager
def _torn_down(datamodule):
    """The datamodule's threads (a remote root's read-ahead) end with the bench, however it ends."""
    try:
        yield
    finally:
        datamodule.teardown("bench")


def bench(spec: RunSpec, plan: LoaderPlan, resources) -> dict:
    from cocodet.loader.failures.diagnose import explained_loader_failures
    from cocodet.models.precision import resolve_precision

    b, device = spec.settings("bench"), spec.trainer.device
    datamodule = build_datamodule(spec, plan)
    precision = resolve_precision(spec.trainer.args.get("precision", "32-true"))
    step = model_step(build_module(spec, datamodule), device, precision) if b["consumer"] == "model" else None
    with explained_loader_failures(plan, shm_path=spec.loader.shm_path), _torn_down(datamodule):
        summary = run_bench(datamodule, plan, consumer=b["consumer"], work_ms=float(b["work_ms"]), batches=b["batches"],
                            warmup=int(b["warmup"]), epochs=int(b["epochs"]), digest_batches=int(b["digest_batches"]),
                            producer=b["producer"], producer_ms=float(b["producer_ms"]),
                            producer_samples=int(b["producer_samples"]), decode_probe_images=int(b["decode_probe"]),
                            shm_path=spec.loader.shm_path, train_step=step, device=device, preload=bool(b["preload"]))
    summary = {**summary, "precision": precision if step else None}
    if spec.mlflow:
        from cocodet.tracking.bench_run import track_bench

        summary["mlflow"] = track_bench(spec.config, plan, summary, spec.run_dir)
    return summary
