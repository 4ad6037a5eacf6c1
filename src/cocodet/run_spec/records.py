"""The run specification: the composed config read once, as frozen records (design §1).

``run_spec/read.py`` builds a :class:`RunSpec` from the validated config tree at start; everything
below the modes receives the parts it needs from it, never the tree. Values are plain Python
(dicts for what Hydra instantiates: the model, callbacks, loggers); nothing here imports
omegaconf, except that :attr:`RunSpec.config` keeps the tree for ``cocodet.tracking``, which logs
it as the run's parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from cocodet.loader.plan.records import BatchGeometry, LoaderRequest, RecipeShape
from cocodet.ranks import Ranks


@dataclass(frozen=True)
class RecipeSpec:
    """The augment group: the class its ``_target_`` names, its keys, and what the recipe
    learns from the rest of the config (``image_size``; a reference preset's model resize)."""

    family: type | None  # the class the target names (None: augment has no target)
    config: dict  # the augment group, resolved, with its _target_
    image_size: int
    model_sizes: tuple[int, int] | None = None  # what the recipe needs of the chosen model (its resize)

    @classmethod
    def read(cls, augment: dict, detector: dict | None, image_size: int) -> RecipeSpec:
        """The augment group's class, located as ``instantiate`` would (an old path mapped by
        ``compat.py`` gives the same class), and what it needs of the model (``detector``:
        model.detector). The recipe modules import neither torch nor albumentations at module
        level, so the plan stays light."""
        from hydra.utils import get_class

        family = get_class(str(augment["_target_"])) if augment.get("_target_") else None
        return cls(family, augment, int(image_size), family.sizes_from_model(detector) if family is not None else None)

    @property
    def resizes_as_model(self) -> bool:
        """The loader resizes images as the model's transform would (design §13)."""
        return self.family is not None and self.family.resizes_as_model

    @cached_property
    def shape(self) -> RecipeShape:
        """What the loader plan needs of this recipe, as its class answers it, derived once
        (mosaic's window only when augment.partners picks one)."""
        if self.family is None:
            return RecipeShape(self.image_size, self.image_size, self.image_size)
        geometry = self.family.geometry(self.config, self.image_size, lambda: self.recipe)
        aug, source = self.config, geometry.partners_from
        return RecipeShape(
            self.image_size,
            geometry.train_side,
            geometry.val_side,
            partner_window=int(aug["partner_window"]) if source == "window" else 0,
            partner_pool=aug.get("partner_pool") or 0,
            partners_from=source,
            preset_grouping=geometry.preset_grouping,
            square_outputs=geometry.square_outputs,
            working_bytes=geometry.working_bytes,
        )

    @cached_property
    def recipe(self):
        """The train recipe, built once (the letterbox family imports albumentations: only
        the modes that read images ask for it)."""
        from hydra.utils import instantiate

        kwargs = {"image_size": self.image_size}
        if self.model_sizes is not None:
            kwargs["model_sizes"] = self.model_sizes
        return instantiate(self.config, **kwargs, _convert_="all")


@dataclass(frozen=True)
class LoaderSpec:
    """The loader group, as the plan is asked it (``loader/plan/records.py``) and as the
    re-planner reads it."""

    request: LoaderRequest
    batches: BatchGeometry
    shm_path: str
    on_failure: str | None
    max_replans: int


@dataclass(frozen=True)
class DatasetSpec:
    """The dataset group: the datamodule class its ``_target_`` names and its keys (checked
    against the constructor's by ``run_spec/validate.py``), ``keep_empty`` resolved."""

    target: str
    options: dict

    @property
    def root(self) -> str:
        return str(self.options["root"])

    @property
    def image_size(self) -> int:
        return int(self.options["image_size"])

    def get(self, key: str, default: Any = None) -> Any:
        return self.options.get(key, default)


@dataclass(frozen=True)
class StorageSpec:
    """How URL roots (and ``predict.source``) are opened: fsspec's ``options`` (never
    credentials) and the ``remote`` group's keys (timeouts, retries, the read-ahead's)."""

    options: dict
    remote: dict


@dataclass(frozen=True)
class CheckpointSpec:
    """Where checkpoints are written and found (``checkpoint.dir``: a folder or a bucket folder),
    its store's fsspec ``options`` (``checkpoint.storage_options``, else the dataset's when both
    are buckets), and whether the folder is the run folder's own ``checkpoints/``."""

    dir: str
    options: dict
    in_run_dir: bool


@dataclass(frozen=True)
class ModelSpec:
    config: dict  # the model group, resolved, for instantiate
    name: str  # model.detector.name
    loader_resizes: bool  # a reference preset resizes images as the model would (design §13)


@dataclass(frozen=True)
class TrainerSpec:
    """Lightning's Trainer arguments and the objects Hydra builds beside it."""

    args: dict
    callbacks: list  # each a config with _target_
    loggers: dict  # name -> config with _target_
    cuda: bool  # batches go to a CUDA device

    @property
    def device(self):
        import torch

        return torch.device("cuda" if self.cuda else "cpu")


@dataclass(frozen=True)
class RunSpec:
    """One run, read once. ``modes``: each mode's own group (``bench``, ``eval``, ``predict``,
    ``export``, ``preview``) as a dict; ``config``: the tree, for tracking only."""

    mode: str
    seed: int
    run_dir: Path
    ranks: Ranks
    recipe: RecipeSpec
    loader: LoaderSpec
    dataset: DatasetSpec
    storage: StorageSpec
    checkpoint: CheckpointSpec
    model: ModelSpec | None
    trainer: TrainerSpec
    ckpt_path: str | None
    weights_only: bool
    modes: dict = field(default_factory=dict)
    run_dir_given: bool = False  # hydra.run.dir on the command line: ckpt_path=last looks there only
    config: Any = None

    def settings(self, mode: str) -> dict:
        return self.modes.get(mode) or {}

    @property
    def mlflow(self) -> bool:
        return "mlflow" in self.trainer.loggers
