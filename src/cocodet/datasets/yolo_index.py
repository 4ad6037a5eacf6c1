"""A YOLO-layout split (``data.yaml``, images, ``labels/*.txt``) as the flat index COCO's splits
are (``datasets/index.py``), cached the same way, with the COCO ground truth COCOeval scores it by.

Image sizes and EXIF orientations come from headers (PIL's lazy open, ``yolo_headers.py``); nothing
is decoded at start. Image ids are the file stems where all are numeric and distinct, else the positions
(0, 1, ...) in the split's sorted list of paths; the index is in image-id order, as COCO's is.
Category ids are the class indices as ``names`` numbers them. Every image must lie under the
dataset folder (``path``), symlinks resolved, as a COCO image must under its split's folder.

The cache key hashes every image's and label file's path, size and mtime (and the names), so
an image or label file added, removed or modified rebuilds the index; listing and stating the
files is all a second start pays (``benchmarks/yolo_index_start.py``).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from cocodet.datasets.index import CocoIndex, DatasetConfigError
from cocodet.datasets.index_cache import INDEX_FORMAT, through_cache
from cocodet.datasets.keep_rules import boxes_stay
from cocodet.datasets.layouts import Source, Splits
from cocodet.datasets.paths import resolve_inside
from cocodet.datasets.yolo_headers import image_header
from cocodet.datasets.yolo_labels import label_path, read_labels
from cocodet.datasets.yolo_yaml import IMAGE_SUFFIXES, YoloLayout, find_data_yaml, parent, read_data_yaml, resolve
from cocodet.storage.store import file_stamps, is_dir, listing, read_bytes
from cocodet.storage.urls import is_remote

GROUND_TRUTH = "ground_truth.json"


def read_splits(source: Source) -> Splits:
    """The YOLO layout's splits; each one's ground truth is written beside its cached index. The
    train images may be anywhere under data.yaml's path: a bucket's read-ahead lists their
    common folder."""
    train, val = yolo_splits(source.get("yaml"), source.root, source.keep_empty, source.cache_dir)
    folder = os.path.commonprefix(train.paths.tolist()).rsplit("/", 1)[0]
    return Splits(train, val, train.ann_file, val.ann_file, (folder, ""))


def yolo_splits(
    yaml_path: str | None, root: str | None, keep_empty: bool | str, cache_dir: str | None
) -> tuple[CocoIndex, CocoIndex]:
    """(train, val) indexes of the dataset ``data.yaml`` describes (``dataset.yaml``, else
    ``<dataset.root>/data.yaml``); validation keeps its negatives, as COCO's does."""
    layout = read_data_yaml(find_data_yaml(yaml_path, root))
    return (split_index(layout, "train", keep_empty, cache_dir), split_index(layout, "val", True, cache_dir))


def split_index(layout: YoloLayout, split: str, keep_empty: bool | str, cache_dir: str | None) -> CocoIndex:
    images = list_images(layout, split)
    if not images:
        raise DatasetConfigError(
            f"{layout.yaml_file}: {split}: no images in {list(layout.splits[split])} "
            f"(image files end in {', '.join(IMAGE_SUFFIXES)})"
        )
    # One stamp per file (size and mtime, or size and ETag from one listing per bucket prefix)
    image_stamps, label_stamps = file_stamps(images), file_stamps([label_path(p) for p in images])
    build = lambda: build_split_index(layout, split, images, image_stamps, label_stamps, keep_empty)  # noqa: E731
    if cache_dir is None:
        index = build()
    else:
        key = files_key(layout, images, image_stamps, label_stamps, keep_empty)
        index = through_cache(
            cache_dir,
            f"index-yolo-{split}-{key}",
            key,
            build,
            f"{layout.yaml_file} {split}",
            extra=lambda index, tmp: {"ann_file": write_ground_truth(index, tmp)},
        )
    if not index.ann_file:  # built in memory: its ground truth lives in a folder of this process
        folder = Path(tempfile.mkdtemp(prefix="cocodet-yolo-"))
        atexit.register(shutil.rmtree, folder, True)
        index.ann_file = str(folder / write_ground_truth(index, folder))
    return index


def list_images(layout: YoloLayout, split: str) -> list[str]:
    """The split's image paths (or URLs), sorted: the image files under each folder it names
    (recursively) and the lines of each list file (relative ones taken from its folder)."""
    found: set[str] = set()
    for entry in layout.splits[split]:
        if is_dir(entry):
            found.update(p for p in _files_under(entry) if os.path.splitext(p)[1].lower() in IMAGE_SUFFIXES)
        else:
            lines = (line.strip() for line in read_bytes(entry).decode("utf-8", "replace").splitlines())
            found.update(resolve(parent(entry), line) for line in lines if line)
    return sorted(found)


def _files_under(folder: str) -> list[str]:
    if is_remote(folder):
        return list(listing(folder))
    return [os.path.join(dirpath, f) for dirpath, _, files in os.walk(folder) for f in files]


