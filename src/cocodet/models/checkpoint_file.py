"""Reading a checkpoint file without trusting it (design §8.2).

Checkpoints load with ``torch.load(weights_only=True)`` in every mode: tensors and plain
containers only, so a file from a colleague or a model hub cannot run code. Everything cocodet
writes loads that way (the datamodule and callback state are plain types). A file that asks
for more is refused in one line that names the global it wanted and the explicit opt-in; a
file that is not a checkpoint at all gets one line too. A checkpoint in a bucket is read in
one GET and checked against the digest its upload recorded (``models/checkpoint_store.py``).
"""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path

import torch

from cocodet.errors import UserError
from cocodet.models import checkpoint_store
from cocodet.storage.urls import is_remote


class CheckpointError(UserError):
    """ckpt_path missing, unreadable, refused as untrusted, or not a checkpoint of this kind of model."""


def load_checkpoint(path: str, weights_only: bool, option: str = "ckpt_path") -> dict:
    """The checkpoint at ``path`` as a dict, loaded on the CPU; CheckpointError (one line) otherwise.
    ``option``: the setting that named the file, for the messages."""
    source = path
    if is_remote(path):
        try:
            source = io.BytesIO(checkpoint_store.read(path))  # refused here if its digest differs
        except FileNotFoundError:
            raise CheckpointError(f"{option}={path}: there is no such object") from None
    elif not Path(path).is_file():
        raise CheckpointError(f"{option}={path} is not a file")
    try:
        checkpoint = torch.load(source, map_location="cpu", weights_only=weights_only)
    except pickle.UnpicklingError as e:
        text = str(e)
        if weights_only and "Weights only load failed" in text:
            wanted = re.search(r"GLOBAL ([\w.]+)", text)
            what = f"the global {wanted.group(1)}" if wanted else "objects beyond tensors and plain containers"
            raise CheckpointError(
                f"{path} was refused: loading it needs {what}, which could run code. If you trust "
                "the file, load it with weights_only=false"
            ) from None
        raise CheckpointError(f"{path} is not a torch checkpoint ({_first_line(e)})") from None
    except Exception as e:  # noqa: BLE001 - junk bytes fail anywhere in torch's readers (KeyError, IndexError, ...)
        raise CheckpointError(f"{path} is not a torch checkpoint ({type(e).__name__}: {_first_line(e)})") from None
    if not isinstance(checkpoint, dict):
        raise CheckpointError(
            f"{path} is not a training checkpoint (it holds a {type(checkpoint).__name__}, "
            "not a dict with a state_dict)"
        )
    return checkpoint


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:200]
