"""Config tree -> objects: the loader plan, the re-planner, the datamodule, the model, the
Trainer and the checkpoint to resume. Objects whose config is their constructor's arguments are
built with Hydra ``instantiate``; everything below takes plain arguments."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from cocodet.loader.flat_layout import batch_bytes, round_up
from cocodet.loader.plan_record import BatchGeometry, LoaderPlan, LoaderRequest
from cocodet.loader.policy import plan_loader
from cocodet.loader.worker_request import worker_request
from cocodet.loader.replan import Replanner
from cocodet.loader.resources import HostResources, local_ranks, probe, uses_cuda
from cocodet.ranks import Ranks, read_ranks
from cocodet.transforms.augment import Mosaic, partner_source
from cocodet.transforms.recipe import Recipe
from cocodet.transforms.reference_presets import ReferencePreset
from cocodet.transforms.ssd_presets import FixedResize

log = logging.getLogger(__name__)


def cli_overrides() -> list[str]:
    """This run's own command-line overrides (what makes a worker count 'explicit')."""
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def build_plan(cfg: DictConfig) -> tuple[LoaderPlan, HostResources]:
    """Probe the host, then plan the workers for this rank (design §3)."""
    policy, requested = worker_request(str(cfg.loader.policy), cfg.loader.get("num_workers"),
                                       list(cfg.loader.get("inherit_from", [])), cli_overrides(), dict(os.environ))
    resources = _probe(cfg)
    plan = plan_loader(loader_request(cfg, policy, requested, int(cfg.loader.prefetch_factor)), batch_geometry(cfg),
                       resources, uses_cuda(cfg.trainer.get("accelerator", "auto")))
    log.info("loader plan%s:\n%s", run_ranks(cfg).label(), plan.table())
    for warning in plan.warnings:
        log.warning("loader plan: %s", warning)
    if cfg.get("model") is not None and cfg.model.get("lr_scaling"):
        log.info("learning rate: %s", lr_scaling_words(cfg))
    return plan, resources


def lr_scaling_words(cfg: DictConfig) -> str:
    """The linear scaling model.lr_scaling asks for, at this run's global batch (the plan's
    ranks; the module applies the same rule from the trainer's, models/reference_schedule.py)."""
    from cocodet.models.reference_schedule import scaled_lr

    scaling, world = cfg.model.lr_scaling, run_ranks(cfg).world_size
    batch, accumulate = int(cfg.loader.batch_size), int(cfg.trainer.get("accumulate_grad_batches", 1) or 1)
    global_batch = world * batch * accumulate
    lr = scaled_lr(scaling.reference_lr, scaling.reference_batch, global_batch)
    return (f"the reference's {scaling.reference_lr:g} at global batch {scaling.reference_batch} -> {lr:g} at this run's "
            f"{global_batch} ({world} rank(s) x loader.batch_size {batch} x accumulate_grad_batches {accumulate})")


def run_ranks(cfg: DictConfig) -> Ranks:
    """This process's ranks as the trainer configured by ``cfg`` will see them (``cocodet.ranks``)."""
    devices = local_ranks(cfg.trainer.get("devices", 1), uses_cuda(cfg.trainer.get("accelerator", "auto")))
    return read_ranks(devices, int(cfg.trainer.get("num_nodes", 1) or 1))


def _probe(cfg: DictConfig) -> HostResources:
    return probe(shm_path=str(cfg.loader.shm_path), ranks_per_host=run_ranks(cfg).local_world_size)


def loader_request(cfg: DictConfig, policy: str, requested: int | None, prefetch: int) -> LoaderRequest:
    """What the loader group asks, with the count and prefetch decided by the caller."""
    loader = cfg.loader
    footprint_mb = loader.get("worker_footprint_mb")
    return LoaderRequest(policy, requested, prefetch, pin_memory=loader.pin_memory,
                         persistent_workers=bool(loader.persistent_workers),
                         worker_footprint_bytes=int(footprint_mb) << 20 if footprint_mb else None,
                         part_images=loader.get("part_images"), timeout_s=float(loader.get("timeout", 0)))


