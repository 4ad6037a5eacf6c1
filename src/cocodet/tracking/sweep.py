"""A ``-m`` sweep as one MLflow parent run, each job a child run (``mlflow.parentRunId``).

``conf/config.yaml`` registers :class:`MlflowSweep` as a Hydra callback; it does nothing unless
the sweep's config has ``logger.mlflow``. ``on_multirun_start`` runs in the launching process
with either launcher (joblib's local processes, submitit's SLURM jobs), before any job: it
creates the parent and writes its id to ``<hydra.sweep.dir>/mlflow_parent.json``, which every job
reads (a shared folder, as SLURM jobs need for their outputs anyway).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from cocodet.credentials import redact
from cocodet.tracking.guard import GuardedClient, bound_requests
from cocodet.tracking.store import artifact_root, register_resolvers
from cocodet.tracking.unsent import UNSENT_NAME

log = logging.getLogger(__name__)

PARENT_FILE = "mlflow_parent.json"


class MlflowSweep(Callback):
    def __init__(self) -> None:
        self.parent = None

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        options = (config.get("logger") or {}).get("mlflow")
        if options is None:
            return
        register_resolvers()
        from cocodet.tracking.tracked_run import TrackedRun

        sweep_dir = Path(str(config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        uri = str(options.tracking_uri)
        bound_requests(int(options.request_timeout_s), int(options.request_max_retries))
        run = TrackedRun(GuardedClient(uri, sweep_dir / UNSENT_NAME), str(options.experiment_name), artifact_root(uri))
        overrides = list(OmegaConf.select(config, "hydra.overrides.task", default=[]) or [])
        run.start(
            str(sweep_dir),
            params={},
            tags={"cocodet.sweep": str(sweep_dir.resolve()), "cocodet.overrides": redact(" ".join(overrides))},
        )
        if run.run_id:
            (sweep_dir / PARENT_FILE).write_text(json.dumps({"run_id": run.run_id, "tracking_uri": redact(uri)}) + "\n")
            log.info("MLflow: sweep %s is parent run %s", sweep_dir, run.run_id)
        self.parent = run

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        if self.parent is not None and self.parent.run_id:
            best = best_trial_tags(Path(str(config.hydra.sweep.dir)))
            with self.parent.guard.closing(10.0, "the sweep's parent run"):
                if best:
                    self.parent.set_tags(best)
                self.parent.end("completed")


def best_trial_tags(sweep_dir: Path) -> dict[str, str]:
    """A searching sweep's winner (``search/winner.py``'s best.yaml) as the parent's tags."""
    import yaml

    path = sweep_dir / "best.yaml"
    if not path.is_file():
        return {}
    best = yaml.safe_load(path.read_text())
    return {
        "cocodet.best_trial": str(best["trial"]),
        "cocodet.best_value": str(best[best["metric"]]),
        "cocodet.best_metric": best["metric"],
        "cocodet.best_overrides": redact(" ".join(best["overrides"])),
    }


def sweep_parent_id() -> str | None:
    """In a ``-m`` job: the parent run the sweep's callback wrote (None: not a sweep, or none)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    path = Path(HydraConfig.get().sweep.dir) / PARENT_FILE
    try:
        return json.loads(path.read_text())["run_id"]
    except (OSError, ValueError, KeyError):
        return None
