"""The one guarded decode: image bytes -> pixels, the header checked first (design §8.1).

Every decode in cocodet goes through :func:`decode_checked` (``tests/test_decode_chokepoint.py``
reads ``src/`` with ast and fails on any other decoding call). A PNG of a few MB whose header
says 30000 x 30000 decodes to 2.7 GB, so the size limit and the annotated size are checked
from the header before OpenCV allocates anything; a caller cannot forget the check, because
the only decoding function here that skips it is private.
"""

from __future__ import annotations

from typing import NamedTuple

import cv2
import numpy as np

from cocodet.images.header import DEFAULT_MAX_IMAGE_PIXELS, ImageTooLarge, check_header
from cocodet.images.resize import letterbox_resize

# Decode in stored pixel order (COCO boxes are in that frame) and always as 3-channel BGR:
# OpenCV converts grayscale, CMYK and palette images for us with IMREAD_COLOR.
_IMREAD_FLAGS = cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION
# libjpeg's DCT scaling: a JPEG decoded at 1/2, 1/4 or 1/8 of its size costs about half a
# full decode, and an image shrunk by that much anyway loses nothing it would have kept.
_REDUCED_FLAGS = {
    1: _IMREAD_FLAGS,
    2: cv2.IMREAD_REDUCED_COLOR_2 | cv2.IMREAD_IGNORE_ORIENTATION,
    4: cv2.IMREAD_REDUCED_COLOR_4 | cv2.IMREAD_IGNORE_ORIENTATION,
    8: cv2.IMREAD_REDUCED_COLOR_8 | cv2.IMREAD_IGNORE_ORIENTATION,
}


class Decoded(NamedTuple):
    """A decoded image: ``image`` HxWx3 uint8 RGB at 1/``reduction`` of ``stored_hw``, the
    stored image's (height, width) (annotated, else from the header, else decoded)."""

    image: np.ndarray
    stored_hw: tuple[int, int]
    reduction: int


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


def decode_checked(
    data: bytes,
    annotated_hw: tuple[int, int] = (0, 0),
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    fit: int | None = None,
) -> Decoded:
    """Decode image bytes after refusing, from the header alone, an image above ``max_pixels``
    or of another size than ``annotated_hw`` (``(0, 0)``: not annotated, the header's size is
    used). ``fit``: decode a JPEG reduced by libjpeg when that still leaves ``fit`` pixels on
    the long side. Raises ValueError (ImageTooLarge for the size limit) with the reason."""
    annotated_hw = (int(annotated_hw[0]), int(annotated_hw[1]))
    header = check_header(data, annotated_hw, max_pixels)
    annotated = annotated_hw != (0, 0)
    jh, jw = annotated_hw if annotated or header is None else header
    reduction = decode_reduction(data, (jh, jw), fit) if fit else 1
    image = _imdecode(data, reduction)
    h, w = image.shape[:2]
    expected = (jh, jw) if reduction == 1 else (-(-jh // reduction), -(-jw // reduction))  # libjpeg rounds up
    if (jh, jw) != (0, 0) and (h, w) != expected:
        source = "the annotation's" if annotated else "its header's"
        raise ValueError(f"decoded size {h * reduction}x{w * reduction} differs from {source} {jh}x{jw}")
    if h * w * reduction * reduction > max_pixels:  # a format whose header could not be read
        raise ImageTooLarge(
            f"too large: decoded {h * reduction}x{w * reduction}, above dataset.max_image_pixels={max_pixels}"
        )
    return Decoded(image, (jh, jw) if reduction > 1 else (h, w), reduction)


def _imdecode(data: bytes, reduction: int) -> np.ndarray:
    """Bytes -> HxWx3 uint8 RGB, with no size check: private, reached only through
    :func:`decode_checked`."""
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


def decode_resized(
    data: bytes, stored_hw: tuple[int, int], size: int, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
) -> tuple[np.ndarray, tuple[int, int], float]:
    """Image bytes -> (RGB image with long side ``size``, stored (h, w), scale stored -> output):
    :func:`decode_checked` with the reduced JPEG decode, then the one letterbox resize. What
    training, validation, prediction and the pixel cache all use."""
    decoded = decode_checked(data, stored_hw, max_pixels, fit=size)
    resized, r = letterbox_resize(decoded.image, size)
    return resized, decoded.stored_hw, r / decoded.reduction
