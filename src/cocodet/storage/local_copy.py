"""Local copies of single objects, for readers that need a path (the annotation parse, COCOeval):
kept in ``<cache_dir>/remote/`` keyed by URL and ETag, built as ``cache_files`` builds every cache."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from cocodet.storage.cache_files import build_atomically, build_once, ensure_folder
from cocodet.storage.errors import StoreError
from cocodet.storage.session import call, settings
from cocodet.storage.store import object_info


def local_copy(url: str, cache_dir: str | os.PathLike | None) -> Path:
    """A local file with the object's bytes, for readers that need a path (the annotation
    parse, COCOeval). Kept in ``<cache_dir>/remote/`` keyed by URL and ETag, so a second
    start makes one HEAD request and downloads nothing; ``cache_dir`` None: a temporary
    folder removed at exit. Built as ``cache_files`` builds every cache (atomic, verified)."""
    info = object_info(url)
    name = url.rstrip("/").rsplit("/", 1)[-1]
    if cache_dir is None:
        return _download(url, info, Path(_temporary_folder()) / name)
    base = Path(os.path.expanduser(str(cache_dir))) / "remote"
    ensure_folder(base)
    tag = re.sub(r"[^A-Za-z0-9]", "", info["etag"])[:40] or str(info["size"])
    folder = base / f"{hashlib.sha256(url.encode()).hexdigest()[:16]}-{tag}"
    build_once(
        folder,
        lambda: build_atomically(folder, lambda tmp: _fetched(url, info, tmp / name)),
        {"format": 1, "url": url, "etag": info["etag"]},
    )
    return folder / name


def _fetched(url: str, info: dict, path: Path) -> dict:
    _download(url, info, path)
    return {"format": 1, "url": url, "etag": info["etag"]}


def _download(url: str, info: dict, path: Path) -> Path:
    # A large file may take longer than one timeout: allow 1 MB/s on top of it.
    data = call(url, "GetObject", "cat_file", url, deadline=settings().timeout_s + info["size"] / 1e6)
    if len(data) != info["size"]:
        raise StoreError(
            f"{url}: read {len(data)} bytes, the store lists {info['size']}; the object changed "
            "while it was read, start again"
        )
    path.write_bytes(data)
    return path


def _temporary_folder() -> str:
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="cocodet-remote-")
    atexit.register(shutil.rmtree, folder, True)
    return folder
