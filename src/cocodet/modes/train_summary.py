"""What a training run's summary says (design §2): its COCO numbers, checkpoints, loader wait,
stream, plan, ranks, health and attempts; ``modes/train.py`` decides the status and ends the run."""

from __future__ import annotations

import time
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from cocodet.elastic.attempts import AttemptLedger
from cocodet.loader.plan.records import LoaderPlan
from cocodet.models import checkpoint_store
from cocodet.models.evaluation import STAT_NAMES
from cocodet.models.preemption import PreemptionCheckpoint
from cocodet.storage.urls import is_remote
from cocodet.timing.callback import LoaderTimingCallback


def train_summary(
    trainer: L.Trainer,
    module: L.LightningModule,
    datamodule: L.LightningDataModule,
    plan: LoaderPlan,
    *,
    status: str,
    started: float,
    checkpoints: list[ModelCheckpoint],
    preemption: PreemptionCheckpoint | None,
    ddp: dict | None,
    ranks: dict | None,
) -> dict:
    """The summary of a run that ended with ``status``, ``started`` at that ``perf_counter``;
    ``ddp`` and ``ranks`` are the records the ranks agreed on before it (or None)."""
    best_checkpoint = next((c for c in checkpoints if c.monitor), None)
    last_checkpoint = next((c for c in checkpoints if not c.monitor), None)
    ledger = next((c for c in trainer.callbacks if isinstance(c, AttemptLedger)), None)
    timing = next((c for c in trainer.callbacks if isinstance(c, LoaderTimingCallback)), None)
    metrics = module.last_metrics or {}
    best = best_checkpoint.best_model_score if best_checkpoint else None
    return {
        "mode": "train",
        "status": status,
        # A run that never validated (stopped in its first epoch) has no numbers: nulls, not zeros.
        **{k: round(float(metrics[k]), 4) if k in metrics else None for k in STAT_NAMES},
        "best_map": round(float(best), 4) if best is not None else None,
        "epochs": int(trainer.current_epoch),
        "steps": int(trainer.global_step),
        "wall_s": round(time.perf_counter() - started, 1),
        "last_ckpt": _last_checkpoint(trainer, last_checkpoint, preemption),
        "best_ckpt": best_on_disk(trainer, best_checkpoint, last_checkpoint, preemption),
        "loader_wait": timing.summary() if timing else {},
        "bad_samples": datamodule.bad_sample_summary(),
        "stream_digest": datamodule.stream.digest,
        "stream_position": datamodule.stream.position.state_dict() if datamodule.stream.position else None,
        "precision": str(trainer.precision),
        "eval_backend": getattr(module, "eval_backend", None),
        "first_batch_pinned": getattr(datamodule, "first_batch_pinned", None),
        "plan": plan.summary(),
        "on_failure": datamodule.replanner.on_failure,
        "replans": datamodule.replanner.records,
        "ddp": ddp,
        "ranks": ranks,
        "health": module.health.summary() if hasattr(module, "health") else None,
        "attempts": ledger.close(status) if ledger is not None else None,
        **remote_record(datamodule),
        **getattr(module, "lr_record", {}),  # global_batch, effective_lr
    }


def remote_record(datamodule) -> dict:
    """``{"remote": ...}``: what a remote root's store served (none for a local root)."""
    remote = datamodule.remote_summary() if hasattr(datamodule, "remote_summary") else None
    return {"remote": remote} if remote is not None else {}


def best_on_disk(trainer, best: ModelCheckpoint | None, last: ModelCheckpoint | None, preemption) -> str | None:
    """The best checkpoint a summary may name: the one its callback names, if whole in its
    folder; else (its successor refused as not finite, or its save out of disk or store: the
    callback already names the new file, and let go of the old one) the newest file this run
    wrote whole into that callback's folder, other than the last and resume checkpoints."""
    if best is None:
        return None
    whole = _written_whole(trainer)
    if _existing(best.best_model_path, whole):
        return best.best_model_path
    # never the last-checkpoint callback's files, a save_last file, or resume.ckpt
    others = {c.last_model_path for c in (last, best) if c is not None}
    if last is not None:
        others |= {*last.best_k_models, last.best_model_path}
    if preemption is not None:
        others.add(preemption.path)
    folder = str(best.dirpath).rstrip("/") if best.dirpath else None
    kept = [p for p in whole if _folder_of(p) == folder and p not in others and _existing(p, whole)]
    return kept[-1] if kept else None


def _written_whole(trainer) -> list[str]:
    """The files this run wrote whole and kept, oldest first (``models/checkpoint_io.py``)."""
    return list(getattr(getattr(trainer.strategy, "checkpoint_io", None), "whole", []))


def _folder_of(path: str) -> str:
    return path.rsplit("/", 1)[0] if is_remote(path) else str(Path(path).parent)


def _existing(path: str | None, whole: list[str]) -> str | None:
    """A checkpoint path a summary may name: one that holds a file or an object (a bucket's, when
    its store is not answering: one this run wrote whole)."""
    if not path:
        return None
    if is_remote(path) and not checkpoint_store.store_answers():
        return path if path in whole else None
    return path if checkpoint_store.exists(path) else None


def _last_checkpoint(trainer, last: ModelCheckpoint | None, preemption: PreemptionCheckpoint | None) -> str | None:
    """The newest state this run wrote: the preemption/step checkpoint or the epoch-end one."""
    whole = _written_whole(trainer)
    paths = [p for p in ((last.best_model_path if last else None), preemption.saved_path if preemption else None) if p]
    existing = [p for p in paths if _existing(p, whole)]

    def age(path: str) -> tuple:  # written by this run: in writing order, after any older one
        return (1, whole.index(path)) if path in whole else (0, checkpoint_store.modified(path))

    return max(existing, key=age) if existing else None
