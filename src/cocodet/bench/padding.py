"""Batch padding from sizes alone (no decode): what ``mode=bench`` measures as
``batch_pad_share`` for recipes whose images carry no padding of their own (``hflip``,
``multiscale``), for any batch order; ``benchmarks/batch_padding.py`` compares groupings with it."""

from __future__ import annotations

import numpy as np

from cocodet.transforms.model_resize import resized_hw
from cocodet.transforms.reference_presets import MultiScale


def sample_sizes(
    preset: str, sizes: np.ndarray, epoch: int, seed: int = 0, model_sizes: tuple[int, int] = (800, 1333)
) -> np.ndarray:
    """[N, 2] each sample's (h, w) as the loader makes it in ``epoch``: the model's resize
    (``hflip``), or the shorter side each sample draws first (``multiscale``, its defaults)."""
    if preset == "hflip":
        return np.array([resized_hw(int(h), int(w), *model_sizes) for h, w in sizes])
    if preset != "multiscale":
        raise ValueError(f"sizes of {preset!r} depend on more than the stored size; use hflip or multiscale")
    recipe = MultiScale(0, model_sizes)
    return np.array(
        [recipe.draw_hw(int(h), int(w), np.random.default_rng((seed, epoch, i))) for i, (h, w) in enumerate(sizes)]
    )


def pad_share(batches: list, hw: np.ndarray) -> float:
    """The share of batch pixels no image covers, each batch padded to its largest image
    rounded up to 32 (the collate's padding, ``loader/flat_batch.py``)."""
    covered = total = 0.0
    for b in batches:
        b = np.asarray(b)
        side_h, side_w = -(-hw[b, 0].max() // 32) * 32, -(-hw[b, 1].max() // 32) * 32
        covered += float((hw[b, 0] * hw[b, 1]).sum())
        total += float(len(b) * side_h * side_w)
    return 1.0 - covered / total
