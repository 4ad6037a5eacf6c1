"""COCO mAP with pycocotools' COCOeval, on original image coordinates and category ids."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

STAT_NAMES = ("map", "map50", "map75", "map_small", "map_medium", "map_large")


def load_ground_truth(ann_file: str | Path) -> COCO:
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools reports progress with print()
        return COCO(str(ann_file))


def to_original_frame(boxes: np.ndarray, to_original: np.ndarray) -> np.ndarray:
    """Map xyxy boxes from the letterboxed input (padded bottom/right) back to the stored image:
    undo the scale, clip to the image."""
    orig_h, orig_w, scale = to_original
    out = boxes.astype(np.float64) / scale
    np.clip(out[:, 0::2], 0, orig_w, out=out[:, 0::2])
    np.clip(out[:, 1::2], 0, orig_h, out=out[:, 1::2])
    return out


def detections_to_coco(image_id: int, boxes_xyxy: np.ndarray, scores: np.ndarray, category_ids: np.ndarray) -> list[dict]:
    """One COCO result record per detection (bbox as x, y, w, h)."""
    xywh = boxes_xyxy.copy()
    xywh[:, 2:] -= xywh[:, :2]
    return [
        {"image_id": int(image_id), "category_id": int(c), "bbox": [round(float(v), 2) for v in b], "score": float(s)}
        for b, s, c in zip(xywh, scores, category_ids)
    ]


def evaluate(gt: COCO, results: list[dict], image_ids: list[int] | None = None) -> dict[str, float]:
    """Run COCOeval (bbox) and return the six headline numbers; zeros when nothing was detected."""
    if not results:
        return dict.fromkeys(STAT_NAMES, 0.0)
    with contextlib.redirect_stdout(io.StringIO()) as text:
        dt = gt.loadRes(results)
        ev = COCOeval(gt, dt, iouType="bbox")
        if image_ids is not None:
            ev.params.imgIds = sorted(set(image_ids))
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    stats = {name: max(0.0, float(v)) for name, v in zip(STAT_NAMES, ev.stats[:6])}
    stats["report"] = text.getvalue()
    return stats
