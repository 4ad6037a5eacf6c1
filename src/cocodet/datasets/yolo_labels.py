"""One YOLO label file: ``class cx cy w h`` lines normalised to [0, 1], or segment lines
(the class, then x y pairs), read into boxes in the stored image's pixels.

Ultralytics' rules, restated: a label file is found by replacing the last ``/images/`` of the
image's path with ``/labels/`` and its extension with ``.txt``; a file in which any line has
more than 6 fields holds segments, and each of its lines becomes the bounding box of its points;
an image without a label file, or with an empty one, is a negative.

Frames. Ultralytics decodes images with their EXIF orientation applied, so labels are in the
oriented frame. cocodet decodes every image in its stored frame (``images/decode.py``: COCO's
boxes are in that frame), so a YOLO box is mapped here, once, from the oriented frame back to
the stored one: the pixels it is read with and the box agree, and so do predictions and the
ground truth built from these boxes.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import numpy as np

from cocodet.storage.store import read_bytes

# A label file of 10,000 boxes is about 400 KB; one above this is refused without being read.
MAX_LABEL_BYTES = 4 << 20
# Normalised coordinates this far outside [0, 1] are clipped later, as COCO boxes past the
# image's edge are (images/read.py clip_targets); further out, the line is refused: such a file
# is usually in pixels, not normalised (Ultralytics refuses any coordinate above 1).
COORD_TOLERANCE = 0.01
# EXIF orientation -> the map of a point from the oriented frame back to the stored one, in
# normalised coordinates (u, v) -> (x, y). Orientation k displays the stored image after PIL's
# exif_transpose: 2 mirror, 3 rotate 180, 4 flip, 5 transpose, 6 rotate 90 clockwise,
# 7 transverse, 8 rotate 90 counter-clockwise.
_TO_STORED = {
    2: lambda u, v: (1 - u, v),
    3: lambda u, v: (1 - u, 1 - v),
    4: lambda u, v: (u, 1 - v),
    5: lambda u, v: (v, u),
    6: lambda u, v: (v, 1 - u),
    7: lambda u, v: (1 - v, 1 - u),
    8: lambda u, v: (1 - v, u),
}


class Labels(NamedTuple):
    """An image's boxes ([n, 4] float64 xyxy, stored pixels) and class indices ([n] int64);
    ``dropped``: boxes left out, by reason (COCO's names); ``problem``: why the image cannot be
    used (the file and line), or ""."""

    boxes: np.ndarray
    classes: np.ndarray
    dropped: dict[str, int]
    problem: str


def label_path(image: str) -> str:
    """Ultralytics' rule: the last ``/images/`` becomes ``/labels/``, the extension ``.txt``
    (a path or a URL)."""
    images, labels = "/images/", "/labels/"
    head, sep, tail = image.rpartition(images)
    swapped = head + labels + tail if sep else image
    return os.path.splitext(swapped)[0] + ".txt"


def read_labels(
    path: str, size: int | None, stored_hw: tuple[int, int], orientation: int, classes: frozenset[int]
) -> Labels:
    """The boxes of the label file ``path`` of ``size`` bytes (None: there is none, a negative)
    for an image stored at ``stored_hw`` with EXIF ``orientation``; ``classes``: the indices
    ``names`` declares. A local file or an object, read through the store's one reader."""
    empty = Labels(np.zeros((0, 4)), np.zeros(0, np.int64), {}, "")
    if size is None:
        return empty
    if size > MAX_LABEL_BYTES:
        return empty._replace(problem=f"label file {path} is {size} bytes, above {MAX_LABEL_BYTES}; not read")
    try:
        text = read_bytes(path).decode("utf-8")  # its size, from the listing or a stat, is within the bound
    except (OSError, UnicodeDecodeError) as e:
        return empty._replace(problem=f"label file {path} cannot be read: {e}")
    lines = [(n, line.split()) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    segments = any(len(fields) > 6 for _, fields in lines)
    boxes, found, dropped = [], [], {"non_finite_box": 0, "degenerate_box": 0}
    for n, fields in lines:
        try:
            cls, box = _parse_line(fields, segments, classes)
        except ValueError as e:
            return empty._replace(problem=f"label file {path} line {n}: {e}")
        if not all(math.isfinite(v) for v in box):
            dropped["non_finite_box"] += 1
            continue
        if not (box[2] > box[0] and box[3] > box[1]):
            dropped["degenerate_box"] += 1
            continue
        boxes.append(_stored_box(box, orientation))
        found.append(cls)
    h, w = stored_hw
    pixels = np.array(boxes, dtype=np.float64).reshape(-1, 4) * np.array([w, h, w, h], dtype=np.float64)
    return Labels(pixels, np.array(found, dtype=np.int64), dropped, "")


def _parse_line(fields: list[str], segments: bool, classes: frozenset[int]) -> tuple[int, list[float]]:
    """(class, normalised xyxy in the oriented frame) of one line; ValueError says what is wrong."""
    try:
        values = [float(f) for f in fields]
    except ValueError:
        raise ValueError(f"non-numeric text in {' '.join(fields)!r}") from None
    if not segments and len(values) != 5:
        raise ValueError(
            f"{len(values)} fields, expected 5 (class cx cy w h) or a segment "
            "(the class, then at least three x y pairs)"
        )
    if segments and (len(values) < 5 or len(values) % 2 == 0):
        raise ValueError(f"{len(values)} fields in a segment file, expected the class then x y pairs")
    cls = values[0]
    if not math.isfinite(cls) or cls != int(cls):
        raise ValueError(f"class {fields[0]} is not an integer")
    if int(cls) not in classes:
        raise ValueError(f"class {int(cls)} is not in data.yaml's names (classes {min(classes)}..{max(classes)})")
    coords = values[1:]
    outside = [v for v in coords if math.isfinite(v) and not -COORD_TOLERANCE <= v <= 1 + COORD_TOLERANCE]
    if outside:
        raise ValueError(
            f"coordinate {outside[0]} is outside [0, 1] by more than {COORD_TOLERANCE}: labels are "
            "normalised by the image's width and height (is this file in pixels?)"
        )
    if segments:
        xs, ys = coords[0::2], coords[1::2]
        return int(cls), [min(xs), min(ys), max(xs), max(ys)]
    cx, cy, bw, bh = coords
    return int(cls), [cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2]


def _stored_box(box: list[float], orientation: int) -> list[float]:
    """A normalised xyxy box of the oriented frame in the stored frame (a box's corners map to
    corners under each of the 8 orientations, so it stays a box)."""
    to_stored = _TO_STORED.get(orientation)
    if to_stored is None:
        return box
    (x0, y0), (x1, y1) = to_stored(box[0], box[1]), to_stored(box[2], box[3])
    return [min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)]
