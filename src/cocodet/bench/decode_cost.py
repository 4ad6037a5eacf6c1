"""What full-resolution JPEG decoding alone costs on this host's cores: the bound it sets on a
loader's samples/s, which mode=bench reports beside what the loader reached."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from cocodet.images.decode import decode_checked
from cocodet.storage.store import read_bytes

if TYPE_CHECKING:
    from cocodet.datamodule import CocoDataModule


def decode_probe(datamodule: CocoDataModule, images: int) -> float | None:
    """Milliseconds one core takes to decode one of the dataset's own files at full resolution.

    Files are read first, so only the decode (and the colour conversion the loader does) is
    timed; a file that fails to decode costs nothing and is left out.
    """
    index, max_pixels = datamodule.train_index, datamodule.max_image_pixels
    blobs = []
    for k in range(min(images, len(index))):
        try:
            blobs.append((read_bytes(str(index.paths[k])), (int(index.sizes[k][0]), int(index.sizes[k][1]))))
        except OSError:
            continue
    times = []
    for data, annotated_hw in blobs:
        best = None
        for _ in range(3):  # the fastest of three: the cost on a core nothing else is using
            t0 = time.perf_counter()
            try:  # guarded like the loader's decode: a file it would refuse is refused here, undecoded
                decode_checked(data, annotated_hw, max_pixels)
            except ValueError:
                break
            best = min(best or 1e9, time.perf_counter() - t0)
        if best is not None:
            times.append(best)
    return 1000.0 * float(np.median(times)) if times else None


def decode_bounds(decode_ms: float, cpus: int, decodes_per_sample: float) -> dict:
    """Samples/s that full-resolution JPEG decoding alone allows on ``cpus`` cores: at the
    decodes per sample measured (None when nothing was decoded: a pixel cache), and for a
    naive 4-decode mosaic whatever the loader does (the reference the speed issues use)."""
    return {
        "decode_ms_per_image": round(decode_ms, 3),
        "decode_bound": round(cpus * 1000.0 / (decode_ms * decodes_per_sample), 1) if decodes_per_sample else None,
        "decode_bound_4": round(cpus * 1000.0 / (decode_ms * 4), 1),
    }
