"""The COCO layout: a root holding each split's image folder and instances JSON
(``conf/dataset/coco.yaml``), or the synthetic dataset generated there first. The JSON is the
split's ground truth as it is; under a bucket root, the local copy fetched once."""

from __future__ import annotations

from pathlib import Path

from cocodet.datasets.index import DatasetConfigError
from cocodet.datasets.index_cache import cached_index
from cocodet.datasets.layouts import Source, Splits
from cocodet.storage.local_copy import local_copy
from cocodet.storage.store import is_dir
from cocodet.storage.urls import is_remote, join

_local_copies: dict[tuple[str, str | None], Path] = {}  # (URL, cache_dir) -> this process's local copy


def read_splits(source: Source) -> Splits:
    """(train, val) of ``root``'s split folders and annotation files; generates the synthetic
    dataset first when ``synthetic`` is given; refuses a missing root."""
    root, cache_dir, synthetic = source.root, source.cache_dir, source.get("synthetic")
    if synthetic and is_remote(root):
        raise DatasetConfigError(
            f"dataset.synthetic writes a generated dataset to a local folder, not to "
            f"dataset.root={root}; use dataset=coco for a bucket, or a local dataset.root"
        )
    if synthetic:
        from cocodet.datasets.synthetic import ensure_synthetic

        ensure_synthetic(Path(root), **synthetic)
    elif not is_dir(root):
        where = "no object under that prefix" if is_remote(root) else f"resolved to {Path(root).resolve()}"
        raise DatasetConfigError(
            f"dataset.root={root} not found ({where}); point "
            "dataset.root at a folder holding the split folders and annotations/"
        )
    train_images, train_ann = source.get("train_images"), annotation_file(root, source.get("train_ann"), cache_dir)
    train = cached_index(join(root, train_images), train_ann, source.keep_empty, cache_dir)
    val_ann = annotation_file(root, source.get("val_ann"), cache_dir)
    val = cached_index(join(root, source.get("val_images")), val_ann, True, cache_dir)
    return Splits(train, val, str(train_ann), str(val_ann), (root, train_images))


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
            raise DatasetConfigError(
                f"annotation file not found: {url} (set dataset.root / dataset.{{train,val}}_ann)"
            ) from None
    return _local_copies[url, cache_dir]
