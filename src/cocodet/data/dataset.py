"""Map-style detection dataset: index -> decode -> recipe, with per-sample generators.

Determinism contract (DESIGN §5): sample i of epoch e draws everything (mosaic partners,
every transform, a bad sample's replacement) from ``np.random.default_rng((seed, e, i))``.
The sampler hands out ``(epoch, i)`` keys, so persistent workers learn the epoch with each
key instead of from state that would stay behind in a worker replica.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch.utils.data

from cocodet.data.augment import Recipe
from cocodet.data.coco import BadSampleError, CocoIndex, load_raw

MAX_REPLACEMENTS = 16  # a dataset where 16 random draws in a row are bad is not worth continuing


class DetectionDataset(torch.utils.data.Dataset):
    """Samples are dicts: image (HxWx3 uint8 RGB), boxes [n,4] xyxy, labels [n], key (epoch, i:
    the sampler's key), image_id (of the image used: a skipped sample's replacement differs),
    to_original (orig_h, orig_w, scale: output pixel / scale = stored pixel), stage_seconds
    (read, decode, augment), pad_share (fraction of output pixels no source image covers),
    skipped (records of bad samples replaced while producing this one)."""

    def __init__(self, index: CocoIndex, recipe: Recipe, seed: int, on_bad_sample: str = "raise"):
        if on_bad_sample not in ("raise", "skip"):
            raise ValueError(f"dataset.on_bad_sample must be 'raise' or 'skip', got {on_bad_sample!r}")
        self.index, self.recipe, self.seed, self.on_bad_sample = index, recipe, seed, on_bad_sample

    def __len__(self) -> int:
        return len(self.index)

    def _skip_record(self, error: BadSampleError, epoch: int, index: int, role: str) -> dict:
        """The bad_samples.jsonl record for a skipped image; re-raises in raise mode."""
        if self.on_bad_sample == "raise":
            raise error
        return {"epoch": epoch, "index": index, "image_id": error.image_id, "file": error.path,
                "reason": error.reason, "role": role}

    def __getitem__(self, key: Any) -> dict:
        epoch, i = key if isinstance(key, tuple) else (0, int(key))
        rng = np.random.default_rng((self.seed, epoch, i))
        stage_seconds = np.zeros(3, dtype=np.float64)
        skipped: list[dict] = []
        k = i
        for _ in range(MAX_REPLACEMENTS):
            try:
                raw = load_raw(self.index, k, stage_seconds)
                break
            except BadSampleError as e:
                skipped.append(self._skip_record(e, epoch, k, "sample"))
                k = int(rng.integers(len(self.index)))  # deterministic replacement
        else:
            raise RuntimeError(f"{MAX_REPLACEMENTS} bad samples in a row starting at index {i}: "
                               f"last {skipped[-1]}; run with dataset.verify=true to list them all")
        partners = []
        wanted = self.recipe.partners(rng)
        while len(partners) < wanted:
            j = int(rng.integers(len(self.index)))
            try:
                partners.append(load_raw(self.index, j, stage_seconds))
            except BadSampleError as e:
                skipped.append(self._skip_record(e, epoch, j, "mosaic_partner"))
                if len(skipped) > MAX_REPLACEMENTS:
                    raise RuntimeError(f"too many bad mosaic partners around index {i}: {skipped[-1]}") from e
        t0 = time.perf_counter()
        out = self.recipe(raw, rng, partners)
        stage_seconds[2] = time.perf_counter() - t0
        h, w = raw[0].shape[:2]
        return {
            "image": out.image,
            "boxes": out.boxes,
            "labels": out.labels,
            "key": (epoch, i),
            "image_id": int(self.index.image_ids[k]),
            "to_original": np.array([h, w, out.scale], dtype=np.float32),
            "stage_seconds": stage_seconds,
            "pad_share": out.pad_share,
            "skipped": skipped,
        }


class EpochSampler(torch.utils.data.Sampler):
    """Yields ``(epoch, i)`` keys; shuffles with a generator seeded by (seed, epoch).

    Shards by rank for DDP (contiguous padding like DistributedSampler), so the stream of a
    rank depends only on (seed, epoch, rank, world size) — never on the worker count.
    Lightning calls ``set_epoch`` before each epoch. ``resume_at(epoch, n)`` makes the next
    pass over that epoch start after its first n keys (exact mid-epoch resume); the length
    stays the whole epoch's, as Lightning counts the batches already done itself.
    """

    def __init__(self, size: int, seed: int, shuffle: bool, rank: int = 0, world_size: int = 1):
        self.size, self.seed, self.shuffle = size, seed, shuffle
        self.rank, self.world_size, self.epoch = rank, world_size, 0
        self._resume: tuple[int, int] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume_at(self, epoch: int, keys_done: int) -> None:
        self._resume = (epoch, keys_done)

    def __len__(self) -> int:
        return -(-self.size // self.world_size)

    def __iter__(self):
        if self.shuffle:
            order = np.random.default_rng((self.seed, self.epoch, 2**62)).permutation(self.size)
        else:
            order = np.arange(self.size)
        per_rank = len(self)
        order = np.resize(order, per_rank * self.world_size)  # pad by wrapping, as DistributedSampler
        mine = order[self.rank::self.world_size]
        if self._resume is not None and self._resume[0] == self.epoch:
            mine = mine[self._resume[1]:]
            self._resume = None
        for i in mine:
            yield (self.epoch, int(i))
