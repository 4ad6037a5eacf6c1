"""What a split keeps, by COCO's rules, which every layout follows: the annotations a detector
trains on (crowd regions and boxes without area are counted, not kept) and the images that stay
under ``dataset.keep_empty`` (``image_stays``; ``boxes_stay`` for a layout without crowd regions).
"""

from __future__ import annotations

import math

import numpy as np


def image_stays(keep_empty: bool | str, kept: list, anns: list[dict]) -> bool:
    """Whether an image enters the index under the ``keep_empty`` rule (see ``index.build_index``)."""
    if keep_empty == "reference":
        return bool(anns) and not all(any(side <= 1 for side in a["bbox"][2:]) for a in anns)
    return bool(kept) or bool(keep_empty)


def boxes_stay(keep_empty: bool | str, boxes: np.ndarray) -> bool:
    """COCO's keep_empty rule (``image_stays``) for an image with no crowd regions, from its xyxy boxes."""
    if keep_empty == "reference":
        return len(boxes) > 0 and not bool(np.all((boxes[:, 2] - boxes[:, 0] <= 1) | (boxes[:, 3] - boxes[:, 1] <= 1)))
    return len(boxes) > 0 or bool(keep_empty)


def training_boxes(anns: list[dict], label_of: dict[int, int], dropped: dict[str, int]) -> list[tuple[list, int]]:
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
