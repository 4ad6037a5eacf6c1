"""COCO mAP on original image coordinates and category ids, through one of two COCOeval
implementations (``model.eval_backend``): ``faster`` (faster-coco-eval, C++; equal to
pycocotools to 1e-4 on every stat and the full precision array, docs/benchmarks.md "Evaluation backends")
or ``pycocotools`` (the reference)."""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

import numpy as np

from cocodet import schema
from cocodet.errors import UserError

STAT_NAMES = ("map", "map50", "map75", "map_small", "map_medium", "map_large")
# COCOeval.stats in order: the six above, then average recall at 1/10/100 detections and by size.
ALL_STAT_NAMES = STAT_NAMES + ("mar_1", "mar_10", "mar_100", "mar_small", "mar_medium", "mar_large")


DEFAULT_BACKEND = "faster"


class EvalBackendError(UserError):
    """The chosen COCOeval implementation cannot be imported."""


def backend_classes(name: str) -> tuple[type, type]:
    """(COCO, COCOeval) of the ``model.eval_backend`` named. An import failure says which
    backend failed and why (a broken build reads differently from a missing package)."""
    schema.check("model.eval_backend", name)
    try:
        if name == "faster":
            from faster_coco_eval import COCO, COCOeval_faster

            return COCO, COCOeval_faster
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval

        return COCO, COCOeval
    except ImportError as e:
        other = "pycocotools" if name == "faster" else "faster"
        raise EvalBackendError(
            f"model.eval_backend={name}: importing it failed ({type(e).__name__}: {e}); "
            f"reinstall requirements.txt, or use model.eval_backend={other}"
        ) from None


def load_ground_truth(ann_file: str | Path, backend: str = DEFAULT_BACKEND):
    coco, _ = backend_classes(backend)
    with contextlib.redirect_stdout(io.StringIO()):  # both report progress with print()
        return coco(str(ann_file))


def to_original_frame(boxes: np.ndarray, to_original: np.ndarray) -> np.ndarray:
    """Map xyxy boxes from the model's input (letterboxed, or resized as the model's transform
    would) back to the stored image: undo the scale per axis, clip to the image.
    ``to_original``: (orig_h, orig_w, scale_y, scale_x), or (orig_h, orig_w, scale)."""
    orig_h, orig_w, *scale = to_original
    sy, sx = (scale[0], scale[0]) if len(scale) == 1 else scale
    out = boxes.astype(np.float64) / np.array([sx, sy, sx, sy])
    np.clip(out[:, 0::2], 0, orig_w, out=out[:, 0::2])
    np.clip(out[:, 1::2], 0, orig_h, out=out[:, 1::2])
    return out


# Box coordinates in COCO results, for validation and mode=predict alike, so a user scoring
# predict's file gets validation's number. 1e-4 px: at 2 decimals (validation's rounding until
# 2026-12) IoUs of small boxes move across thresholds, and a 2-epoch synthetic checkpoint read
# mAP 0.4657 in validation against 0.4646 from the same boxes written at 4 decimals.
RESULT_DECIMALS = 4


def detections_to_coco(
    image_id: int, boxes_xyxy: np.ndarray, scores: np.ndarray, category_ids: np.ndarray
) -> list[dict]:
    """One COCO result record per detection (bbox as x, y, w, h, rounded to RESULT_DECIMALS)."""
    xywh = boxes_xyxy.copy()
    xywh[:, 2:] -= xywh[:, :2]
    return [
        {
            "image_id": int(image_id),
            "category_id": int(c),
            "bbox": [round(float(v), RESULT_DECIMALS) for v in b],
            "score": float(s),
        }
        for b, s, c in zip(xywh, scores, category_ids)
    ]


def coco_results(
    output: dict, target: dict, category_ids: np.ndarray, score_threshold: float | None = None
) -> list[dict]:
    """One image's detections as COCO results, for validation and ``mode=predict`` alike: the
    model's ``output`` (boxes, scores, labels 1..K) kept at ``score_threshold`` (None: all),
    boxes mapped back to the stored image by ``target["to_original"]``, labels to the original
    ``category_ids`` (of labels 1..K)."""
    boxes, scores, categories = kept_detections(output, category_ids, score_threshold)
    image_id = int(target["image_id"])
    return detections_to_coco(
        image_id, to_original_frame(boxes, target["to_original"].cpu().numpy()), scores, categories
    )


