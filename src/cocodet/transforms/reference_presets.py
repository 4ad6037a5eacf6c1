"""torchvision's detection reference presets (``references/detection/presets.py``):
``augment=hflip|multiscale|lsj``, each sample as the reference model sees it (design §13).

The reference hands its model float images at their stored size (after the preset) and lets
the model's ``GeneralizedRCNNTransform`` resize them: always in evaluation, in training only
for ``hflip`` (``train.py`` sets ``_skip_resize`` for ``multiscale`` and ``lsj``). Here the
loader performs that resize too (``transforms/model_resize.py``), on uint8, and the model's transform
is told not to (``models/zoo.py``): batches leave the workers at their final size.

Every draw comes from the per-sample generator, in the reference's order, as the reference
draws it (``torch.rand`` is float32; integer sizes truncate): flip iff u < p; a shortest side
picked uniformly from ``min_sizes``; a jitter scale lo + u (hi - lo); one crop fraction for
both offsets, drawn only when the image must be cropped.

Facts from pytorch/vision ``references/detection`` at commit 3749cad2 (``transforms.py``:
``RandomShortestSize``, ``ScaleJitter``, ``FixedSizeCrop``) and 8a347e1b (``presets.py``);
``tests/test_reference_presets.py`` holds each against ``torchvision.transforms.v2``.
"""

from __future__ import annotations

import numpy as np

from cocodet.transforms import model_resize
from cocodet.transforms.model_resize import largest_hw, resized_hw
from cocodet.transforms.recipe import Geometry, Raw, Recipe, Sample, hflip

# Every torchvision reference recipe's --aspect-ratio-group-factor: what loader.group_aspect_ratio=preset
# means for a reference preset (off for the other families).
REFERENCE_GROUPING = 3


def resize_uint8(image: np.ndarray, hw: tuple[int, int], antialias: bool) -> np.ndarray:
    """HxWx3 uint8 resized to ``hw`` with torch's bilinear kernel (align_corners=False), the
    kernel both the reference's transforms and the model's transform use; uint8 in and out.
    ``antialias``: the presets' resize (torchvision's default); the model's resize has none."""
    if tuple(image.shape[:2]) == tuple(hw):
        return image
    import torch  # lazily: mode=plan builds recipes without torch

    source = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)[None]  # channels-last view, no copy
    out = torch.nn.functional.interpolate(
        source, size=tuple(hw), mode="bilinear", align_corners=False, antialias=antialias
    )
    return out[0].permute(1, 2, 0).contiguous().numpy()


def scale_boxes(boxes: np.ndarray, old_hw: tuple[int, int], new_hw: tuple[int, int]) -> tuple[np.ndarray, tuple]:
    """Boxes multiplied per axis by new/old, in float32 as torchvision does; and (y, x) factors."""
    fy = np.float32(new_hw[0]) / np.float32(old_hw[0])
    fx = np.float32(new_hw[1]) / np.float32(old_hw[1])
    return (boxes * np.array([fx, fy, fx, fy], np.float32)).astype(np.float32), (float(fy), float(fx))


class ReferencePreset(Recipe):
    """What the three presets share: stored pixels in, the reference's box rule (positive
    extent after clipping), its train split rule (``keep_empty=reference``), the model's
    evaluation resize for validation.

    Args:
        image_size: unused by these presets (kept so every recipe is built alike).
        model_sizes: (min_size, max_size) of the chosen model's transform (``model_resize.builder_sizes``).
        flip_p: probability of a horizontal flip (the reference's ``hflip_prob``).
    """

    min_box_side = 0.0
    keep_empty = "reference"
    resizes_as_model = True

    @classmethod
    def sizes_from_model(cls, detector):
        # Looked up on the module when asked: the output-parity tests plant a size fault there.
        return model_resize.builder_sizes(str(detector["name"]), detector.get("min_size"), detector.get("max_size"))

    @classmethod
    def geometry(cls, augment, image_size, build):
        """Built: the sides come from the model's resize, and outputs vary in size."""
        built = build()
        return Geometry(
            max(built.largest_hw()),
            max(built.eval_recipe().largest_hw()),
            built.working_bytes(),
            preset_grouping=REFERENCE_GROUPING,
        )

    def __init__(self, image_size: int, model_sizes: tuple[int, int], flip_p: float = 0.5):
        super().__init__(image_size)
        self.model_sizes = (int(model_sizes[0]), int(model_sizes[1]))
        self.flip_p = float(flip_p)

    @property
    def decode_size(self) -> None:
        return None

    @property
    def output_hw(self) -> None:
        return None

    def largest_hw(self) -> tuple[int, int]:
        return largest_hw(*self.model_sizes)

    def eval_recipe(self) -> "ModelResize":
        return ModelResize(self.image_size, self.model_sizes)

    def flip_decision(self, rng) -> bool:
        """One draw: flip iff u < flip_p (u float32, as torch.rand gives it to v2's flip)."""
        return bool(np.float32(rng.random()) < self.flip_p)

    def _flip(self, image, boxes, rng) -> tuple[np.ndarray, np.ndarray]:
        # A copy: the decoded source may serve another sample of the batch.
        return hflip(image, boxes, in_place=False) if self.flip_decision(rng) else (image, boxes)

    def _model_resize(self, image: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple]:
        """The model's resize (no antialias, as its transform): image, boxes, (y, x) factors."""
        hw = resized_hw(*image.shape[:2], *self.model_sizes)
        return (resize_uint8(image, hw, antialias=False), *scale_boxes(boxes, image.shape[:2], hw))


