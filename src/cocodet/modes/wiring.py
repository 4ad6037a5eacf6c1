"""RunSpec -> objects: the loader plan, the re-planner, the datamodule, the model, the Trainer
and the checkpoint to resume. Objects whose config is their constructor's arguments are built
with Hydra ``instantiate`` from the spec's plain dicts; everything below takes plain arguments."""

from __future__ import annotations

import logging
import sys
from dataclasses import replace
from pathlib import Path

from hydra.utils import get_class, instantiate

from cocodet.loader.plan_record import LoaderPlan
from cocodet.loader.policy import plan_loader
from cocodet.loader.replan import Replanner
from cocodet.loader.resources import HostResources, probe
from cocodet.run_spec.records import RunSpec

log = logging.getLogger(__name__)


def build_plan(spec: RunSpec) -> tuple[LoaderPlan, HostResources]:
    """Probe the host, then plan the workers for this rank (design §3)."""
    loader = spec.loader
    resources = probe(shm_path=loader.shm_path, ranks_per_host=spec.ranks.local_world_size)
    plan = plan_loader(loader.request, loader.batches, resources, spec.trainer.cuda)
    log.info("loader plan%s:\n%s", spec.ranks.label(), plan.table())
    for warning in plan.warnings:
        log.warning("loader plan: %s", warning)
    return plan, resources


def build_replanner(spec: RunSpec, plan: LoaderPlan) -> Replanner:
    """loader.on_failure: the run's plan, and a smaller one planned against the host as
    probed at the failure (``loader/replan.py``)."""
    loader = spec.loader

    def plan_fn(workers: int, prefetch: int) -> LoaderPlan:
        request = replace(loader.request, policy="inherited", requested=workers, prefetch_factor=prefetch)
        resources = probe(shm_path=loader.shm_path, ranks_per_host=spec.ranks.local_world_size)
        return plan_loader(request, loader.batches, resources, spec.trainer.cuda)

    return Replanner(plan, plan_fn, on_failure=loader.on_failure, max_replans=loader.max_replans,
                     shm_path=loader.shm_path)


def build_datamodule(spec: RunSpec, plan: LoaderPlan):
    batches = spec.loader.batches
    return get_class(spec.dataset.target)(
        **spec.dataset.options, recipe=spec.recipe.recipe, batch_size=batches.batch_size, seed=spec.seed, plan=plan,
        val_batch_size=batches.val_batch_size, run_dir=str(spec.run_dir), group_aspect_ratio=plan.group_aspect_ratio,
        replanner=build_replanner(spec, plan))


def build_module(spec: RunSpec, datamodule):
    return instantiate(spec.model.config, val_ann_file=datamodule.val_ann_file, image_size=spec.dataset.image_size,
                       loader_resizes=spec.model.loader_resizes,
                       category_ids=datamodule.train_index.category_ids.tolist(), _recursive_=True)


def build_trainer(spec: RunSpec):
    import lightning as L

    from cocodet.models.precision import cpu_fp16_plugin, resolve_precision

    args = dict(spec.trainer.args)
    args["precision"] = resolve_precision(args.get("precision", "32-true"))
    fp16_on_cpu = cpu_fp16_plugin(args["precision"], args.get("accelerator", "auto"))
    if fp16_on_cpu is not None:  # Lightning takes the precision from the plugin, not from both
        del args["precision"]
    callbacks = [instantiate(c) for c in spec.trainer.callbacks]
    loggers = [instantiate(lg) for lg in spec.trainer.loggers.values()] or False
    if loggers and spec.mlflow:
        from cocodet.tracking.trainer_hooks import tracking_callbacks

        callbacks += tracking_callbacks(loggers)  # the MLflow run id in every checkpoint
    if not loggers:  # Lightning refuses a learning-rate monitor with nothing to log to
        from lightning.pytorch.callbacks import LearningRateMonitor

        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    from cocodet.models.checkpoint_io import AtomicCheckpointIO

    plugins = [AtomicCheckpointIO(), *([fp16_on_cpu] if fp16_on_cpu is not None else [])]
    return L.Trainer(**args, default_root_dir=str(spec.run_dir), callbacks=callbacks, logger=loggers,
                     plugins=plugins)  # a full disk never truncates the last checkpoint


def resume_path(spec: RunSpec) -> str | None:
    """``ckpt_path``: a file; ``last``, the newest checkpoint of any kind of this run dir (else
    of any run under ``outputs/``); ``last_if_any``, the newest of this run dir if it has one, else none (start
    fresh): what a rescheduled pod running its first command needs, and never another run's."""
    from cocodet.models.preemption import find_last_checkpoint, newest_checkpoint, resume_line

    ckpt, run_dir = spec.ckpt_path, spec.run_dir
    if ckpt == "last_if_any":
        path = newest_checkpoint(run_dir)
        log.info("ckpt_path=last_if_any: %s", f"resuming {path}" if path else f"no checkpoint in {run_dir}, starting fresh")
        return str(path) if path else None
    if ckpt != "last":
        return ckpt
    path = find_last_checkpoint(run_dir, Path("outputs"))
    if spec.ranks.global_rank == 0:  # one line per run, not per rank
        print(resume_line(path, run_dir), file=sys.stderr, flush=True)
    return str(path)