def kept_detections(
    output: dict, category_ids: np.ndarray, score_threshold: float | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An output's (boxes in the model's input frame, scores, original category ids), label 0
    dropped (FCOS and RetinaNet score it too; it is background here and has no COCO id) and,
    with ``score_threshold``, the detections scoring below it."""
    keep = output["labels"] > 0
    if score_threshold is not None:
        keep = keep & (output["scores"] >= score_threshold)
    keep = keep.cpu().numpy()
    labels = output["labels"].cpu().numpy()[keep]
    return (
        output["boxes"].float().cpu().numpy()[keep],
        output["scores"].float().cpu().numpy()[keep],
        category_ids[labels - 1],
    )


def evaluate(
    gt, results: list[dict], image_ids: list[int] | None = None, backend: str = DEFAULT_BACKEND
) -> dict[str, float]:
    """Run COCOeval (bbox) with ``backend`` (``gt`` loaded by the same one) and return the twelve
    standard numbers (ALL_STAT_NAMES), the printed report, and the COCOeval object
    (``coco_eval``, for per-category tables); zeros and None when nothing was detected."""
    if not results:
        return {**dict.fromkeys(ALL_STAT_NAMES, 0.0), "coco_eval": None}
    _, cocoeval = backend_classes(backend)
    with contextlib.redirect_stdout(io.StringIO()) as text:
        dt = gt.loadRes(results)
        ev = cocoeval(gt, dt, iouType="bbox")
        if image_ids is not None:
            ev.params.imgIds = sorted(set(image_ids))
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    # As COCOeval reports them: -1 where the split has no ground truth in that area range (a
    # dataset without small objects), not 0, which would read as a model failing on them.
    stats = {name: float(v) for name, v in zip(ALL_STAT_NAMES, ev.stats[: len(ALL_STAT_NAMES)])}
    stats["report"] = text.getvalue()
    stats["coco_eval"] = ev
    return stats


def per_category_ap(ev, names: dict[int, str]) -> list[dict]:
    """AP (IoU 0.50:0.95) and AP50 of each category, all areas, 100 detections, ranked by AP.
    A category without ground truth in the evaluated images has no AP (None)."""
    precision = ev.eval["precision"]  # [IoU thresholds, recall thresholds, categories, areas, max dets]
    rows = []
    for k, cat_id in enumerate(ev.params.catIds):
        p = precision[:, :, k, 0, -1]
        valid = p[p > -1]
        p50 = p[0][p[0] > -1]
        rows.append(
            {
                "category_id": int(cat_id),
                "name": names.get(int(cat_id), str(cat_id)),
                "ap": round(float(valid.mean()), 4) if valid.size else None,
                "ap50": round(float(p50.mean()), 4) if p50.size else None,
            }
        )
    return sorted(rows, key=lambda r: -1.0 if r["ap"] is None else r["ap"], reverse=True)


def precision_recall(ev) -> dict[str, np.ndarray]:
    """Precision at each of COCOeval's 101 recall thresholds, averaged over the categories
    that have ground truth: at IoU 0.50, 0.75 and over 0.50:0.95 (all areas, 100 detections)."""
    precision = ev.eval["precision"][:, :, :, 0, -1]  # [T, R, K]

    def mean_over_categories(p: np.ndarray) -> np.ndarray:  # -1 marks "no ground truth"
        masked = np.where(p > -1, p, np.nan)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a recall level no category reaches
            return np.nan_to_num(np.nanmean(masked, axis=-1))

    return {
        "recall": np.asarray(ev.params.recThrs),
        "iou50": mean_over_categories(precision[0]),
        "iou75": mean_over_categories(precision[5]),
        "iou50_95": mean_over_categories(precision).mean(axis=0),
    }
