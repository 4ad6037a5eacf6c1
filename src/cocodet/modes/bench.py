"""mode=bench: the configured loader (or a controlled producer) through the harness; the one
place that imports ``cocodet.bench``."""

from __future__ import annotations

from contextlib import contextmanager

from cocodet.loader.plan_record import LoaderPlan
from cocodet.modes.wiring import build_datamodule, build_module
from cocodet.run_spec.records import RunSpec


@contextmanager
def _torn_down(datamodule):
    """The datamodule's threads (a remote root's read-ahead) end with the bench, however it ends."""
    try:
        yield
    finally:
        datamodule.teardown("bench")


def bench(spec: RunSpec, plan: LoaderPlan, resources) -> dict:
    from cocodet.bench.run import model_step, run_bench
    from cocodet.loader.diagnose import explained_loader_failures
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
