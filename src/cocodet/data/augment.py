"""Augmentation recipes: ``mosaic`` (YOLO-style train recipe), ``basic``, ``none``; letterbox for eval.

Every recipe takes its randomness from the numpy Generator it is handed, which the dataset
seeds from (seed, epoch, index): the output never depends on the worker that ran it.
"""

from __future__ import annotations

from typing import Callable

import albumentations as A
import cv2
import numpy as np

PAD_VALUE = 114  # YOLO's grey: padding that looks like nothing in particular
Raw = tuple[np.ndarray, np.ndarray, np.ndarray]  # rgb image, xyxy boxes, labels


def letterbox(image: np.ndarray, boxes: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Resize the long side to ``size`` keeping the aspect ratio, pad bottom/right to size x size."""
    h, w = image.shape[:2]
    scale = size / max(h, w)
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    interp = cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR
    resized = cv2.resize(image, (nw, nh), interpolation=interp) if (nh, nw) != (h, w) else image
    out = np.full((size, size, 3), PAD_VALUE, dtype=np.uint8)
    out[:nh, :nw] = resized
    return out, boxes * np.float32(scale), scale


def _hflip(image: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w = image.shape[1]
    flipped = boxes.copy()
    flipped[:, [0, 2]] = w - boxes[:, [2, 0]]
    return np.ascontiguousarray(image[:, ::-1]), flipped


class Recipe:
    """A named transform. ``partners`` is how many extra raw samples it consumes (mosaic: 3)."""

    partners = 0

    def __init__(self, image_size: int):
        self.image_size = image_size

    def __call__(self, raw: Raw, rng: np.random.Generator, partner_raws: list[Raw]) -> tuple[Raw, float]:
        """Return the transformed (image, boxes, labels) and the scale from the source frame
        (meaningful for letterbox-style recipes, used to map predictions back)."""
        raise NotImplementedError


class Letterbox(Recipe):
    """Validation and ``augment=none``: letterbox only, deterministic."""

    def __call__(self, raw, rng, partner_raws):
        image, boxes, labels = raw
        image, boxes, scale = letterbox(image, boxes, self.image_size)
        return (image, boxes, labels), scale


class Basic(Recipe):
    """Letterbox + horizontal flip."""

    def __init__(self, image_size: int, flip_p: float = 0.5):
        super().__init__(image_size)
        self.flip_p = flip_p

    def __call__(self, raw, rng, partner_raws):
        image, boxes, labels = raw
        image, boxes, scale = letterbox(image, boxes, self.image_size)
        if rng.random() < self.flip_p:
            image, boxes = _hflip(image, boxes)
        return (image, boxes, labels), scale


class Mosaic(Recipe):
    """4-image mosaic -> random affine (scale, translate) -> HSV jitter -> flip -> clip/filter.

    Built on albumentations (bbox-aware); reseeded per sample from the sample's generator.
    Boxes under ``min_box_px`` or keeping under ``min_visibility`` of their area are dropped.
    """

    partners = 3

    def __init__(self, image_size: int, scale: tuple[float, float] = (0.5, 1.5), translate: float = 0.1,
                 hsv: tuple[int, int, int] = (10, 40, 30), flip_p: float = 0.5, mosaic_p: float = 1.0,
                 min_box_px: float = 2.0, min_visibility: float = 0.1):
        super().__init__(image_size)
        s = image_size
        bbox = A.BboxParams(format="pascal_voc", label_fields=["labels"], min_width=min_box_px,
                            min_height=min_box_px, min_visibility=min_visibility, clip=True,
                            filter_invalid_bboxes=True)
        self.compose = A.Compose(
            [
                A.Mosaic(grid_yx=(2, 2), target_size=(s, s), cell_shape=(s, s), center_range=(0.3, 0.7),
                         fit_mode="contain", fill=PAD_VALUE, p=mosaic_p),
                A.LongestMaxSize(max_size=s, p=1.0),
                A.PadIfNeeded(min_height=s, min_width=s, position="top_left", border_mode=cv2.BORDER_CONSTANT,
                              fill=PAD_VALUE, p=1.0),
                A.Affine(scale=tuple(scale), translate_percent=(-translate, translate), fill=PAD_VALUE,
                         border_mode=cv2.BORDER_CONSTANT, p=1.0),
                A.HueSaturationValue(hue_shift_limit=hsv[0], sat_shift_limit=hsv[1], val_shift_limit=hsv[2], p=1.0),
                A.HorizontalFlip(p=flip_p),
            ],
            bbox_params=bbox,
            seed=0,
        )

    def __call__(self, raw, rng, partner_raws):
        image, boxes, labels = raw
        metadata = [{"image": im, "bboxes": bx, "labels": lb} for im, bx, lb in partner_raws]
        # One seed drawn from the sample's generator drives every albumentations transform.
        self.compose.set_random_seed(int(rng.integers(2**31 - 1)))
        out = self.compose(image=image, bboxes=boxes, labels=labels, mosaic_metadata=metadata)
        out_boxes = np.asarray(out["bboxes"], dtype=np.float32).reshape(-1, 4)
        out_labels = np.asarray(out["labels"], dtype=np.int64).reshape(-1)
        return (out["image"], out_boxes, out_labels), 1.0


RECIPES: dict[str, Callable[..., Recipe]] = {"mosaic": Mosaic, "basic": Basic, "none": Letterbox}


def build_recipe(name: str, image_size: int, **params) -> Recipe:
    """Build a recipe by name; fail loudly on an unknown one."""
    if name not in RECIPES:
        raise ValueError(f"unknown augment recipe {name!r}; choose one of {sorted(RECIPES)}")
    return RECIPES[name](image_size=image_size, **params)