class ModelResize(ReferencePreset):
    """The model's evaluation resize, deterministic: validation, ``mode=eval`` and ``mode=predict``."""

    def __init__(self, image_size: int, model_sizes: tuple[int, int]):
        super().__init__(image_size, model_sizes, flip_p=0.0)

    def eval_recipe(self) -> "ModelResize":
        return self

    def export_resize(self) -> dict:
        return {"kind": "shortest_side", "min_size": self.model_sizes[0], "max_size": self.model_sizes[1]}

    def __call__(self, raw: Raw, rng, partner_raws, out=None) -> Sample:
        image, boxes, labels = raw
        resized, boxes, scale = self._model_resize(image, boxes)
        return Sample(resized, boxes, labels, scale, 0.0)


class HFlip(ReferencePreset):
    """``hflip``: flip with p = flip_p, then the model's (training) resize."""

    def __call__(self, raw: Raw, rng, partner_raws, out=None) -> Sample:
        image, boxes, labels = raw
        image, boxes = self._flip(image, boxes, rng)
        resized, boxes, scale = self._model_resize(image, boxes)
        return Sample(resized, boxes, labels, scale, 0.0)


class MultiScale(ReferencePreset):
    """``multiscale``: the shorter side drawn from ``min_sizes``, the longer at most
    ``max_size`` (antialiased bilinear), then the flip; the model does not resize in training."""

    def __init__(
        self,
        image_size: int,
        model_sizes: tuple[int, int],
        flip_p: float = 0.5,
        min_sizes: tuple[int, ...] = tuple(range(480, 801, 32)),
        max_size: int = 1333,
    ):
        super().__init__(image_size, model_sizes, flip_p)
        self.min_sizes, self.max_size = tuple(int(m) for m in min_sizes), int(max_size)

    def largest_hw(self) -> tuple[int, int]:
        return (self.max_size, self.max_size)

    def draw_hw(self, h: int, w: int, rng) -> tuple[int, int]:
        """One draw: a shorter side from min_sizes, uniformly; the size it gives h x w."""
        shortest = self.min_sizes[int(rng.integers(len(self.min_sizes)))]
        r = min(shortest / min(h, w), self.max_size / max(h, w))
        return int(h * r), int(w * r)

    def __call__(self, raw: Raw, rng, partner_raws, out=None) -> Sample:
        image, boxes, labels = raw
        h, w = image.shape[:2]
        hw = self.draw_hw(h, w, rng)
        image = resize_uint8(image, hw, antialias=True)
        boxes, scale = scale_boxes(boxes, (h, w), hw)
        image, boxes = self._flip(image, boxes, rng)
        return Sample(image, boxes, labels, scale, 0.0)


class LargeScaleJitter(ReferencePreset):
    """``lsj``: scale jitter to ``size`` (factor drawn from ``scale_range``, antialiased
    bilinear), a crop to ``size`` where larger (one random fraction for both offsets), padding
    bottom/right with ``fill`` where smaller, then the flip. Boxes are clipped to the crop and
    those left without area dropped (the reference's ``FixedSizeCrop``)."""

    def __init__(
        self,
        image_size: int,
        model_sizes: tuple[int, int],
        flip_p: float = 0.5,
        size: int = 1024,
        scale_range: tuple[float, float] = (0.1, 2.0),
        fill: tuple[int, int, int] = (123, 117, 104),
    ):
        super().__init__(image_size, model_sizes, flip_p)
        self.size, self.scale_range = int(size), (float(scale_range[0]), float(scale_range[1]))
        self.fill = tuple(int(c) for c in fill)

    def largest_hw(self) -> tuple[int, int]:
        return (self.size, self.size)

    def jitter_hw(self, h: int, w: int, u: float) -> tuple[int, int]:
        """The jittered size for a uniform draw u, in float32 as the reference computes it."""
        lo, hi = self.scale_range
        scale = np.float32(lo) + np.float32(u) * np.float32(hi - lo)
        r = np.float32(min(self.size / h, self.size / w)) * scale
        return int(np.float32(h) * r), int(np.float32(w) * r)

    def __call__(self, raw: Raw, rng, partner_raws, out=None) -> Sample:
        image, boxes, labels = raw
        h, w = image.shape[:2]
        hw = self.jitter_hw(h, w, float(np.float32(rng.random())))
        image = resize_uint8(image, hw, antialias=True)
        boxes, _ = scale_boxes(boxes, (h, w), hw)
        image, boxes, labels = self._crop(image, boxes, labels, rng)
        ch, cw = image.shape[:2]
        canvas = np.empty((self.size, self.size, 3), np.uint8)
        canvas[:] = self.fill
        canvas[:ch, :cw] = image
        canvas, boxes = self._flip(canvas, boxes, rng)
        return Sample(canvas, boxes, labels, 1.0, 1.0 - ch * cw / (self.size * self.size))

    def _crop(self, image, boxes, labels, rng):
        h, w = image.shape[:2]
        ch, cw = min(h, self.size), min(w, self.size)
        if (ch, cw) == (h, w):
            return image, boxes, labels
        u = np.float32(rng.random())
        top, left = int(np.float32(max(h - self.size, 0)) * u), int(np.float32(max(w - self.size, 0)) * u)
        boxes = boxes - np.array([left, top, left, top], np.float32)
        np.clip(boxes[:, 0::2], 0, cw, out=boxes[:, 0::2])
        np.clip(boxes[:, 1::2], 0, ch, out=boxes[:, 1::2])
        keep = (boxes[:, 0] < boxes[:, 2]) & (boxes[:, 1] < boxes[:, 3])
        return image[top : top + ch, left : left + cw], boxes[keep], labels[keep]
