"""Load a training checkpoint's weights into a freshly built DetectorModule."""

from __future__ import annotations

import torch

from cocodet.models.checkpoint_file import CheckpointError, load_checkpoint


def read_weights(ckpt_path: str | None, weights_only: bool) -> dict:
    """The checkpoint a mode that uses weights needs (one line and exit 2 when there is none,
    or when it is refused)."""
    if not ckpt_path:
        needs_checkpoint()
    return load_checkpoint(ckpt_path, weights_only)


def needs_checkpoint() -> None:
    raise CheckpointError(
        "this mode needs a checkpoint: add ckpt_path=<run>/checkpoints/last.ckpt "
        "(or ckpt_path=last for the newest run's)"
    )


def load_weights(
    module: torch.nn.Module, ckpt_path: str | None, weights_only: bool, checkpoint: dict | None = None
) -> dict:
    """Copy the checkpoint's ``state_dict`` into ``module`` (``checkpoint``: already read from
    ``ckpt_path``); return the checkpoint."""
    if checkpoint is None:
        checkpoint = read_weights(ckpt_path, weights_only)
    try:
        module.load_state_dict(checkpoint["state_dict"])
    except (KeyError, RuntimeError) as e:
        # The summary names the tensor and the shapes; torch's own text lists every tensor.
        raise CheckpointError(
            f"{ckpt_path} does not fit the configured model ({mismatch(checkpoint, module, e)}); "
            "pass the model=... and dataset the run was trained with"
        ) from None
    return checkpoint


# fcos_resnet18_fpn's width, read from the first FPN lateral convolution: (out, in, 1, 1).
_FPN_LATERAL = "model.backbone.fpn.inner_blocks.0.0.weight"


def mismatch(checkpoint: dict, module: torch.nn.Module, error: Exception) -> str:
    """What differs between the checkpoint's weights and the model the config builds, in a few
    words: the first tensor whose shape differs (and, for an FPN of another width, the override
    that builds it), else how many tensors are missing or unexpected."""
    saved, built = checkpoint.get("state_dict"), module.state_dict()
    if not isinstance(saved, dict):
        return f"{type(error).__name__}: the checkpoint holds no state_dict"
    missing, unexpected = sorted(built.keys() - saved.keys()), sorted(saved.keys() - built.keys())
    if missing or unexpected:  # another architecture
        return (
            f"{len(missing)} tensors missing, first {missing[:1]}; {len(unexpected)} unexpected, first {unexpected[:1]}"
        )
    shapes = [
        (k, tuple(saved[k].shape), tuple(v.shape))
        for k, v in built.items()
        if hasattr(saved[k], "shape") and tuple(saved[k].shape) != tuple(v.shape)
    ]
    if not shapes:
        return f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
    key, theirs, ours = shapes[0]
    words = f"{len(shapes)} tensors differ in shape, first {key}: {list(theirs)} saved, {list(ours)} configured"
    if key == _FPN_LATERAL:  # the same model at another width
        words += f"; it was trained with model.detector.fpn_channels={theirs[0]}"
    elif key.endswith("cls_logits.weight") or key.endswith("cls_score.weight"):
        words += "; it was trained on a dataset with another number of categories"
    return words
