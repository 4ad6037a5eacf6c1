"""An image's size from its header, before any decode (design §8.1).

A PNG of a few MB whose header says 30000 x 30000 decodes to 2.7 GB; checking the size after
decoding is too late. JPEG (the SOF marker) and PNG (IHDR) headers are read here; other
formats through PIL's lazy ``Image.open``, which reads only the header. OpenCV has no
header-only reader in its Python API.
"""

from __future__ import annotations

import io
import struct
import warnings

# The size at which PIL itself refuses an image (twice Image.MAX_IMAGE_PIXELS): the default
# of dataset.max_image_pixels.
DEFAULT_MAX_IMAGE_PIXELS = 178_956_970
# Start-of-frame markers: baseline, extended, progressive, lossless and the arithmetic ones
# (not DHT 0xC4, JPG 0xC8 or DAC 0xCC, which share the range).
_SOF_MARKERS = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


class ImageTooLarge(ValueError):
    """An image whose header is above the pixel limit."""


def header_size(data: bytes) -> tuple[int, int] | None:
    """(height, width) from the header, or None when no format here can tell without decoding.

    Raises ImageTooLarge where PIL refuses the header itself (its decompression-bomb limit).
    """
    if data[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return height, width
    return _pil_size(data)


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """Walk the marker segments to the first SOF; None for a header cut short."""
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # markers without a length
            pos += 2
            continue
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        if marker in _SOF_MARKERS:
            if pos + 9 > len(data):
                return None
            height, width = struct.unpack(">HH", data[pos + 5 : pos + 9])
            return height, width
        pos += 2 + length
    return None


def _pil_size(data: bytes) -> tuple[int, int] | None:
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the caller applies its own limit
            with Image.open(io.BytesIO(data)) as im:
                width, height = im.size
    except Image.DecompressionBombError as e:
        raise ImageTooLarge(f"too large to decode: {e}") from None
    except Exception:  # noqa: BLE001 - not a format PIL knows: the decode will say what it is
        return None
    return height, width


def check_header(data: bytes, annotated_hw: tuple[int, int], max_pixels: int) -> tuple[int, int] | None:
    """The header's (height, width), after refusing, without a decode, an image larger than
    ``max_pixels`` or one whose header disagrees with the annotation (``(0, 0)``: not
    annotated, not compared). Raises ValueError (ImageTooLarge) with the reason."""
    hw = header_size(data)
    if hw is None:
        return None
    h, w = hw
    if h * w > max_pixels:
        raise ImageTooLarge(
            f"too large: the header says {h}x{w} = {h * w / 1e6:.0f} MP, above "
            f"dataset.max_image_pixels={max_pixels} ({max_pixels / 1e6:.0f} MP); not decoded"
        )
    if tuple(annotated_hw) != (0, 0) and (h, w) != tuple(annotated_hw):
        raise ValueError(
            f"header size {h}x{w} differs from the annotation's {annotated_hw[0]}x{annotated_hw[1]}; not decoded"
        )
    return hw
