"""mode=eval, predict and export: the configured model with a checkpoint's weights."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from cocodet.loader.plan_record import LoaderPlan
from cocodet.modes.wiring import build_datamodule, build_module, build_trainer, device_of, resume_path


def _with_weights(cfg: DictConfig, plan: LoaderPlan, run_dir: Path):
    """(datamodule, module with the checkpoint's weights, checkpoint path)."""
    from cocodet.inference.checkpoint import load_weights, read_weights

    ckpt = resume_path(cfg, run_dir)
    checkpoint = read_weights(ckpt, bool(cfg.weights_only))  # refused before any dataset work
    datamodule = build_datamodule(cfg, plan, run_dir)
    module = build_module(cfg, datamodule)
    load_weights(module, ckpt, bool(cfg.weights_only), checkpoint)
    return datamodule, module, ckpt


def evaluate(cfg: DictConfig, plan: LoaderPlan, resources, run_dir: Path) -> dict:
    from cocodet.inference.evaluate import evaluate_checkpoint
    from cocodet.loader.diagnose import explained_loader_failures

    datamodule, module, ckpt = _with_weights(cfg, plan, run_dir)
    with explained_loader_failures(plan, shm_path=str(cfg.loader.shm_path)):
        return evaluate_checkpoint(build_trainer(cfg, run_dir), module, datamodule, ckpt, str(cfg.eval.split), run_dir)


def predict(cfg: DictConfig, plan: LoaderPlan, resources, run_dir: Path) -> dict:
    from cocodet.inference.predict import PredictSourceError, predict as predict_images
    from cocodet.loader.diagnose import explained_loader_failures

    datamodule, module, _ = _with_weights(cfg, plan, run_dir)
    if not cfg.predict.source:
        raise PredictSourceError("mode=predict needs predict.source=<image folder or file>")
    with explained_loader_failures(plan, shm_path=str(cfg.loader.shm_path)):
        return predict_images(module, datamodule, plan, source=str(cfg.predict.source),
                              score_threshold=float(cfg.predict.score_threshold), draw=bool(cfg.predict.draw),
                              on_bad_sample=str(cfg.dataset.on_bad_sample), batch_size=int(cfg.loader.batch_size),
                              run_dir=run_dir, device=device_of(cfg),
                              max_image_pixels=int(cfg.dataset.max_image_pixels))


def export(cfg: DictConfig, plan: LoaderPlan, resources, run_dir: Path) -> dict:
    from cocodet.inference.export import export as export_model

    datamodule, module, _ = _with_weights(cfg, plan, run_dir)
    return export_model(module, datamodule, fmt=str(cfg.export.format), model_name=str(cfg.model.detector.name),
                        run_dir=run_dir, opset=int(cfg.export.opset))
