"""COCO index and sample decoding.

The index is built once in the main process from pycocotools and kept as flat numpy
buffers plus offsets (detectron2-style), so DataLoader workers that touch it on every
sample do not copy-on-read a graph of Python dicts epoch after epoch.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import cv2
import numpy as np
from tqdm import tqdm

from cocodet.data.image_header import DEFAULT_MAX_IMAGE_PIXELS, ImageTooLarge, check_header
from cocodet.errors import UserError

log = logging.getLogger(__name__)

# Decode in stored pixel order (COCO boxes are in that frame) and always as 3-channel BGR:
# OpenCV converts grayscale, CMYK and palette images for us with IMREAD_COLOR.
_IMREAD_FLAGS = cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION


class BadSampleError(RuntimeError):
    """A sample that cannot be used; carries what a user needs to find it."""

    def __init__(self, path: str, image_id: int | None = None, reason: str | None = None):
        # One-argument form: DataLoader re-raises worker errors as exc_type(message).
        message = path if image_id is None else f"bad sample: image_id={image_id} file={path}: {reason}"
        super().__init__(message)
        self.path, self.image_id, self.reason = path, image_id, reason

    def __reduce__(self):  # keep the fields when the error crosses a worker boundary
        return (BadSampleError, (self.path, self.image_id, self.reason))


class DatasetConfigError(UserError, ValueError):
    """The dataset cannot be used at all (missing files, malformed annotations)."""


def resolve_inside(root: Path, file_name: str, real_dirs: dict[str, str] | None = None) -> Path | None:
    """Return the path of ``file_name`` under ``root`` or None if it escapes the root.

    Rejects absolute names, ``..`` components and symlinks that point outside the root.
    ``real_dirs`` caches the resolved folders between calls: at COCO scale a full
    ``realpath`` per image (an lstat per path component) costs more than the JSON parse.
    """
    if os.path.isabs(file_name) or ".." in Path(file_name).parts:
        return None
    path = root / file_name
    cache = real_dirs if real_dirs is not None else {}
    folder = str(path.parent)
    if folder not in cache:
        cache[folder] = os.path.realpath(folder)
    if str(root) not in cache:
        cache[str(root)] = os.path.realpath(root)
    real_root = cache[str(root)]
    real = os.path.realpath(path) if os.path.islink(path) else os.path.join(cache[folder], path.name)
    if os.path.commonpath([real_root, real]) != real_root:
        return None
    return path


# libjpeg's DCT scaling: a JPEG decoded at 1/2, 1/4 or 1/8 of its size costs about half a
# full decode, and an image shrunk by that much anyway loses nothing it would have kept.
_REDUCED_FLAGS = {1: _IMREAD_FLAGS, 2: cv2.IMREAD_REDUCED_COLOR_2 | cv2.IMREAD_IGNORE_ORIENTATION,
                  4: cv2.IMREAD_REDUCED_COLOR_4 | cv2.IMREAD_IGNORE_ORIENTATION,
                  8: cv2.IMREAD_REDUCED_COLOR_8 | cv2.IMREAD_IGNORE_ORIENTATION}


class Source(NamedTuple):
    """An image at the working resolution (long side = the dataset's image_size) with its
    targets in that frame: what every recipe starts from, decoded or read from the pixel cache.

    ``orig_hw`` is the stored image's (height, width); ``scale`` maps stored pixels to these.
    """

    image: np.ndarray
    boxes: np.ndarray
    labels: np.ndarray
    orig_hw: tuple[int, int]
    scale: float


def decode_reduction(data: bytes, stored_hw: tuple[int, int], size: int) -> int:
    """The largest libjpeg reduction (1, 2, 4 or 8) that still decodes at least ``size`` pixels
    on the long side. JPEG only (other formats would be decoded in full and resized by
    OpenCV anyway); 1 when the stored size is unknown."""
    if data[:2] != b"\xff\xd8" or min(stored_hw) <= 0:
        return 1
    for factor in (8, 4, 2):
        if max(stored_hw) // factor >= size:
            return factor
    return 1


def decode_image(data: bytes, reduction: int = 1) -> np.ndarray:
    """Decode image bytes by content into an HxWx3 uint8 RGB array (at 1/``reduction`` of the
    stored size for a JPEG); raise ValueError with a reason."""
    if not data:
        raise ValueError("file is empty (0 bytes)")
    if data[:2] == b"\xff\xd8" and not data.rstrip(b"\x00").endswith(b"\xff\xd9"):
        # libjpeg decodes a truncated file into a half-grey image with only a warning.
        raise ValueError(f"truncated JPEG: no end-of-image marker ({len(data)} bytes)")
    try:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), _REDUCED_FLAGS[reduction])
    except cv2.error as e:  # e.g. above OpenCV's own pixel limit (2^30): a bad sample, not a crash
        raise ValueError(f"OpenCV cannot decode it: {str(e).strip().splitlines()[-1]}") from None
    if image is None:
        raise ValueError(f"not a decodable image (first bytes {data[:8]!r})")
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


@dataclass
class CocoIndex:
    """Flat, picklable view of a COCO annotation file.

    Attributes:
        image_ids: [N] int64 COCO image ids.
        sizes: [N, 2] int32 (height, width) from the JSON.
        paths: one str per image (resolved absolute path, or "" when it escapes the root).
        box_offsets: [N+1] int64; boxes of image k are boxes[box_offsets[k]:box_offsets[k+1]].
        boxes: [M, 4] float32 xyxy in stored pixel order (crowd regions excluded).
        labels: [M] int64 contiguous labels 1..K (0 is background).
        category_ids: [K] int64; label L maps to category_ids[L - 1].
        category_names: [K] names in label order.
        problems: per-image reason found while indexing (empty string when none).
        dropped: counts of annotations dropped while indexing, by reason.
    """

    image_ids: np.ndarray
    sizes: np.ndarray
    paths: np.ndarray
    box_offsets: np.ndarray
    boxes: np.ndarray
    labels: np.ndarray
    category_ids: np.ndarray
    category_names: list[str]
    problems: np.ndarray
    ann_file: str
    dropped: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.image_ids)

    @property
    def num_classes(self) -> int:
        """Detector classes including background."""
        return len(self.category_ids) + 1

    def targets(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = self.box_offsets[k], self.box_offsets[k + 1]
        return self.boxes[lo:hi], self.labels[lo:hi]

    def label_to_category(self, labels: np.ndarray) -> np.ndarray:
        return self.category_ids[np.asarray(labels, dtype=np.int64) - 1]

    def without(self, drop: set[int]) -> "CocoIndex":
        """This index without the images at positions ``drop`` (``dataset.verify`` found them bad)."""
        keep = np.array([k for k in range(len(self)) if k not in drop], dtype=np.int64)
        counts = np.diff(self.box_offsets)[keep]
        rows = np.concatenate([np.arange(self.box_offsets[k], self.box_offsets[k + 1]) for k in keep]
                              or [np.zeros(0, np.int64)]).astype(np.int64)
        return CocoIndex(image_ids=np.asarray(self.image_ids)[keep], sizes=np.asarray(self.sizes)[keep],
                         paths=np.asarray(self.paths)[keep], box_offsets=np.concatenate([[0], np.cumsum(counts)]),
                         boxes=np.asarray(self.boxes)[rows], labels=np.asarray(self.labels)[rows],
                         category_ids=self.category_ids, category_names=self.category_names,
                         problems=np.asarray(self.problems)[keep], ann_file=self.ann_file, dropped=dict(self.dropped))


def load_coco_json(ann_file: Path) -> dict:
    if not ann_file.is_file():
        raise DatasetConfigError(f"annotation file not found: {ann_file} (set dataset.root / dataset.{{train,val}}_ann)")
    try:
        # The standard library, not orjson: orjson parses COCO 2017 train about 1.4x faster but
        # peaks 1.7 GB higher (5.1 against 3.4 GB), and the parse happens once per file (cached).
        with open(ann_file, "rb") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DatasetConfigError(f"annotation file {ann_file} is not valid JSON: {e}") from e
    missing = [k for k in ("images", "annotations", "categories") if not isinstance(data, dict) or
               not isinstance(data.get(k), list)]
    if missing:
        raise DatasetConfigError(f"annotation file {ann_file} is not COCO instances format: missing lists {missing}")
    return data


def build_index(image_root: str | os.PathLike, ann_file: str | os.PathLike, keep_empty: bool = True) -> CocoIndex:
    """Read a COCO instances file and build the compact index; refuse what cannot be repaired.

    A direct parse into flat arrays: pycocotools' ``COCO()`` would also build dicts of every
    annotation and category that the loader never reads (``scripts/bench_index.py`` measures
    both). Shows a progress bar for large files.
    """
    image_root, ann_file = Path(image_root), Path(ann_file)
    if not image_root.is_dir():
        raise DatasetConfigError(f"image folder not found: {image_root} (set dataset.root / dataset.{{train,val}}_images)")
    image_root = Path(os.path.abspath(image_root))  # absolute paths: a cached index is read from any working directory
    data = load_coco_json(ann_file)
    _check_ids(data, ann_file)
    anns_of, dropped = _annotations_by_image(data, ann_file)
    category_ids = np.array(sorted({c["id"] for c in data["categories"]}), dtype=np.int64)
    names = {c["id"]: c.get("name", str(c["id"])) for c in data["categories"]}
    label_of = {int(c): k + 1 for k, c in enumerate(category_ids)}

    image_ids, sizes, paths, problems, offsets = [], [], [], [], [0]
    boxes, labels = [], []
    real_dirs: dict[str, str] = {}
    dropped["degenerate_box"] = dropped["non_finite_box"] = dropped["crowd"] = dropped["empty_image"] = 0
    images = sorted(data["images"], key=lambda im: im["id"])
    for img in tqdm(images, desc=f"indexing {ann_file.name}", unit="image", disable=len(images) < 20_000,
                    mininterval=2.0):
        kept = _training_boxes(anns_of.get(img["id"], []), label_of, dropped)
        if not kept and not keep_empty:
            dropped["empty_image"] += 1
            continue
        path = resolve_inside(image_root, str(img.get("file_name", "")), real_dirs)
        problems.append("" if path is not None else f"file_name {img.get('file_name')!r} resolves outside the image root {image_root}")
        paths.append(str(path) if path is not None else "")
        image_ids.append(img["id"])
        sizes.append((img.get("height", 0), img.get("width", 0)))
        boxes.extend(b for b, _ in kept)
        labels.extend(lab for _, lab in kept)
        offsets.append(len(boxes))
    if not image_ids:
        raise DatasetConfigError(f"{ann_file}: no usable images (dataset.keep_empty={keep_empty})")
    return CocoIndex(
        image_ids=np.array(image_ids, dtype=np.int64),
        sizes=np.array(sizes, dtype=np.int32).reshape(-1, 2),
        paths=np.array(paths, dtype=np.str_),
        box_offsets=np.array(offsets, dtype=np.int64),
        boxes=np.array(boxes, dtype=np.float32).reshape(-1, 4),
        labels=np.array(labels, dtype=np.int64),
        category_ids=category_ids,
        category_names=[names[int(c)] for c in category_ids],
        problems=np.array(problems, dtype=np.str_),
        ann_file=str(ann_file),
        dropped=dropped,
    )


def _check_ids(data: dict, ann_file: Path) -> None:
    """Refuse duplicate image ids and annotations of categories the file does not declare."""
    dup = sorted(i for i, n in Counter(img.get("id") for img in data["images"]).items() if n > 1)
    if dup:
        raise DatasetConfigError(f"{ann_file}: duplicate image ids {dup[:10]} ({len(dup)} in all); "
                                 "COCO requires unique ids — deduplicate the 'images' list")
    known_cats = {c["id"] for c in data["categories"]}
    unknown = sorted({a["category_id"] for a in data["annotations"]} - known_cats)
    if unknown:
        raise DatasetConfigError(f"{ann_file}: annotations use category ids {unknown} that are not in "
                                 f"'categories' {sorted(known_cats)}; fix the file or remove those annotations")


def _annotations_by_image(data: dict, ann_file: Path) -> tuple[dict[int, list[dict]], dict[str, int]]:
    """Annotations grouped by image id (segmentations freed), and the count of those whose
    image id is not among the images (dropped)."""
    anns_of: dict[int, list[dict]] = {}
    for a in data["annotations"]:
        a.pop("segmentation", None)  # most of the parsed JSON; freed now so the arrays below reuse it
        anns_of.setdefault(a["image_id"], []).append(a)
    image_id_set = {img.get("id") for img in data["images"]}
    dropped = {"missing_image": sum(len(v) for k, v in anns_of.items() if k not in image_id_set)}
    if dropped["missing_image"]:
        log.warning("%s: %d annotations point at image ids not in 'images'; dropped", ann_file, dropped["missing_image"])
    return anns_of, dropped


def _training_boxes(anns: list[dict], label_of: dict[int, int], dropped: dict[str, int]) -> list[tuple[list, int]]:
    """(xyxy box, contiguous label) of the annotations a detector trains on; crowd regions and
    boxes without area are counted in ``dropped`` instead."""
    kept = []
    for a in anns:
        if a.get("iscrowd", 0):
            dropped["crowd"] += 1  # left to COCOeval, which ignores detections matched to crowds
            continue
        x, y, w, h = a["bbox"]
        if not all(math.isfinite(v) for v in (x, y, w, h)):
            dropped["non_finite_box"] += 1  # JSON's NaN/Infinity: an Infinity width would clip to the image edge
            continue
        if not (w > 0 and h > 0):
            dropped["degenerate_box"] += 1
            continue
        kept.append(([x, y, x + w, y + h], label_of[a["category_id"]]))
    return kept


def _read(index: CocoIndex, k: int) -> tuple[str, int, bytes]:
    """(path, image id, file bytes) of image k; BadSampleError for a refused or unreadable file."""
    path, image_id = str(index.paths[k]), int(index.image_ids[k])
    if index.problems[k]:
        raise BadSampleError(path or "<outside root>", image_id, str(index.problems[k]))
    try:
        with open(path, "rb") as f:
            return path, image_id, f.read()
    except OSError as e:
        raise BadSampleError(path, image_id, f"cannot read: {e.strerror or e}") from None


def load_raw(index: CocoIndex, k: int, timings: np.ndarray | None = None,
             max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read and decode image k; return (rgb image, xyxy boxes clipped to it, labels).

    Raises BadSampleError naming file, image id and reason (an image too large or of another
    size than annotated, from its header, without a decode). ``timings`` (read, decode) in
    seconds are accumulated in place when given.
    """
    t0 = time.perf_counter()
    path, image_id, data = _read(index, k)
    t1 = time.perf_counter()
    try:
        check_header(data, tuple(int(x) for x in index.sizes[k]), max_pixels)
        image = decode_image(data)
    except ValueError as e:
        raise BadSampleError(path, image_id, str(e)) from None
    t2 = time.perf_counter()
    if timings is not None:
        timings[0] += t1 - t0
        timings[1] += t2 - t1
    h, w = image.shape[:2]
    jh, jw = index.sizes[k]
    if (jh, jw) != (0, 0) and (h, w) != (jh, jw):
        raise BadSampleError(path, image_id, f"decoded size {h}x{w} differs from the annotation's {jh}x{jw}")
    return (image, *_clip_targets(index, k, h, w))


def _clip_targets(index: CocoIndex, k: int, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Image k's boxes clipped to its stored (h, w); boxes wholly outside are dropped."""
    boxes, labels = index.targets(k)
    boxes = boxes.copy()
    np.clip(boxes[:, 0::2], 0, w, out=boxes[:, 0::2])
    np.clip(boxes[:, 1::2], 0, h, out=boxes[:, 1::2])
    keep = (boxes[:, 2] - boxes[:, 0] >= 1) & (boxes[:, 3] - boxes[:, 1] >= 1)
    return boxes[keep], labels[keep]


def load_resized(index: CocoIndex, k: int, size: int, timings: np.ndarray | None = None,
                 max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> Source:
    """Read image k and bring it to the working resolution (long side ``size``): a reduced
    JPEG decode when the image is at least 2x larger, then the one letterbox resize.

    The pixel cache stores exactly this output, so cached and uncached runs see the same
    pixels. Raises BadSampleError like :func:`load_raw`; ``timings`` (read, decode) in seconds
    accumulate in place, the resize counting as decode.
    """
    t0 = time.perf_counter()
    path, image_id, data = _read(index, k)
    t1 = time.perf_counter()
    jh, jw = (int(x) for x in index.sizes[k])
    try:
        resized, (orig_h, orig_w), scale = decode_resized(data, (jh, jw), size, max_pixels)
    except ValueError as e:
        raise BadSampleError(path, image_id, str(e)) from None
    t2 = time.perf_counter()
    if timings is not None:
        timings[0] += t1 - t0
        timings[1] += t2 - t1
    boxes, labels = _clip_targets(index, k, orig_h, orig_w)
    return Source(resized, boxes * np.float32(scale), labels, (orig_h, orig_w), scale)


def decode_resized(data: bytes, stored_hw: tuple[int, int], size: int,
                   max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> tuple[np.ndarray, tuple[int, int], float]:
    """Image bytes -> (RGB image with long side ``size``, stored (h, w), scale stored -> output):
    the header checked first (size limit, annotated size; ``(0, 0)``: not annotated, the
    header's size is used), the reduced JPEG decode when the size allows it, then the one
    letterbox resize. Raises ValueError with a reason (too large, undecodable, or a size that
    is not the annotated one). What training, validation, prediction and the pixel cache all use."""
    from cocodet.data.augment import letterbox_resize  # augment imports albumentations: only here

    header = check_header(data, stored_hw, max_pixels)
    jh, jw = stored_hw if tuple(stored_hw) != (0, 0) or header is None else header
    reduction = decode_reduction(data, (jh, jw), size)
    image = decode_image(data, reduction)
    h, w = image.shape[:2]
    expected = (jh, jw) if reduction == 1 else (-(-jh // reduction), -(-jw // reduction))  # libjpeg rounds up
    if (jh, jw) != (0, 0) and (h, w) != expected:
        raise ValueError(f"decoded size {h * reduction}x{w * reduction} differs from the annotation's {jh}x{jw}")
    if h * w * reduction * reduction > max_pixels:  # a format whose header could not be read
        raise ImageTooLarge(f"too large: decoded {h * reduction}x{w * reduction}, above "
                            f"dataset.max_image_pixels={max_pixels}")
    orig = (jh, jw) if reduction > 1 else (h, w)
    resized, r = letterbox_resize(image, size)
    return resized, orig, r / reduction
