"""Load a training checkpoint's weights into a freshly built DetectorModule."""

from __future__ import annotations

from pathlib import Path

import torch

from cocodet.errors import UserError


class CheckpointError(UserError):
    """ckpt_path missing, unreadable, or not a checkpoint of this kind of model."""


def load_weights(module: torch.nn.Module, ckpt_path: str | None, weights_only: bool) -> dict:
    """Copy the checkpoint's ``state_dict`` into ``module``; return the checkpoint."""
    if not ckpt_path:
        raise CheckpointError("this mode needs a checkpoint: add ckpt_path=<run>/checkpoints/last.ckpt "
                              "(or ckpt_path=last for the newest run's)")
    if not Path(ckpt_path).is_file():
        raise CheckpointError(f"ckpt_path={ckpt_path} is not a file")
    checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=weights_only)
    try:
        module.load_state_dict(checkpoint["state_dict"])
    except (KeyError, RuntimeError) as e:
        raise CheckpointError(f"{ckpt_path} does not fit the configured model ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:300]}); pass the model=... and dataset the run was "
                              "trained with") from e
    return checkpoint
