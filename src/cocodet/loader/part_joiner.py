"""Joins the parts of a batch shipped in parts (``FlatBatch.part``, when one whole batch would
not fit the shm budget) back into one FlatBatch, in the main process."""

from __future__ import annotations

import torch

from cocodet.loader.flat_batch import FlatBatch


class PartJoiner:
    """Joins the parts of a batch as they arrive: each part's images are copied into the
    batch's own (ordinary or pinned) memory at once and the part dropped, so /dev/shm holds
    only the parts in flight, never a whole batch."""

    def __init__(self, pin_memory: bool = False):
        self.pin_memory = pin_memory
        self._images: torch.Tensor | None = None
        self._filled = 0
        self._rest: list[FlatBatch] = []

    def add(self, part: FlatBatch) -> FlatBatch | None:
        """Take one part; return the joined batch after the last part, else None."""
        if not part.part:
            return part  # a whole batch
        k, n = part.part
        images = part.images
        if self._images is None:
            # Every part but the last has the first part's size; the last may be smaller.
            b, _, h, w = images.shape
            self._images = torch.empty((n * b, 3, h, w), dtype=torch.uint8, pin_memory=self.pin_memory)
        if images.shape[2:] != self._images.shape[2:]:  # a part padded to another size: grow to fit both
            self._images = _pad_to(self._images, images.shape[2], images.shape[3], self._filled)
            images = _pad_to(images, self._images.shape[2], self._images.shape[3], images.shape[0])
        self._images[self._filled : self._filled + images.shape[0]].copy_(images)
        self._filled += images.shape[0]
        # The small tensors are cloned too, which releases the part's shm segments and fds now.
        self._rest.append(part._replace(images=torch.empty(0), **{f: getattr(part, f).clone() for f in _SMALL}))
        if k < n - 1:
            return None
        parts, images, filled = self._rest, self._images, self._filled
        self._images, self._filled, self._rest = None, 0, []
        return FlatBatch(
            images=images[:filled],
            skipped=tuple(r for p in parts for r in p.skipped),
            epoch_end=part.epoch_end,
            **{f: torch.cat([getattr(p, f) for p in parts]) for f in _SMALL},
        )


_SMALL = ("image_sizes", "boxes", "labels", "box_counts", "sample_keys", "to_original", "sample_stats")


def _pad_to(images: torch.Tensor, h: int, w: int, rows: int) -> torch.Tensor:
    """``images`` (its first ``rows`` valid) in a zero-padded tensor of at least h x w."""
    b, c, ih, iw = images.shape
    if ih >= h and iw >= w:
        return images
    out = torch.zeros((b, c, max(ih, h), max(iw, w)), dtype=images.dtype, pin_memory=images.is_pinned())
    out[:rows, :, :ih, :iw] = images[:rows]
    return out
