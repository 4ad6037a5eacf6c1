"""Where checkpoints live: ``checkpoint.dir``, a local folder or an ``s3://`` bucket folder, and
how a checkpoint file is written there, found, and read back whole.

A bucket folder (design §7.5):
- each checkpoint is one object, written whole or not at all (``storage/objects.py``), its
  SHA-256 recorded in the object's own metadata by the same upload, and checked when it is
  read: a changed byte is a :class:`CheckpointDigestError`;
- an upload is retried with the dataset's rules (``dataset.remote``: per-request timeout,
  retries, give-up clock); a store that stays down is a :class:`CheckpointStoreDown`, which
  names the newest checkpoint written whole;
- the run's small records (summary, unsent MLflow calls, bad samples, the attempts ledger) are
  copied beside the checkpoints, so a machine that is gone leaves them too.

A local folder keeps the writer's temporary-file-and-rename (``models/checkpoint_io.py``); the
digest there is the rename's atomicity, not a record.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from cocodet.errors import UserError
from cocodet.storage import objects
from cocodet.storage.errors import StoreDown, StoreError
from cocodet.storage.session import RESUME_ADVICE, configure_checkpoints, down_for
from cocodet.storage.store import read_bytes
from cocodet.storage.urls import is_remote, join

log = logging.getLogger(__name__)
STORE = "checkpoint"  # storage/session.py's name for the checkpoint folder's store options
DIGEST_KEY = "sha256"  # the object metadata key (x-amz-meta-sha256)
WRITTEN_KEY = "written"  # when the upload began, in seconds since the epoch (to the microsecond)
SUFFIX = ".ckpt"


class CheckpointDigestError(UserError):
    """A checkpoint whose bytes are not the ones recorded when it was written."""


class CheckpointStoreDown(StoreDown):
    """The checkpoint folder's store failed an upload for ``give_up_s``: the run ends ``store_down``."""


@dataclass
class CheckpointFolder:
    """``checkpoint.dir`` and its store's options; ``part_bytes``: an upload's part."""

    dir: str
    options: dict = field(default_factory=dict)
    part_bytes: int = 64 * 2**20
    started: float = field(default_factory=time.time)  # uploads begun before this were left by killed writers

    @property
    def remote(self) -> bool:
        return is_remote(self.dir)


_folder = CheckpointFolder(dir="checkpoints")
_kept: tuple[str, bytes] | None = None  # (URL, bytes) of an object read with keep=True, until read again


def configure(folder: CheckpointFolder) -> None:
    """The checkpoint folder this process writes to and resumes from (``app.py``, every mode)."""
    global _folder
    if folder.remote and not folder.dir.startswith(("s3://", "s3a://")):
        raise UserError(
            f"checkpoint.dir={folder.dir}: only s3:// buckets (AWS or S3-compatible) hold checkpoints; "
            "use an s3:// URL or a local folder"
        )
    _folder = folder
    configure_checkpoints(folder.options)  # also for a ckpt_path in a bucket


def digest(data) -> str:
    return hashlib.sha256(memoryview(data)).hexdigest()


def write(url: str, data) -> None:
    """``data``, a serialised checkpoint, as the object at ``url``, with its digest."""
    metadata = {DIGEST_KEY: digest(data), WRITTEN_KEY: f"{time.time():.6f}"}
    objects.put_whole(url, data, metadata, STORE, _folder.part_bytes)


def store_down(error: StoreDown, newest_whole: str | None) -> CheckpointStoreDown:
    """The error that ends a run whose checkpoint upload the store failed for ``give_up_s``,
    naming the newest checkpoint written whole (None: none was)."""
    newest = (
        f"the newest checkpoint written whole is {newest_whole}: resume with the same command plus ckpt_path=last"
        if newest_whole
        else "no checkpoint of this run was written whole: start again with the same command"
    )
    what = str(error).replace(RESUME_ADVICE, "").rstrip(". ")
    return CheckpointStoreDown(f"checkpoint.dir {_folder.dir}: {what}; {newest} once the store answers")


