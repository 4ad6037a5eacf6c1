"""The letterbox family's train recipes: ``mosaic`` (YOLO-style) and ``basic`` (``none``, letterbox
only, is ``recipe.Letterbox``).

Every recipe takes its randomness from the numpy Generator it is handed, which the dataset
seeds from (seed, epoch, index): the output never depends on the worker that ran it.

Every recipe returns a :class:`Sample` whose ``pad_share`` is computed from the geometry
(the output rectangles the source images cover), not from pixel colours.
"""

from __future__ import annotations

import math
import time

import cv2
import numpy as np

from cocodet import schema
from cocodet.images.resize import letterbox_resize
from cocodet.transforms.colour import jitter_hsv, jitter_matrix
from cocodet.transforms.partner_source import partner_source
from cocodet.transforms.recipe import Raw, Recipe, Sample, canvas, hflip, letterbox


def _visible_span(
    origin: float, zoom: float, length: int, canvas: tuple[float, float], size: int
) -> tuple[int, int, int, int] | None:
    """Along one axis: the output pixels [lo, hi) that a source of ``length`` pixels placed at
    ``origin`` (scaled by ``zoom``) covers inside the canvas and the output, and the whole
    source pixels [a, b) that land there. None when nothing is visible."""
    lo = int(round(max(origin, canvas[0], 0.0)))
    hi = int(round(min(origin + zoom * length, canvas[1], float(size))))
    if hi <= lo:
        return None
    a = max(0, math.floor((lo - origin) / zoom + 1e-6))
    b = min(length, math.ceil((hi - origin) / zoom - 1e-6))
    if b <= a:
        return None
    return lo, hi, a, b


class Basic(Recipe):
    """Letterbox + horizontal flip (albumentations, as the recipe users extend)."""

    def __init__(self, image_size: int, flip_p: float = 0.5):
        super().__init__(image_size)
        import albumentations as A  # only where it is used: the plan locates this class without it

        self.flip = A.Compose(
            [A.HorizontalFlip(p=1.0)], bbox_params=A.BboxParams(format="pascal_voc", label_fields=["labels"])
        )
        self.flip_p = flip_p

    def __call__(self, raw, rng, partner_raws, out=None):
        image, boxes, labels = raw
        image, boxes, scale, pad_share = letterbox(image, boxes, self.image_size, out)
        if rng.random() < self.flip_p:
            out = self.flip(image=image, bboxes=boxes, labels=labels)
            image = np.ascontiguousarray(out["image"])
            boxes = np.asarray(out["bboxes"], np.float32).reshape(-1, 4)
            labels = np.asarray(out["labels"], np.int64).reshape(-1)
        return Sample(image, boxes, labels, scale, pad_share)


