"""torchvision's detection reference schedule (``references/detection/train.py`` and
``engine.py``) as one per-step ``LambdaLR``, and its linear learning-rate scaling rule.

- Warm-up, hard-coded in ``engine.train_one_epoch``, not a flag: in epoch 0 only, a
  ``LinearLR`` from ``warmup_factor`` (1/1000) of the rate over min(1000, iterations per
  epoch - 1) iterations, stepped every iteration.
- Then the main scheduler, stepped once per epoch: ``MultiStepLR`` (x ``gamma`` at each
  milestone epoch, ``--lr-steps``) or ``CosineAnnealingLR`` over the epochs
  (``--lr-scheduler cosineannealinglr``, no minimum).
- The two multiply, as the reference's two schedulers do on the same optimizer.
"""

from __future__ import annotations

import bisect
import math

import torch


class ReferenceSchedule(torch.optim.lr_scheduler.LambdaLR):
    """A ``LambdaLR`` that says where its warm-up ends (``warmup_steps``): the health checks
    judge predictions only after it."""

    def __init__(self, optimizer: torch.optim.Optimizer, factor, warmup_steps: int):
        self.warmup_steps = int(warmup_steps)
        super().__init__(optimizer, factor)


def reference_schedule(
    optimizer: torch.optim.Optimizer,
    steps_per_epoch: int,
    epochs: int,
    milestones: list[int] | None = None,
    gamma: float = 0.1,
    cosine: bool = False,
    warmup_factor: float = 1.0 / 1000,
    warmup_iters: int = 1000,
) -> ReferenceSchedule:
    """The reference's rate factor at each optimizer step (``scheduler_interval: step``)."""
    steps_per_epoch = max(1, int(steps_per_epoch))
    warm = min(int(warmup_iters), steps_per_epoch - 1)
    steps = sorted(int(m) for m in (milestones or []))

    def factor(step: int) -> float:
        epoch = step // steps_per_epoch
        warmup = 1.0
        if epoch == 0 and step < warm:
            warmup = warmup_factor + (1.0 - warmup_factor) * step / warm
        decay = (1 + math.cos(math.pi * epoch / epochs)) / 2 if cosine else gamma ** bisect.bisect_right(steps, epoch)
        return warmup * decay

    return ReferenceSchedule(optimizer, factor, warm)


def scaled_lr(reference_lr: float, reference_batch: int, global_batch: int) -> float:
    """The linear scaling rule: the reference's rate for its global batch, times this run's
    global batch over it (Goyal et al. 2017, as the references' commands assume)."""
    return float(reference_lr) * global_batch / int(reference_batch)


def lr_words(scaling: dict, batch: int, world: int, accumulate: int) -> str:
    """``model.lr_scaling`` at this run's global batch, in words (the plan's log; the module
    applies the same rule from the trainer's ranks, ``models/optimization.py``)."""
    global_batch = world * batch * accumulate
    lr = scaled_lr(scaling["reference_lr"], scaling["reference_batch"], global_batch)
    return (
        f"the reference's {scaling['reference_lr']:g} at global batch {scaling['reference_batch']} -> {lr:g} at "
        f"this run's {global_batch} ({world} rank(s) x loader.batch_size {batch} x accumulate_grad_batches "
        f"{accumulate})"
    )
