"""The one resize every recipe and every reader uses, so train and validation preprocessing
cannot drift apart (OpenCV only)."""

from __future__ import annotations

import cv2
import numpy as np


def letterbox_resize(image: np.ndarray, size: int, dst_for=None) -> tuple[np.ndarray, float]:
    """Resize so the long side is ``size``, keeping the aspect ratio (INTER_AREA when shrinking).

    The one resize every recipe uses, so train and validation preprocessing cannot drift apart.
    ``dst_for(h, w)``: where the resized pixels go (an h x w x 3 uint8 array, e.g. a slot of the
    window cache, so they are written once), or None for a new array; not called when no
    resize is needed (the input comes back as it is).
    """
    h, w = image.shape[:2]
    scale = size / max(h, w)
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    if (nh, nw) == (h, w):
        return image, scale
    interp = cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR
    dst = dst_for(nh, nw) if dst_for is not None else None
    if dst is None:
        return cv2.resize(image, (nw, nh), interpolation=interp), scale
    cv2.resize(image, (nw, nh), dst=dst, interpolation=interp)
    return dst, scale
