"""A run's optimizer and learning-rate schedule, built from their config partials and the
trainer's run length (design §14): the rate scaled linearly to the run's global batch
(``model.lr_scaling``), the schedule sized to the run, its peak rate and where its warm-up ends."""

from __future__ import annotations

import inspect
import logging
import math
from dataclasses import dataclass, field
from functools import partial

import torch

from cocodet.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass
class Optimization:
    optimizer: torch.optim.Optimizer
    scheduler: object | None = None
    warmup_end: int = 0  # the optimizer step at which the schedule's warm-up ends
    record: dict = field(default_factory=dict)  # global_batch and effective_lr (the peak rate), for summary.json


def build_optimization(
    params,
    optimizer_factory: partial,
    scheduler_factory: partial | None,
    interval: str,
    trainer,
    lr_scaling: dict | None,
) -> Optimization:
    """``trainer``: the run's (None outside one: no scaling, no schedule, nothing to size it by)."""
    record, scaled = scaled_lr(trainer, lr_scaling)
    optimizer = optimizer_factory(params=params, **scaled)
    refuse_clipping_a_fused_optimizer(optimizer, trainer)
    record["effective_lr"] = optimizer.param_groups[0]["lr"]
    if scheduler_factory is None or trainer is None:
        return Optimization(optimizer, record=record)
    kwargs = {}
    accepted = inspect.signature(getattr(scheduler_factory, "func", scheduler_factory)).parameters
    given = getattr(scheduler_factory, "keywords", {})
    if "max_lr" in accepted:
        # OneCycle sets the rate itself, peaking at max_lr (the config's is the unscaled
        # optimizer.lr): the scaled rate is its peak, and that peak is the effective rate.
        if scaled:
            kwargs["max_lr"] = scaled["lr"]
        record["effective_lr"] = float(kwargs.get("max_lr", given.get("max_lr", record["effective_lr"])))
    steps, epochs = int(trainer.estimated_stepping_batches), int(trainer.max_epochs or 1)
    sized = {
        "total_steps": epochs if interval == "epoch" else steps,
        "T_max": epochs if interval == "epoch" else steps,
        "epochs": epochs,
        "steps_per_epoch": -(-steps // epochs),
    }
    kwargs.update({name: value for name, value in sized.items() if name in accepted and name not in given})
    scheduler = scheduler_factory(optimizer, **kwargs)
    defaults = {n: p.default for n, p in accepted.items() if p.default is not inspect.Parameter.empty}
    return Optimization(optimizer, scheduler, warmup_end_step(scheduler, {**defaults, **given, **kwargs}), record)


def scaled_lr(trainer, lr_scaling: dict | None) -> tuple[dict, dict]:
    """(``{"global_batch": ...}``, ``{"lr": ...}`` scaled to this run's global batch, logged; {}
    without ``lr_scaling``): devices x nodes x loader.batch_size x accumulate_grad_batches."""
    if trainer is None:
        return {}, {}
    batch = int(getattr(trainer.datamodule, "batch_size", 0) or 0) if trainer.datamodule is not None else 0
    accumulate = int(trainer.accumulate_grad_batches)
    global_batch = trainer.world_size * batch * accumulate
    if not lr_scaling or not batch:
        return {"global_batch": global_batch}, {}
    from cocodet.models.reference_schedule import scaled_lr as linear

    ref_lr, ref_batch = float(lr_scaling["reference_lr"]), int(lr_scaling["reference_batch"])
    lr = linear(ref_lr, ref_batch, global_batch)
    log.info(
        "learning rate scaled linearly: the reference's %g at global batch %d -> %g at this run's global batch "
        "%d (%d rank(s) x loader.batch_size %d x accumulate_grad_batches %d)",
        ref_lr,
        ref_batch,
        lr,
        global_batch,
        trainer.world_size,
        batch,
        accumulate,
    )
    return {"global_batch": global_batch}, {"lr": lr}


def refuse_clipping_a_fused_optimizer(optimizer: torch.optim.Optimizer, trainer) -> None:
    """Under the fp16 GradScaler a fused optimizer unscales its gradients inside its own step,
    after Lightning would clip them, so Lightning stops the first step with a traceback: refuse
    the combination here, before the first batch, in one line."""
    scaler = getattr(getattr(trainer, "precision_plugin", None), "scaler", None)
    clip = float(getattr(trainer, "gradient_clip_val", None) or 0.0)
    if scaler is None or clip <= 0:
        return
    from lightning.pytorch.plugins.precision.amp import _optimizer_handles_unscaling

    if _optimizer_handles_unscaling(optimizer):
        raise ConfigError(
            f"{type(optimizer).__name__} with fused=true unscales its fp16 gradients inside its own step, so they "
            f"cannot be clipped first (trainer.gradient_clip_val={clip:g}, trainer.precision="
            f"{trainer.precision}): set trainer.gradient_clip_val=0 to keep the fused optimizer, or drop "
            "model.optimizer.fused"
        )


def warmup_end_step(scheduler, factory_keywords: dict) -> int:
    """The optimizer step at which the schedule cocodet built ends its warm-up, from what it
    was built with: OneCycle's ``pct_start`` share of ``total_steps`` (its rise), the reference
    schedule's own ``warmup_steps``, a LinearLR ramp's ``total_iters``; 0 for a schedule
    without one. ``factory_keywords``: the arguments the scheduler was built with (config and
    run length), with the class's defaults for those left out."""
    if "pct_start" in factory_keywords and "total_steps" in factory_keywords:
        # OneCycle peaks at step pct_start x total_steps - 1 (torch's phase end).
        return int(math.ceil(float(factory_keywords["pct_start"]) * int(factory_keywords["total_steps"]) - 1))
    if hasattr(scheduler, "warmup_steps"):
        return int(scheduler.warmup_steps)
    if isinstance(scheduler, torch.optim.lr_scheduler.LinearLR):
        return int(scheduler.total_iters)
    return 0
