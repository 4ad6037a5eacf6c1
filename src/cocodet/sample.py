"""What the data side hands the loader: the sampler's batch keys and one sample's fields.

The bottom layer both ``data/`` (which builds samples) and ``loader/`` (whose collate flattens
them) import, so that neither imports the other (README "Project layout").
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np


class SampleKey(NamedTuple):
    """What the sampler asks the dataset for: sample ``index`` of ``epoch``, and where its mosaic
    partners come from: ``position`` (its place in this rank's epoch order: window partners),
    ``pool`` (the aligned run of keys it belongs to), or neither (the whole dataset)."""

    epoch: int
    index: int
    pool: tuple = ()
    position: int | None = None

    @classmethod
    def of(cls, key) -> "SampleKey":
        """A sampler's key, an ``(epoch, index)`` pair, or a bare index (epoch 0)."""
        try:
            return cls(*key)
        except TypeError:  # not a sequence: a bare index
            return cls(0, int(key))


# One sample, as DetectionDataset, mode=predict and the bench's producers build it and the
# FlatBatch collate reads it: the letterboxed or augmented HWC uint8 image, its xyxy boxes and
# labels, the sampler's (epoch, index) key, the image id, (orig_h, orig_w, scale_y, scale_x) to map boxes
# back, read/decode/augment seconds, the padded share of the image, the decodes it took and
# the records of bad samples replaced while building it.
SAMPLE_FIELDS = (
    "image",
    "boxes",
    "labels",
    "key",
    "image_id",
    "to_original",
    "stage_seconds",
    "pad_share",
    "decodes",
    "skipped",
)


def make_sample(
    image: np.ndarray,
    boxes: np.ndarray,
    labels: np.ndarray,
    key: tuple[int, int],
    image_id: int,
    to_original: np.ndarray,
    stage_seconds: np.ndarray,
    pad_share: float = 0.0,
    decodes: int = 0,
    skipped: list[dict] | None = None,
) -> dict[str, Any]:
    """A sample dict with every field of :data:`SAMPLE_FIELDS` (the one place that spells them)."""
    return {
        "image": image,
        "boxes": boxes,
        "labels": labels,
        "key": key,
        "image_id": image_id,
        "to_original": to_original,
        "stage_seconds": stage_seconds,
        "pad_share": pad_share,
        "decodes": decodes,
        "skipped": skipped if skipped is not None else [],
    }


class BatchKeys(list):
    """The keys of one batch (or part k of n of it: ``part``), and whether it ends its epoch:
    what the batch sampler knows and the collate needs. The dataset hands both on with the
    samples (``with_samples``)."""

    def __init__(self, keys, part: tuple = (), epoch_end: bool = False):
        super().__init__(keys)
        self.part, self.epoch_end = part, epoch_end

    def with_samples(self, samples: list) -> "BatchKeys":
        return BatchKeys(samples, self.part, self.epoch_end)
