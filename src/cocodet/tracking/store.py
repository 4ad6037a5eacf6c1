"""Where runs are tracked when no server is named: one SQLite database per checkout, shared by
every run and sweep, so that they compare (``logger.mlflow.tracking_uri``'s default).

The config spells the default ``sqlite:///${cocodet.checkout:}/mlflow.db`` (an absolute path:
four slashes); ``COCODET_MLFLOW_DB`` moves it (the image puts it in its outputs volume) and
``MLFLOW_TRACKING_URI`` replaces it. MLflow's deprecated file store is never used.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from omegaconf import OmegaConf

SQLITE = "sqlite:///"
INIT_WAIT_S = 60  # another process creating the store: wait this long for it, then track nothing


def checkout_dir(config=None) -> str:
    """The folder that holds ``conf/`` (the checkout, or /app in the image): where Hydra found
    the primary config, as the job's HydraConfig says, or ``config``'s own ``hydra`` node (a
    sweep's callback in the launching process, before any job sets HydraConfig); else (Hydra's
    compose API) the checkout this package runs from, when it runs from one (an editable
    install); else the working directory."""
    from hydra.core.hydra_config import HydraConfig

    runtime = HydraConfig.get().runtime if HydraConfig.initialized() else None
    if runtime is None and config is not None:
        runtime = OmegaConf.select(config, "hydra.runtime", default=None)
    for source in (runtime.config_sources if runtime is not None else None) or []:
        if source.provider == "main" and source.schema == "file":  # not resolved: a linked conf/ is this checkout's
            return os.path.dirname(os.path.abspath(source.path))
    source_tree = Path(__file__).resolve().parents[3]  # <checkout>/src/cocodet/tracking/store.py
    if (source_tree / "conf" / "config.yaml").is_file():
        return str(source_tree)
    return str(Path.cwd().resolve())


def register_resolvers() -> None:
    """``${cocodet.checkout:}`` for the config (idempotent); OmegaConf hands it the config's root."""
    if not OmegaConf.has_resolver("cocodet.checkout"):
        OmegaConf.register_new_resolver("cocodet.checkout", lambda *, _root_: checkout_dir(_root_))


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None: a server or another store)."""
    if not tracking_uri.startswith(SQLITE):
        return None
    return Path(tracking_uri[len(SQLITE) :]).resolve()


def artifact_root(tracking_uri: str) -> str | None:
    """Where a SQLite store's experiments keep artifacts: ``mlartifacts/`` beside the database,
    not MLflow's ``./mlruns`` under whatever folder the run started in. None for a server (it
    decides)."""
    db = sqlite_path(tracking_uri)
    return (db.parent / "mlartifacts").as_uri() if db is not None else None


@contextmanager
def store_created_once(tracking_uri: str):
    """Around a process's first MLflow client. On a new SQLite file that client runs all of
    MLflow's migrations; two processes doing so at once (runs started together, a sweep's jobs
    on a fresh store) break alembic's version row and one run loses MLflow. An exclusive lock
    beside the database (``mlflow.db.lock``) makes them take turns; a server needs none."""
    from filelock import FileLock  # torch's own dependency

    db = sqlite_path(tracking_uri)
    if db is None:
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{db}.lock", timeout=INIT_WAIT_S):
        yield
