"""EMA weights (``model.ema.decay``; design §12): Lightning's weight-averaging callback with
the usual warm-up ramp, updated only after steps that changed the weights.

Lightning's ``WeightAveraging`` already does what the rest of cocodet needs: validation (so
``best``) runs on the average, every checkpoint's ``state_dict`` holds the average (so
``mode=eval|predict|export``, which read ``state_dict``, use it without knowing), the raw
weights travel as ``current_model_state`` and a resume restores both. What it lacks, added
here: the ramp ``decay_t = min(decay, (1 + n) / (10 + n))`` after ``n`` updates (timm's
``ModelEmaV3`` and Ultralytics ramp the same way, so early averages are not dominated by the
random initial weights), and no update after a step the health check skipped.
"""

from __future__ import annotations

import torch
from lightning.pytorch.callbacks.weight_averaging import WeightAveraging


def ramped_ema(decay: float):
    """A ``multi_avg_fn`` for ``torch.optim.swa_utils.AveragedModel``: every tensor at once,
    one ramped decay per update."""

    @torch.no_grad()
    def update(averaged: list[torch.Tensor], current: list[torch.Tensor], num_averaged: torch.Tensor) -> None:
        n = float(num_averaged)
        weight = 1.0 - min(decay, (1.0 + n) / (10.0 + n))
        floats = [(a, c) for a, c in zip(averaged, current) if a.is_floating_point()]
        if floats:
            torch._foreach_lerp_([a for a, _ in floats], [c for _, c in floats], weight)
        for a, c in zip(averaged, current):  # counters (BatchNorm's num_batches_tracked) follow the model
            if not a.is_floating_point():
                a.copy_(c)

    return update


class EMAWeights(WeightAveraging):
    def __init__(self, decay: float):
        super().__init__(use_buffers=True, multi_avg_fn=ramped_ema(decay))
        self._module = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._module = pl_module
        super().setup(trainer, pl_module, stage)

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        health = getattr(self._module, "health", None)
        return step_idx is not None and not (health is not None and health.last_step_skipped)
