"""Checkpoints written whole or not at all: a full disk never costs the previous one.

Lightning's own writer opens the target for writing (or, in an fsspec transaction, moves a
file from the system's temp folder onto it), so a disk that fills mid-save can leave
``last.ckpt`` truncated: the one file a resume needs. Here the checkpoint goes to a temporary
file beside the target, is flushed to disk, and only then renamed over it (one atomic rename
on the same filesystem). On ENOSPC the temporary file is removed and :class:`DiskFull` names the
folder and its free space. A bucket folder gets one whole object with its digest
(``models/checkpoint_store.py``).
"""

from __future__ import annotations

import errno
import io
import logging
import os
import shutil
from pathlib import Path

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from cocodet.errors import DiskFull
from cocodet.models import checkpoint_store
from cocodet.storage.errors import StoreDown
from cocodet.storage.urls import is_remote
from cocodet.units import mib

FULL = (errno.ENOSPC, errno.EDQUOT)
log = logging.getLogger(__name__)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Also the record of what this run's checkpoints hold: ``written`` (the newest file
    written, and its step) and ``refused`` (the newest state refused since, with its
    non-finite tensors), which the end of fit reads to tell a usable run from one that only
    completed (``modes/train.py``); ``whole``: every file this run wrote whole and has not
    removed, oldest first (a best checkpoint whose successor was refused or did not fit is
    still one of them, though its callback no longer names it)."""

    def __init__(self):
        super().__init__()
        self.written: tuple[str, int] | None = None
        self.refused: dict | None = None
        self.whole: list[str] = []
        self._read: tuple[str, dict] | None = None  # a checkpoint the run already read, for Lightning's restore
        self.resumed_from: str | None = None  # the checkpoint this run resumed (whole: it was read)

    def hand_over(self, path, checkpoint: dict) -> None:
        """``checkpoint`` was read from ``path`` already: Lightning's load of that path takes it
        (once) instead of reading the file again."""
        self._read = (str(path), checkpoint)
        self.resumed_from = str(path)

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict:
        if self._read is not None and self._read[0] == str(path):
            checkpoint, self._read = self._read[1], None
            return checkpoint
        self._read = None  # another file: the one handed over is never used
        if is_remote(str(path)):  # Lightning's reader would open it with a filesystem of its own
            data = checkpoint_store.read(str(path))
            return torch.load(io.BytesIO(data), map_location=map_location, weights_only=bool(weights_only))
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        # Every checkpoint passes here (epoch ends, best, every_n_steps, SIGTERM): a state with a
        # non-finite tensor (a BatchNorm statistic a NaN forward reached) is not written, so
        # the file a resume or mode=eval reads stays the last finite state (design §12).
        bad = nonfinite_tensors({k: checkpoint.get(k) for k in ("state_dict", "current_model_state")})
        if bad:
            log.warning(
                "not writing checkpoint %s: %d tensors are not finite (%s); the previous file stays",
                path,
                len(bad),
                ", ".join(bad[:3]) + (", ..." if len(bad) > 3 else ""),
            )
            self.refused = {"path": str(path), "step": checkpoint.get("global_step"), "tensors": bad}
            return
        try:
            self._write(checkpoint, path, storage_options)
        except StoreDown as e:  # the checkpoint folder's store: the run ends naming what is whole
            raise self.store_down(e) from None
        self.written, self.refused = (str(path), int(checkpoint.get("global_step") or 0)), None
        self.whole = [p for p in self.whole if p != str(path)] + [str(path)]

    def store_down(self, error: StoreDown) -> Exception:
        """The error that ends the run when the checkpoint folder's store is down: it names the
        newest checkpoint written whole (this run's, else the one it resumed)."""
        return checkpoint_store.store_down(error, self.whole[-1] if self.whole else self.resumed_from)

    def remove_checkpoint(self, path) -> None:
        # A ModelCheckpoint removes the file its new save replaced; when that save was refused
        # the old file is the last good state of its kind, so it stays.
        if self.refused is not None:
            log.warning("keeping checkpoint %s: the state that was to replace it was not finite", path)
            return
        if is_remote(str(path)):
            try:
                checkpoint_store.remove(str(path))
            except StoreDown as e:
                raise self.store_down(e) from None
        else:
            super().remove_checkpoint(path)
        self.whole = [p for p in self.whole if p != str(path)]

    def _write(self, checkpoint: dict, path, storage_options=None) -> None:
        if is_remote(str(path)):  # one whole object, its digest recorded by the same upload
            buffer = io.BytesIO()
            torch.save(checkpoint, buffer)
            return checkpoint_store.write(str(path), buffer.getbuffer())
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        try:
            # Serialised in memory first (as Lightning does): torch.save straight into a file
            # reports a failed write as a RuntimeError about zip offsets, without the errno.
            buffer = io.BytesIO()
            torch.save(checkpoint, buffer)
            with open(tmp, "wb") as f:
                f.write(buffer.getbuffer())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            if e.errno not in FULL:
                raise
            raise DiskFull(disk_full_message(target)) from None
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def disk_full_message(target: Path) -> str:
    usage = shutil.disk_usage(target.parent)
    kept = f"the previous {target.name} is intact" if target.exists() else f"no earlier {target.name} existed"
    return (
        f"no space left on device saving checkpoint {target.name} in {target.parent} ({mib(usage.free)} free "
        f"of {mib(usage.total)}); {kept}. Free space there or point the checkpoint callbacks' dirpath "
        "(checkpoint.dir) at a larger disk or a bucket, then resume with ckpt_path=<that folder>/last.ckpt"
    )


def nonfinite_tensors(state: dict) -> list[str]:
    """The names of the floating tensors in a (nested) state that are not finite."""
    bad: list[str] = []

    def visit(prefix: str, value) -> None:
        if isinstance(value, torch.Tensor):
            if value.is_floating_point() and not bool(torch.isfinite(value).all()):
                bad.append(prefix)
        elif isinstance(value, dict):
            for k, v in value.items():
                visit(f"{prefix}.{k}" if prefix else str(k), v)

    visit("", state)
    return bad
