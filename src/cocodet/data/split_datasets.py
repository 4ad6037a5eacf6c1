"""The two splits' datasets, as the datamodule's ``setup()`` builds them from the indexes read:
``dataset.verify``'s scan first (an image found bad leaves its split, or ends the run), then
``dataset.cache``'s pixel caches, which hold only the images kept, then one
:class:`DetectionDataset` per split."""

from __future__ import annotations

from pathlib import Path

from cocodet.data.dataset import DetectionDataset
from cocodet.data.pixel_cache import open_pixel_cache
from cocodet.datasets.bad_samples import BadSampleLedger
from cocodet.datasets.index import CocoIndex
from cocodet.errors import BadSampleError, UserError
from cocodet.images.verify import verify_indexes
from cocodet.transforms.recipe import Recipe


class PixelCacheConfigError(UserError):
    """dataset.cache asked for without a place to keep it."""


def refuse_uncacheable(cache: str, recipe: Recipe) -> None:
    """The pixel cache holds images letterboxed to ``dataset.image_size``: refused at once for a
    recipe that reads stored pixels."""
    if cache != "none" and recipe.decode_size is None:
        raise PixelCacheConfigError(
            f"dataset.cache={cache} cannot hold what {type(recipe).__name__} reads: the pixel cache stores images "
            f"letterboxed to dataset.image_size, and the reference presets read stored pixels (COCO train decoded: "
            f"about 100 GB); use dataset.cache=none, or augment=mosaic|basic|none"
        )


def verified_indexes(
    train: CocoIndex,
    val: CocoIndex,
    run_dir: Path,
    max_image_pixels: int,
    on_bad_sample: str,
    bad_samples: BadSampleLedger,
) -> tuple[CocoIndex, CocoIndex]:
    """dataset.verify: scan every image once. With on_bad_sample=skip, the images found bad
    never enter sampling (and count as skipped); with raise, the run ends on the first
    one as it would when drawing it, before any training. Returns (train, val) as kept."""
    problems = verify_indexes(train, val, run_dir, max_image_pixels)
    indexes = {"train": train, "val": val}
    for split in ("train", "val"):
        if problems[split] and on_bad_sample == "raise":
            raise BadSampleError(*(problems[split][0][key] for key in ("file", "image_id", "reason")))
        if problems[split]:
            indexes[split] = indexes[split].without({p["index"] for p in problems[split]})
            bad_samples.exclude(split, problems[split])
    return indexes["train"], indexes["val"]


def pixel_caches(
    train: CocoIndex,
    val: CocoIndex,
    image_size: int,
    cache: str,
    cache_dir: str | None,
    usable_cpus: int | None,
    max_image_pixels: int,
) -> tuple:
    """(train, val) pixel caches of ``dataset.cache`` (None, None for none), built with the plan's CPUs
    (``usable_cpus``; None: the cache's own default)."""
    if cache == "none":
        return None, None
    if cache_dir is None:
        raise PixelCacheConfigError(
            f"dataset.cache={cache} needs dataset.cache_dir (it is null): set a "
            "folder with room for the images at dataset.image_size, or use dataset.cache=none"
        )
    return tuple(
        open_pixel_cache(index, image_size, cache, cache_dir, split, usable_cpus, max_image_pixels)
        for index, split in ((train, "train"), (val, "val"))
    )


def split_datasets(
    train: CocoIndex,
    val: CocoIndex,
    recipe: Recipe,
    eval_recipe: Recipe,
    seed: int,
    on_bad_sample: str,
    pixels: tuple,
    max_image_pixels: int,
) -> tuple[DetectionDataset, DetectionDataset]:
    """(train, val) datasets: train through ``recipe``, val through ``eval_recipe`` (the datamodule's
    one, which mode=eval and mode=predict read too), each reading its own pixel cache of ``pixels``."""
    # Both sets are read only through the FlatBatch collate, which copies every batch.
    train_set = DetectionDataset(
        train, recipe, seed, on_bad_sample, pixels[0], reuse_outputs=True, max_image_pixels=max_image_pixels
    )
    val_set = DetectionDataset(
        val, eval_recipe, seed, on_bad_sample, pixels[1], reuse_outputs=True, max_image_pixels=max_image_pixels
    )
    return train_set, val_set
