"""The pixel and box arithmetic of the single-shot presets (``transforms/ssd_presets.py``), given
the draws: v2's photometric distort with its own uint8 kernels, the region of the zoomed canvas
that the crop keeps (composed without building the canvas), and the crop's IoU test with
torchvision's ``box_iou`` arithmetic.
"""

from __future__ import annotations

import numpy as np

# v2's RandomPhotometricDistort ranges, in the order it draws them.
DISTORT_RANGES = (
    ("brightness", (0.875, 1.125)),
    ("contrast", (0.5, 1.5)),
    ("saturation", (0.5, 1.5)),
    ("hue", (-0.05, 0.05)),
)


def box_iou_max(boxes: np.ndarray, region: np.ndarray) -> np.float32:
    """The largest IoU of ``boxes`` [n, 4] with one ``region`` [4], in float32 with torchvision's
    ``box_iou`` arithmetic (so a tie with the drawn minimum falls as it does there)."""
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    region_area = (region[2] - region[0]) * (region[3] - region[1])
    wh = np.clip(np.minimum(boxes[:, 2:], region[2:]) - np.maximum(boxes[:, :2], region[:2]), 0, None)
    inter = wh[:, 0] * wh[:, 1]
    return (inter / (area + region_area - inter)).max()


def compose(
    image: np.ndarray, origin: tuple[int, int], hw: tuple[int, int], fill: tuple[int, int, int]
) -> tuple[np.ndarray, int]:
    """The hw region of a ``fill`` canvas with ``image`` at ``origin`` (its top-left corner in
    the region's frame, possibly negative), and how many region pixels the image covers. The
    image itself (a view) when it fills the region exactly."""
    (oy, ox), (rh, rw), (h, w) = origin, hw, image.shape[:2]
    if (oy, ox) == (0, 0) and (h, w) == (rh, rw):
        return image, rh * rw
    y0, x0, y1, x1 = max(oy, 0), max(ox, 0), min(oy + h, rh), min(ox + w, rw)
    if (y0, x0) == (0, 0) and (y1, x1) == (rh, rw) and oy <= 0 and ox <= 0:
        return image[-oy : -oy + rh, -ox : -ox + rw], rh * rw  # a crop inside the image: a view
    region = np.empty((rh, rw, 3), np.uint8)
    region[:] = fill
    if y1 > y0 and x1 > x0:
        region[y0:y1, x0:x1] = image[y0 - oy : y1 - oy, x0 - ox : x1 - ox]
    return region, max(0, y1 - y0) * max(0, x1 - x0)


def distort(image: np.ndarray, params: dict) -> np.ndarray:
    """RandomPhotometricDistort.transform on an HxWx3 uint8 image with v2's own uint8 kernels
    (brightness, contrast before or after saturation and hue, channel permutation)."""
    if all(params[k] is None for k, _ in DISTORT_RANGES) and params["permutation"] is None:
        return image
    import torch
    from torchvision.transforms.v2 import functional as F

    t = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).contiguous()  # CHW, as v2 receives it
    if params["brightness"] is not None:
        t = F.adjust_brightness(t, brightness_factor=params["brightness"])
    if params["contrast"] is not None and params["contrast_before"]:
        t = F.adjust_contrast(t, contrast_factor=params["contrast"])
    if params["saturation"] is not None:
        t = F.adjust_saturation(t, saturation_factor=params["saturation"])
    if params["hue"] is not None:
        t = F.adjust_hue(t, hue_factor=params["hue"])
    if params["contrast"] is not None and not params["contrast_before"]:
        t = F.adjust_contrast(t, contrast_factor=params["contrast"])
    if params["permutation"] is not None:
        t = F.permute_channels(t, permutation=params["permutation"].tolist())
    return t.permute(1, 2, 0).contiguous().numpy()
