"""torchvision's single-shot reference presets (``references/detection/presets.py``):
``augment=ssd|ssdlite``, each sample as an SSD model sees it after its own fixed-size resize
(design §13).

- ``ssd``: photometric distort, zoom out (fill: the reference's mean), IoU crop, flip;
- ``ssdlite``: IoU crop, flip.

The reference then drops boxes under 1 px (v2's ``SanitizeBoundingBoxes``) and its model
resizes every image to a fixed square without keeping the aspect ratio (320 x 320 for
SSDlite320, 300 x 300 for SSD300). Here the loader does that resize too, on uint8, and the
model's transform does nothing more, in training or evaluation (``models/zoo.py``).

Every draw comes from the per-sample generator in the order v2 draws it (``torch.rand`` is
float32, sizes truncate to int): the distort's four on/off draws each followed by its factor,
the contrast order, the channel-shuffle draw and permutation; the zoom's apply draw, side
factor and two offsets; the crop's minimum-IoU choice and, per trial, two scales and (when the
aspect ratio passes) two offsets. The zoomed canvas is never materialised: only the region the
crop keeps is composed (the same pixels as cropping the padded canvas). The draws are here; what
they drive (the distort, the composed region, the crop's IoU) is ``transforms/ssd_kernels.py``.

Facts from torchvision 0.29 ``transforms/v2`` (``RandomPhotometricDistort``, ``RandomZoomOut``,
``RandomIoUCrop``, ``SanitizeBoundingBoxes``) and pytorch/vision ``references/detection/presets.py``;
``tests/test_ssd_presets.py`` holds each against them.
"""

from __future__ import annotations

import numpy as np

from cocodet.transforms import model_resize
from cocodet.transforms.recipe import Raw, Sample
from cocodet.transforms.reference_presets import ReferencePreset, resize_uint8, scale_boxes
from cocodet.transforms.ssd_kernels import DISTORT_RANGES, box_iou_max, compose, distort

MEAN_FILL = (123, 117, 104)  # the reference's zoom-out fill (its `mean`, ImageNet's in 0-255)
IOU_OPTIONS = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)  # RandomIoUCrop's minimum IoUs; 1.0: leave the image as is


def _u(rng) -> np.float32:
    """One torch.rand draw: float32 in [0, 1)."""
    return np.float32(rng.random())


class FixedResize(ReferencePreset):
    """An SSD model's evaluation resize: the whole image to size x size, no aspect ratio kept
    (validation, ``mode=eval``, ``mode=predict``, exported models)."""

    @classmethod
    def sizes_from_model(cls, detector):
        return model_resize.fixed_sizes(str(detector["name"]))  # on the module when asked (as builder_sizes)

    def __init__(self, image_size: int, model_sizes: tuple[int, int]):
        super().__init__(image_size, model_sizes, flip_p=0.0)

    @property
    def output_hw(self) -> tuple[int, int]:
        return self.model_sizes

    def largest_hw(self) -> tuple[int, int]:
        return self.model_sizes

    def eval_recipe(self) -> "FixedResize":
        return self

    def export_resize(self) -> dict:
        return {"kind": "fixed", "height": self.model_sizes[0], "width": self.model_sizes[1]}

    def _fixed_resize(self, image, boxes, out=None):
        resized = resize_uint8(image, self.model_sizes, antialias=False)  # the model's kernel: no antialias
        if out is not None and out.shape == resized.shape:
            np.copyto(out, resized)
            resized = out
        return (resized, *scale_boxes(boxes, image.shape[:2], self.model_sizes))

    def __call__(self, raw: Raw, rng, partner_raws, out=None) -> Sample:
        image, boxes, labels = raw
        resized, boxes, scale = self._fixed_resize(image, boxes, out)
        return Sample(resized, boxes, labels, scale, 0.0)


