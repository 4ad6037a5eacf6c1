"""Config tree -> :class:`RunSpec`, once, at start (``app.run``): the only reader of the tree
besides ``run_spec/validate.py`` (which runs first) and ``cocodet.tracking`` (its parameters)."""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from cocodet.compat import current_targets
from cocodet.run_spec.validate import validate
from cocodet.loader.flat_layout import batch_bytes, round_up
from cocodet.loader.plan_record import BatchGeometry, LoaderRequest
from cocodet.loader.resources import uses_cuda
from cocodet.loader.worker_request import worker_request
from cocodet.ranks import trainer_ranks
from cocodet.run_spec.records import DatasetSpec, LoaderSpec, ModelSpec, RecipeSpec, RunSpec, StorageSpec, TrainerSpec
from cocodet.transforms.augment import Mosaic, partner_source
from cocodet.transforms.recipe import Recipe
from cocodet.transforms.reference_presets import ReferencePreset
from cocodet.transforms.ssd_presets import FixedResize

MODE_GROUPS = ("bench", "eval", "predict", "export", "preview")


def read_spec(cfg: DictConfig) -> RunSpec:
    """Map old ``_target_`` paths (``compat.py``), validate ``cfg`` (``run_spec/validate.py``: exit 2
    naming the key), then read each group once."""
    current_targets(cfg)
    validate(cfg)
    trainer = _trainer(cfg)
    ranks = trainer_ranks(trainer.args.get("devices", 1), trainer.args.get("num_nodes"), trainer.cuda)
    recipe, dataset = _recipe(cfg), _plain(cfg.dataset)
    return RunSpec(mode=str(cfg.mode), seed=int(cfg.seed), run_dir=Path(str(cfg.output_dir)), ranks=ranks,
                   recipe=recipe, loader=_loader(cfg, recipe, ranks.world_size), dataset=_datamodule(dataset, recipe),
                   storage=StorageSpec(dataset.get("storage_options") or {}, dict(dataset.get("remote") or {})),
                   model=_model(cfg, recipe), trainer=trainer, ckpt_path=cfg.get("ckpt_path"),
                   weights_only=bool(cfg.get("weights_only", True)),
                   modes={m: _plain(cfg.get(m)) for m in MODE_GROUPS}, config=cfg)


def _plain(node) -> dict:
    """A group as plain Python: resolved, its schema's choices as their strings."""
    return OmegaConf.to_container(node, resolve=True, enum_to_str=True) if node is not None else {}


def cli_overrides() -> list[str]:
    """This run's own command-line overrides (what makes a worker count 'explicit')."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def _trainer(cfg: DictConfig) -> TrainerSpec:
    args = _plain(cfg.trainer)
    return TrainerSpec(args=args, callbacks=list(_plain(cfg.get("callbacks")).values()),
                       loggers=_plain(cfg.get("logger")), cuda=uses_cuda(args.get("accelerator", "auto")))


def _recipe(cfg: DictConfig) -> RecipeSpec:
    """The augment group's class, located as ``instantiate`` would (an old path that re-exports
    a class gives the same class); the recipe modules import neither torch nor albumentations
    at module level, so the plan stays light."""
    from hydra.utils import get_class

    augment = _plain(cfg.get("augment"))
    family = get_class(str(augment["_target_"])) if augment.get("_target_") else None
    sizes = None
    if family is not None and issubclass(family, ReferencePreset):
        from cocodet.transforms.model_resize import builder_sizes, fixed_sizes

        detector = cfg.model.detector
        sizes = (fixed_sizes(str(detector.name)) if issubclass(family, FixedResize) else
                 builder_sizes(str(detector.name), detector.get("min_size"), detector.get("max_size")))
    return RecipeSpec(family, augment, int(cfg.dataset.image_size), sizes)


def _loader(cfg: DictConfig, recipe: RecipeSpec, world_size: int) -> LoaderSpec:
    loader = _plain(cfg.loader)
    policy, requested = worker_request(str(loader["policy"]), loader.get("num_workers"),
                                       list(loader.get("inherit_from") or []), cli_overrides(), dict(os.environ))
    footprint_mb = loader.get("worker_footprint_mb")
    request = LoaderRequest(policy, requested, int(loader["prefetch_factor"]), pin_memory=loader["pin_memory"],
                            persistent_workers=bool(loader["persistent_workers"]),
                            worker_footprint_bytes=int(footprint_mb) << 20 if footprint_mb else None,
                            part_images=loader.get("part_images"), timeout_s=float(loader.get("timeout", 0)))
    return LoaderSpec(request, _batches(loader, recipe), str(loader["shm_path"]), loader.get("on_failure"),
                      int(loader.get("max_replans", 3)), _lr_words(cfg, int(loader["batch_size"]), world_size))


def _batches(loader: dict, recipe: RecipeSpec) -> BatchGeometry:
    """The train and val batches, in images and FlatBatch bytes, each at the largest image its
    recipe can produce (the reference presets: not dataset.image_size)."""
    batch, val = int(loader["batch_size"]), loader.get("val_batch_size")
    reference = recipe.is_a(ReferencePreset)  # the letterbox family is not built (albumentations)
    built = recipe.recipe if reference else None
    train_side, val_side = ((max(built.largest_hw()), max(built.eval_recipe().largest_hw())) if built is not None
                            else (recipe.image_size, recipe.image_size))
    val_bytes = batch_bytes(val or batch, val_side) if val or val_side != train_side else None
    group, note = _group_factor(loader.get("group_aspect_ratio", "preset"), recipe)
    return BatchGeometry(batch, batch_bytes(batch, train_side), val_batch_size=int(val) if val else None,
                         val_batch_bytes=val_bytes, partner_pool=recipe.config.get("partner_pool") or 0,
                         partner_window=partner_window(recipe), image_side=round_up(train_side),
                         val_image_side=round_up(val_side), group_aspect_ratio=group, group_note=note,
                         worker_working_bytes=built.working_bytes() if built is not None else 0)


def partner_window(recipe: RecipeSpec) -> int:
    """Mosaic's window W when its partners come from a window (augment.partners=window), else 0."""
    if not recipe.is_a(Mosaic):
        return 0
    aug = recipe.config
    source = partner_source(aug.get("partners"), aug.get("partner_window"), aug.get("partner_pool"))
    return int(aug["partner_window"]) if source == "window" else 0


