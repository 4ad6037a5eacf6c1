"""Config tree -> :class:`RunSpec`, once, at start (``app.run``): the only reader of the tree
besides ``run_spec/validate.py`` (which runs first) and ``cocodet.tracking`` (its parameters).

``mode=eval|predict|export ckpt_path=<file>`` first takes the dataset, model and augment groups
the run was trained with (``with_trained_config``), so that a user names the checkpoint and not
the run's whole config again: from the checkpoint itself (training keeps them under
``models.detector.RUN_CONFIG_KEY``), else the run folder's ``.hydra/config.yaml`` (checkpoints
written before they carried them). The command line still wins: a group chosen on it
(``dataset=coco``, ``model=...``, ``augment=...``, or an ``experiment=``) is the composed one,
and each ``group.key=value`` it sets is applied over the trained group.

One pass, downward: the tree as plain Python, validated, old ``_target_`` paths mapped, then
each group handed to the layer that owns its meaning (the recipe's shape to the loader's
batch geometry, the loader group to the plan's request, the trainer's arguments to the ranks).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from cocodet.compat import current_targets, targets_in
from cocodet.elastic.run_folder import unshared_folder
from cocodet.errors import ConfigError, UserError
from cocodet.loader.plan.flat_layout import batch_geometry
from cocodet.loader.plan.request import loader_request
from cocodet.ranks import trainer_ranks
from cocodet.run_spec.records import (
    CheckpointSpec,
    DatasetSpec,
    LoaderSpec,
    ModelSpec,
    RecipeSpec,
    RunSpec,
    StorageSpec,
    TrainerSpec,
)
from cocodet.run_spec.validate import validate
from cocodet.storage.urls import is_remote
from cocodet.transforms.recipe import Recipe

log = logging.getLogger(__name__)

MODE_GROUPS = ("bench", "eval", "predict", "export", "preview")
CHECKPOINT_MODES = ("eval", "predict", "export")  # they read a checkpoint's weights ...
TRAINED_GROUPS = ("dataset", "model", "augment")  # ... and, unless the command line chooses them, its groups


def read_spec(cfg: DictConfig) -> RunSpec:
    """The groups a checkpoint was trained with, for the modes that use one
    (``with_trained_config`` below); validate ``cfg`` (``run_spec/validate.py``: exit 2 naming
    the key), map old ``_target_`` paths (``compat.py``), then read each group once."""
    overrides = cli_overrides()
    with_trained_config(cfg, overrides)  # eval|predict|export: the groups the checkpoint was trained with
    tree = plain_tree(cfg)
    validate(cfg, tree, overrides)
    current_targets(tree)
    data = tree["dataset"]
    loader = tree["loader"]
    model = tree.get("model")
    trainer = tree["trainer"]
    recipe = RecipeSpec.read(tree.get("augment") or {}, (model or {}).get("detector"), data["image_size"])
    request = loader_request(loader, overrides, dict(os.environ))
    batches = batch_geometry(
        loader["batch_size"], loader.get("val_batch_size"), loader.get("group_aspect_ratio", "preset"), recipe.shape
    )
    ranks, cuda = trainer_ranks(trainer)
    run_dir_given = any(o.split("=", 1)[0] == "hydra.run.dir" for o in hydra_overrides())
    run_dir = Path(str(tree["output_dir"]))
    checkpoint = checkpoint_spec(tree.get("checkpoint") or {}, data, run_dir)
    unshared = (
        unshared_folder(ranks, run_dir_given) if tree["mode"] == "train" and not is_remote(checkpoint.dir) else None
    )
    if unshared:  # every node and restart must find the one run's checkpoints (elastic/run_folder.py)
        raise UserError(unshared)
    options = {k: v for k, v in data.items() if k not in ("_target_", "storage_options")}
    if options.get("keep_empty") is None:  # the recipe's default, a class attribute (nothing built)
        options["keep_empty"] = getattr(recipe.family, "keep_empty", Recipe.keep_empty)
    return RunSpec(
        mode=str(tree["mode"]),
        seed=int(tree["seed"]),
        run_dir=run_dir,
        ranks=ranks,
        recipe=recipe,
        dataset=DatasetSpec(str(data["_target_"]), options),
        loader=LoaderSpec(
            request, batches, str(loader["shm_path"]), loader.get("on_failure"), int(loader.get("max_replans", 3))
        ),
        storage=StorageSpec(data.get("storage_options") or {}, dict(data.get("remote") or {})),
        checkpoint=checkpoint,
        model=None
        if model is None
        else ModelSpec(config=model, name=str(model["detector"]["name"]), loader_resizes=recipe.resizes_as_model),
        trainer=TrainerSpec(
            args=trainer,
            callbacks=list((tree.get("callbacks") or {}).values()),
            loggers=tree.get("logger") or {},
            cuda=cuda,
        ),
        ckpt_path=tree.get("ckpt_path"),
        weights_only=bool(tree.get("weights_only", True)),
        modes={m: tree.get(m) or {} for m in MODE_GROUPS},
        config=cfg,
        run_dir_given=run_dir_given,
    )


def checkpoint_spec(checkpoint: dict, data: dict, run_dir: Path) -> CheckpointSpec:
    """The checkpoint group: its folder (default: the run folder's ``checkpoints/``) and its store's
    options (for the folder, and for a ``ckpt_path`` URL): its own keys, and the dataset's for
    those it leaves null when the dataset is in a bucket too."""
    folder = str(checkpoint.get("dir") or run_dir / "checkpoints")
    own = {k: v for k, v in (checkpoint.get("storage_options") or {}).items() if v is not None}
    shared = is_remote(str(data.get("root")))
    options = {**((data.get("storage_options") or {}) if shared else {}), **own}
    in_run_dir = not is_remote(folder) and Path(folder).resolve() == (run_dir / "checkpoints").resolve()
    return CheckpointSpec(folder, dict(options), in_run_dir)


def plain_tree(cfg: DictConfig) -> dict:
    """The tree as plain Python, resolved, the schemas' choices as their strings."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


def with_trained_config(cfg: DictConfig, overrides: list[str]) -> None:
    """Replace, in place, the groups of ``cfg`` the command line did not choose by those the
    checkpoint was trained with, keeping every ``group.key=value`` of the command line."""
    from hydra.core.hydra_config import HydraConfig

    ckpt = cfg.get("ckpt_path")
    if not HydraConfig.initialized():  # composed by a program (tests, an API user): it says what it means
        return
    if cfg.get("mode") not in CHECKPOINT_MODES or not ckpt or ckpt in ("last", "last_if_any"):
        return
    if not is_remote(str(ckpt)) and not Path(str(ckpt)).is_file():
        return  # a missing file is refused, in one line, where the weights are read
    keys = [o.lstrip("+").split("=", 1)[0] for o in overrides if not o.startswith("~")]
    chosen = {k for k in keys if k in TRAINED_GROUPS} | (set(TRAINED_GROUPS) if "experiment" in keys else set())
    wanted = [g for g in TRAINED_GROUPS if g not in chosen]
    if not wanted:
        return
    weights_only = bool(cfg.get("weights_only", True))
    trained, source = (
        _groups_in_bucket(cfg, str(ckpt), weights_only)
        if is_remote(str(ckpt))
        else _trained_groups(Path(str(ckpt)), weights_only)
    )
    if trained is None:
        log.info(
            "%s: the run's config is neither in the checkpoint nor beside it; the dataset and model are this command's",
            ckpt,
        )
        return
    with open_dict(cfg):
        for group in (g for g in wanted if trained.get(g) is not None):
            node = OmegaConf.create(trained[group])
            for key in (k for k in keys if k.startswith(group + ".")):
                OmegaConf.update(node, key[len(group) + 1 :], OmegaConf.select(cfg, key), merge=False, force_add=True)
            if cfg.get("weights_only", True):
                _refuse_foreign_targets(OmegaConf.to_container(node, resolve=False), group, keys, str(ckpt))
            cfg[group] = node
    log.info(
        "mode=%s: %s as the run was trained (%s); the command line's own keys over them",
        cfg.mode,
        ", ".join(wanted),
        source,
    )


# What a checkpoint's config may name for Hydra to build, when the checkpoint is not trusted with
# code (weights_only=true): cocodet's own classes and torch's optimizers and schedulers. A
# checkpoint is data; a _target_ in it is code that instantiate would run.
TRUSTED_TARGETS = ("cocodet.", "torch.optim.")


def _refuse_foreign_targets(group_tree: dict, group: str, keys: list[str], ckpt: str) -> None:
    """ConfigError for a ``_target_`` the checkpoint names outside ``TRUSTED_TARGETS`` (one the
    command line set itself is the user's own)."""
    for path, _, target in targets_in(group_tree, group):
        if path not in keys and not str(target).startswith(TRUSTED_TARGETS):
            raise ConfigError(
                f"{ckpt} names {path}={target} for its run's config, which is not cocodet's or "
                f"torch.optim's: with weights_only=true a checkpoint's config never names code to run. "
                f"Pass {group}=... (or {path}=...) yourself, or weights_only=false for a file you trust"
            )


def _trained_groups(ckpt: Path, weights_only: bool) -> tuple[dict | None, str]:
    """(the trained groups, where they were found), or (None, ""). The checkpoint is mapped, not
    read: only its small dict of groups is; a file torch refuses is refused, in one line, where
    the mode reads its weights (``models/checkpoint_file.py``)."""
    import torch

    from cocodet.models.detector import RUN_CONFIG_KEY

    try:
        groups = torch.load(ckpt, map_location="cpu", weights_only=weights_only, mmap=True).get(RUN_CONFIG_KEY)
    except Exception:  # noqa: BLE001 - any refusal is worded where the weights are read
        groups = None
    if groups:
        return groups, f"from {ckpt.name}"
    run = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
    saved = run / ".hydra" / "config.yaml"
    if saved.is_file():
        return OmegaConf.to_container(OmegaConf.load(saved), resolve=False), f"from {saved}"
    return None, ""


def _groups_in_bucket(cfg: DictConfig, url: str, weights_only: bool) -> tuple[dict | None, str]:
    """(the trained groups, where), of a checkpoint in a bucket: read now, in its one GET, whose
    bytes the weights' read takes (``models/checkpoint_store.py``: ``keep``)."""
    import io

    import torch

    from cocodet.models import checkpoint_store
    from cocodet.models.checkpoint_store import CheckpointFolder
    from cocodet.models.detector import RUN_CONFIG_KEY

    checkpoint, data = (OmegaConf.to_container(cfg.get(g) or {}, resolve=True) for g in ("checkpoint", "dataset"))
    folder = checkpoint_spec(checkpoint, data, Path(str(cfg.output_dir)))
    checkpoint_store.configure(CheckpointFolder(folder.dir, folder.options))  # its store's options, before app.py's
    try:
        data = checkpoint_store.read(url, keep=True)
    except FileNotFoundError:
        return None, ""  # refused, in one line, where the weights are read
    try:
        groups = torch.load(io.BytesIO(data), map_location="cpu", weights_only=weights_only).get(RUN_CONFIG_KEY)
    except Exception:  # noqa: BLE001 - any refusal is worded where the weights are read
        return None, ""
    return (groups, f"from {url}") if groups else (None, "")


def cli_overrides() -> list[str]:
    """This run's own command-line overrides (what makes a worker count 'explicit')."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def hydra_overrides() -> list[str]:
    """This run's command-line overrides of Hydra's own keys (``hydra.run.dir=...``)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.hydra) if HydraConfig.initialized() else []