class SingleShotPreset(FixedResize):
    """``ssd`` (``photometric`` and ``zoom_out`` on) or ``ssdlite`` (both off): the reference's
    train transforms, its 1-px box rule, then the model's fixed-size resize.

    Args:
        image_size: unused (kept so every recipe is built alike).
        model_sizes: the model's fixed (height, width) (``model_resize.fixed_sizes``).
        photometric: v2's RandomPhotometricDistort (each of its five operations with ``distort_p``).
        zoom_out: v2's RandomZoomOut with ``zoom_p``, the side grown by a factor in ``zoom_range``.
        flip_p: probability of a horizontal flip.
        fill: the zoom-out canvas's colour.
        crop_scale, crop_aspect, crop_trials: RandomIoUCrop's scale and aspect-ratio limits and its
            trials per drawn minimum IoU.
        stored_side: the longest stored image side the loader plan budgets the zoom-out canvas
            for (COCO's 640); a worker's memory estimate grows with its square.
    """

    def __init__(
        self,
        image_size: int,
        model_sizes: tuple[int, int],
        photometric: bool,
        zoom_out: bool,
        flip_p: float = 0.5,
        distort_p: float = 0.5,
        zoom_p: float = 0.5,
        zoom_range: tuple[float, float] = (1.0, 4.0),
        fill: tuple[int, int, int] = MEAN_FILL,
        crop_scale: tuple[float, float] = (0.3, 1.0),
        crop_aspect: tuple[float, float] = (0.5, 2.0),
        crop_trials: int = 40,
        stored_side: int = 640,
    ):
        super().__init__(image_size, model_sizes)
        self.flip_p = float(flip_p)
        self.photometric, self.zoom_out = bool(photometric), bool(zoom_out)
        self.distort_p, self.zoom_p = float(distort_p), float(zoom_p)
        self.zoom_range = (float(zoom_range[0]), float(zoom_range[1]))
        if not 1.0 <= self.zoom_range[0] <= self.zoom_range[1]:
            raise ValueError(f"augment.zoom_range={list(zoom_range)}: both factors at least 1, the first the smaller")
        self.fill = tuple(int(c) for c in fill)
        self.crop_scale = (float(crop_scale[0]), float(crop_scale[1]))
        self.crop_aspect = (float(crop_aspect[0]), float(crop_aspect[1]))
        self.crop_trials, self.stored_side = int(crop_trials), int(stored_side)

    def eval_recipe(self) -> FixedResize:
        return FixedResize(self.image_size, self.model_sizes)

    def working_bytes(self) -> int:
        """A worker's largest intermediate beyond its batch, for a stored_side-square image: the
        zoomed region (uint8, up to zoom_range[1] squared times the image) and the distort's
        float32 hue conversion (about four float copies of the image)."""
        pixels = self.stored_side**2
        canvas = int((self.zoom_range[1] ** 2) * pixels * 3) if self.zoom_out else 0
        distort = pixels * 3 * 4 * 4 if self.photometric else 0
        return canvas + distort

    # --- the draws, each in v2's order --------------------------------------------------

    def distort_params(self, rng) -> dict:
        """RandomPhotometricDistort.make_params: each factor (or None), contrast first or last,
        the channel permutation (or None)."""
        params = {}
        for key, (lo, hi) in DISTORT_RANGES:
            on = _u(rng) < self.distort_p
            params[key] = float(np.float32(lo) + _u(rng) * np.float32(hi - lo)) if on else None
        params["contrast_before"] = bool(_u(rng) < 0.5)
        params["permutation"] = rng.permutation(3) if _u(rng) < self.distort_p else None
        return params

    def zoom_params(self, h: int, w: int, rng) -> tuple[int, int, int, int] | None:
        """RandomZoomOut: None (not applied), or the canvas (height, width) and the image's (top, left) on it."""
        if not _u(rng) < self.zoom_p:
            return None
        lo, hi = self.zoom_range
        r = np.float32(lo) + _u(rng) * np.float32(hi - lo)
        ch, cw = int(np.float32(h) * r), int(np.float32(w) * r)
        u_left, u_top = _u(rng), _u(rng)
        return ch, cw, int(np.float32(ch - h) * u_top), int(np.float32(cw - w) * u_left)

    def crop_params(self, h: int, w: int, boxes: np.ndarray, rng) -> tuple[int, int, int, int, np.ndarray] | None:
        """RandomIoUCrop: None (the image as is), or (top, left, height, width, boxes kept): a
        region holding at least one box centre, one of them overlapping it by the drawn IoU."""
        lo, hi = np.float32(self.crop_scale[0]), np.float32(self.crop_scale[1] - self.crop_scale[0])
        cx, cy = np.float32(0.5) * (boxes[:, 0] + boxes[:, 2]), np.float32(0.5) * (boxes[:, 1] + boxes[:, 3])
        while True:  # as v2: a new minimum IoU whenever its trials run out (1.0 ends it)
            min_iou = IOU_OPTIONS[int(rng.integers(len(IOU_OPTIONS)))]
            if min_iou >= 1.0:
                return None
            for _ in range(self.crop_trials):
                sw, sh = lo + hi * _u(rng), lo + hi * _u(rng)
                new_w, new_h = int(np.float32(w) * sw), int(np.float32(h) * sh)
                # A zero width fails the aspect ratio (v2 then skips its zero-area check); a zero
                # height, which v2 divides by, can only come from an image under 4 px high.
                if new_h == 0 or not self.crop_aspect[0] <= new_w / new_h <= self.crop_aspect[1]:
                    continue
                u_left, u_top = _u(rng), _u(rng)
                left, top = int(np.float32(w - new_w) * u_left), int(np.float32(h - new_h) * u_top)
                right, bottom = left + new_w, top + new_h
                inside = (left < cx) & (cx < right) & (top < cy) & (cy < bottom)
                if not inside.any():
                    continue
                if box_iou_max(boxes[inside], np.float32([left, top, right, bottom])) < np.float32(min_iou):
                    continue
                return top, left, new_h, new_w, inside

    # --- the transforms -----------------------------------------------------------------

    def __call__(self, raw: Raw, rng, partner_raws, out=None) -> Sample:
        image, boxes, labels = raw
        if self.photometric:
            image = distort(image, self.distort_params(rng))
        h, w = image.shape[:2]
        zoom = self.zoom_params(h, w, rng) if self.zoom_out else None
        ch, cw, top_z, left_z = zoom or (h, w, 0, 0)
        boxes = boxes + np.float32([left_z, top_z, left_z, top_z]) if zoom else boxes
        crop = self.crop_params(ch, cw, boxes, rng)
        top, left, rh, rw = crop[:4] if crop else (0, 0, ch, cw)
        region, covered = compose(image, (top_z - top, left_z - left), (rh, rw), self.fill)
        if crop:
            boxes, labels = boxes[crop[4]] - np.float32([left, top, left, top]), labels[crop[4]]
            np.clip(boxes[:, 0::2], 0, rw, out=boxes[:, 0::2])
            np.clip(boxes[:, 1::2], 0, rh, out=boxes[:, 1::2])
        region, boxes = self._flip(region, boxes, rng)
        keep = ((boxes[:, 2] - boxes[:, 0]) >= 1) & ((boxes[:, 3] - boxes[:, 1]) >= 1)  # SanitizeBoundingBoxes
        resized, boxes, scale = self._fixed_resize(region, boxes[keep], out)
        return Sample(resized, boxes, labels[keep], scale, 1.0 - covered / (rh * rw))
