"""The resize a torchvision detector's own transform (``GeneralizedRCNNTransform``) applies, as
numbers: with the reference presets (``augment=hflip|multiscale|lsj``) the loader performs it,
so the model's transform neither resizes nor pads again (design §13).

Torch-free, so that ``mode=plan`` can size batches without importing torch.

Facts read from torchvision 0.29 (``models/detection/transform.py``, the builders in
``faster_rcnn.py``, ``fcos.py``, ``retinanet.py``): the scale is
``min(min_size / shorter side, max_size / longer side)`` in Python floats; the output side is
``floor(side * scale)`` (``interpolate(scale_factor=..., recompute_scale_factor=True)``);
boxes are multiplied per axis by float32 ``new / old``; a batch is padded to its largest image,
each side rounded up to a multiple of 32. Training draws ``min_size`` from the tuple (every
builder here has one value); evaluation uses its last value.
"""

from __future__ import annotations

import math

from cocodet.errors import UserError

# (min_size, max_size) of each zoo model's transform as its torchvision builder leaves it
# (tests/test_reference_presets.py builds each model and compares). SSD fixes its own size.
BUILDER_SIZES: dict[str, tuple[int, int]] = {
    "fasterrcnn_mobilenet_v3_large_fpn": (800, 1333),
    "fasterrcnn_mobilenet_v3_large_320_fpn": (320, 640),
    "fasterrcnn_resnet50_fpn_v2": (800, 1333),
    "fasterrcnn_resnet50_fpn": (800, 1333),
    "retinanet_resnet50_fpn": (800, 1333),
    "retinanet_resnet50_fpn_v2": (800, 1333),
    "fcos_resnet50_fpn": (800, 1333),
    "fcos_resnet18_fpn": (800, 1333),  # torchvision's FCOS class defaults
}
# (height, width) an SSD-family model's transform resizes every image to (its builder's fixed_size),
# for augment=ssd|ssdlite (transforms/ssd_presets.py).
FIXED_SIZES: dict[str, tuple[int, int]] = {"ssdlite320_mobilenet_v3_large": (320, 320), "ssd300_vgg16": (300, 300)}


class ModelSizeError(UserError, ValueError):
    """A model whose transform these presets cannot stand in for."""


def builder_sizes(model: str, min_size: int | None = None, max_size: int | None = None) -> tuple[int, int]:
    """The (min_size, max_size) ``model``'s transform resizes to: the builder's, or the
    ``model.detector.min_size`` / ``max_size`` the user set."""
    if model not in BUILDER_SIZES:
        raise ModelSizeError(
            f"augment=hflip|multiscale|lsj size images as {model}'s own transform would, and "
            f"{model} fixes its input size instead; use one of {sorted(BUILDER_SIZES)}, or "
            + ("augment=ssd|ssdlite (its own presets)" if model in FIXED_SIZES else "augment=mosaic|basic|none")
        )
    default_min, default_max = BUILDER_SIZES[model]
    return int(min_size or default_min), int(max_size or default_max)


def fixed_sizes(model: str) -> tuple[int, int]:
    """The fixed (height, width) ``model``'s transform resizes every image to."""
    if model not in FIXED_SIZES:
        raise ModelSizeError(
            f"augment=ssd|ssdlite resize every image to the fixed square of an SSD model's "
            f"transform, and {model} resizes by min_size/max_size instead; use "
            f"model={'|'.join(sorted(FIXED_SIZES))}, or augment=hflip|multiscale|lsj with {model}"
        )
    return FIXED_SIZES[model]


def resized_hw(h: int, w: int, min_size: int, max_size: int) -> tuple[int, int]:
    """(height, width) the model's transform resizes an h x w image to."""
    scale = min(min_size / min(h, w), max_size / max(h, w))
    return int(math.floor(h * scale)), int(math.floor(w * scale))


def largest_hw(min_size: int, max_size: int) -> tuple[int, int]:
    """The largest batch image that resize can produce, as the loader plan budgets it: no side
    exceeds max_size, and a batch holding a tall and a wide image pads to max_size x max_size."""
    return max_size, max_size
