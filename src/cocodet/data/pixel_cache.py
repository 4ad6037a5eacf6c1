"""``dataset.cache=ram|disk``: every image of a split at the working resolution, in one file.

The file holds each image exactly as :func:`~cocodet.images.read.load_resized` returns it
(reduced JPEG decode, then the one letterbox resize), back to back as uint8 HxWx3, with the
offsets, shapes and scales beside it. Workers and ranks open it with ``np.memmap``: the
pages live once in the host's page cache, whatever the number of processes reading them
(a per-worker dict would hold one copy per worker and start cold in each).

    disk  pages are read on first touch and the kernel may evict them (fits in free disk).
    ram   the same file, read through once at start so every page is resident (fits in
          free disk and in available memory; refused otherwise, with the numbers).

Key: the image files (path, size, mtime), the working resolution and ``PIXEL_FORMAT``.
Built, verified and rebuilt as ``cache_files`` describes: a ``pixels.u8`` cut short or offsets
changed on disk make it rebuild, never read. Images
that cannot be decoded are recorded with their reason and raise :class:`BadSampleError`
when read, exactly as the uncached path would.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from tqdm import tqdm

from cocodet import schema
from cocodet.datasets.index import CocoIndex
from cocodet.errors import BadSampleError, UserError
from cocodet.host import memory_available
from cocodet.images.header import DEFAULT_MAX_IMAGE_PIXELS
from cocodet.images.read import Source, clip_targets, load_resized
from cocodet.storage.cache_files import CacheUnwritable, build_atomically, build_once, ensure_folder
from cocodet.storage.store import file_stamps
from cocodet.units import MiB

log = logging.getLogger(__name__)
PIXEL_FORMAT = 2  # bump when load_resized's output changes (2: a verified manifest)


class CacheSpaceError(UserError):
    """The pixel cache would not fit where it has to live."""


def pixel_key(index: CocoIndex, size: int, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> str:
    """What the cached pixels depend on: every image file's path, size and mtime (an object's
    size and ETag, from one listing: ``storage.file_stamps``), the
    resolution, the pixel limit (which images are refused) and the format (the annotations
    only matter through the file list)."""
    h = hashlib.sha256(f"{PIXEL_FORMAT}\n{size}\n{max_pixels}\n".encode())
    for path, stamp in zip(index.paths, file_stamps(index.paths)):
        h.update(f"{path}\0{stamp}\n".encode())
    return h.hexdigest()[:24]


def estimated_bytes(index: CocoIndex, size: int) -> int:
    """Bytes of the pixel file, from the annotation's image sizes (size x size when unknown)."""
    hw = np.asarray(index.sizes, dtype=np.float64)
    long_side = np.maximum(hw.max(axis=1), 1)
    known = hw.min(axis=1) > 0
    scale = np.where(known, size / long_side, 1.0)
    h = np.where(known, np.maximum(1, np.round(hw[:, 0] * scale)), size)
    w = np.where(known, np.maximum(1, np.round(hw[:, 1] * scale)), size)
    return int((h * w * 3).sum())


def check_space(mode: str, need: int, folder: Path, split: str) -> None:
    """Refuse, with the numbers, a cache that would not fit on disk (or in memory for ram)."""
    free_disk = shutil.disk_usage(folder).free
    if need > free_disk * 0.9:
        raise CacheSpaceError(
            f"dataset.cache={mode}: the {split} pixel cache needs {need / MiB:.0f} MiB but "
            f"{folder} has {free_disk / MiB:.0f} MiB free. Point dataset.cache_dir at a larger "
            f"disk, lower dataset.image_size, or use dataset.cache=none"
        )
    if mode == "ram":
        available, source = memory_available()
        if need > available * 0.5:  # the rest is for workers, batches and the model
            raise CacheSpaceError(
                f"dataset.cache=ram: the {split} pixel cache needs {need / MiB:.0f} MiB resident "
                f"but only {available / MiB:.0f} MiB of memory is available ({source}; the cache may take "
                "half). Use dataset.cache=disk (pages read on demand) or dataset.cache=none"
            )


