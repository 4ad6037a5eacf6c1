"""One slot of the window cache, in bytes: its header and its pixels (bottom layer: numpy only).

The cache (``data/window_cache.py``) lays its slots out by it and the loader plan
(``loader/plan/window_slots.py``) counts how many fit by it, so neither imports the other.
"""

from __future__ import annotations

import numpy as np

# A slot's header, read and written by the cache: 64 bytes.
SLOT_HEADER = np.dtype(
    [
        ("gen", "<i8"),
        ("index", "<i8"),
        ("size", "<i8"),
        ("h", "<i8"),
        ("w", "<i8"),
        ("orig_h", "<i8"),
        ("orig_w", "<i8"),
        ("scale", "<f8"),
    ]
)


def slot_pixels(side: int) -> int:
    """One slot's pixel area, for images whose long side is ``side``."""
    return side * side * 3


def slot_bytes(side: int) -> int:
    """One slot: its pixel area and its header."""
    return slot_pixels(side) + SLOT_HEADER.itemsize
