"""Config validation, once, at start, beside the run specification: what the groups' structured
configs (``schemas.py``) cannot express. Every user-settable value the code relies on is checked
against its rule (``cocodet.schema``: ranges, and the words each choice is refused with), and
every key against the keys its group declares (a ``+`` override passes Hydra's own check).

Hydra composes strings, numbers and nulls without knowing what they mean; a negative batch
size or ``image_size=0`` would otherwise fail deep inside a library (or not at all). Each
rule names the key, the value and what is allowed, in one line a user can act on.
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect

from omegaconf import DictConfig, OmegaConf

from cocodet.credentials import ADVICE, credential_keys
from cocodet.datasets.layouts import layout_keys, layout_rules
from cocodet.errors import ConfigError
from cocodet.run_spec.schemas import SCHEMAS, declared_keys
from cocodet.schema import DATASET_KEYS, MODES, RULES, show


def validate(cfg: DictConfig, tree: dict, overrides: list[str] = ()) -> None:
    """Raise ConfigError for a key its group does not declare (a constructor's group: its
    signature), for the first value outside its rule (keys absent from this config are skipped),
    or for a credential written in the config. ``tree``: ``cfg`` resolved, as plain Python;
    ``cfg`` itself for what must be read unresolved; ``overrides``: this run's command line."""
    if tree.get("mode") not in MODES:
        raise ConfigError(f"mode={show(tree.get('mode'))} is not allowed: expected one of {', '.join(MODES)}")
    for group, declared in (("dataset", DATASET_KEYS + layout_keys()), *((g, declared_keys(g)) for g in SCHEMAS)):
        undeclared(group, set(tree.get(group) or {}), declared)
    check_signatures(tree, list(overrides))
    for rule, value in [(rule, _select(tree, rule.key)) for rule in (*RULES, *layout_rules())]:
        if value is not _ABSENT:
            rule.validate(value)
    # Unresolved: a value from ${oc.env:...} (the environment) is allowed, a literal one is not.
    secrets = (
        credential_keys(
            OmegaConf.to_container(cfg.dataset.get("storage_options") or {}, resolve=False), "dataset.storage_options"
        )
        if cfg.get("dataset")
        else []
    )
    options = (cfg.get("checkpoint") or {}).get("storage_options")
    secrets += (
        credential_keys(OmegaConf.to_container(options, resolve=False), "checkpoint.storage_options") if options else []
    )
    mlflow = (cfg.get("logger") or {}).get("mlflow")
    secrets += credential_keys(OmegaConf.to_container(mlflow, resolve=False), "logger.mlflow") if mlflow else []
    if secrets:
        raise ConfigError(
            f"{', '.join(secrets)}: a credential in the config (Hydra writes it to .hydra/config.yaml): {ADVICE}"
        )


def _select(tree: dict, key: str):
    """The value at a dotted ``key`` of a plain tree (``_ABSENT`` where a part is missing)."""
    node = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def undeclared(group: str, keys: set[str], declared: tuple[str, ...], taker: str = "") -> None:
    """Refuse a key ``group`` does not declare, naming the closest declared one: a typo appended
    with ``+`` (which Hydra lets past a structured config) would otherwise be ignored.
    ``taker``: who takes the keys, when not the group itself (``Lightning's Trainer``)."""
    unknown = sorted(keys - set(declared))
    if not unknown:
        return
    named = []
    for key in unknown:
        closest = difflib.get_close_matches(key, declared, n=1, cutoff=0.6)
        named.append(f"{group}.{key}" + (f" (did you mean {group}.{closest[0]}?)" if closest else ""))
    raise ConfigError(
        f"unknown {group} key{'s' if len(unknown) > 1 else ''} {', '.join(named)}: "
        f"{taker or f'the {group} group'} takes {', '.join(k for k in declared if k != '_target_')} "
        "(a typo, or a key for another group?)"
    )


# Modes that build neither a Trainer nor a model: they import Lightning (or an optimizer's
# library) only to check a key this run's command line appended (mode=plan stays light).
LIGHT_MODES = ("plan", "verify")


def check_signatures(tree: dict, overrides: list[str]) -> None:
    """The open groups that are a constructor's arguments, against that constructor: ``trainer``
    against Lightning's ``Trainer``, ``model.optimizer`` against its ``_target_`` class. Every
    key in the modes that build them; in ``LIGHT_MODES``, the keys a ``+`` override appended."""
    light = tree.get("mode") in LIGHT_MODES
    trainer = set(tree.get("trainer") or {}) if not light else _appended(overrides, "trainer")
    if trainer and importlib.util.find_spec("lightning") is not None:  # not installed: its import fails on its own
        import lightning

        _check("trainer", trainer, lightning.Trainer.__init__, "Lightning's Trainer")
    optimizer = ((tree.get("model") or {}).get("optimizer")) or {}
    keys = {k for k in optimizer if not k.startswith("_")} if not light else _appended(overrides, "model.optimizer")
    if keys and optimizer.get("_target_"):
        from hydra.utils import get_class

        try:
            cls = get_class(str(optimizer["_target_"]))
        except Exception:  # noqa: BLE001 - not importable here: instantiate names it where the model is built
            return
        _check("model.optimizer", keys, cls.__init__, str(optimizer["_target_"]))


def _appended(overrides: list[str], group: str) -> set[str]:
    """The keys a ``+`` (or ``++``) override put directly under ``group``."""
    keys = set()
    for override in overrides:
        key = override.split("=", 1)[0]
        if key.startswith("+") and key.lstrip("+").startswith(group + "."):
            keys.add(key.lstrip("+")[len(group) + 1 :].split(".")[0])
    return keys


def _check(group: str, keys: set[str], function, taker: str) -> None:
    """``keys`` against ``function``'s keyword parameters (any key passes a ``**kwargs``)."""
    params = inspect.signature(function).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    declared = tuple(p.name for p in params if p.name != "self" and p.kind is not inspect.Parameter.VAR_POSITIONAL)
    undeclared(group, keys, declared, taker)


_ABSENT = object()
