"""The model as mode=bench's consumer: the configured detector's training step without a Trainer,
and batches preloaded onto the device (so the model alone is timed)."""

from __future__ import annotations

from typing import Callable

import torch

from cocodet.loader.flat_batch import FlatBatch, restore, to_device


def model_step(module, device: torch.device, precision: str) -> Callable:
    """The configured DetectorModule's detector and ``configure_optimizers`` (restore, forward
    with the training losses, backward, optimizer step) on a batch already on ``device``, under
    the run's mixed precision; without a Trainer, so the loader is what the bench measures."""
    module = module.to(device)
    module.train()
    optimizers = module.configure_optimizers()
    optimizer = optimizers["optimizer"] if isinstance(optimizers, dict) else optimizers
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    autocast = device.type == "cuda" and dtype is not None
    scaler = torch.amp.GradScaler("cuda", enabled=autocast and dtype == torch.float16)

    def step(batch: FlatBatch) -> None:
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=autocast):
            loss = sum(module.model(*restore(batch)).values())
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    return step


class PreloadedBatches(list):
    """Batches already on the device, measured as a loader is (its epochs are the same list)."""

    def set_epoch(self, epoch: int) -> None:
        pass


def preloaded(loader, device: torch.device, count: int) -> PreloadedBatches:
    """``count`` batches from ``loader`` (cycling its epochs), already on ``device``."""
    batches, epoch = PreloadedBatches(), 0
    while len(batches) < count:
        loader.set_epoch(epoch)
        for batch in loader:
            batches.append(to_device(batch, device))
            if len(batches) == count:
                break
        epoch += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return batches
