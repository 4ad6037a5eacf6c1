"""The flat index cache: built once per annotation file, shared, and rebuilt when the file changes."""

from __future__ import annotations

import json
import multiprocessing as mp
import shutil
from pathlib import Path

import numpy as np

from cocodet.datasets import index_cache
from cocodet.datasets.index import build_index
from cocodet.datasets.index_cache import cached_index


def same(a, b) -> bool:
    return (
        all(np.array_equal(np.asarray(getattr(a, n)), np.asarray(getattr(b, n))) for n in index_cache.ARRAYS)
        and a.category_names == b.category_names
        and a.dropped == b.dropped
    )


def test_second_load_comes_from_the_cache_memory_mapped(coco_tiny, tmp_path, monkeypatch):
    root = coco_tiny / "train2017"
    ann = coco_tiny / "annotations" / "instances_train2017.json"
    first = cached_index(root, ann, True, tmp_path)
    assert same(first, build_index(root, ann, keep_empty=True))
    monkeypatch.setattr(index_cache, "build_index", lambda *a, **k: (_ for _ in ()).throw(AssertionError("rebuilt")))
    second = cached_index(root, ann, True, tmp_path)
    assert same(first, second)
    assert isinstance(second.boxes, np.memmap) and not second.boxes.flags.writeable  # shared pages, no copy
    assert len(list(tmp_path.glob("index-*/meta.json"))) == 1


def test_a_changed_file_or_option_gets_its_own_index(coco_tiny, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(coco_tiny / "annotations", root / "annotations")
    ann = root / "annotations" / "instances_val2017.json"
    images = coco_tiny / "val2017"
    before = cached_index(images, ann, True, tmp_path / "cache")
    data = json.loads(ann.read_text())
    data["annotations"] = data["annotations"][:-50]
    ann.write_text(json.dumps(data))
    after = cached_index(images, ann, True, tmp_path / "cache")
    assert len(after.boxes) < len(before.boxes)
    cached_index(images, ann, False, tmp_path / "cache")
    assert len(list((tmp_path / "cache").glob("index-*/meta.json"))) == 3


def _load(args) -> int:
    root, ann, cache = args
    return len(cached_index(root, ann, True, cache))


def test_concurrent_starts_build_it_once(coco_tiny, tmp_path, monkeypatch):
    root = coco_tiny / "train2017"
    ann = coco_tiny / "annotations" / "instances_train2017.json"
    builds = tmp_path / "builds.log"

    def counted_build(*args, **kwargs):
        with open(builds, "a") as f:
            f.write("build\n")
        return build_index(*args, **kwargs)

    monkeypatch.setattr(index_cache, "build_index", counted_build)  # inherited by the forked starts
    cache = tmp_path / "cache"
    with mp.get_context("fork").Pool(4) as pool:
        sizes = pool.map(_load, [(root, ann, cache)] * 4)
    assert sizes == [80] * 4
    assert builds.read_text().count("build") == 1
    assert len(list(cache.glob("index-*"))) == 2  # the index folder and its lock file; no leftover temporaries


def test_cached_paths_do_not_depend_on_the_working_directory(coco_tiny, tmp_path, monkeypatch):
    """A relative dataset.root cached from one directory must still be readable from another."""
    monkeypatch.chdir(coco_tiny.parent)
    first = cached_index("coco_tiny/val2017", "coco_tiny/annotations/instances_val2017.json", True, tmp_path)
    monkeypatch.chdir(tmp_path)
    again = cached_index(coco_tiny / "val2017", coco_tiny / "annotations/instances_val2017.json", True, tmp_path)
    assert all(Path(p).is_absolute() and Path(p).is_file() for p in again.paths[:5])
    assert list(first.paths) == list(again.paths)