class Mosaic(Recipe):
    """4-image mosaic on a 2s x 2s canvas, a random affine (scale, translate) of that canvas
    down to s x s, colour jitter, horizontal flip, box clip and filter (YOLO's order).

    The canvas is never materialised. The affine has no rotation or shear, so each source
    image lands in an axis-aligned output rectangle, and one ``cv2.resize`` of its visible
    whole pixels fills that rectangle (s x s output pixels in all, about 3x cheaper than
    ``warpAffine``; the zoom is thereby rounded to whole pixels per source, below 1 %).
    Applying the zoom to the canvas before cropping to s means zooming out reveals more
    mosaic rather than padding.

    Args:
        image_size: output side s.
        scale: zoom range of the affine (1.0: the central s x s of the 2s canvas).
        translate: shift range as a fraction of s.
        colour: the colour jitter (``transforms/colour.py``): ``matrix``, one 3x3 RGB map per
            sample (hue rotation, saturation and value gains), or ``hsv``, additive shifts in
            OpenCV's HSV (the stream mosaic had before ``matrix``).
        hue_deg: ``matrix``: hue rotated by up to this many degrees either way.
        saturation: ``matrix``: [low, high] gain on the chroma, drawn uniformly.
        value: ``matrix``: [low, high] gain on the brightness, drawn uniformly.
        hsv: ``hsv``: hue (OpenCV units, 0-179), saturation and value shift limits, drawn uniformly.
        flip_p: probability of a horizontal flip.
        mosaic_p: probability of a mosaic; otherwise one letterboxed image gets the affine.
        center_range: the mosaic centre's range as fractions of the 2s canvas side.
        min_box_px: boxes narrower or lower than this (output pixels) are dropped.
        min_visibility: boxes keeping less than this fraction of their area are dropped.
        partners: where the three partners of a mosaic come from (``transforms/partner_source.py``):
            ``window``, the ``partner_window`` positions of this rank's epoch order before the
            sample (images the workers decoded moments ago, shared through the window cache);
            ``pool``, the aligned run of ``partner_pool`` samples it belongs to (a batch decodes
            each image once, but each image meets the same few all epoch); ``dataset``, any
            image (up to four decodes per sample). None: ``pool`` if ``partner_pool`` is set,
            else ``dataset`` (what ``partner_pool`` alone meant before windows).
        partner_window: the window's length W (positions), with ``partners=window``.
        partner_pool: the pool's size, with ``partners=pool``; an integer also selects pools
            when ``partners`` is ``window`` (the command line's ``augment.partner_pool=8``).
    """

    @classmethod
    def geometry(cls, augment, image_size, build):
        source = partner_source(augment.get("partners"), augment.get("partner_window"), augment.get("partner_pool"))
        return super().geometry(augment, image_size, build)._replace(partners_from=source)

    def __init__(
        self,
        image_size: int,
        scale: tuple[float, float] = (0.5, 1.5),
        translate: float = 0.1,
        hsv: tuple[int, int, int] = (10, 40, 30),
        flip_p: float = 0.5,
        mosaic_p: float = 1.0,
        center_range: tuple[float, float] = (0.3, 0.7),
        min_box_px: float = 2.0,
        min_visibility: float = 0.1,
        partner_pool: int | None = None,
        partners: str | None = None,
        partner_window: int | None = None,
        colour: str = "hsv",
        hue_deg: float = 20.0,
        saturation: tuple[float, float] = (0.7, 1.3),
        value: tuple[float, float] = (0.8, 1.2),
    ):
        super().__init__(image_size)
        self.scale, self.translate, self.hsv = tuple(scale), float(translate), tuple(hsv)
        for key, v in (("colour", colour), ("hue_deg", hue_deg), ("saturation", saturation), ("value", value)):
            schema.check(f"augment.{key}", v)
        self.colour, self.hue_deg = colour, float(hue_deg)
        self.saturation, self.value = tuple(map(float, saturation)), tuple(map(float, value))
        self.flip_p, self.mosaic_p, self.center_range = flip_p, mosaic_p, tuple(center_range)
        self.min_box_px, self.min_visibility = min_box_px, min_visibility
        for key, value in (("partners", partners), ("partner_window", partner_window), ("partner_pool", partner_pool)):
            schema.check(f"augment.{key}", value)
        self.partners_from = partner_source(partners, partner_window, partner_pool)
        self.partner_pool = partner_pool if self.partners_from == "pool" else None
        self.partner_window = int(partner_window) if self.partners_from == "window" else 0

    def partners(self, rng):
        return 3 if rng.random() < self.mosaic_p else 0

    def _placements(self, raws: list[Raw], rng) -> tuple[list[tuple[np.ndarray, np.ndarray, float, float]], float]:
        """Letterboxed images with their top-left corner on the canvas, and the canvas side."""
        s = self.image_size
        resized = [letterbox_resize(im, s) for im, _, _ in raws]
        if len(raws) == 1:
            image, r = resized[0]
            h, w = image.shape[:2]
            return [(image, raws[0][1] * np.float32(r), (s - w) / 2, (s - h) / 2)], float(s)
        side = 2.0 * s
        xc, yc = rng.uniform(*self.center_range, size=2) * side
        out = []
        for k, ((image, r), (_, boxes, _)) in enumerate(zip(resized, raws)):
            h, w = image.shape[:2]
            x0 = xc - w if k in (0, 2) else xc  # quadrants: top-left, top-right, bottom-left, bottom-right
            y0 = yc - h if k in (0, 1) else yc
            out.append((image, boxes * np.float32(r), x0, y0))
        return out, side

    def __call__(self, raw, rng, partner_raws, out=None):
        s = self.image_size
        raws = [raw, *partner_raws]
        placements, side = self._placements(raws, rng)
        zoom = rng.uniform(*self.scale)
        tx, ty = s / 2 + rng.uniform(-self.translate, self.translate, size=2) * s
        # canvas point p -> output point zoom * (p - side/2) + (tx, ty), in continuous pixel
        # coordinates (pixel k spans [k, k+1)), the frame boxes live in.
        canvas_x = (tx - zoom * side / 2, tx + zoom * side / 2)
        canvas_y = (ty - zoom * side / 2, ty + zoom * side / 2)
        out = canvas(s, out)
        covered = 0
        mapped_boxes, labels_of, rects = [], [], []
        for (image, boxes, x0, y0), (_, _, labels) in zip(placements, raws):
            h, w = image.shape[:2]
            ox, oy = zoom * (x0 - side / 2) + tx, zoom * (y0 - side / 2) + ty  # image origin in the output
            xs = _visible_span(ox, zoom, w, canvas_x, s)
            ys = _visible_span(oy, zoom, h, canvas_y, s)
            if xs is None or ys is None:
                continue
            (X0, X1, u0, u1), (Y0, Y1, v0, v1) = xs, ys
            # One resize of whole source pixels onto whole output pixels: the pixels follow the
            # mapping X = X0 + (u - u0) * fx exactly (cv2's pixel-centre convention), so the
            # boxes are mapped with the same fx, fy rather than the drawn zoom.
            cv2.resize(image[v0:v1, u0:u1], (X1 - X0, Y1 - Y0), dst=out[Y0:Y1, X0:X1], interpolation=cv2.INTER_LINEAR)
            covered += (X1 - X0) * (Y1 - Y0)
            if len(boxes):
                fx, fy = (X1 - X0) / (u1 - u0), (Y1 - Y0) / (v1 - v0)
                mapped_boxes.append(boxes * np.float32([fx, fy, fx, fy]) + np.float32([X0 - u0 * fx, Y0 - v0 * fy] * 2))
                labels_of.append(labels)
                rects.append(np.broadcast_to(np.float32([X0, Y0, X1, Y1]), (len(boxes), 4)))
        if mapped_boxes:
            boxes, kept = self._clip_and_filter(np.concatenate(mapped_boxes), np.concatenate(rects))
            boxes, labels = boxes[kept], np.concatenate(labels_of)[kept]
        else:
            boxes, labels = np.zeros((0, 4), np.float32), np.zeros((0,), np.int64)
        t0 = time.perf_counter()
        self._jitter_colour(out, rng)
        colour_s = time.perf_counter() - t0
        if rng.random() < self.flip_p:
            out, boxes = hflip(out, boxes)
        return Sample(out, boxes.astype(np.float32), labels.astype(np.int64), 1.0, 1.0 - covered / (s * s), colour_s)

    def _clip_and_filter(self, mapped: np.ndarray, rects: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Clip each box to the rectangle (x0, y0, x1, y1) its image covers; keep those at least
        min_box_px on each side that keep min_visibility of their (unclipped) area.
        Returns (clipped, kept indices)."""
        lo = np.concatenate([rects[:, :2], rects[:, :2]], axis=1)
        hi = np.concatenate([rects[:, 2:], rects[:, 2:]], axis=1)
        clipped = np.minimum(np.maximum(mapped, lo), hi)
        w, h = clipped[:, 2] - clipped[:, 0], clipped[:, 3] - clipped[:, 1]
        full = (mapped[:, 2] - mapped[:, 0]) * (mapped[:, 3] - mapped[:, 1])
        keep = (w >= self.min_box_px) & (h >= self.min_box_px) & (w * h >= self.min_visibility * full)
        return clipped, np.flatnonzero(keep)

    def _jitter_colour(self, image: np.ndarray, rng) -> None:
        """The colour jitter ``colour`` names, in place; one draw of three numbers either way."""
        u = rng.uniform(-1, 1, size=3)
        if self.colour == "matrix":
            jitter_matrix(image, u, self.hue_deg, self.saturation, self.value)
        else:
            jitter_hsv(image, u, self.hsv)
