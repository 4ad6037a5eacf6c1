"""Map-style detection dataset: it only maps, sample key -> partners -> images -> recipe.

Determinism contract (design §5): sample i of epoch e draws everything (mosaic partners, every transform, a bad
sample's replacement) from ``np.random.default_rng((seed, e, i))``. The sampler hands out
:class:`~cocodet.sample.SampleKey` s, so persistent workers learn the epoch with each key instead of from state
that would stay behind in a worker replica.

Where partners come from is ``data/partners.py`` (a window, a pool, the whole dataset); how an image is read
(this call's reads, the window cache, the pixel cache, a decode) is ``data/image_reader.py``; the reads a
sample will make, ``data/read_plan.py``. Per-call state travels in a ``CallReads``, never on the dataset.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import torch.utils.data

from cocodet import schema
from cocodet.data.image_reader import COLOUR, DECODES, GEOMETRY, CallReads, ImageReader
from cocodet.data.partners import DatasetPartners, PoolPartners, WindowPartners
from cocodet.data.read_plan import ReadPlan
from cocodet.datasets.bad_samples import skip_record
from cocodet.datasets.index import CocoIndex
from cocodet.errors import BadSampleError
from cocodet.images.header import DEFAULT_MAX_IMAGE_PIXELS
from cocodet.images.read import Source
from cocodet.sample import BatchKeys, SampleKey, make_sample
from cocodet.transforms.recipe import Recipe, to_original

MAX_REPLACEMENTS = 16  # a dataset where 16 random draws in a row are bad is not worth continuing


class DetectionDataset(ReadPlan, torch.utils.data.Dataset):
    """Samples are dicts with ``sample.SAMPLE_FIELDS`` (``image_id``: of the image used, which a
    skipped sample's replacement changes). Images come at the working resolution from a decode
    or, with ``pixel_cache``, from the cache that stores exactly its output."""

    def __init__(
        self,
        index: CocoIndex,
        recipe: Recipe,
        seed: int,
        on_bad_sample: str = "raise",
        pixel_cache=None,
        reuse_outputs: bool = False,
        max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    ):
        schema.check("dataset.on_bad_sample", on_bad_sample)
        self.index, self.recipe, self.seed, self.on_bad_sample = index, recipe, seed, on_bad_sample
        self.pixel_cache = pixel_cache
        self.reader = ImageReader(index, recipe, pixel_cache, max_image_pixels)
        self.pools, self.whole = PoolPartners(), DatasetPartners(len(index))
        self.window: WindowPartners | None = None
        # reuse_outputs: sample j of every __getitems__ call goes into one buffer (warm pages, no page faults);
        # only for a loader whose collate copies each batch first, never for callers that keep samples.
        self.reuse_outputs = reuse_outputs
        self._outputs: list[np.ndarray] = []
        self.rank_order = None  # window partners: this rank's epoch order (loader/rank_share.RankOrder)

    def use_window(self, rank_order, window_cache=None) -> None:
        """Window partners index this rank's epoch order; ``window_cache`` (None: every read
        decodes) is set in the main process before the workers fork."""
        self.rank_order, self.reader.window_cache = rank_order, window_cache
        self.window = WindowPartners(rank_order, self.recipe.partner_window, window_cache is not None)

    def __len__(self) -> int:
        return len(self.index)

    def partners_of(self, key: SampleKey):
        """The partner source a key asks for: its window position, its pool, else the whole dataset."""
        return self.window if key.position is not None else self.pools if key.pool else self.whole

    def __getitem__(self, key) -> dict:
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: list) -> list[dict]:
        """Build the samples of ``keys`` (one batch or part) reading each image once."""
        reads, hw = CallReads(), self.recipe.output_hw
        outs = [None] * len(keys)
        if self.reuse_outputs and hw is not None:  # outputs of varying size get fresh arrays
            self._outputs += [np.empty((*hw, 3), np.uint8) for _ in range(len(keys) - len(self._outputs))]
            outs = self._outputs[: len(keys)]
        samples = [self._sample(SampleKey.of(key), reads, out) for key, out in zip(keys, outs)]
        # The collate learns which part it builds and whether the batch ends its epoch.
        return keys.with_samples(samples) if isinstance(keys, BatchKeys) else samples

    def _sample(self, key: SampleKey, reads: CallReads, out: np.ndarray | None) -> dict:
        """Sample ``key``, built again while a window-cache slot it read was rewritten meanwhile
        (from its third try on, the cache is read by copy, which nothing rewrites)."""
        for tries in itertools.count():
            reads.by_copy = tries >= 2
            sample, sources = self._build(key, reads, out)
            if not (reads.views and self.reader.rewritten(reads, sources)):
                return sample

    def _build(self, key: SampleKey, reads: CallReads, out: np.ndarray | None) -> tuple[dict, list[Source]]:
        rng = np.random.default_rng((self.seed, key.epoch, key.index))
        timings = np.zeros(5, dtype=np.float64)  # indexed by image_reader's READ, DECODE, GEOMETRY, COLOUR, DECODES
        skipped: list[dict] = []
        k, primary = key.index, None
        for _ in range(MAX_REPLACEMENTS):
            try:
                primary = self.reader.read(k, key.position if k == key.index else None, reads, timings)
                break
            except BadSampleError as e:
                # The position's own image is the "sample"; a bad replacement of it is counted
                # apart, so that seen + skipped stays the epoch's size (datasets/bad_samples.py).
                skipped.append(self._skipped(e, key.epoch, k, "sample" if k == key.index else "replacement"))
                k = int(rng.integers(len(self.index)))  # deterministic replacement
        if primary is None:
            raise RuntimeError(
                f"{MAX_REPLACEMENTS} bad samples in a row starting at index {key.index}: "
                f"last {skipped[-1]}; run with dataset.verify=true to list them all"
            )
        partners = self._partners(key, rng, primary, reads, timings, skipped)
        t0 = time.perf_counter()
        made = self.recipe(primary[:3], rng, [p[:3] for p in partners], out)
        timings[GEOMETRY], timings[COLOUR] = time.perf_counter() - t0 - made.colour_s, made.colour_s
        sample = make_sample(
            made.image,
            made.boxes,
            made.labels,
            (key.epoch, key.index),
            int(self.index.image_ids[k]),
            to_original(primary.orig_hw, primary.scale, made.scale),
            stage_seconds=timings[:4],
            pad_share=made.pad_share,
            decodes=int(timings[DECODES]),
            skipped=skipped,
        )
        return sample, [primary, *partners]

    def _partners(
        self, key: SampleKey, rng, primary: Source, reads: CallReads, timings: np.ndarray, skipped: list[dict]
    ) -> list[Source]:
        """The partners the recipe wants, drawn by the key's source; a bad one is recorded and
        drawn again (a pool leaves it out)."""
        wanted, source, partners, bad = self.recipe.partners(rng), self.partners_of(key), [], set()
        while len(partners) < wanted:
            draw = source.draw(key, rng, bad)
            if draw is None:  # the sample's own image stands in
                partners.append(primary)
                continue
            try:
                partners.append(self.reader.read(draw[0], draw[1], reads, timings))
            except BadSampleError as e:
                skipped.append(self._skipped(e, key.epoch, draw[0], "mosaic_partner"))
                bad.add(draw[0])
                if len(skipped) > MAX_REPLACEMENTS:
                    raise RuntimeError(f"too many bad mosaic partners around index {key.index}: {skipped[-1]}") from e
        return partners

    def _skipped(self, error: BadSampleError, epoch: int, index: int, role: str) -> dict:
        """The bad_samples.jsonl record for a skipped image; re-raises in raise mode."""
        if self.on_bad_sample == "raise":
            raise error
        return skip_record(error, epoch, index, role)