def files_key(
    layout: YoloLayout, images: list[str], image_stamps: list[str], label_stamps: list[str], keep_empty: bool | str
) -> str:
    """What the cached index depends on, hashed: the format, names and ``keep_empty``, then each
    image's path and stamp and its label file's stamp."""
    digest = hashlib.sha256(
        json.dumps([INDEX_FORMAT, "yolo", layout.root, layout.category_ids, layout.names, str(keep_empty)]).encode()
    )
    for image, image_stamp, label_stamp in zip(images, image_stamps, label_stamps):
        digest.update(f"{image}\t{image_stamp}\t{label_stamp}\n".encode())
    return digest.hexdigest()[:24]


def image_ids(images: list[str]) -> list[int]:
    """The stems as integers when all are numeric and distinct, else positions in ``images``."""
    stems = [Path(p).stem for p in images]
    if all(s.isdigit() for s in stems) and len(set(map(int, stems))) == len(stems):
        return [int(s) for s in stems]
    return list(range(len(images)))


def build_split_index(
    layout: YoloLayout,
    split: str,
    images: list[str],
    image_stamps: list[str],
    label_stamps: list[str],
    keep_empty: bool | str,
) -> CocoIndex:
    label_of = {c: k + 1 for k, c in enumerate(layout.category_ids)}
    classes = frozenset(layout.category_ids)
    dropped = {"non_finite_box": 0, "degenerate_box": 0, "empty_image": 0}
    columns: dict[str, list] = {"image_ids": [], "sizes": [], "paths": [], "problems": [], "boxes": [], "labels": []}
    offsets, real_dirs = [0], {}
    for image_id, path, stamp, image_stamp in sorted(zip(image_ids(images), images, label_stamps, image_stamps)):
        problem = _outside(layout.root, path, real_dirs)
        hw, orientation = (0, 0), 1
        if not problem:
            hw, orientation, problem = image_header(path, _size(image_stamp))
        labels = None
        if not problem:
            labels = read_labels(label_path(path), _size(stamp), hw, orientation, classes)
            problem = labels.problem
            for reason, n in labels.dropped.items():
                dropped[reason] += n
        boxes = labels.boxes if labels is not None else np.zeros((0, 4))
        if not problem and not boxes_stay(keep_empty, boxes):
            dropped["empty_image"] += 1
            continue
        for name, value in (("image_ids", image_id), ("sizes", hw), ("paths", path), ("problems", problem)):
            columns[name].append(value)
        columns["boxes"].extend(boxes.tolist())
        columns["labels"].extend(label_of[int(c)] for c in (labels.classes if labels is not None else []))
        offsets.append(len(columns["boxes"]))
    if not columns["image_ids"]:
        raise DatasetConfigError(f"{layout.yaml_file}: {split}: no usable images (dataset.keep_empty={keep_empty})")
    return CocoIndex(
        image_ids=np.array(columns["image_ids"], dtype=np.int64),
        sizes=np.array(columns["sizes"], dtype=np.int32).reshape(-1, 2),
        paths=np.array(columns["paths"], dtype=np.str_),
        box_offsets=np.array(offsets, dtype=np.int64),
        boxes=np.array(columns["boxes"], dtype=np.float32).reshape(-1, 4),
        labels=np.array(columns["labels"], dtype=np.int64),
        category_ids=np.array(layout.category_ids, dtype=np.int64),
        category_names=list(layout.names),
        problems=np.array(columns["problems"], dtype=np.str_),
        ann_file="",
        dropped=dropped,
    )


def _outside(root: str, path: str, real_dirs: dict) -> str:
    """Why ``path`` may not be read (it lies outside the dataset folder, symlinks resolved; an
    object outside its prefix), or ""."""
    if is_remote(root):
        inside = path.startswith(root.rstrip("/") + "/")
    else:
        relative = os.path.relpath(path, root)
        inside = not relative.startswith("..") and resolve_inside(Path(root), relative, real_dirs) is not None
    return "" if inside else f"image {path} resolves outside the dataset folder {root} (data.yaml's path)"


def _size(stamp: str) -> int | None:
    """The byte size in a ``file_stamps`` stamp; None for a missing file."""
    return None if stamp == "missing" else int(stamp.split("\0")[0])


def write_ground_truth(index: CocoIndex, folder: Path) -> str:
    """The split as COCO instances JSON (no crowd regions, ``area`` = w * h), for COCOeval;
    returns the file's name in ``folder``."""
    images, annotations = [], []
    for k, (image_id, (h, w), path) in enumerate(zip(index.image_ids, index.sizes, index.paths)):
        images.append({"id": int(image_id), "file_name": str(path), "height": int(h), "width": int(w)})
        boxes, labels = index.targets(k)
        for (x0, y0, x1, y1), label in zip(boxes.tolist(), labels.tolist()):
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": int(image_id),
                    "iscrowd": 0,
                    "category_id": int(index.category_ids[label - 1]),
                    "bbox": [x0, y0, x1 - x0, y1 - y0],
                    "area": (x1 - x0) * (y1 - y0),
                }
            )
    categories = [{"id": int(c), "name": n} for c, n in zip(index.category_ids, index.category_names)]
    (folder / GROUND_TRUTH).write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": categories})
    )
    return GROUND_TRUTH
