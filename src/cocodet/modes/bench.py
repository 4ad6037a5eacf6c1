"""mode=bench: the configured loader (or a controlled producer) through the harness; the one
place that imports ``cocodet.bench`` (its harness, producers, bookkeeping, decode cost, model
step and padding)."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Callable

import torch

from cocodet.bench.bookkeeping import Bookkeeping, epoch_row
from cocodet.bench.decode_cost import decode_bounds, decode_probe
from cocodet.bench.harness import PeakSampler, calibrate_spin, measure
from cocodet.bench.model_step import model_step, preloaded
from cocodet.bench.producers import CostDataset, make_consumer
from cocodet.datamodule import CocoDataModule
from cocodet.loader.build import build_loader
from cocodet.loader.epoch_sampler import EpochSampler
from cocodet.loader.flat_batch import to_device
from cocodet.loader.plan.records import LoaderPlan
from cocodet.modes.wiring import build_datamodule, build_module
from cocodet.run_spec.records import RunSpec
from cocodet.timing.measurement import Measurement
from cocodet.timing.transfer import TransferTimer
from cocodet.timing.workers import worker_memory

log = logging.getLogger(__name__)


def run_bench(
    datamodule: CocoDataModule,
    plan: LoaderPlan,
    *,
    consumer: str,
    work_ms: float,
    batches: int | None,
    warmup: int,
    epochs: int,
    digest_batches: int,
    producer: str,
    producer_ms: float,
    producer_samples: int,
    decode_probe_images: int,
    shm_path: str = "/dev/shm",
    train_step: Callable | None = None,
    device: torch.device = torch.device("cpu"),
    preload: bool = False,
) -> dict:
    """Measure the train loader across epochs until ``batches`` batches after warm-up exist.

    Warm-up (``warmup`` batches) is discarded once, at the start; each epoch's first-batch
    wait (its start-up) is also reported apart (``epoch_start_s``). ``batches=None`` measures
    whole epochs, ``epochs`` of them; otherwise ``epochs`` is the minimum number of epochs.
    """
    # Probed first, while no worker runs: after the run, workers streaming into the next epoch
    # would still be filling their queues and share the cores with the probe.
    probed = producer == "dataset" and decode_probe_images > 0
    decode_ms = decode_probe(datamodule, decode_probe_images) if probed else None
    iters_per_ms = calibrate_spin(1.0) if "spin" in (consumer, producer) else 0
    if batches is not None:  # workers and the read-ahead read nothing for batches the bench will not take
        datamodule.stream_batches = (warmup + batches, epochs)
    loader = _bench_loader(datamodule, plan, producer, producer_ms, producer_samples, iters_per_ms)
    timer = TransferTimer()
    consume = _timed_transfer(make_consumer(consumer, work_ms, iters_per_ms, train_step), device, timer, preload)
    if preload:
        loader = preloaded(loader, device, warmup + (batches or len(loader)))
    books = Bookkeeping(digest_batches, datamodule.bad_samples if producer == "dataset" else None)
    m, per_epoch, peaks = _measure_epochs(
        loader, consume, books, datamodule, device, shm_path, warmup=warmup, batches=batches, epochs=epochs
    )
    summary = {
        "mode": "bench",
        **m.report(min(warmup, max(0, len(m.waits) - 1))),
        **books.summary(),
        "consumer": consumer,
        "producer": producer,
        "peak_rss_mb": round(peaks.peak_rss / 2**20, 1),
        "peak_shm_mb": round(peaks.peak_shm / 2**20, 1),
        "epochs": per_epoch,
        "preloaded": preload,
        **timer.summary(),
    }
    return _with_derived(summary, per_epoch, books, plan, datamodule, producer=producer, decode_ms=decode_ms)


def _measure_epochs(
    loader,
    consume: Callable,
    books: Bookkeeping,
    datamodule: CocoDataModule,
    device: torch.device,
    shm_path: str,
    *,
    warmup: int,
    batches: int | None,
    epochs: int,
) -> tuple[Measurement, list[dict], PeakSampler]:
    """The measured epochs, ``epochs`` of them at least and, with ``batches``, until that many
    batches after warm-up exist: the measurement, one row per epoch (each logged) and the peaks."""
    m = Measurement()
    per_epoch = []
    with PeakSampler(shm_path) as peaks:
        while books.epoch < epochs or (batches is not None and len(m.waits) < warmup + batches):
            loader.set_epoch(books.epoch)
            wanted = None if batches is None else max(1, warmup + batches - len(m.waits))
            before = len(m.waits)
            measure(
                loader,
                consume,
                count=lambda b: b.images.shape[0],
                max_batches=wanted,
                on_batch=lambda b: (books.on_batch(b), datamodule.note_consumed(b)),
                sync_cuda=device.type == "cuda",
                into=m,
            )
            peaks.sample()
            per_epoch.append(epoch_row(books.epoch, m, before, worker_memory(loader)))
            log.info("bench epoch %d: %s", books.epoch, per_epoch[-1])
            books.epoch += 1
    return m, per_epoch, peaks


def _with_derived(
    summary: dict,
    per_epoch: list[dict],
    books: Bookkeeping,
    plan: LoaderPlan,
    datamodule: CocoDataModule,
    *,
    producer: str,
    decode_ms: float | None,
) -> dict:
    """``summary`` with what follows from it: the workers' memory growth across epochs, the
    decode bound where the decode was probed, the plan's fields it lacks, the remote record."""
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


def _bench_loader(
    datamodule: CocoDataModule,
    plan: LoaderPlan,
    producer: str,
    producer_ms: float,
    producer_samples: int,
    iters_per_ms: int,
):
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
        summary = run_bench(
            datamodule,
            plan,
            consumer=b["consumer"],
            work_ms=float(b["work_ms"]),
            batches=b["batches"],
            warmup=int(b["warmup"]),
            epochs=int(b["epochs"]),
            digest_batches=int(b["digest_batches"]),
            producer=b["producer"],
            producer_ms=float(b["producer_ms"]),
            producer_samples=int(b["producer_samples"]),
            decode_probe_images=int(b["decode_probe"]),
            shm_path=spec.loader.shm_path,
            train_step=step,
            device=device,
            preload=bool(b["preload"]),
        )
    summary = {**summary, "precision": precision if step else None}
    if spec.mlflow:
        from cocodet.tracking.bench_run import track_bench

        summary["mlflow"] = track_bench(spec.config, plan, summary, spec.run_dir)
    return summary
