"""``predict.draw``: each predicted image as a PNG, the model's input with its detections drawn
(``predict.py`` runs the model; this module only draws)."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import cv2
import numpy as np
import torch

from cocodet.models.evaluation import kept_detections


def image_drawer(draw_dir: Path, file_of: dict, category_ids, names: dict, score_threshold: float):
    """A function (image, its model output, its image id) -> a PNG in ``draw_dir`` named after
    the image's file (``file_of``: image id -> file), with the detections at ``score_threshold``."""

    def draw_image(image: torch.Tensor, out: dict, image_id: int) -> None:
        path = draw_dir / f"{PurePosixPath(file_of[image_id]).stem}.png"
        draw_detections(image, *kept_detections(out, category_ids, score_threshold), names, path)

    return draw_image


def draw_detections(
    image: torch.Tensor, boxes: np.ndarray, scores: np.ndarray, category_ids: np.ndarray, names: dict, path: Path
) -> None:
    """The letterboxed input with its detections (boxes in that frame), as a PNG."""
    canvas = cv2.cvtColor((image.cpu().permute(1, 2, 0).numpy() * 255).round().astype(np.uint8), cv2.COLOR_RGB2BGR)
    for (x0, y0, x1, y1), score, cid in zip(boxes, scores, category_ids):
        p0, p1 = (int(x0), int(y0)), (int(x1), int(y1))
        cv2.rectangle(canvas, p0, p1, (0, 200, 255), 2)
        cv2.putText(
            canvas,
            f"{names.get(int(cid), cid)} {score:.2f}",
            (p0[0], max(12, p0[1] - 4)),
            cv2.FONT_HERSHEY_SIMPLEX,
            0.45,
            (0, 200, 255),
            1,
            cv2.LINE_AA,
        )
    cv2.imwrite(str(path), canvas)
