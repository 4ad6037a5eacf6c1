"""Where runs are tracked when no server is named: one SQLite database per checkout, shared by
every run and sweep, so that they compare (``logger.mlflow.tracking_uri``'s default).

The config spells the default ``sqlite:///${cocodet.checkout:}/mlflow.db`` (an absolute path:
four slashes); ``COCODET_MLFLOW_DB`` moves it (the image puts it in its outputs volume) and
``MLFLOW_TRACKING_URI`` replaces it. MLflow's deprecated file store is never used.
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import OmegaConf

SQLITE = "sqlite:///"


def checkout_dir() -> str:
    """The folder that holds ``conf/`` (the checkout, or /app in the image): where Hydra found
    the primary config; else (Hydra's compose API) the checkout this package runs from, when it
    runs from one (an editable install); else the working directory."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        for source in HydraConfig.get().runtime.config_sources:
            if source.provider == "main" and source.schema == "file":  # not resolved: a linked conf/ is this checkout's
                return os.path.dirname(os.path.abspath(source.path))
    source_tree = Path(__file__).resolve().parents[3]  # <checkout>/src/cocodet/tracking/store.py
    if (source_tree / "conf" / "config.yaml").is_file():
        return str(source_tree)
    return str(Path.cwd().resolve())


def register_resolvers() -> None:
    """``${cocodet.checkout:}`` for the config (idempotent)."""
    if not OmegaConf.has_resolver("cocodet.checkout"):
        OmegaConf.register_new_resolver("cocodet.checkout", checkout_dir)


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None: a server or another store)."""
    if not tracking_uri.startswith(SQLITE):
        return None
    return Path(tracking_uri[len(SQLITE):]).resolve()


def artifact_root(tracking_uri: str) -> str | None:
    """Where a SQLite store's experiments keep artifacts: ``mlartifacts/`` beside the database,
    not MLflow's ``./mlruns`` under whatever folder the run started in. None for a server (it
    decides)."""
    db = sqlite_path(tracking_uri)
    return (db.parent / "mlartifacts").as_uri() if db is not None else None
