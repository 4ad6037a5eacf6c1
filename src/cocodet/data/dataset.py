"""Map-style detection dataset: index -> image at the working resolution -> recipe.

Determinism contract (design §5): sample i of epoch e draws everything (mosaic partners,
every transform, a bad sample's replacement) from ``np.random.default_rng((seed, e, i))``.
The sampler hands out ``(epoch, i)`` keys (a pool or a window position third), so persistent
workers learn the epoch with each key instead of from state that would stay behind in a worker
replica.

Mosaic partners come from one of three places (``augment.partners``, ``transforms/augment.py``):

- a *window*: a sample at position p of its rank's epoch order draws each partner
  from the W = ``partner_window`` positions before p; at the epoch's start (p < W), from the
  first W + 1 positions other than p. The images there were decoded moments ago by the samples
  at those positions, and the window cache (``data/window_cache.py``) shares their pixels
  between the workers, so a sample costs about one decode. The choice depends on (seed, epoch,
  the rank's order, p, W) alone; the cache only makes reads faster, never other.
- a *pool*: the aligned run of ``partner_pool`` consecutive samples of the epoch order. The
  DataLoader hands a worker a whole batch (or part) at once (``__getitems__``), so each pool
  member is decoded once and serves as a primary and as the partners that drew it.
- the whole dataset (the default): any image, up to four decodes per sample.

None of them depends on the batch size, how a batch is split into parts, the worker count or
a cache.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch.utils.data

from cocodet.transforms.recipe import Recipe
from cocodet.coco.bad_samples import skip_record
from cocodet.coco.index import CocoIndex
from cocodet.errors import BadSampleError
from cocodet.images.read import Source, clip_targets, load_resized
from cocodet.transforms.recipe import to_original
from cocodet.images.header import DEFAULT_MAX_IMAGE_PIXELS
from cocodet import schema
from cocodet.sample import BatchKeys, make_sample

MAX_REPLACEMENTS = 16  # a dataset where 16 random draws in a row are bad is not worth continuing


class DetectionDataset(torch.utils.data.Dataset):
    """Samples are dicts: image (HxWx3 uint8 RGB), boxes [n,4] xyxy, labels [n], key (epoch, i:
    the sampler's key), image_id (of the image used: a skipped sample's replacement differs),
    to_original (orig_h, orig_w, scale_y, scale_x: output pixel / scale = stored pixel), stage_seconds
    (read, decode, augment), decodes (images decoded for it), pad_share (fraction of output
    pixels no source image covers), skipped (records of bad samples replaced while producing it).

    Images come at the working resolution from ``load_resized`` or, with ``pixel_cache``, from
    the cache that stores exactly its output.
    """

    def __init__(self, index: CocoIndex, recipe: Recipe, seed: int, on_bad_sample: str = "raise",
                 pixel_cache=None, reuse_outputs: bool = False, max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS):
        schema.check("dataset.on_bad_sample", on_bad_sample)
        self.index, self.recipe, self.seed, self.on_bad_sample = index, recipe, seed, on_bad_sample
        self.pixel_cache, self.max_image_pixels = pixel_cache, max_image_pixels
        # Images found bad in this process (each worker has its own): not read or decoded again
        # when the sampler draws them later, as a sample or as a mosaic partner.
        self._bad: dict[int, BadSampleError] = {}
        # With reuse_outputs, sample j of every __getitems__ call is written into the same
        # buffer (warm pages, no per-sample page faults): only for a loader whose collate
        # copies each batch before the next call, never for callers that keep samples.
        self.reuse_outputs = reuse_outputs
        self._outputs: list[np.ndarray] = []
        self.rank_order = None  # window partners: this rank's epoch order (loader/rank_share.RankOrder)
        self.window_cache = None  # window partners: the pixels shared between workers (data/window_cache.py)
        self._views: dict[int, tuple] = {}  # id of a view into the window cache -> (image index, its token)
        self._copy_reads = False  # read the window cache by copy (a sample's last try, after rewritten slots)

    def use_window(self, rank_order, window_cache=None) -> None:
        """Window partners index this rank's epoch order; ``window_cache`` (None: every read
        decodes) is set in the main process before the workers fork."""
        self.rank_order, self.window_cache = rank_order, window_cache

    def __len__(self) -> int:
        return len(self.index)

    def _skip_record(self, error: BadSampleError, epoch: int, index: int, role: str) -> dict:
        """The bad_samples.jsonl record for a skipped image; re-raises in raise mode."""
        if self.on_bad_sample == "raise":
            raise error
        return skip_record(error, epoch, index, role)

    def _load(self, k: int, timings: np.ndarray, position: int | None = None) -> Source:
        if k in self._bad:
            raise self._bad[k]
        try:
            return self._read(k, timings, position)
        except BadSampleError as e:
            self._bad[k] = e
            raise

    def _read(self, k: int, timings: np.ndarray, position: int | None = None) -> Source:
        """Image k; ``position``: where it stands in the rank's epoch order (window partners):
        the window cache's slot, read if it holds k, else filled after the decode."""
        if self.window_cache is not None and position is not None:
            t0 = time.perf_counter()
            found = self.window_cache.get(position, k, copy=self._copy_reads)
            if found is not None:
                image, orig_hw, scale, token = found
                if not self._copy_reads:  # a view: checked once the sample is built (_rewritten)
                    self._views[id(image)] = (k, token)
                boxes, labels = clip_targets(self.index, k, *orig_hw, self.recipe.min_box_side)
                timings[0] += time.perf_counter() - t0
                return Source(image, boxes * np.float32(scale), labels, orig_hw, scale)
            with self.window_cache.publishing(position, k) as slot:  # the resize writes into the slot
                source = self._decode(k, timings, slot.pixels if slot is not None else None)
                published = slot.done(source.image, source.orig_hw, source.scale) if slot is not None else None
            if published is not None:  # read, like any hit, as a checked read-only view (or a copy)
                view, token = published
                if self._copy_reads:
                    view = view.copy()
                if not self.window_cache.intact(token):  # rewritten at once by another process: decode again
                    return self._decode(k, timings)
                if not self._copy_reads:
                    self._views[id(view)] = (k, token)
                source = source._replace(image=view)
            return source
        return self._decode(k, timings)

    def _decode(self, k: int, timings: np.ndarray, dst_for=None) -> Source:
        if self.pixel_cache is not None:
            t0 = time.perf_counter()
            try:
                return self.pixel_cache.load(self.index, k)
            finally:
                timings[0] += time.perf_counter() - t0
        timings[3] += 1
        return load_resized(self.index, k, self.recipe.decode_size, timings, self.max_image_pixels,
                            self.recipe.min_box_side, dst_for)

    def planned_reads(self, key: Any) -> list[int]:
        """The dataset indices sample ``key`` reads when every image is good, in the order
        :meth:`_sample` reads them: the same draws from the same generator (the read-ahead's
        plan, ``storage/prefetch.py``; ``tests/test_read_ahead.py`` compares it with the reads).
        With the window cache, a window partner at or before the sample's position is a cache
        read, not an object read, and is left out; among the epoch's first W + 1 positions the
        sample's own image may be in the cache already (an earlier sample drew it as a partner
        ahead of itself), so there the plan is an upper bound."""
        epoch, i, pool = _unpack(key)
        rng = np.random.default_rng((self.seed, epoch, i))
        if isinstance(pool, int):  # window partners at or before the sample's position come from the window cache
            order, p, reads = self.rank_order(epoch), pool, [i]
            for _ in range(self.recipe.partners(rng)):
                q = window_position(p, len(order), self.recipe.partner_window, rng)
                if q is not None and (q > p or self.window_cache is None):
                    reads.append(int(order[q]))
            return reads
        others = [j for j in pool if j != i] or [i] if pool else None
        return [i] + [int(others[rng.integers(len(others))]) if others else int(rng.integers(len(self.index)))
                      for _ in range(self.recipe.partners(rng))]

    def planned_epoch_reads(self, keys) -> list[list[int]]:
        """:meth:`planned_reads` of an epoch's keys, in order. With the window cache, an image is
        read from the store once per epoch: among the first W + 1 positions a sample may draw a
        partner ahead of itself, which is then in the cache when its own position comes (read
        in order, the plan is the reads exactly; ``tests/test_read_ahead.py``)."""
        reads = [self.planned_reads(key) for key in keys]
        if self.window_cache is None or not getattr(self.recipe, "partner_window", 0):
            return reads
        seen: set[int] = set()
        return [[k for k in r if not (k in seen or seen.add(k))] for r in reads]

    def __getitem__(self, key: Any) -> dict:
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: list) -> list[dict]:
        """Build the samples of ``keys`` (one batch or part) decoding each image once."""
        loaded: dict[int, Source | BadSampleError] = {}

        def load(k: int, timings: np.ndarray, position: int | None = None) -> Source:
            if k not in loaded:
                try:
                    loaded[k] = self._load(k, timings, position)
                except BadSampleError as e:
                    loaded[k] = e
            if isinstance(loaded[k], BadSampleError):
                raise loaded[k]
            return loaded[k]

        load.forget = lambda k: loaded.pop(k, None)  # a view whose slot was rewritten: read it again
        self._views = {}

        hw = self.recipe.output_hw
        if self.reuse_outputs and hw is not None:  # outputs of varying size get fresh arrays
            while len(self._outputs) < len(keys):
                self._outputs.append(np.empty((*hw, 3), np.uint8))
            samples = [self._sample(key, load, self._outputs[j]) for j, key in enumerate(keys)]
        else:
            samples = [self._sample(key, load) for key in keys]
        # The collate learns which part it builds and whether the batch ends its epoch.
        return keys.with_samples(samples) if isinstance(keys, BatchKeys) else samples

    def _sample(self, key: Any, load, out: np.ndarray | None = None, tries: int = 0) -> dict:
        """Sample ``key``; ``tries``: how often it was built from a window-cache slot that was
        rewritten while it was read (its last try reads by copy)."""
        self._copy_reads, buffer = tries >= 2, out
        epoch, i, pool = _unpack(key)
        rng = np.random.default_rng((self.seed, epoch, i))
        timings = np.zeros(4, dtype=np.float64)  # read, decode, augment seconds; decodes
        skipped: list[dict] = []
        k, position = i, (pool if isinstance(pool, int) else None)  # a window key's third part: its position
        for _ in range(MAX_REPLACEMENTS):
            try:
                primary = load(k, timings, position if k == i else None)
                break
            except BadSampleError as e:
                skipped.append(self._skip_record(e, epoch, k, "sample"))
                k = int(rng.integers(len(self.index)))  # deterministic replacement
        else:
            raise RuntimeError(f"{MAX_REPLACEMENTS} bad samples in a row starting at index {i}: "
                               f"last {skipped[-1]}; run with dataset.verify=true to list them all")
        wanted = self.recipe.partners(rng)
        if position is not None:
            partners = self._window_partners(epoch, i, position, wanted, rng, load, timings, primary, skipped)
        else:
            partners = self._pool_partners(epoch, i, pool, wanted, rng, load, timings, primary, skipped)
        t0 = time.perf_counter()
        out = self.recipe(primary[:3], rng, [p[:3] for p in partners], out)
        timings[2] = time.perf_counter() - t0
        if self._views and self._rewritten(load, primary, partners):  # built from a slot rewritten meanwhile
            return self._sample(key, load, buffer, tries + 1)
        return make_sample(out.image, out.boxes, out.labels, (epoch, i), int(self.index.image_ids[k]),
                           to_original(primary.orig_hw, primary.scale, out.scale),
                           stage_seconds=timings[:3], pad_share=out.pad_share, decodes=int(timings[3]),
                           skipped=skipped)

    def _rewritten(self, load, primary: Source, partners: list[Source]) -> bool:
        """Whether a window-cache view this sample used was rewritten while it was used; those
        images are forgotten, to be read again."""
        stale = {id(s.image) for s in (primary, *partners)
                 if id(s.image) in self._views and not self.window_cache.intact(self._views[id(s.image)][1])}
        for view in stale:
            getattr(load, "forget", lambda k: None)(self._views.pop(view)[0])
        return bool(stale)

    def _window_partners(self, epoch, i, p, wanted, rng, load, timings, primary, skipped) -> list[Source]:
        """Partners from the window before position ``p`` (a bad one is recorded and drawn again)."""
        order, partners = self.rank_order(epoch), []
        while len(partners) < wanted:
            q = window_position(p, len(order), self.recipe.partner_window, rng)
            if q is None:  # the rank's order holds this sample alone
                partners.append(primary)
                continue
            try:
                partners.append(load(int(order[q]), timings, q))
            except BadSampleError as e:
                skipped.append(self._skip_record(e, epoch, int(order[q]), "mosaic_partner"))
                if len(skipped) > MAX_REPLACEMENTS:
                    raise RuntimeError(f"too many bad mosaic partners around index {i}: {skipped[-1]}") from e
        return partners

    def _pool_partners(self, epoch, i, pool, wanted, rng, load, timings, primary, skipped) -> list[Source]:
        """Partners from the sample's pool, or (no pool) from the whole dataset."""
        partners = []
        # The pool without the sample itself (itself only when the pool has no other member);
        # no pool (a plain key): the whole dataset.
        others = [j for j in pool if j != i] or [i] if pool else None
        while len(partners) < wanted:
            if others == []:  # every pool member is bad: the sample's own (good) image stands in
                partners.append(primary)
                continue
            j = int(others[rng.integers(len(others))]) if others else int(rng.integers(len(self.index)))
            try:
                partners.append(load(j, timings))
            except BadSampleError as e:
                skipped.append(self._skip_record(e, epoch, j, "mosaic_partner"))
                if others is not None:  # a bad member is not drawn again (a pool of one would never end)
                    others = [o for o in others if o != j]
                if len(skipped) > MAX_REPLACEMENTS:
                    raise RuntimeError(f"too many bad mosaic partners around index {i}: {skipped[-1]}") from e
        return partners


def window_position(p: int, n: int, window: int, rng: np.random.Generator) -> int | None:
    """A window partner's position in a rank's epoch order of ``n`` positions: one of the
    ``window`` positions before ``p``; at the epoch's start (p < window), one of the first
    window + 1 positions other than ``p``. One draw from ``rng``; None when the order holds
    ``p`` alone."""
    w = min(window, n - 1)
    if w <= 0:
        return None
    r = int(rng.integers(w))
    return p - 1 - r if p >= w else r + (r >= p)


def _unpack(key: Any) -> tuple[int, int, tuple | int]:
    """(epoch, i, pool) from a sampler key: a pool's tuple, a window key's position (an int), or
    () for a key without either; a bare index is epoch 0 without a pool."""
    if isinstance(key, tuple):
        return (key[0], key[1], key[2]) if len(key) == 3 else (key[0], key[1], ())
    return 0, int(key), ()
