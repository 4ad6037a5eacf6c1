"""One image reader for the dataset: decode -> pixel cache -> window cache.

:meth:`ImageReader.read` gives image k at the working resolution with its clipped targets, from
the first place that has it: this call's own reads (an image drawn twice by one batch is read
once), the window cache (window partners, ``data/window_cache.py``), the pixel cache, or a
decode. It owns the window cache's read protocol: a miss claims the slot and decodes into it,
or waits for the process already decoding that image there and reads its pixels (one decode
per image, whichever worker gets there first); a view into a slot is checked after the sample
is built (:meth:`rewritten`), and the images of slots rewritten meanwhile are forgotten so that
the sample is built again (by copy on its last try).

Per-call state lives in a :class:`CallReads` that the dataset passes along; what stays on the
reader is what this process knows for good: the images found bad (each worker has its own
memory; not read or decoded again when drawn later, as a sample or as a partner).
"""

from __future__ import annotations

import time

import numpy as np

from cocodet.datasets.index import CocoIndex
from cocodet.errors import BadSampleError
from cocodet.images.read import Source, clip_targets, load_resized

# A sample's stage timings: one float64 array, indexed by these (load_resized adds READ and DECODE;
# the recipe's time is GEOMETRY and COLOUR, the part its colour step took).
READ, DECODE, GEOMETRY, COLOUR, DECODES = range(5)


class CallReads:
    """What one ``__getitems__`` call has read: ``loaded`` (image -> Source, or the error that
    made it bad), ``views`` (id of a window-cache view -> (image, its token)), and whether the
    window cache is read by copy (a sample's last try, after rewritten slots)."""

    def __init__(self):
        self.loaded: dict[int, Source | BadSampleError] = {}
        self.views: dict[int, tuple[int, tuple]] = {}
        self.by_copy = False


class ImageReader:
    """``recipe``: what sets the working size (``decode_size``) and the smallest box kept."""

    def __init__(self, index: CocoIndex, recipe, pixel_cache, max_image_pixels: int):
        self.index, self.recipe = index, recipe
        self.pixel_cache, self.max_image_pixels = pixel_cache, max_image_pixels
        self.window_cache = None  # set by the dataset's use_window, in the main process before workers fork
        self.copies = None  # a remote split's read-ahead copies (read_ahead/start.py), set before workers fork
        self.bad: dict[int, BadSampleError] = {}

    def read(self, k: int, position: int | None, reads: CallReads, timings: np.ndarray) -> Source:
        """Image k; ``position``: where it stands in the rank's epoch order (window partners):
        the window cache's slot, read if it holds k, else filled after the decode."""
        if k not in reads.loaded:
            try:
                reads.loaded[k] = self._remembered(k, position, reads, timings)
            except BadSampleError as e:
                reads.loaded[k] = e
        found = reads.loaded[k]
        if isinstance(found, BadSampleError):
            raise found
        return found

    def rewritten(self, reads: CallReads, sources: list[Source]) -> bool:
        """Whether a window-cache view these sources use was rewritten while they were used;
        those images are forgotten, to be read again."""
        stale = {
            id(s.image)
            for s in sources
            if id(s.image) in reads.views and not self.window_cache.intact(reads.views[id(s.image)][1])
        }
        for view in stale:
            reads.loaded.pop(reads.views.pop(view)[0], None)
        return bool(stale)

    def _remembered(self, k: int, position: int | None, reads: CallReads, timings: np.ndarray) -> Source:
        if k in self.bad:
            raise self.bad[k]
        try:
            if self.window_cache is not None and position is not None:
                return self._through_window(k, position, reads, timings)
            return self._decode(k, timings)
        except BadSampleError as e:
            self.bad[k] = e
            raise

    def _through_window(self, k: int, position: int, reads: CallReads, timings: np.ndarray) -> Source:
        cache = self.window_cache
        t0 = time.perf_counter()
        found = cache.get(position, k, copy=reads.by_copy)
        if found is None:
            # Claim the slot, or wait for another process that is writing k there (a partner
            # its own sample is decoding right now): then read what it wrote.
            with cache.publishing(position, k) as slot:
                if slot is not None:  # ours: the resize writes into the slot
                    return self._decode_into(slot, k, reads, timings)
                found = cache.get(position, k, copy=reads.by_copy)
            if found is None:  # the slot is another image's, or its writer was stuck: decode here alone
                return self._decode(k, timings)
        image, orig_hw, scale, token = found
        if not reads.by_copy:  # a view: checked once the sample is built (rewritten)
            reads.views[id(image)] = (k, token)
        boxes, labels = clip_targets(self.index, k, *orig_hw, self.recipe.min_box_side)
        timings[READ] += time.perf_counter() - t0
        return Source(image, boxes * np.float32(scale), labels, orig_hw, scale)

    def _decode_into(self, slot, k: int, reads: CallReads, timings: np.ndarray) -> Source:
        """Decode image k into the claimed window-cache ``slot`` (a ``Publishing``) and publish
        it; called while the claim is held, so nothing rewrites the slot before this returns."""
        source = self._decode(k, timings, slot.pixels)
        published = slot.done(source.image, source.orig_hw, source.scale)
        if published is None:  # larger than a slot: kept in this process only
            return source
        view, token = published  # read, like any hit, as a checked read-only view (or a copy)
        if reads.by_copy:
            return source._replace(image=view.copy())
        reads.views[id(view)] = (k, token)
        return source._replace(image=view)

    def _decode(self, k: int, timings: np.ndarray, dst_for=None) -> Source:
        if self.pixel_cache is not None:
            t0 = time.perf_counter()
            try:
                return self.pixel_cache.load(self.index, k)
            finally:
                timings[READ] += time.perf_counter() - t0
        timings[DECODES] += 1
        return load_resized(
            self.index,
            k,
            self.recipe.decode_size,
            timings,
            self.max_image_pixels,
            self.recipe.min_box_side,
            dst_for,
            self.copies,
        )
