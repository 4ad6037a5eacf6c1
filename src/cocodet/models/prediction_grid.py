"""A picture of what the model predicts, at every validation: ground truth beside predictions.

After each validation's COCOeval (rank 0 only) the callback draws a fixed set of val images,
the first ``images`` of the val split that were evaluated, into one PNG grid in the run directory,
and logs the same picture to TensorBoard when that logger is on. Each tile is a pair of panels:
the ground truth on the left, the predictions scoring at least ``score_threshold`` on the right,
both on the stored image (the detections after their map back to the original frame, so a fault
anywhere on that path shows), one colour per class, class names and scores written on the boxes.
"""

from __future__ import annotations

import colorsys
import logging
from pathlib import Path

import cv2
import lightning as L
import numpy as np
from lightning.pytorch.loggers import TensorBoardLogger

from cocodet.datasets.index import CocoIndex
from cocodet.images.decode import decode_checked
from cocodet.images.header import DEFAULT_MAX_IMAGE_PIXELS
from cocodet.storage.errors import StoreError
from cocodet.storage.store import read_bytes

log = logging.getLogger(__name__)

GAP = 4  # pixels of GAP_RGB around every panel
GAP_RGB = (32, 32, 32)
CAPTION = 18  # pixels under each panel for its caption
TAG = "val/predictions"


def class_colour(label: int) -> tuple[int, int, int]:
    """RGB colour of contiguous label ``label`` (golden-ratio hues: neighbours look different)."""
    r, g, b = colorsys.hsv_to_rgb((label * 0.618033988749895) % 1.0, 0.9, 1.0)
    return int(r * 255), int(g * 255), int(b * 255)


def panel_origin(tile: int, panel: int, cols: int, tile_px: int) -> tuple[int, int]:
    """(x, y) of the top-left pixel of ``panel`` (0: ground truth, 1: predictions) of ``tile``."""
    row, col = divmod(tile, cols)
    x = GAP + (col * 2 + panel) * (tile_px + GAP)
    y = GAP + row * (tile_px + CAPTION + GAP)
    return x, y


def grid_shape(tiles: int, cols: int, tile_px: int) -> tuple[int, int]:
    """(height, width) of the grid of ``tiles`` tiles, ``cols`` tiles to a row."""
    rows = -(-tiles // cols)
    return GAP + rows * (tile_px + CAPTION + GAP), GAP + 2 * min(cols, tiles) * (tile_px + GAP)


def _draw_box(canvas: np.ndarray, box: np.ndarray, colour: tuple[int, int, int], text: str) -> None:
    x1, y1, x2, y2 = (int(round(v)) for v in box)
    cv2.rectangle(canvas, (x1, y1), (x2, y2), colour, 2)
    (w, h), _ = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, 0.4, 1)
    top = max(y1 - h - 4, 0)  # the label sits above the box, inside the panel when the box touches its top
    cv2.rectangle(canvas, (x1, top), (x1 + w + 2, top + h + 4), colour, -1)
    cv2.putText(canvas, text, (x1 + 1, top + h + 1), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (0, 0, 0), 1, cv2.LINE_AA)


