"""What every augmentation recipe is: its output (:class:`Sample`) and the questions the dataset,
the pixel cache and the loader plan ask it (:class:`Recipe`). Numpy and OpenCV only, so that ``mode=plan``
can size batches from a recipe without importing torch or albumentations."""

from __future__ import annotations

from typing import Callable, NamedTuple

import cv2
import numpy as np

from cocodet.images.resize import letterbox_resize

PAD_VALUE = 114  # YOLO's grey: padding that looks like nothing in particular
Raw = tuple[np.ndarray, np.ndarray, np.ndarray]  # rgb image, xyxy boxes, labels


class Sample(NamedTuple):
    """A recipe's output: HxWx3 uint8 image, [n,4] float32 xyxy boxes, [n] int64 labels,
    ``scale`` (source pixels -> output pixels, used to map predictions back: one factor for
    letterbox recipes, (y, x) factors for the model's resize; 1.0 for mosaic), ``pad_share``
    (fraction of output pixels no source covers) and ``colour_s``, the seconds of the recipe's
    colour step where it times one apart (the rest of its time is geometry)."""

    image: np.ndarray
    boxes: np.ndarray
    labels: np.ndarray
    scale: float | tuple[float, float]
    pad_share: float
    colour_s: float = 0.0


def hflip(image: np.ndarray, boxes: np.ndarray, in_place: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Mirror the image (cv2.flip: 30x faster than a numpy copy of image[:, ::-1]) and its
    boxes. ``in_place=False`` for a source that may serve another sample of the batch."""
    w = image.shape[1]
    flipped = boxes.copy()
    flipped[:, [0, 2]] = w - boxes[:, [2, 0]]
    return (cv2.flip(image, 1, dst=image) if in_place else cv2.flip(image, 1)), flipped


def to_original(orig_hw: tuple[int, int], read_scale: float, scale: float | tuple[float, float]) -> np.ndarray:
    """A sample's ``to_original`` [4] float32: (orig_h, orig_w, scale_y, scale_x), where
    output pixel / scale = stored pixel; ``read_scale`` is the read's (stored -> working
    resolution), ``scale`` the recipe's (:class:`Sample`)."""
    sy, sx = scale if isinstance(scale, tuple) else (scale, scale)
    return np.array([*orig_hw, read_scale * sy, read_scale * sx], dtype=np.float32)


class Geometry(NamedTuple):
    """What the loader plan needs of a recipe, answered by its class (:meth:`Recipe.geometry`):
    the largest image side of a train and of a val sample, a worker's largest intermediate in
    bytes, whether every output is one ``image_size`` square (aspect-ratio grouping is then
    moot), where mosaic's partners come from (None: no partners) and the grouping
    ``loader.group_aspect_ratio=preset`` means (None: off)."""

    train_side: int
    val_side: int
    working_bytes: int = 0
    square_outputs: bool = False
    partners_from: str | None = None
    preset_grouping: int | None = None


class Recipe:
    """A named transform over one sample and the partner samples it asked for.

    The letterbox family (``mosaic``, ``basic``, ``none``) reads images with their long side at
    ``image_size`` and outputs ``image_size`` squares; the reference presets
    (``transforms/reference_presets.py``) read stored pixels and output images of varying size.
    """

    partner_pool = 0  # partners come from aligned runs of this many samples (0: no pools)
    partner_window = 0  # partners come from this many positions of the epoch order before the sample (0: no window)
    min_box_side = 1.0  # boxes narrower or lower than this after clipping to the stored image are dropped
    keep_empty: bool | str = True  # what dataset.keep_empty=null means for this recipe's train split
    resizes_as_model = False  # the loader resizes as the model's transform would, so the model does not

    @classmethod
    def sizes_from_model(cls, detector: dict | None) -> tuple[int, int] | None:
        """What this recipe needs of the chosen model (``model.detector``) to be built: its
        resize's sizes, passed as ``model_sizes``; None: nothing."""
        return None

    @classmethod
    def geometry(cls, augment: dict, image_size: int, build: Callable[[], "Recipe"]) -> Geometry:
        """The plan's questions, answered from the augment keys; ``build`` makes the train recipe
        where the answer depends on it (the letterbox family answers without: building it
        imports albumentations, which ``mode=plan`` avoids)."""
        return Geometry(image_size, image_size, square_outputs=True)

    def __init__(self, image_size: int):
        self.image_size = image_size

    @property
    def decode_size(self) -> int | None:
        """The long side images are read at (a reduced JPEG decode, then one resize); None: the
        stored size, untouched (what the pixel cache cannot hold)."""
        return self.image_size

    @property
    def output_hw(self) -> tuple[int, int] | None:
        """Every output's (height, width); None when outputs vary in size."""
        return (self.image_size, self.image_size)

    def largest_hw(self) -> tuple[int, int]:
        """The largest output a batch may have to hold, before rounding to 32 (what the plan budgets)."""
        return (self.image_size, self.image_size)

    def eval_recipe(self) -> "Recipe":
        """What validation, ``mode=eval`` and ``mode=predict`` apply (letterbox for this family)."""
        return Letterbox(self.image_size)

    def working_bytes(self) -> int:
        """A worker's largest intermediate beyond its outputs, added to the plan's footprint estimate."""
        return 0

    def export_resize(self) -> dict:
        """How an exported model's input is made, as this (evaluation) recipe makes it
        (``model.json``'s ``input.resize``, applied by the standalone predict script)."""
        return {"kind": "letterbox", "size": self.image_size, "pad_value": PAD_VALUE}

    def partners(self, rng: np.random.Generator) -> int:
        """How many extra raw samples this call will consume (drawn before any decode)."""
        return 0

    def __call__(
        self, raw: Raw, rng: np.random.Generator, partner_raws: list[Raw], out: np.ndarray | None = None
    ) -> Sample:
        """``out``: an ``output_hw`` x 3 buffer the output may be written into (fixed sizes only)."""
        raise NotImplementedError


def canvas(size: int, out: np.ndarray | None = None) -> np.ndarray:
    """A size x size x 3 uint8 image filled with PAD_VALUE: ``out`` when given (a buffer the
    caller reuses: a fresh 1.2 MB array per sample costs ~0.7 ms of page faults when a whole
    batch of them is alive at once), else a new one."""
    if out is None or out.shape != (size, size, 3):
        return np.full((size, size, 3), PAD_VALUE, dtype=np.uint8)
    out.fill(PAD_VALUE)
    return out


def letterbox(
    image: np.ndarray, boxes: np.ndarray, size: int, out: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Letterbox to size x size, padding bottom/right; returns (image, boxes, scale, pad_share)."""
    resized, scale = letterbox_resize(image, size)
    nh, nw = resized.shape[:2]
    out = canvas(size, out)
    out[:nh, :nw] = resized
    return out, boxes * np.float32(scale), scale, 1.0 - (nh * nw) / (size * size)


class Letterbox(Recipe):
    """Validation and ``augment=none``: letterbox only, deterministic."""

    def __call__(self, raw, rng, partner_raws, out=None):
        image, boxes, labels = raw
        image, boxes, scale, pad_share = letterbox(image, boxes, self.image_size, out)
        return Sample(image, boxes, labels, scale, pad_share)