def _group_factor(value, recipe: RecipeSpec) -> tuple[int | None, str | None]:
    """loader.group_aspect_ratio resolved: ``preset`` is 3 (every torchvision reference recipe's
    --aspect-ratio-group-factor) with a reference preset, off otherwise; mosaic ignores it, and
    the note says so."""
    if value == "preset":
        return (3 if recipe.is_a(ReferencePreset) else None), None
    if value is not None and recipe.is_a(Mosaic):
        return None, (f"loader.group_aspect_ratio={value} is ignored: mosaic's outputs are all "
                      f"{recipe.image_size}x{recipe.image_size}, so every batch is one aspect ratio already")
    return (int(value) if value is not None else None), None


def _lr_words(cfg: DictConfig, batch: int, world: int) -> str | None:
    """The linear scaling model.lr_scaling asks for, at this run's global batch (the plan's
    ranks; the module applies the same rule from the trainer's, models/reference_schedule.py)."""
    scaling = _plain(cfg.model.get("lr_scaling")) if cfg.get("model") is not None else None
    if not scaling:
        return None
    from cocodet.models.reference_schedule import scaled_lr

    accumulate = int(cfg.trainer.get("accumulate_grad_batches", 1) or 1)
    global_batch = world * batch * accumulate
    lr = scaled_lr(scaling["reference_lr"], scaling["reference_batch"], global_batch)
    return (f"the reference's {scaling['reference_lr']:g} at global batch {scaling['reference_batch']} -> {lr:g} at "
            f"this run's {global_batch} ({world} rank(s) x loader.batch_size {batch} x accumulate_grad_batches "
            f"{accumulate})")


def _datamodule(dataset: dict, recipe: RecipeSpec) -> DatasetSpec:
    """The datamodule's keys: the dataset group's, less how the store is opened (``StorageSpec``)."""
    options = {k: v for k, v in dataset.items() if k not in ("_target_", "storage_options")}
    target = str(dataset["_target_"])
    if options.get("keep_empty") is None:  # the recipe's default, a class attribute (nothing built)
        options["keep_empty"] = getattr(recipe.family, "keep_empty", Recipe.keep_empty)
    return DatasetSpec(target, options)


def _model(cfg: DictConfig, recipe: RecipeSpec) -> ModelSpec | None:
    if cfg.get("model") is None:
        return None
    return ModelSpec(config=_plain(cfg.model), name=str(cfg.model.detector.name),
                     loader_resizes=recipe.is_a(ReferencePreset))
