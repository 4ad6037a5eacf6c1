"""The flat COCO index, cached on disk: built once per annotation file, then memory-mapped.

At COCO 2017 scale, parsing the 450-620 MB instances JSON takes tens of seconds and
gigabytes on every start (every run, every sweep job, every DDP rank). The index the
loader needs is a few flat arrays; they are written once as ``.npy`` files and opened with
``mmap_mode="r"``, so a second start reads only what it touches and DataLoader workers
share the same page-cache pages instead of holding copies.

Key: the annotation file's size, mtime and SHA-256, the resolved image root, ``keep_empty``
and ``INDEX_FORMAT``. A build is written to a temporary folder and renamed into place
under an exclusive ``flock``, so concurrent ranks and sweep jobs build it once and never
read a half-written index.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from cocodet.data.coco import CocoIndex, build_index

log = logging.getLogger(__name__)
INDEX_FORMAT = 2  # bump when CocoIndex's fields or their meaning change (2: absolute image paths)
ARRAYS = ("image_ids", "sizes", "paths", "box_offsets", "boxes", "labels", "category_ids", "problems")


def index_key(image_root: Path, ann_file: Path, keep_empty: bool) -> str:
    """What the cached index depends on, hashed."""
    st = ann_file.stat()
    content = hashlib.sha256()
    with open(ann_file, "rb") as f:
        for block in iter(lambda: f.read(16 << 20), b""):
            content.update(block)
    parts = [str(INDEX_FORMAT), str(st.st_size), str(st.st_mtime_ns), content.hexdigest(),
             os.path.realpath(image_root), str(bool(keep_empty))]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def cached_index(image_root: str | os.PathLike, ann_file: str | os.PathLike, keep_empty: bool,
                 cache_dir: str | os.PathLike | None) -> CocoIndex:
    """The index of ``ann_file``: from ``cache_dir`` when built before, else built and stored there.

    ``cache_dir=None`` builds in memory every time (nothing written).
    """
    image_root, ann_file = Path(image_root), Path(ann_file)
    if cache_dir is None or not ann_file.is_file() or not image_root.is_dir():
        return build_index(image_root, ann_file, keep_empty=keep_empty)  # build_index names what is missing
    cache = Path(os.path.expanduser(str(cache_dir)))
    cache.mkdir(parents=True, exist_ok=True)
    folder = cache / f"index-{ann_file.stem}-{index_key(image_root, ann_file, keep_empty)}"

    def build() -> None:
        _write(build_index(image_root, ann_file, keep_empty=keep_empty), folder)
        log.info("cached the index of %s in %s", ann_file, folder)

    build_once(folder, build)
    return _read(folder)


def build_once(folder: Path, build: Callable[[], None]) -> None:
    """Run ``build`` (which writes ``folder/meta.json`` last) unless it is there: under an
    exclusive flock, so concurrent ranks and sweep jobs build once and the others wait."""
    if (folder / "meta.json").is_file():
        return
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "meta.json").is_file():
            build()


def _write(index: CocoIndex, folder: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp-", dir=folder.parent))
    try:
        for name in ARRAYS:
            np.save(tmp / f"{name}.npy", getattr(index, name), allow_pickle=False)
        meta = {"category_names": index.category_names, "ann_file": index.ann_file, "dropped": index.dropped,
                "format": INDEX_FORMAT}
        (tmp / "meta.json").write_text(json.dumps(meta))  # written last: its presence marks a complete index
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _read(folder: Path) -> CocoIndex:
    meta = json.loads((folder / "meta.json").read_text())
    arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r", allow_pickle=False) for name in ARRAYS}
    return CocoIndex(**arrays, category_names=meta["category_names"], ann_file=meta["ann_file"],
                     dropped=meta["dropped"])