def _panel(image: np.ndarray | None, tile_px: int) -> tuple[np.ndarray, float]:
    """The image scaled to fit ``tile_px`` (top-left aligned, like the letterbox) and that scale."""
    panel = np.full((tile_px, tile_px, 3), 96, np.uint8)
    if image is None:
        cv2.putText(panel, "unreadable", (8, tile_px // 2), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (255, 255, 255), 1)
        return panel, 0.0
    scale = tile_px / max(image.shape[:2])
    h, w = (max(1, int(round(n * scale))) for n in image.shape[:2])
    panel[:h, :w] = cv2.resize(image, (w, h), interpolation=cv2.INTER_AREA)
    return panel, scale


def _stored_image(index: CocoIndex, k: int, tile_px: int, max_pixels: int) -> tuple[np.ndarray | None, float]:
    """Image k decoded through the guarded decode (at a reduced size when that still covers
    the tile) and the factor from stored pixels to decoded pixels; None for a file that cannot
    be read or that the header check refuses (drawn as "unreadable")."""
    try:
        data = read_bytes(str(index.paths[k]))
        image = decode_checked(data, tuple(int(n) for n in index.sizes[k]), max_pixels, fit=tile_px).image
    except StoreError:  # a store that refuses the run refuses it here too
        raise
    except (OSError, ValueError) as e:  # a bad sample is the loader's to report; the picture shows it
        log.debug("prediction grid: image %s unreadable (%s)", index.paths[k], e)
        return None, 0.0
    return image, image.shape[0] / float(index.sizes[k][0])


def draw_tile(
    index: CocoIndex,
    k: int,
    detections: list[dict],
    tile_px: int,
    score_threshold: float,
    max_boxes: int,
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
) -> list[np.ndarray]:
    """The two panels of image k's tile, captions included: ground truth, then predictions."""
    image, to_decoded = _stored_image(index, k, tile_px, max_pixels)
    gt, image_id = index.targets(k), int(index.image_ids[k])
    names = dict(zip(index.category_ids.tolist(), index.category_names))
    label_of = {int(c): n + 1 for n, c in enumerate(index.category_ids.tolist())}
    panels = []
    shown = sorted((d for d in detections if d["score"] >= score_threshold), key=lambda d: -d["score"])[:max_boxes]
    for kind in ("gt", "pred"):
        panel, scale = _panel(image, tile_px)
        factor = scale * to_decoded  # stored pixels -> panel pixels
        if kind == "gt":
            for box, label in zip(*gt):
                _draw_box(panel, box * factor, class_colour(int(label)), index.category_names[int(label) - 1])
            caption = f"image {image_id}: ground truth ({len(gt[1])})"
        else:
            for d in shown:
                x, y, w, h = d["bbox"]
                box = np.array([x, y, x + w, y + h]) * factor
                _draw_box(
                    panel, box, class_colour(label_of[d["category_id"]]), f"{names[d['category_id']]} {d['score']:.2f}"
                )
            caption = f"predictions >= {score_threshold:.2f} ({len(shown)})"
        strip = np.zeros((CAPTION, tile_px, 3), np.uint8)  # black, not the gap colour: gaps stay findable
        cv2.putText(strip, caption, (4, CAPTION - 5), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (230, 230, 230), 1, cv2.LINE_AA)
        panels.append(np.vstack([panel, strip]))
    return panels


def draw_grid(
    index: CocoIndex,
    detections: dict[int, list[dict]],
    images: int,
    cols: int,
    tile_px: int,
    score_threshold: float,
    max_boxes: int,
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
) -> np.ndarray | None:
    """The RGB grid of the first ``images`` images of ``index`` that ``detections`` holds (None: none)."""
    picked = [k for k in range(len(index)) if int(index.image_ids[k]) in detections][:images]
    if not picked:
        return None
    height, width = grid_shape(len(picked), cols, tile_px)
    grid = np.full((height, width, 3), GAP_RGB, np.uint8)
    for tile, k in enumerate(picked):
        panels = draw_tile(
            index, k, detections[int(index.image_ids[k])], tile_px, score_threshold, max_boxes, max_pixels
        )
        for p, panel in enumerate(panels):
            x, y = panel_origin(tile, p, cols, tile_px)
            grid[y : y + panel.shape[0], x : x + tile_px] = panel
    return grid


class PredictionGrid(L.Callback):
    """Draws ``filename`` in ``dirpath`` after every validation (not the sanity check), rank 0.

    Args:
        dirpath: the run directory.
        images: how many val images (the first ones evaluated, the same every epoch).
        cols: tiles (ground truth + predictions pairs) per row.
        tile_px: side of each panel.
        score_threshold: predictions scoring less are not drawn.
        max_boxes: at most this many predictions per image, the highest scoring.
    """

    def __init__(
        self,
        dirpath: str,
        filename: str = "val_predictions.png",
        images: int = 8,
        cols: int = 2,
        tile_px: int = 320,
        score_threshold: float = 0.3,
        max_boxes: int = 30,
    ):
        self.path = Path(dirpath) / filename
        self.images, self.cols, self.tile_px = int(images), int(cols), int(tile_px)
        self.score_threshold, self.max_boxes = float(score_threshold), int(max_boxes)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        detections = getattr(pl_module, "last_detections", None)
        index = getattr(trainer.datamodule, "val_index", None) if trainer.datamodule is not None else None
        if trainer.sanity_checking or not trainer.is_global_zero or not detections or index is None:
            return
        max_pixels = getattr(trainer.datamodule, "max_image_pixels", DEFAULT_MAX_IMAGE_PIXELS)
        grid = draw_grid(
            index, detections, self.images, self.cols, self.tile_px, self.score_threshold, self.max_boxes, max_pixels
        )
        if grid is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not cv2.imwrite(str(self.path), np.ascontiguousarray(grid[:, :, ::-1])):  # OpenCV writes BGR
            log.warning("prediction grid: could not write %s (disk full or not writable?)", self.path)
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_image(TAG, grid, global_step=trainer.global_step, dataformats="HWC")