class PixelCache:
    """The images of one split at one resolution, memory-mapped read-only."""

    def __init__(self, folder: Path):
        self.folder = folder
        meta = json.loads((folder / "meta.json").read_text())
        self.size, self.count = meta["size"], meta["count"]
        self.offsets = np.load(folder / "offsets.npy")
        self.shapes = np.load(folder / "shapes.npy")
        self.orig_hw = np.load(folder / "orig_hw.npy")
        self.scales = np.load(folder / "scales.npy")
        self.errors = meta["errors"]  # str(k) -> reason
        self._pixels: np.memmap | None = None  # opened lazily in each process

    def __getstate__(self):  # a worker opens its own mapping of the same file
        return {**self.__dict__, "_pixels": None}

    @property
    def pixels(self) -> np.ndarray:
        if self._pixels is None:
            total = int(self.offsets[-1])
            self._pixels = (
                np.memmap(self.folder / "pixels.u8", dtype=np.uint8, mode="r", shape=(total,))
                if total
                else np.zeros(0, np.uint8)
            )
        return self._pixels

    def nbytes(self) -> int:
        return int(self.offsets[-1])

    def preload(self) -> None:
        """Read the whole file once so its pages are resident (``ram``)."""
        with open(self.folder / "pixels.u8", "rb") as f:
            while f.read(64 * MiB):
                pass

    def load(self, index: CocoIndex, k: int) -> Source:
        """Image k as load_resized would return it (a read-only view into the mapping)."""
        if str(k) in self.errors:
            raise BadSampleError(str(index.paths[k]) or "<outside root>", int(index.image_ids[k]), self.errors[str(k)])
        h, w = (int(x) for x in self.shapes[k])
        image = self.pixels[self.offsets[k] : self.offsets[k + 1]].reshape(h, w, 3)
        oh, ow = (int(x) for x in self.orig_hw[k])
        boxes, labels = clip_targets(index, k, oh, ow)
        scale = float(self.scales[k])
        return Source(image, boxes * np.float32(scale), labels, (oh, ow), scale)


def open_pixel_cache(
    index: CocoIndex,
    size: int,
    mode: str,
    cache_dir: str | os.PathLike,
    split: str,
    threads: int | None = None,
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
) -> PixelCache:
    """The split's pixel cache in ``cache_dir``: opened if built before (and valid), else checked
    for space, built (progress bar, ``threads`` decoding at once) and opened."""
    if schema.check("dataset.cache", mode) == "none":
        raise ValueError("dataset.cache=none has no pixel cache to open")
    cache = Path(os.path.expanduser(str(cache_dir)))
    key = pixel_key(index, size, max_pixels)
    folder = cache / f"pixels-{split}-{size}-{key}"

    def build() -> None:
        check_space(mode, estimated_bytes(index, size), cache, split)
        try:
            build_atomically(
                folder, lambda tmp: _build(index, size, tmp, split, threads or os.cpu_count() or 1, key, max_pixels)
            )
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            raise CacheSpaceError(
                f"dataset.cache={mode}: the disk filled while building the {split} pixel cache in "
                f"{cache} ({shutil.disk_usage(cache).free / MiB:.0f} MiB free now; the partial "
                "build was removed). Free space there, point dataset.cache_dir at a larger disk, "
                "or use dataset.cache=none"
            ) from None

    try:
        ensure_folder(cache)
        build_once(folder, build, {"format": PIXEL_FORMAT, "key": key, "size": size})
    except CacheUnwritable as e:
        raise CacheSpaceError(
            f"dataset.cache={mode}: dataset.cache_dir={cache_dir} cannot be written and holds no "
            f"valid {split} pixel cache ({e.strerror}). Point dataset.cache_dir at a writable "
            "folder, or use dataset.cache=none"
        ) from None
    pixel_cache = PixelCache(folder)
    if mode == "ram":
        pixel_cache.preload()
    log.info(
        "%s pixel cache (%s): %d images, %.1f MiB in %s",
        split,
        mode,
        pixel_cache.count,
        pixel_cache.nbytes() / MiB,
        folder,
    )
    return pixel_cache


def _build(index: CocoIndex, size: int, tmp: Path, split: str, threads: int, key: str, max_pixels: int) -> dict:
    """Decode and resize every image into ``tmp``; return the manifest's fields."""
    n = len(index)
    offsets = np.zeros(n + 1, np.int64)
    shapes = np.zeros((n, 2), np.int32)
    orig_hw = np.zeros((n, 2), np.int32)
    scales = np.zeros(n, np.float32)
    errors: dict[str, str] = {}

    def one(k: int):
        try:
            return load_resized(index, k, size, max_pixels=max_pixels)
        except BadSampleError as e:
            return e

    with (
        open(tmp / "pixels.u8", "wb") as out,
        ThreadPoolExecutor(threads) as pool,
        tqdm(total=n, desc=f"caching {split} pixels", unit="image", mininterval=1.0) as bar,
    ):
        # OpenCV releases the GIL while decoding and resizing, so threads scale; map() keeps
        # the order, and chunks bound what waits in memory to be written.
        for start in range(0, n, 256):
            chunk = range(start, min(n, start + 256))
            for k, result in zip(chunk, pool.map(one, chunk)):
                if isinstance(result, BadSampleError):
                    errors[str(k)] = result.reason or str(result)
                else:
                    out.write(np.ascontiguousarray(result.image).data)
                    shapes[k] = result.image.shape[:2]
                    orig_hw[k] = result.orig_hw
                    scales[k] = result.scale
                offsets[k + 1] = out.tell()
            bar.update(len(chunk))
    for name, array in (("offsets", offsets), ("shapes", shapes), ("orig_hw", orig_hw), ("scales", scales)):
        np.save(tmp / f"{name}.npy", array, allow_pickle=False)
    log.info("built the %s pixel cache: %d images (%d unreadable), %.1f MiB", split, n, len(errors), offsets[-1] / MiB)
    return {"format": PIXEL_FORMAT, "key": key, "size": size, "count": n, "errors": errors}