def batch_geometry(cfg: DictConfig) -> BatchGeometry:
    """The train and val batches the config makes, in images and FlatBatch bytes, each at the
    largest image its recipe can produce (the reference presets: not dataset.image_size)."""
    loader, batch = cfg.loader, int(cfg.loader.batch_size)
    recipe = build_recipe(cfg) if is_reference_preset(cfg) else None  # the letterbox family: not built (albumentations)
    train_side, val_side = image_sides(cfg, recipe)
    val = int(loader.val_batch_size) if loader.get("val_batch_size") else None
    val_bytes = batch_bytes(val or batch, val_side) if val or val_side != train_side else None
    working = recipe.working_bytes() if recipe is not None else 0
    group, note = group_factor(cfg)
    return BatchGeometry(batch, batch_bytes(batch, train_side), val_batch_size=val, val_batch_bytes=val_bytes,
                         partner_pool=cfg.augment.get("partner_pool") or 0, partner_window=partner_window(cfg),
                         image_side=round_up(train_side),
                         val_image_side=round_up(val_side), group_aspect_ratio=group, group_note=note,
                         worker_working_bytes=working)


def partner_window(cfg: DictConfig) -> int:
    """Mosaic's window W when its partners come from a window (augment.partners=window), else 0."""
    if not _is_recipe(cfg, Mosaic):
        return 0
    aug = cfg.augment
    source = partner_source(aug.get("partners"), aug.get("partner_window"), aug.get("partner_pool"))
    return int(aug.partner_window) if source == "window" else 0


def group_factor(cfg: DictConfig) -> tuple[int | None, str | None]:
    """loader.group_aspect_ratio resolved: ``preset`` is 3 (every torchvision reference recipe's
    --aspect-ratio-group-factor) with a reference preset, off otherwise; mosaic ignores it, and
    the note says so."""
    value = cfg.loader.get("group_aspect_ratio", "preset")
    if value == "preset":
        return (3 if is_reference_preset(cfg) else None), None
    if value is not None and _is_recipe(cfg, Mosaic):
        return None, (f"loader.group_aspect_ratio={value} is ignored: mosaic's outputs are all "
                      f"{cfg.dataset.image_size}x{cfg.dataset.image_size}, so every batch is one aspect ratio already")
    return (int(value) if value is not None else None), None


def recipe_class(cfg: DictConfig) -> type | None:
    """The class ``augment._target_`` names (None: no target), located as ``instantiate`` would:
    an old path that re-exports a class (``cocodet.data.augment.Mosaic``) gives the same class.
    The recipe modules import neither torch nor albumentations at module level, so the plan stays light."""
    from hydra.utils import get_class

    target = cfg.augment.get("_target_") if cfg.get("augment") is not None else None
    return get_class(str(target)) if target else None


def _is_recipe(cfg: DictConfig, family: type) -> bool:
    """Whether the augment group's class is ``family`` or a subclass of it."""
    cls = recipe_class(cfg)
    return cls is not None and issubclass(cls, family)


def is_reference_preset(cfg: DictConfig) -> bool:
    """augment=hflip|multiscale|lsj|ssd|ssdlite: the loader sizes images as the model's transform would."""
    return _is_recipe(cfg, ReferencePreset)


def build_recipe(cfg: DictConfig):
    """The train recipe; the reference presets also learn the chosen model's resize (its
    builder's sizes, or ``model.detector.min_size`` / ``max_size``; an SSD's fixed size for
    ``ssd|ssdlite``). Torch-free for those."""
    kwargs = {"image_size": int(cfg.dataset.image_size)}
    if is_reference_preset(cfg):
        from cocodet.transforms.model_resize import builder_sizes, fixed_sizes

        detector = cfg.model.detector
        if _is_recipe(cfg, FixedResize):
            kwargs["model_sizes"] = fixed_sizes(str(detector.name))
        else:
            kwargs["model_sizes"] = builder_sizes(str(detector.name), detector.get("min_size"), detector.get("max_size"))
    return instantiate(cfg.augment, **kwargs, _convert_="all")


def image_sides(cfg: DictConfig, recipe=None) -> tuple[int, int]:
    """The largest image side of a train and of a val batch (before rounding to 32); ``recipe``:
    a reference preset's, already built (None: the letterbox family's dataset.image_size)."""
    if recipe is None:
        return int(cfg.dataset.image_size), int(cfg.dataset.image_size)
    return max(recipe.largest_hw()), max(recipe.eval_recipe().largest_hw())


def train_keep_empty(cfg: DictConfig) -> bool | str:
    """dataset.keep_empty, with null resolved to the recipe's default."""
    value = cfg.dataset.get("keep_empty")
    if value is not None:
        return value
    # The letterbox family's default, read from the base class: building Basic would import albumentations.
    return build_recipe(cfg).keep_empty if is_reference_preset(cfg) else Recipe.keep_empty


