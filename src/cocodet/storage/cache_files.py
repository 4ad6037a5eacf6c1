"""Caches on disk that verify themselves (design §8.3), and the one atomic build both the index
and the pixel cache use.

A cache is a folder: data files, then ``meta.json`` written last, holding the format, the key,
the byte length of every file and a SHA-256 of every metadata array (``.npy``; the pixel data
itself is checked by its length only, so opening a cache stays cheap). It is built in a
temporary folder beside its final place and renamed into place under an exclusive ``flock``,
so concurrent ranks and sweep jobs build it once and never read a half-written one. A cache
that does not match on open (cut short by a full disk, flipped bytes, another format) is
logged with what is wrong and rebuilt; it is never read.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)
MANIFEST = "meta.json"
# Errors that say "this folder cannot be written", as opposed to a bug.
UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


class CacheUnwritable(OSError):
    """The cache folder holds no valid cache and cannot be written."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(16 << 20), b""):
            h.update(block)
    return h.hexdigest()


def build_atomically(folder: Path, write: Callable[[Path], dict]) -> None:
    """``write(tmp)`` fills a temporary folder and returns the manifest's own fields (format,
    key, ...); the manifest is completed with every file's length and every ``.npy``'s
    checksum, written last, and the folder renamed into place (replacing an invalid one).
    Whatever fails, the temporary folder is removed."""
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp-", dir=folder.parent))
    try:
        meta = write(tmp)
        meta["files"] = {
            p.name: {"bytes": p.stat().st_size, **({"sha256": _sha256(p)} if p.suffix == ".npy" else {})}
            for p in sorted(tmp.iterdir())
        }
        (tmp / MANIFEST).write_text(json.dumps(meta))
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def problem(folder: Path, expect: dict) -> str | None:
    """Why ``folder`` is not a valid cache with the ``expect``-ed manifest fields; None when it is."""
    try:
        meta = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return "no cache" if not folder.exists() else f"no {MANIFEST} (an unfinished build)"
    except (OSError, ValueError) as e:
        return f"unreadable {MANIFEST} ({e})"
    for key, value in expect.items():
        if meta.get(key) != value:
            return f"{key} is {meta.get(key)!r}, expected {value!r}"
    files = meta.get("files")
    if not isinstance(files, dict) or not files:
        return f"{MANIFEST} lists no files (an older cache format)"
    for name, want in files.items():
        path = folder / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{name} is missing"
        if size != want.get("bytes"):
            return f"{name} has {size} bytes, the manifest says {want.get('bytes')} (cut short?)"
        if "sha256" in want and _sha256(path) != want["sha256"]:
            return f"{name} does not match its checksum (changed on disk)"
    return None


def ensure_folder(folder: Path) -> None:
    """Create the cache folder; :class:`CacheUnwritable` when it cannot be (a read-only mount)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        if e.errno in UNWRITABLE:
            raise CacheUnwritable(e.errno, f"{folder} cannot be created ({e.strerror})") from e
        raise


def build_once(folder: Path, build: Callable[[], None], expect: dict) -> None:
    """Run ``build`` (which calls :func:`build_atomically`) unless ``folder`` holds a valid cache.
    Under an exclusive flock, so concurrent ranks and sweep jobs build once and the others
    wait. Raises :class:`CacheUnwritable` when a build is needed and the folder cannot be
    written (a valid cache on a read-only mount is read as it is)."""
    why = problem(folder, expect)
    if why is None:
        return
    try:
        lock = open(folder.parent / f"{folder.name}.lock", "w")
    except OSError as e:
        if e.errno in UNWRITABLE:
            raise CacheUnwritable(
                e.errno, f"{folder.parent} is not writable ({e.strerror}) and holds no valid cache ({why})"
            ) from e
        raise
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        why = problem(folder, expect)
        if why is None:
            return
        if folder.exists():
            log.warning("cache %s is not valid (%s): rebuilding it", folder, why)
        build()
