"""mode=train: build the datamodule, the model and the Trainer, fit, summarise (design §2)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from cocodet.loader.plan_record import LoaderPlan
from cocodet.modes.wiring import build_datamodule, build_module, build_trainer, resume_path, run_ranks


def train(cfg: DictConfig, plan: LoaderPlan, resources, run_dir: Path) -> dict:
    from cocodet.models.checkpoint_file import load_checkpoint
    from cocodet.models.fit import fit, seed_model_init

    from cocodet.tracking.trainer_hooks import CHECKPOINT_KEY, prepare_tracking

    ckpt, weights_only = resume_path(cfg, run_dir), bool(cfg.weights_only)
    # Refused in one line before Lightning loads it (as it will: with the same weights_only);
    # only the MLflow run id it carries is kept, not its tensors, while the model is built.
    resumed_run_id = load_checkpoint(ckpt, weights_only).get(CHECKPOINT_KEY) if ckpt else None
    datamodule = build_datamodule(cfg, plan, run_dir)
    seed_model_init(int(cfg.seed))
    module = build_module(cfg, datamodule)
    trainer = build_trainer(cfg, run_dir)
    prepare_tracking(trainer, cfg, plan, resumed_run_id)
    return fit(trainer, module, datamodule, plan, ckpt_path=ckpt, weights_only=weights_only,
               shm_path=str(cfg.loader.shm_path), ranks=run_ranks(cfg))