def build_replanner(cfg: DictConfig, plan: LoaderPlan) -> Replanner:
    """loader.on_failure: the run's plan, and a smaller one planned against the host as
    probed at the failure (``loader/replan.py``)."""
    def plan_fn(workers: int, prefetch: int) -> LoaderPlan:
        return plan_loader(loader_request(cfg, "inherited", workers, prefetch), batch_geometry(cfg), _probe(cfg),
                           uses_cuda(cfg.trainer.get("accelerator", "auto")))

    return Replanner(plan, plan_fn, on_failure=cfg.loader.get("on_failure"),
                     max_replans=int(cfg.loader.get("max_replans", 3)), shm_path=str(cfg.loader.shm_path))


def build_datamodule(cfg: DictConfig, plan: LoaderPlan, run_dir: Path):
    recipe = build_recipe(cfg)
    # Runtime objects are passed to the partial, not to instantiate, which would turn the plan
    # (a dataclass) into a config node.
    datamodule = instantiate(cfg.dataset, _partial_=True, _convert_="all")
    return datamodule(recipe=recipe, batch_size=int(cfg.loader.batch_size), seed=int(cfg.seed), plan=plan,
                      val_batch_size=cfg.loader.get("val_batch_size"), run_dir=str(run_dir),
                      group_aspect_ratio=plan.group_aspect_ratio,
                      replanner=build_replanner(cfg, plan))


def build_module(cfg: DictConfig, datamodule):
    return instantiate(cfg.model, val_ann_file=datamodule.val_ann_file, image_size=int(cfg.dataset.image_size),
                       loader_resizes=is_reference_preset(cfg),
                       category_ids=datamodule.train_index.category_ids.tolist(), _recursive_=True)


def build_trainer(cfg: DictConfig, run_dir: Path):
    import lightning as L

    from cocodet.models.precision import cpu_fp16_plugin, resolve_precision

    args = OmegaConf.to_container(cfg.trainer, resolve=True)
    args["precision"] = resolve_precision(args.get("precision", "32-true"))
    fp16_on_cpu = cpu_fp16_plugin(args["precision"], args.get("accelerator", "auto"))
    if fp16_on_cpu is not None:  # Lightning takes the precision from the plugin, not from both
        del args["precision"]
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values()]
    loggers = [instantiate(lg) for lg in (cfg.get("logger") or {}).values()] or False
    if loggers and "mlflow" in cfg.logger:
        from cocodet.tracking.trainer_hooks import tracking_callbacks

        callbacks += tracking_callbacks(loggers)  # the MLflow run id in every checkpoint
    if not loggers:  # Lightning refuses a learning-rate monitor with nothing to log to
        from lightning.pytorch.callbacks import LearningRateMonitor

        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    from cocodet.models.checkpoint_io import AtomicCheckpointIO

    plugins = [AtomicCheckpointIO(), *([fp16_on_cpu] if fp16_on_cpu is not None else [])]
    return L.Trainer(**args, default_root_dir=str(run_dir), callbacks=callbacks, logger=loggers,
                     plugins=plugins)  # a full disk never truncates the last checkpoint


def resume_path(cfg: DictConfig, run_dir: Path) -> str | None:
    """``ckpt_path``: a file; ``last``, the newest checkpoint of any kind of this run dir (else
    of any run under ``outputs/``); ``last_if_any``, the newest of this run dir if it has one, else none (start
    fresh): what a rescheduled pod running its first command needs, and never another run's."""
    from cocodet.models.preemption import find_last_checkpoint, newest_checkpoint, resume_line

    ckpt = cfg.get("ckpt_path")
    if ckpt == "last_if_any":
        path = newest_checkpoint(run_dir)
        log.info("ckpt_path=last_if_any: %s", f"resuming {path}" if path else f"no checkpoint in {run_dir}, starting fresh")
        return str(path) if path else None
    if ckpt != "last":
        return ckpt
    path = find_last_checkpoint(run_dir, Path("outputs"))
    if run_ranks(cfg).global_rank == 0:  # one line per run, not per rank
        print(resume_line(path, run_dir), file=sys.stderr, flush=True)
    return str(path)


def device_of(cfg: DictConfig):
    """The torch device batches go to: CUDA when the trainer's accelerator uses it."""
    import torch

    return torch.device("cuda" if uses_cuda(cfg.trainer.get("accelerator", "auto")) else "cpu")
