"""One sample of a COCO index read from disk: its file, through the guarded decode, with its
targets in the decoded frame. What training, validation, verify and the pixel cache read."""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from cocodet.datasets.index import CocoIndex
from cocodet.errors import BadSampleError
from cocodet.images.decode import Decoded, decode_checked
from cocodet.images.header import DEFAULT_MAX_IMAGE_PIXELS
from cocodet.images.resize import letterbox_resize
from cocodet.storage.store import read_bytes


class Source(NamedTuple):
    """An image at the working resolution (long side = the dataset's image_size, or stored) with its
    targets in that frame: what every recipe starts from, decoded or read from the pixel cache.

    ``orig_hw`` is the stored image's (height, width); ``scale`` maps stored pixels to these.
    """

    image: np.ndarray
    boxes: np.ndarray
    labels: np.ndarray
    orig_hw: tuple[int, int]
    scale: float


def read_file(index: CocoIndex, k: int, via=None) -> tuple[str, int, bytes]:
    """(path, image id, file bytes) of image k; BadSampleError for a refused or unreadable file.
    ``via``: the read-ahead's copies, tried first for an object (``storage/store.read_bytes``)."""
    path, image_id = str(index.paths[k]), int(index.image_ids[k])
    if index.problems[k]:
        raise BadSampleError(path or "<outside root>", image_id, str(index.problems[k]))
    try:
        return path, image_id, read_bytes(path, via)
    except OSError as e:  # a missing or unreadable file or object; a store that refuses the run raises StoreError
        raise BadSampleError(path, image_id, f"cannot read: {e.strerror or e}") from None


def read_decoded(
    index: CocoIndex, k: int, max_pixels: int, fit: int | None, timings: np.ndarray | None, via=None
) -> Decoded:
    """Image k read and decoded through :func:`decode_checked` (``fit``: the reduced JPEG
    decode); ``timings`` (read, decode) in seconds accumulate in place when given. Raises
    BadSampleError naming file, image id and reason."""
    t0 = time.perf_counter()
    path, image_id, data = read_file(index, k, via)
    t1 = time.perf_counter()
    try:
        decoded = decode_checked(data, (int(index.sizes[k][0]), int(index.sizes[k][1])), max_pixels, fit)
    except ValueError as e:
        raise BadSampleError(path, image_id, str(e)) from None
    if timings is not None:
        timings[0] += t1 - t0
        timings[1] += time.perf_counter() - t1
    return decoded


def load_raw(
    index: CocoIndex,
    k: int,
    timings: np.ndarray | None = None,
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    min_box_side: float = 1.0,
    via=None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Image k at its stored size: (rgb image, xyxy boxes clipped to it, labels)."""
    image = read_decoded(index, k, max_pixels, None, timings, via).image
    h, w = image.shape[:2]
    return (image, *clip_targets(index, k, h, w, min_box_side))


def clip_targets(index: CocoIndex, k: int, h: int, w: int, min_side: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Image k's boxes clipped to its stored (h, w); boxes left narrower or lower than
    ``min_side`` are dropped (1 px: cocodet's rule; 0: the reference's, any positive extent)."""
    boxes, labels = index.targets(k)
    boxes = boxes.copy()
    np.clip(boxes[:, 0::2], 0, w, out=boxes[:, 0::2])
    np.clip(boxes[:, 1::2], 0, h, out=boxes[:, 1::2])
    bw, bh = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    keep = (bw > 0) & (bh > 0) & (bw >= min_side) & (bh >= min_side)
    return boxes[keep], labels[keep]


def load_resized(
    index: CocoIndex,
    k: int,
    size: int | None,
    timings: np.ndarray | None = None,
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    min_box_side: float = 1.0,
    dst_for=None,
    via=None,
) -> Source:
    """Image k at the working resolution (long side ``size``): a reduced JPEG decode when the
    image is at least 2x larger, then the one letterbox resize (counted as decode time).
    ``size`` None: the stored pixels, untouched (the reference presets). ``dst_for``: where the
    resize writes (``letterbox_resize``); ``via``: the read-ahead's copies (:func:`read_file`).

    The pixel cache stores exactly this output, so cached and uncached runs see the same pixels.
    """
    if size is None:
        image, boxes, labels = load_raw(index, k, timings, max_pixels, min_box_side, via)
        return Source(image, boxes, labels, tuple(image.shape[:2]), 1.0)

    decoded = read_decoded(index, k, max_pixels, size, timings, via)
    t_resize = time.perf_counter()
    resized, r = letterbox_resize(decoded.image, size, dst_for)
    if timings is not None:
        timings[1] += time.perf_counter() - t_resize
    scale = r / decoded.reduction
    boxes, labels = clip_targets(index, k, *decoded.stored_hw, min_box_side)
    return Source(resized, boxes * np.float32(scale), labels, decoded.stored_hw, scale)
