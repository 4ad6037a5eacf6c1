"""A YOLO image's stored size and EXIF orientation, read from its first bytes at index time: YOLO's
labels give no sizes (COCO's JSON and VOC's XML do), and its boxes are in the EXIF-oriented frame
(``yolo_labels.py`` turns them into the stored one). PIL's lazy open reads a header, never pixels.
"""

from __future__ import annotations

import io
import warnings

from cocodet.storage.store import read_bytes

EXIF_ORIENTATION = 0x0112
# The bytes read for an image's size and EXIF orientation (a JPEG's EXIF block is at most 64 KiB
# and comes before its frame header); a header that needs more is read whole.
HEADER_BYTES = 1 << 17


def image_header(path: str, size: int | None) -> tuple[tuple[int, int], int, str]:
    """((height, width) as stored, EXIF orientation, problem) from the image's first bytes
    (PIL's lazy open: a header, not a decode); read whole when those do not hold it. ``size``:
    the file's byte size, None for a missing file."""
    from PIL import Image

    try:
        if size is None:
            raise FileNotFoundError(f"no such file: {path}")
        data = read_bytes(path, limit=min(HEADER_BYTES, size)) if size else b""
        for attempt in (0, 1):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the decode applies its own limit
                    with Image.open(io.BytesIO(data)) as im:
                        (w, h), orientation = im.size, im.getexif().get(EXIF_ORIENTATION, 1)
                break
            except (OSError, SyntaxError, ValueError):
                if attempt or len(data) < HEADER_BYTES:
                    raise
                data = read_bytes(path)
    except Image.DecompressionBombError as e:
        return (0, 0), 1, f"too large to decode: {e}"
    except Exception as e:  # noqa: BLE001 - a missing file, a format PIL does not know, a header cut short
        return (0, 0), 1, f"cannot read the image header: {type(e).__name__}: {e}"
    return (h, w), int(orientation) if isinstance(orientation, int) else 1, ""