def read(path: str, keep: bool = False) -> bytes:
    """Every byte of the checkpoint object at ``path``, checked against the digest its upload
    recorded (a local file is torch.load's to read). FileNotFoundError when there is none;
    :class:`CheckpointDigestError` when the bytes changed since. ``keep``: an object read before
    the run is built (for the groups it was trained with) is kept for the next read of it, the
    weights', which takes it."""
    global _kept
    if _kept is not None and _kept[0] == path:
        data, _kept = _kept[1], None
        return data
    data, metadata = objects.get_whole(path, STORE)
    recorded = metadata.get(DIGEST_KEY)
    if recorded is not None and recorded != digest(data):
        raise CheckpointDigestError(
            f"{path} is not the checkpoint that was written: its {len(data):,} bytes have SHA-256 "
            f"{digest(data)[:16]}..., the upload recorded {recorded[:16]}... (changed or damaged in the store); "
            "pass another checkpoint, or ckpt_path=last for the newest whole one"
        )
    if keep:
        _kept = (path, data)
    return data


def remove(path: str) -> None:
    objects.delete(path, STORE)


def exists(path: str) -> bool:
    if not is_remote(path):
        return Path(path).is_file()
    return objects.head(path, STORE) is not None


def modified(path: str) -> float:
    if not is_remote(path):
        return Path(path).stat().st_mtime
    found = objects.head(path, STORE)
    if not found:
        return 0.0
    return float(found["metadata"].get(WRITTEN_KEY) or found["modified"])


def store_answers() -> bool:
    """False while the give-up clock runs (a request failed and none succeeded since)."""
    return down_for() == 0.0


def checkpoints_in(dir_: str) -> list[tuple[str, float]]:
    """(path, when written) of every checkpoint in the folder ``dir_``. In a bucket, when its
    upload began, from its metadata (one HEAD each: the listing's times are whole seconds, and
    a SIGTERM's resume.ckpt may follow last.ckpt within one)."""
    if not is_remote(dir_):
        found = list(Path(dir_).glob(f"*{SUFFIX}")) if Path(dir_).is_dir() else []
        return [(str(p), p.stat().st_mtime) for p in found]
    return [(url, modified(url)) for url in objects.listed(dir_, STORE) if url.endswith(SUFFIX)]


def abort_left_uploads() -> None:
    """Abort what writers killed mid-upload left in the checkpoint folder (rank 0, at a run's start)."""
    if not _folder.remote:
        return
    try:
        aborted = objects.abort_incomplete(_folder.dir, STORE, _folder.started)
    except (StoreError, FileNotFoundError) as e:  # FileNotFoundError: an upload aborted meanwhile
        log.warning("%s: could not look for incomplete uploads (%s)", _folder.dir, e)
        return
    if aborted:
        log.info("%s: aborted %d incomplete upload(s) left by a writer that was killed", _folder.dir, aborted)


def copy_record(file: Path, dir_: str | None) -> None:
    """A copy of the run's record ``file`` in its checkpoint folder ``dir_``, when that is
    elsewhere than the run's folder (a bucket, another disk); never stops the run."""
    if dir_ is None or not file.is_file() or not _elsewhere(file, dir_):
        return
    if is_remote(dir_) and not store_answers():
        log.warning("%s not copied to %s: the store is not answering", file.name, dir_)
        return
    target = join(dir_, file.name)
    try:
        if is_remote(target):
            data = read_bytes(file)
            objects.put_whole(target, data, {DIGEST_KEY: digest(data)}, STORE, _folder.part_bytes)
        else:
            os.makedirs(dir_, exist_ok=True)
            tmp = f"{target}.tmp-{os.getpid()}"
            Path(tmp).write_bytes(read_bytes(file))
            os.replace(tmp, target)
    except (OSError, StoreError) as e:
        log.warning("%s not copied to %s (%s)", file.name, dir_, e)


def _elsewhere(file: Path, dir_: str) -> bool:
    """Whether the checkpoint folder ``dir_`` is outside the run folder that holds ``file``."""
    if is_remote(dir_):
        return True
    run, checkpoints = file.parent.resolve(), Path(dir_).resolve()
    return checkpoints != run and run not in checkpoints.parents


def restore_record(file: Path, dir_: str | None) -> None:
    """The copy of the run's record ``file`` kept in its checkpoint folder ``dir_``, written to
    ``file``, if there is one (a run resumed on a machine that never held the run's folder)."""
    if dir_ is None or not _elsewhere(file, dir_) or (is_remote(dir_) and not store_answers()):
        return
    source = join(dir_, file.name)
    try:
        data = objects.get_whole(source, STORE)[0] if is_remote(source) else read_bytes(source)
    except FileNotFoundError:
        return
    except (OSError, StoreError) as e:
        log.warning("%s not read from %s (%s)", file.name, dir_, e)
        return
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_bytes(data)
