"""The two splits of a COCO-format dataset, as flat indexes: what every mode starts from.

Free of torch and Lightning, so ``mode=plan`` checks a dataset in a fraction of a second.
"""

from __future__ import annotations

from pathlib import Path

from cocodet.data.coco import CocoIndex, DatasetConfigError
from cocodet.data.index_cache import cached_index


def load_splits(root: str, train_images: str, train_ann: str, val_images: str, val_ann: str, keep_empty: bool = True,
                on_bad_sample: str = "raise", synthetic: dict | None = None, cache_dir: str | None = None) -> tuple[CocoIndex, CocoIndex]:
    """(train, val) indexes of the dataset under ``root`` (arguments as in ``conf/dataset/coco.yaml``).

    Generates the synthetic dataset first when ``synthetic`` is given; refuses a missing root,
    splits with different category lists and, with ``on_bad_sample=raise``, file names that
    escape the image root.
    """
    base = Path(root)
    if synthetic:
        from cocodet.data.synthetic import ensure_synthetic

        ensure_synthetic(base, **synthetic)
    elif not base.is_dir():
        raise DatasetConfigError(f"dataset.root={root} not found (resolved to {base.resolve()}); point "
                                 "dataset.root at a folder holding the split folders and annotations/")
    train = cached_index(base / train_images, base / train_ann, keep_empty, cache_dir)
    val = cached_index(base / val_images, base / val_ann, True, cache_dir)
    if list(train.category_ids) != list(val.category_ids):
        raise DatasetConfigError(f"train and val category ids differ: {train.category_ids.tolist()} vs "
                                 f"{val.category_ids.tolist()}; both splits must share one category list")
    if on_bad_sample == "raise":
        _refuse_index_problems(train)
        _refuse_index_problems(val)
    return train, val


def _refuse_index_problems(index: CocoIndex) -> None:
    bad = [(int(i), str(p)) for i, p in zip(index.image_ids, index.problems) if p]
    if bad:
        listing = "; ".join(f"image_id={i}: {p}" for i, p in bad[:5])
        raise DatasetConfigError(f"{index.ann_file}: {len(bad)} images refused at start: {listing}. "
                                 "Fix the file names, or set dataset.on_bad_sample=skip to skip them with a record")
