"""The MLflow logger's part in a training run: its callback, what it starts with, how it ends.

Called from ``modes/wiring.py`` (the callback), ``modes/train.py`` (``prepare_tracking``) and
``modes/train.py`` (``close_tracking``, ``abort_tracking``); each is a no-op without
``logger=mlflow``, and only rank 0 talks to MLflow.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from cocodet.tracking.lightning_logger import MlflowLogger, RunIdInCheckpoint


def mlflow_logger(loggers) -> MlflowLogger | None:
    return next((lg for lg in loggers or [] if isinstance(lg, MlflowLogger)), None)


def tracking_callbacks(loggers) -> list:
    """The callback that writes the run id into checkpoints, when a logger is MLflow's."""
    logger = mlflow_logger(loggers)
    return [RunIdInCheckpoint(logger)] if logger is not None else []


def prepare_tracking(trainer, cfg: DictConfig, plan, resumed_run_id: str | None) -> None:
    """Hand the logger the run's parameters and tags, its sweep parent, and the run id a
    resumed checkpoint carries (``CHECKPOINT_KEY``; None: a new run)."""
    logger = mlflow_logger(trainer.loggers)
    if logger is None or not trainer.is_global_zero:
        return
    from cocodet.tracking.run_record import flat_params, start_tags
    from cocodet.tracking.store import checkout_dir
    from cocodet.tracking.sweep import sweep_parent_id

    logger.prepare(flat_params(cfg), start_tags(cfg, plan, Path(checkout_dir())), sweep_parent_id(), resumed_run_id)


def close_tracking(trainer, summary: dict, plan, files: list[Path]) -> dict | None:
    """End the MLflow run as ``summary`` says, sending those of ``files`` that exist and hold
    something; the summary's ``mlflow`` block (None: no MLflow)."""
    logger = mlflow_logger(trainer.loggers)
    if logger is None or not trainer.is_global_zero:
        return None
    artifacts = [Path(p) for p in files if Path(p).is_file() and Path(p).stat().st_size > 0]
    return logger.close(summary, artifacts, plan.table())


def abort_tracking(trainer, error: BaseException) -> None:
    """An unexpected error (or Ctrl-C) ended training: the run ends FAILED (KILLED for Ctrl-C)."""
    logger = mlflow_logger(trainer.loggers)
    if logger is None or not trainer.is_global_zero:
        return
    interrupted = isinstance(error, (KeyboardInterrupt, SystemExit))
    ending = "interrupted" if interrupted else "error"  # an MLflow tag only: no summary is written
    logger.close({"status": ending, "error": f"{type(error).__name__}: {error}"}, [], "")
