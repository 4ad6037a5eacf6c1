"""The two splits of a COCO-format dataset, as flat indexes: what every mode starts from.

Free of torch and Lightning, so ``mode=plan`` checks a dataset in a fraction of a second.
"""

from __future__ import annotations

from pathlib import Path

from cocodet.coco.index import CocoIndex, DatasetConfigError
from cocodet.coco.index_cache import cached_index
from cocodet.storage.local_copy import local_copy
from cocodet.storage.store import is_dir, is_remote, join

_local_copies: dict[tuple[str, str | None], Path] = {}  # (URL, cache_dir) -> this process's local copy


def load_splits(root: str, train_images: str, train_ann: str, val_images: str, val_ann: str, keep_empty: bool = True,
                on_bad_sample: str = "raise", synthetic: dict | None = None, cache_dir: str | None = None,
                layout: str = "coco", yaml: str | None = None) -> tuple[CocoIndex, CocoIndex]:
    """(train, val) indexes of the dataset under ``root`` (arguments as in ``conf/dataset/coco.yaml``),
    or, with ``layout="yolo"``, of the one ``yaml`` (or ``<root>/data.yaml``) describes
    (``conf/dataset/yolo.yaml``; the ``*_images``/``*_ann`` arguments are not read).

    Generates the synthetic dataset first when ``synthetic`` is given; refuses a missing root,
    splits with different category lists and, with ``on_bad_sample=raise``, images refused
    while indexing (file names that escape the image root, unreadable YOLO label lines).
    """
    if layout == "yolo":
        from cocodet.coco.yolo_index import yolo_splits

        train, val = yolo_splits(yaml, root, keep_empty, cache_dir)
        return _checked(train, val, on_bad_sample)
    if synthetic and is_remote(root):
        raise DatasetConfigError(f"dataset.synthetic writes a generated dataset to a local folder, not to "
                                 f"dataset.root={root}; use dataset=coco for a bucket, or a local dataset.root")
    if synthetic:
        from cocodet.coco.synthetic import ensure_synthetic

        ensure_synthetic(Path(root), **synthetic)
    elif not is_dir(root):
        where = "no object under that prefix" if is_remote(root) else f"resolved to {Path(root).resolve()}"
        raise DatasetConfigError(f"dataset.root={root} not found ({where}); point "
                                 "dataset.root at a folder holding the split folders and annotations/")
    train = cached_index(join(root, train_images), annotation_file(root, train_ann, cache_dir), keep_empty, cache_dir)
    val = cached_index(join(root, val_images), annotation_file(root, val_ann, cache_dir), True, cache_dir)
    return _checked(train, val, on_bad_sample)


def _checked(train: CocoIndex, val: CocoIndex, on_bad_sample: str) -> tuple[CocoIndex, CocoIndex]:
    if list(train.category_ids) != list(val.category_ids):
        raise DatasetConfigError(f"train and val category ids differ: {train.category_ids.tolist()} vs "
                                 f"{val.category_ids.tolist()}; both splits must share one category list")
    if on_bad_sample == "raise":
        _refuse_index_problems(train)
        _refuse_index_problems(val)
    return train, val


def annotation_file(root: str, ann: str, cache_dir: str | None) -> Path:
    """The local path of a split's annotation file: under a local root, the file itself; under
    a remote one, the copy fetched once into ``cache_dir``, keyed by URL and ETag
    (``storage.local_copy``; later calls in this process ask the store nothing)."""
    if not is_remote(root):
        return Path(root) / ann
    url = join(root, ann)
    if (url, cache_dir) not in _local_copies:
        try:
            _local_copies[url, cache_dir] = local_copy(url, cache_dir)
        except FileNotFoundError:
            raise DatasetConfigError(f"annotation file not found: {url} (set dataset.root / "
                                     "dataset.{train,val}_ann)") from None
    return _local_copies[url, cache_dir]


def _refuse_index_problems(index: CocoIndex) -> None:
    bad = [(int(i), str(p)) for i, p in zip(index.image_ids, index.problems) if p]
    if bad:
        listing = "; ".join(f"image_id={i}: {p}" for i, p in bad[:5])
        raise DatasetConfigError(f"{index.ann_file}: {len(bad)} images refused at start: {listing}. "
                                 "Fix them (the file names, the label lines), or set dataset.on_bad_sample=skip to "
                                 "skip them with a record")
