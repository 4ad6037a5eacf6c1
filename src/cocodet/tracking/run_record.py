"""What an MLflow run records about a cocodet run: its parameters (the resolved config, flat,
without credentials), its tags, and how a summary's ``status`` ends it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from cocodet.credentials import is_credential, redact

# How each summary status ends the MLflow run (errors.RUN_STATUSES): a run stopped from outside
# (a preemption, a store that went away) can be resumed, so KILLED; the run's own failures FAILED.
MLFLOW_STATUS = {
    "completed": "FINISHED",
    "preempted": "KILLED",
    "interrupted": "KILLED",
    "store_down": "KILLED",
    "diverged": "FAILED",
    "collapsed": "FAILED",
    "disk_full": "FAILED",
    "nonfinite": "FAILED",
}
PARAM_VALUE_MAX = 6000  # MLflow refuses longer parameter values
PARAM_BATCH = 100  # and more than 100 parameters in one log_batch


def flat_params(cfg: DictConfig) -> dict[str, str]:
    """The resolved config as ``{"loader.batch_size": "8", ...}``: lists and empty mappings as
    JSON, credential keys left out, any ``user:password@`` in a URL replaced by ``***@``."""
    tree = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False, enum_to_str=True)
    params: dict[str, str] = {}

    def walk(node, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}.{key}" if prefix else str(key))
            return
        if is_credential(prefix):
            return
        text = json.dumps(node) if isinstance(node, (list, dict)) else str(node)
        params[prefix] = redact(text)[:PARAM_VALUE_MAX]

    walk(tree, "")
    return params


def start_tags(cfg: DictConfig, plan, checkout: Path | None) -> dict[str, str]:
    """Tags known when the run starts: the preset, the git commit, the loader plan, the folder."""
    tags = {
        "cocodet.mode": str(cfg.mode),
        "cocodet.run_dir": str(Path(cfg.output_dir).resolve()),
        "cocodet.loader.workers": str(plan.num_workers),
        "cocodet.loader.source": str(plan.source),
        "mlflow.source.name": "train.py",
        "mlflow.source.type": "LOCAL",
    }  # what MLflow's UI shows as the source
    user = user_name()
    if user:
        tags["mlflow.user"] = user
    preset, overrides, job = hydra_choices()
    if preset:
        tags["cocodet.preset"] = preset
    if overrides:
        tags["cocodet.overrides"] = redact(" ".join(overrides))[:PARAM_VALUE_MAX]
    if job is not None:
        tags["cocodet.job"] = str(job)
    commit = git_commit(checkout) if checkout else None
    if commit:
        tags["mlflow.source.git.commit"] = commit
    return tags


def hydra_choices() -> tuple[str | None, list[str], int | None]:
    """The ``experiment=`` preset this run composed (None: none), its command-line overrides, and
    its job number in a ``-m`` sweep (None: not a sweep)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None, [], None
    hydra = HydraConfig.get()
    job = int(hydra.job.num) if hydra.mode == RunMode.MULTIRUN else None
    return hydra.runtime.choices.get("experiment"), list(hydra.overrides.task), job


def user_name() -> str | None:
    """Who ran it, for MLflow's "User" column (None: a container user without a passwd entry)."""
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


def git_commit(checkout: Path) -> str | None:
    """The commit checked out at ``checkout`` (None: not a git checkout, or no git)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def end_tags(summary: dict) -> dict[str, str]:
    """Tags known when the run ends: its status, the stream it read, what went wrong."""
    tags = {"cocodet.status": str(summary.get("status"))}
    for key in ("stream_digest", "batch_digest"):
        if summary.get(key):
            tags[f"cocodet.{key}"] = str(summary[key])
    for key in ("best_ckpt", "last_ckpt"):  # a bucket's checkpoints are named where they are, not uploaded
        if "://" in str(summary.get(key) or ""):
            tags[f"cocodet.{key}"] = str(summary[key])
    if summary.get("error"):
        tags["cocodet.error"] = redact(str(summary["error"]))[:PARAM_VALUE_MAX]
    return tags


def summary_metrics(summary: dict, keys=None) -> dict[str, float]:
    """The summary's top-level numbers (``keys``: only these), for a run that logs once (bench)."""
    return {
        k: float(v)
        for k, v in summary.items()
        if (keys is None or k in keys)
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
        and v == v
        and abs(v) != float("inf")
    }
