"""mode=train: fit a DetectorModule on the datamodule and summarise the run (DESIGN §2)."""

from __future__ import annotations

import time

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from cocodet.bench.callback import LoaderTimingCallback
from cocodet.loader.diagnose import explained_loader_failures
from cocodet.loader.policy import LoaderPlan

HEADLINE = ("map", "map50", "map75", "map_small", "map_medium", "map_large")


def seed_model_init(seed: int) -> None:
    """Seed the generators a detector's weight init draws from (call before building it); the
    data never uses them (DESIGN §5)."""
    L.seed_everything(seed, workers=False, verbose=False)


def fit(trainer: L.Trainer, module: L.LightningModule, datamodule: L.LightningDataModule, plan: LoaderPlan, *,
        ckpt_path: str | None, weights_only: bool, shm_path: str) -> dict:
    """Train, validating as configured; return the training summary."""
    started = time.perf_counter()
    with explained_loader_failures(plan, shm_path=shm_path):
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path,
                    weights_only=weights_only if ckpt_path else None)
    checkpoint = next((c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)), None)
    timing = next((c for c in trainer.callbacks if isinstance(c, LoaderTimingCallback)), None)
    metrics = module.last_metrics or {}
    best = checkpoint.best_model_score if checkpoint else None
    return {
        "mode": "train",
        **{k: round(float(metrics.get(k, 0.0)), 4) for k in HEADLINE},
        "best_map": round(float(best), 4) if best is not None else None,
        "epochs": int(trainer.current_epoch),
        "steps": int(trainer.global_step),
        "wall_s": round(time.perf_counter() - started, 1),
        "last_ckpt": (checkpoint.last_model_path or None) if checkpoint else None,
        "best_ckpt": (checkpoint.best_model_path or None) if checkpoint else None,
        "loader_wait": timing.summary() if timing else {},
        "bad_samples": datamodule.bad_sample_summary(),
        "precision": str(trainer.precision),
        "plan": plan.summary(),
    }
