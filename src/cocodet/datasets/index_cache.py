"""The flat COCO index, cached on disk: built once per annotation file, then memory-mapped.

At COCO 2017 scale, parsing the 450-620 MB instances JSON takes tens of seconds and
gigabytes on every start (every run, every sweep job, every DDP rank). The index the
loader needs is a few flat arrays; they are written once as ``.npy`` files and opened with
``mmap_mode="r"``, so a second start reads only what it touches and DataLoader workers
share the same page-cache pages instead of holding copies.

Key: the annotation file's size, mtime and SHA-256, the resolved image root, ``keep_empty``
and ``INDEX_FORMAT``. Built, verified and rebuilt as ``cache_files`` describes: a cache cut
short or changed on disk is rebuilt, never read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Callable

import numpy as np

from cocodet.datasets.index import CocoIndex, build_index
from cocodet.storage.cache_files import CacheUnwritable, build_atomically, build_once, ensure_folder
from cocodet.storage.store import is_dir
from cocodet.storage.urls import is_remote

log = logging.getLogger(__name__)
# Bump when CocoIndex's fields or their meaning change (2: absolute image paths; 3: a verified
# manifest; 4: non-finite boxes dropped).
INDEX_FORMAT = 4
ARRAYS = ("image_ids", "sizes", "paths", "box_offsets", "boxes", "labels", "category_ids", "problems")


def index_key(image_root: str | Path, ann_file: Path, keep_empty: bool) -> str:
    """What the cached index depends on, hashed (a remote image root: its URL)."""
    st = ann_file.stat()
    content = hashlib.sha256()
    with open(ann_file, "rb") as f:
        for block in iter(lambda: f.read(16 << 20), b""):
            content.update(block)
    parts = [
        str(INDEX_FORMAT),
        str(st.st_size),
        str(st.st_mtime_ns),
        content.hexdigest(),
        str(image_root) if is_remote(image_root) else os.path.realpath(image_root),
        str(keep_empty if keep_empty == "reference" else bool(keep_empty)),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def cached_index(
    image_root: str | os.PathLike, ann_file: str | os.PathLike, keep_empty: bool, cache_dir: str | os.PathLike | None
) -> CocoIndex:
    """The index of ``ann_file``: from ``cache_dir`` when built before (and valid), else built
    and stored there.

    ``cache_dir=None`` builds in memory every time (nothing written); so does a ``cache_dir``
    that cannot be written and holds no valid index, with a warning.
    """
    image_root, ann_file = str(image_root), Path(ann_file)
    build = lambda: build_index(image_root, ann_file, keep_empty=keep_empty)  # noqa: E731
    if cache_dir is None or not ann_file.is_file() or not is_dir(image_root):
        return build()  # build_index names what is missing
    key = index_key(image_root, ann_file, keep_empty)
    return through_cache(cache_dir, f"index-{ann_file.stem}-{key}", key, build, str(ann_file))


def through_cache(
    cache_dir: str | os.PathLike,
    name: str,
    key: str,
    build: Callable[[], CocoIndex],
    what: str,
    extra: Callable[[CocoIndex, Path], dict[str, str]] | None = None,
) -> CocoIndex:
    """The index cached as ``<cache_dir>/<name>``: read when valid, else ``build()``-t and stored
    (one build among concurrent ranks: ``storage/cache_files.py``). ``extra(index, tmp)`` writes more
    files beside the arrays and returns {index field: file name} to point at them (the YOLO
    ground truth). A cache folder that cannot be written: built in memory, with a warning."""
    cache = Path(os.path.expanduser(str(cache_dir)))
    folder = cache / name
    built = []

    def build_into() -> None:
        index = build()
        build_atomically(folder, lambda tmp: _write(index, tmp, key, folder, extra))
        built.append(True)
        log.info("built the index of %s and cached it in %s", what, folder)

    try:
        ensure_folder(cache)
        build_once(folder, build_into, {"format": INDEX_FORMAT, "key": key})
    except CacheUnwritable as e:
        log.warning(
            "dataset.cache_dir=%s: %s; indexing %s without a cache (every start reads it again). "
            "Point dataset.cache_dir at a writable folder to keep the index",
            cache_dir,
            e.strerror,
            what,
        )
        return build()
    if not built:
        log.info("read the cached index of %s from %s", what, folder)
    return _read(folder)


def _write(index: CocoIndex, tmp: Path, key: str, folder: Path, extra) -> dict:
    for name in ARRAYS:
        np.save(tmp / f"{name}.npy", getattr(index, name), allow_pickle=False)
    fields = {"ann_file": index.ann_file}
    if extra is not None:  # files written beside the arrays, named by where they will be
        fields.update({field: str(folder / file) for field, file in extra(index, tmp).items()})
    return {
        "category_names": index.category_names,
        "ann_file": fields["ann_file"],
        "dropped": index.dropped,
        "format": INDEX_FORMAT,
        "key": key,
    }


def _read(folder: Path) -> CocoIndex:
    meta = json.loads((folder / "meta.json").read_text())
    arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r", allow_pickle=False) for name in ARRAYS}
    return CocoIndex(
        **arrays, category_names=meta["category_names"], ann_file=meta["ann_file"], dropped=meta["dropped"]
    )
