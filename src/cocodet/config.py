"""Config validation, once, at start: every user-settable value the code relies on, checked
against the one schema (``cocodet.schema``), and the dataset group's keys.

Hydra composes strings, numbers and nulls without knowing what they mean; a negative batch
size or ``image_size=0`` would otherwise fail deep inside a library (or not at all). Each
rule names the key, the value and what is allowed, in one line a user can act on.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from cocodet.credentials import ADVICE, credential_keys
from cocodet.errors import ConfigError, UserError  # noqa: F401  (UserError: what cli catches)
from cocodet.schema import DATASET_KEYS, MODES, RULES, show


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError for the first value outside its rule (keys absent from this config
    are skipped) or for a dataset key no constructor takes."""
    if cfg.get("mode") not in MODES:
        raise ConfigError(f"mode={show(cfg.get('mode'))} is not allowed: expected one of {', '.join(MODES)}")
    unknown = sorted(set(cfg.get("dataset") or {}) - set(DATASET_KEYS))
    if unknown:
        raise ConfigError(f"unknown dataset key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: the dataset "
                          f"group takes {', '.join(k for k in DATASET_KEYS if k != '_target_')} (a typo, or a key "
                          "for another group?)")
    # Unresolved: a value from ${oc.env:...} (the environment) is allowed, a literal one is not.
    secrets = credential_keys(OmegaConf.to_container(cfg.dataset.get("storage_options") or {}, resolve=False),
                              "dataset.storage_options") if cfg.get("dataset") else []
    mlflow = (cfg.get("logger") or {}).get("mlflow")
    secrets += credential_keys(OmegaConf.to_container(mlflow, resolve=False), "logger.mlflow") if mlflow else []
    if secrets:
        raise ConfigError(f"{', '.join(secrets)}: a credential in the config (Hydra writes it to .hydra/config.yaml): "
                          f"{ADVICE}")
    for rule in RULES:
        value = OmegaConf.select(cfg, rule.key, default=_ABSENT, throw_on_missing=False)
        if value is _ABSENT:
            continue
        rule.validate(OmegaConf.to_container(value) if OmegaConf.is_config(value) else value)


_ABSENT = object()
