"""RunSpec -> objects: the loader plan, the re-planner, the datamodule, the model, the Trainer
and the checkpoint to resume. Objects whose config is their constructor's arguments are built
with Hydra ``instantiate`` from the spec's plain dicts; everything below takes plain arguments."""

from __future__ import annotations

import logging
from dataclasses import replace

from hydra.utils import get_class, instantiate

from cocodet.loader.failures.replan import Replanner
from cocodet.loader.plan.policy import plan_loader
from cocodet.loader.plan.records import LoaderPlan
from cocodet.loader.plan.resources import HostResources, probe
from cocodet.run_spec.records import RunSpec

log = logging.getLogger(__name__)


def build_plan(spec: RunSpec) -> tuple[LoaderPlan, HostResources]:
    """Probe the host, then plan the workers for this rank (design §3)."""
    loader = spec.loader
    resources = probe(shm_path=loader.shm_path, ranks_per_host=spec.ranks.local_world_size)
    plan = plan_loader(loader.request, loader.batches, resources, spec.trainer.cuda)
    r = spec.ranks
    plan.ranks_from = f"{r.launcher} (rank {r.global_rank} of {r.world_size}, node {r.node_rank})"
    log.info("loader plan%s:\n%s", spec.ranks.label(), plan.table())
    for warning in plan.warnings:
        log.warning("loader plan: %s", warning)
    return plan, resources


def build_replanner(spec: RunSpec, plan: LoaderPlan) -> Replanner:
    """loader.on_failure: the run's plan, and a smaller one planned against the host as
    probed at the failure (``loader/failures/replan.py``)."""
    loader = spec.loader

    def plan_fn(workers: int, prefetch: int) -> LoaderPlan:
        request = replace(loader.request, policy="inherited", requested=workers, prefetch_factor=prefetch)
        resources = probe(shm_path=loader.shm_path, ranks_per_host=spec.ranks.local_world_size)
        return plan_loader(request, loader.batches, resources, spec.trainer.cuda)

    return Replanner(
        plan, plan_fn, on_failure=loader.on_failure, max_replans=loader.max_replans, shm_path=loader.shm_path
    )


def build_datamodule(spec: RunSpec, plan: LoaderPlan):
    """The datamodule, its splits read: the model is sized by their classes and scored against
    their ground truth before Lightning would call ``setup()`` (its own calls find it done)."""
    batches = spec.loader.batches
    datamodule = get_class(spec.dataset.target)(
        **spec.dataset.options,
        recipe=spec.recipe.recipe,
        batch_size=batches.batch_size,
        seed=spec.seed,
        plan=plan,
        val_batch_size=batches.val_batch_size,
        run_dir=str(spec.run_dir),
        group_aspect_ratio=plan.group_aspect_ratio,
        replanner=build_replanner(spec, plan),
    )
    datamodule.setup()
    return datamodule


def build_module(spec: RunSpec, datamodule):
    module = instantiate(
        spec.model.config,
        val_ann_file=datamodule.val_ann_file,
        image_size=spec.dataset.image_size,
        loader_resizes=spec.model.loader_resizes,
        category_ids=datamodule.train_index.category_ids.tolist(),
        _recursive_=True,
    )
    module.run_config = trained_groups(spec)  # not through instantiate: its _target_ keys are data here
    return module


def trained_groups(spec: RunSpec) -> dict:
    """The groups a checkpoint carries (``run_spec/read.py:with_trained_config`` reads them back), as this
    run read them: the dataset (its store options: never credentials), the model, the augment recipe."""
    dataset = {"_target_": spec.dataset.target, **spec.dataset.options, "storage_options": spec.storage.options}
    return {"dataset": dataset, "model": spec.model.config, "augment": spec.recipe.config}


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
    if spec.mode == "train":  # restarts and the steps they redid, for the summary (elastic/attempts.py)
        from cocodet.elastic.attempts import AttemptLedger

        callbacks.append(AttemptLedger(spec.run_dir, spec.checkpoint.dir))
    from cocodet.models.checkpoint_io import AtomicCheckpointIO

    plugins = [AtomicCheckpointIO(), *([fp16_on_cpu] if fp16_on_cpu is not None else [])]
    return L.Trainer(
        **args, default_root_dir=str(spec.run_dir), callbacks=callbacks, logger=loggers, plugins=plugins
    )  # a full disk never truncates the last checkpoint
