"""mode=train: build the datamodule, the model and the Trainer, fit, summarise (design §2)."""

from __future__ import annotations


from cocodet.loader.plan_record import LoaderPlan
from cocodet.modes.wiring import build_datamodule, build_module, build_trainer, resume_path
from cocodet.run_spec.records import RunSpec


def train(spec: RunSpec, plan: LoaderPlan, resources) -> dict:
    from cocodet.models.checkpoint_file import load_checkpoint
    from cocodet.models.fit import fit, seed_model_init

    from cocodet.tracking.lightning_logger import CHECKPOINT_KEY
    from cocodet.tracking.trainer_hooks import prepare_tracking

    ckpt, weights_only = resume_path(spec), spec.weights_only
    # Refused in one line before Lightning loads it (as it will: with the same weights_only);
    # only the MLflow run id it carries is kept, not its tensors, while the model is built.
    resumed_run_id = load_checkpoint(ckpt, weights_only).get(CHECKPOINT_KEY) if ckpt else None
    datamodule = build_datamodule(spec, plan)
    seed_model_init(spec.seed)
    module = build_module(spec, datamodule)
    trainer = build_trainer(spec)
    prepare_tracking(trainer, spec.config, plan, resumed_run_id)
    return fit(trainer, module, datamodule, plan, ckpt_path=ckpt, weights_only=weights_only,
               shm_path=spec.loader.shm_path, ranks=spec.ranks)
