"""Config tree -> :class:`RunSpec`, once, at start (``app.run``): the only reader of the tree
besides ``run_spec/validate.py`` (which runs first) and ``cocodet.tracking`` (its parameters).

One pass, downward: the tree as plain Python, validated, old ``_target_`` paths mapped, then
each group handed to the layer that owns its meaning (the recipe's shape to the loader's
batch geometry, the loader group to the plan's request, the trainer's arguments to the ranks).
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from cocodet.compat import current_targets
from cocodet.loader.flat_layout import batch_geometry
from cocodet.loader.worker_request import loader_request
from cocodet.ranks import trainer_ranks
from cocodet.run_spec.records import (DatasetSpec, LoaderSpec, ModelSpec, RecipeSpec, RunSpec, StorageSpec,
                                      TrainerSpec)
from cocodet.run_spec.validate import validate
from cocodet.transforms.recipe import Recipe
from cocodet.transforms.reference_presets import ReferencePreset

MODE_GROUPS = ("bench", "eval", "predict", "export", "preview")


def read_spec(cfg: DictConfig) -> RunSpec:
    """Validate ``cfg`` (``run_spec/validate.py``: exit 2 naming the key), map old ``_target_``
    paths (``compat.py``), then read each group once."""
    tree = plain_tree(cfg)
    overrides = cli_overrides()
    validate(cfg, tree, overrides)
    current_targets(tree)
    data = tree["dataset"]
    loader = tree["loader"]
    model = tree.get("model")
    trainer = tree["trainer"]
    recipe = RecipeSpec.read(tree.get("augment") or {}, (model or {}).get("detector"), data["image_size"])
    request = loader_request(loader, overrides, dict(os.environ))
    batches = batch_geometry(loader["batch_size"], loader.get("val_batch_size"), loader.get("group_aspect_ratio", "preset"),
                             recipe.shape)
    ranks, cuda = trainer_ranks(trainer)
    options = {k: v for k, v in data.items() if k not in ("_target_", "storage_options")}
    if options.get("keep_empty") is None:  # the recipe's default, a class attribute (nothing built)
        options["keep_empty"] = getattr(recipe.family, "keep_empty", Recipe.keep_empty)
    return RunSpec(
        mode=str(tree["mode"]), seed=int(tree["seed"]), run_dir=Path(str(tree["output_dir"])), ranks=ranks,
        recipe=recipe, dataset=DatasetSpec(str(data["_target_"]), options),
        loader=LoaderSpec(request, batches, str(loader["shm_path"]), loader.get("on_failure"),
                          int(loader.get("max_replans", 3))),
        storage=StorageSpec(data.get("storage_options") or {}, dict(data.get("remote") or {})),
        model=None if model is None else ModelSpec(config=model, name=str(model["detector"]["name"]),
                                                   loader_resizes=recipe.is_a(ReferencePreset)),
        trainer=TrainerSpec(args=trainer, callbacks=list((tree.get("callbacks") or {}).values()),
                            loggers=tree.get("logger") or {}, cuda=cuda),
        ckpt_path=tree.get("ckpt_path"), weights_only=bool(tree.get("weights_only", True)),
        modes={m: tree.get(m) or {} for m in MODE_GROUPS}, config=cfg)


def plain_tree(cfg: DictConfig) -> dict:
    """The tree as plain Python, resolved, the schemas' choices as their strings."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


def cli_overrides() -> list[str]:
    """This run's own command-line overrides (what makes a worker count 'explicit')."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
