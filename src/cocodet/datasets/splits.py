"""The two splits of a dataset, as flat indexes with their ground truths: what every mode starts
from, read by the layout ``dataset.layout`` names (``layouts.py``).

Free of torch and Lightning, so ``mode=plan`` checks a dataset in a fraction of a second.
"""

from __future__ import annotations

from cocodet.datasets.index import CocoIndex, DatasetConfigError
from cocodet.datasets.layouts import LAYOUTS, Source, Splits, layout_keys

# The dataset keys every layout's reading shares; a layout's own keys are in its table entry.
SOURCE_KEYS = ("layout", "root", "keep_empty", "on_bad_sample", "cache_dir")


class SplitLoader:
    """Where a dataset's splits are and how they are read; :meth:`load` reads them.

    ``layout``: a key of ``LAYOUTS``; ``keep_empty``: the train split's rule for images without a
    box (``index.build_index``); ``on_bad_sample``: "raise" refuses images the reader found bad
    (a file name outside the root, an unreadable label) at start, "skip" leaves them in the index
    with their problem, for the loader to skip and record; ``layout_options``: the layout's own
    keys (another layout's keys are accepted and not read: a layout's config inherits coco.yaml).
    """

    def __init__(
        self,
        layout: str = "coco",
        root: str | None = None,
        keep_empty: bool | str = True,
        on_bad_sample: str = "raise",
        cache_dir: str | None = None,
        **layout_options,
    ):
        if layout not in LAYOUTS:
            raise DatasetConfigError(
                f"dataset.layout={layout!r} is not a layout cocodet reads: expected one of {', '.join(LAYOUTS)}"
            )
        unknown = sorted(set(layout_options) - set(layout_keys()))
        if unknown:
            raise TypeError(
                f"unknown dataset keys {unknown}: the layouts read {', '.join(layout_keys())} "
                f"besides {', '.join(SOURCE_KEYS)}"
            )
        self.layout, self.on_bad_sample = layout, on_bad_sample
        own = {k: v for k, v in layout_options.items() if k in LAYOUTS[layout].keys}
        self.source = Source(None if root is None else str(root), keep_empty, cache_dir, own)

    @classmethod
    def from_dataset(cls, dataset: dict) -> SplitLoader:
        """From the dataset group's keys (those of the datamodule's own, image_size, cache and
        the rest, are not this loader's)."""
        wanted = set(SOURCE_KEYS) | set(layout_keys())
        return cls(**{k: v for k, v in dataset.items() if k in wanted})

    def load(self) -> Splits:
        """Both splits, checked: the same category list, and under ``on_bad_sample=raise`` no
        image refused while indexing."""
        splits = LAYOUTS[self.layout].read(self.source)
        train, val = splits.train, splits.val
        if list(train.category_ids) != list(val.category_ids):
            raise DatasetConfigError(
                f"train and val category ids differ: {train.category_ids.tolist()} vs "
                f"{val.category_ids.tolist()}; both splits must share one category list"
            )
        if self.on_bad_sample == "raise":
            _refuse_index_problems(train, f"dataset.layout={self.layout}, train split")
            _refuse_index_problems(val, f"dataset.layout={self.layout}, val split")
        return splits


def _refuse_index_problems(index: CocoIndex, split: str) -> None:
    bad = [(int(i), str(p)) for i, p in zip(index.image_ids, index.problems) if p]
    if bad:
        listing = "; ".join(f"image_id={i}: {p}" for i, p in bad[:5])
        raise DatasetConfigError(
            f"{split}: {len(bad)} images refused at start (the first {min(5, len(bad))}: "
            f"{listing}). "
            "Fix them (the file names, the annotations), or set dataset.on_bad_sample=skip to "
            "skip them with a record"
        )
