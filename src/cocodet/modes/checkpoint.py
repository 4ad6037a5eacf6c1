"""mode=eval, predict and export: the configured model with a checkpoint's weights."""

from __future__ import annotations

from cocodet.loader.plan.records import LoaderPlan
from cocodet.modes.last_run import resume_checkpoint
from cocodet.modes.wiring import build_datamodule, build_module, build_trainer
from cocodet.run_spec.records import RunSpec


def _with_weights(spec: RunSpec, plan: LoaderPlan):
    """(datamodule, module with the checkpoint's weights, checkpoint path)."""
    from cocodet.inference.checkpoint import load_weights, needs_checkpoint

    ckpt, checkpoint = resume_checkpoint(spec)  # read, and refused, before any dataset work
    if not ckpt:  # none given, or last_if_any found none
        needs_checkpoint()
    datamodule = build_datamodule(spec, plan)
    module = build_module(spec, datamodule)
    load_weights(module, ckpt, spec.weights_only, checkpoint)
    return datamodule, module, ckpt


def evaluate(spec: RunSpec, plan: LoaderPlan, resources) -> dict:
    from cocodet.inference.evaluate import evaluate_checkpoint
    from cocodet.loader.failures.diagnose import explained_loader_failures

    datamodule, module, ckpt = _with_weights(spec, plan)
    with explained_loader_failures(plan, shm_path=spec.loader.shm_path):
        return evaluate_checkpoint(
            build_trainer(spec), module, datamodule, ckpt, str(spec.settings("eval")["split"]), spec.run_dir
        )


def predict(spec: RunSpec, plan: LoaderPlan, resources) -> dict:
    from cocodet.inference.predict import PredictSourceError
    from cocodet.inference.predict import predict as predict_images
    from cocodet.loader.failures.diagnose import explained_loader_failures

    datamodule, module, _ = _with_weights(spec, plan)
    settings = spec.settings("predict")
    if not settings.get("source"):
        raise PredictSourceError("mode=predict needs predict.source=<image folder or file>")
    with explained_loader_failures(plan, shm_path=spec.loader.shm_path):
        return predict_images(
            module,
            datamodule,
            plan,
            source=str(settings["source"]),
            score_threshold=float(settings["score_threshold"]),
            draw=bool(settings["draw"]),
            on_bad_sample=str(spec.dataset.get("on_bad_sample", "raise")),
            batch_size=spec.loader.batches.batch_size,
            run_dir=spec.run_dir,
            device=spec.trainer.device,
            max_image_pixels=int(spec.dataset.get("max_image_pixels")),
        )


def export(spec: RunSpec, plan: LoaderPlan, resources) -> dict:
    from cocodet.inference.export import export as export_model

    datamodule, module, _ = _with_weights(spec, plan)
    settings = spec.settings("export")
    return export_model(
        module,
        datamodule,
        fmt=str(settings["format"]),
        model_name=spec.model.name,
        run_dir=spec.run_dir,
        opset=int(settings["opset"]),
    )
