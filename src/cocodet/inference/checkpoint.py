"""Load a training checkpoint's weights into a freshly built DetectorModule."""

from __future__ import annotations

import torch

from cocodet.models.checkpoint_file import CheckpointError, load_checkpoint


def read_weights(ckpt_path: str | None, weights_only: bool) -> dict:
    """The checkpoint a mode that uses weights needs (one line and exit 2 when there is none,
    or when it is refused)."""
    if not ckpt_path:
        raise CheckpointError("this mode needs a checkpoint: add ckpt_path=<run>/checkpoints/last.ckpt "
                              "(or ckpt_path=last for the newest run's)")
    return load_checkpoint(ckpt_path, weights_only)


def load_weights(module: torch.nn.Module, ckpt_path: str | None, weights_only: bool,
                 checkpoint: dict | None = None) -> dict:
    """Copy the checkpoint's ``state_dict`` into ``module`` (``checkpoint``: already read from
    ``ckpt_path``); return the checkpoint."""
    if checkpoint is None:
        checkpoint = read_weights(ckpt_path, weights_only)
    try:
        module.load_state_dict(checkpoint["state_dict"])
    except (KeyError, RuntimeError) as e:
        raise CheckpointError(f"{ckpt_path} does not fit the configured model ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:300]}); pass the model=... and dataset the run was "
                              "trained with") from e
    return checkpoint
