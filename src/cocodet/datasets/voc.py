"""The Pascal VOC layout: ``dataset.root`` holds ``Annotations/<id>.xml``, ``ImageSets/Main/`` and
``JPEGImages/``; a split is the ids its list file names (``dataset.train_list`` / ``val_list``,
relative to the root). Read into the flat index COCO's splits are, with the COCO ground truth
COCOeval scores it by, and cached as the YOLO layout's is.

- Images: ``JPEGImages/<filename>`` as the XML names it, under the root, symlinks resolved
  (COCO's rule); sizes from ``<size>``, as COCO's from its JSON: nothing is decoded at start.
- Classes: ``dataset.classes`` in its order, else every ``<name>`` of both splits, sorted; the
  category id is 1 + the position (what ``mode=predict`` writes). Image ids: numeric ids, else
  positions in the split's sorted ids (``yolo_index.image_ids``).
- Boxes: VOC's corners are 1-based pixel indices, both inclusive, so pixel ``xmin`` starts at
  COCO's ``xmin - 1`` and pixel ``xmax`` ends at ``xmax``: [x, y, w, h] = [xmin - 1, ymin - 1,
  xmax - xmin + 1, ymax - ymin + 1], area w * h.
- ``<difficult>1``: no training target; in the ground truth with ``iscrowd`` 1, so COCOeval
  ignores the detections it matches, as VOC's own evaluation does.
- Bad input makes the image a problem naming the file and the ``<object>`` (1-based): an XML
  that does not parse, declares a DTD or entities (defusedxml refuses it unread), or lacks
  ``<filename>`` or ``<size>``; an object without a class or numeric corners, of a class outside
  ``dataset.classes``, without area, or past the image's edge by more than ``EDGE_PX``; a missing
  image (each XML is read and its objects checked by ``voc_xml.py``). Refused at start under
  ``on_bad_sample=raise`` (``splits.py``), skipped and recorded under ``skip``. The cache key
  hashes the ids, the stamps of every XML and of every file under ``JPEGImages/``, the classes
  and ``keep_empty``.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

from cocodet.datasets.index import CocoIndex, DatasetConfigError
from cocodet.datasets.index_cache import INDEX_FORMAT, through_cache
from cocodet.datasets.keep_rules import image_stays
from cocodet.datasets.layouts import Source, Splits
from cocodet.datasets.paths import remote_inside, resolve_inside
from cocodet.datasets.voc_xml import Annotation, object_problem, read_xml
from cocodet.datasets.yolo_index import image_ids
from cocodet.storage.store import file_stamps, is_dir, listing, read_bytes
from cocodet.storage.urls import is_remote, join

LISTS = {"train": "ImageSets/Main/train.txt", "val": "ImageSets/Main/val.txt"}
GROUND_TRUTH = "ground_truth.json"


def read_splits(source: Source) -> Splits:
    """Both splits of the VOC folder ``source.root``; validation keeps its negatives."""
    root = _root(source.root)
    ids = {split: _split_ids(root, split, source.get(f"{split}_list", LISTS[split])) for split in LISTS}
    xmls = {split: [join(root, "Annotations", f"{i}.xml") for i in ids[split]] for split in LISTS}
    stamps = {split: file_stamps(xmls[split]) for split in LISTS}
    images, classes = _image_stamps(root), source.get("classes")
    common = [INDEX_FORMAT, "voc", root, classes, ids, stamps, sorted(images.items())]
    read, truths = {}, {}  # both splits' XML, read at the first build (classes span both); ground truths

    def build(split: str, keep_empty: bool | str) -> CocoIndex:
        if not read:
            read.update({s: [read_xml(x, t) for x, t in zip(xmls[s], stamps[s])] for s in LISTS})
        names = list(classes) if classes else sorted({o[0] for a in read.values() for x in a for o in x.objects} - {""})
        index, truths[split] = _index(root, ids[split], xmls[split], read[split], names, images, keep_empty)
        return index

    out = {}
    for split in LISTS:
        keep_empty = source.keep_empty if split == "train" else True
        key = hashlib.sha256(json.dumps([*common, split, str(keep_empty)]).encode()).hexdigest()[:24]
        make = lambda split=split, keep_empty=keep_empty: build(split, keep_empty)  # noqa: E731
        extra = lambda index, tmp, split=split: {"ann_file": write_ground_truth(index, truths[split], tmp)}  # noqa: E731
        index = (
            make()
            if source.cache_dir is None
            else through_cache(source.cache_dir, f"index-voc-{split}-{key}", key, make, f"{root} {split}", extra=extra)
        )
        if not index.ann_file:  # built in memory: its ground truth lives in a folder of this process
            folder = Path(tempfile.mkdtemp(prefix="cocodet-voc-"))
            atexit.register(shutil.rmtree, folder, True)
            index.ann_file = str(folder / write_ground_truth(index, truths[split], folder))
        out[split] = index
    return Splits(out["train"], out["val"], out["train"].ann_file, out["val"].ann_file, (root, "JPEGImages"))


def _root(root: str | None) -> str:
    if root is None or not is_dir(root):
        raise DatasetConfigError(
            f"dataset.root={root} not found: point it at the VOC folder that holds "
            "Annotations/, ImageSets/Main/ and JPEGImages/ (VOCdevkit/VOC2012)"
        )
    root = root.rstrip("/") if is_remote(root) else os.path.abspath(os.path.expanduser(root))
    missing = [f"{d}/" for d in ("Annotations", "JPEGImages") if not is_dir(join(root, d))]
    if missing:
        raise DatasetConfigError(f"dataset.root={root} has no {' or '.join(missing)}: a VOC root holds those")
    return root


def _split_ids(root: str, split: str, listed: str) -> list[str]:
    """The ids ``listed`` names (the first word of each line), sorted; refuses a missing or
    empty list, a repeated id and one that is not a plain file stem."""
    path = join(root, listed)
    try:
        text = read_bytes(path).decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetConfigError(
            f"dataset.{split}_list={listed}: cannot read {path} ({e}); set it to the split's "
            "id list, relative to dataset.root (ImageSets/Main/{train,val}.txt)"
        ) from None
    ids = [line.split()[0] for line in text.splitlines() if line.strip()]
    repeated = sorted(i for i, n in Counter(ids).items() if n > 1)
    odd = [i for i in ids if "/" in i or "\\" in i or i in (".", "..")]
    if not ids or repeated or odd:
        why = (
            "names no id" if not ids else f"repeats ids {repeated[:5]}" if repeated else f"has ids with paths {odd[:5]}"
        )
        raise DatasetConfigError(
            f"{path} (dataset.{split}_list) {why}: list each image's id (its Annotations/<id>.xml) once per line"
        )
    return sorted(ids)


def _image_stamps(root: str) -> dict[str, str]:
    """Every file under ``JPEGImages/``, by path or URL: its stamp (``storage.store.file_stamps``)."""
    folder = join(root, "JPEGImages")
    if is_remote(root):
        return {url: f"{meta['size']}\0{meta['etag']}" for url, meta in listing(folder).items()}
    paths = [os.path.join(d, f) for d, _, files in os.walk(folder) for f in files]
    return dict(zip(paths, file_stamps(paths)))


def _index(
    root: str,
    ids: list[str],
    xmls: list[str],
    anns: list[Annotation],
    names: list[str],
    images: dict[str, str],
    keep_empty: bool | str,
) -> tuple[CocoIndex, dict]:
    """The split's index, and its ground truth: image id -> [(category id, [x, y, w, h], iscrowd)]."""
    category = {name: k + 1 for k, name in enumerate(names)}
    cols: dict[str, list] = {"image_ids": [], "sizes": [], "paths": [], "problems": [], "boxes": [], "labels": []}
    offsets, truth, real_dirs, dropped = [0], {}, {}, {"difficult": 0, "empty_image": 0}
    for image_id, xml, ann in sorted(zip(image_ids(ids), xmls, anns), key=lambda row: row[0]):
        path, problems = _image_path(root, ann.filename, images, real_dirs) if not ann.problem else ("", [ann.problem])
        boxes, labels, truth[image_id] = [], [], []
        for k, (name, difficult, corners) in enumerate(ann.objects, 1):
            why = object_problem(name, corners, ann.hw, category)
            if why:
                problems.append(f"{xml} <object> {k} of {len(ann.objects)}: {why}")
                continue
            x0, y0, x1, y1 = corners[0] - 1, corners[1] - 1, corners[2], corners[3]
            truth[image_id].append((category[name], [x0, y0, x1 - x0, y1 - y0], int(difficult)))
            dropped["difficult"] += difficult
            if not difficult:
                boxes.append([x0, y0, x1, y1])
                labels.append(category[name])
        if not image_stays(keep_empty, boxes, [{"bbox": box} for _, box, _ in truth[image_id]]):
            dropped["empty_image"] += 1
            del truth[image_id]
            continue
        more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
        for field, value in (
            ("image_ids", image_id),
            ("sizes", ann.hw),
            ("paths", path),
            ("problems", "; ".join(problems[:3]) + more),
        ):
            cols[field].append(value)
        cols["boxes"] += boxes
        cols["labels"] += labels
        offsets.append(len(cols["boxes"]))
    if not cols["image_ids"]:
        raise DatasetConfigError(f"{root}: {len(ids)} ids listed, no usable images (dataset.keep_empty={keep_empty})")
    index = CocoIndex(
        image_ids=np.array(cols["image_ids"], dtype=np.int64),
        sizes=np.array(cols["sizes"], dtype=np.int32).reshape(-1, 2),
        paths=np.array(cols["paths"], dtype=np.str_),
        box_offsets=np.array(offsets, dtype=np.int64),
        boxes=np.array(cols["boxes"], dtype=np.float32).reshape(-1, 4),
        labels=np.array(cols["labels"], dtype=np.int64),
        category_ids=np.arange(1, len(names) + 1, dtype=np.int64),
        category_names=list(names),
        problems=np.array(cols["problems"], dtype=np.str_),
        ann_file="",
        dropped=dropped,
    )
    return index, truth


def _image_path(root: str, filename: str, images: dict[str, str], real_dirs: dict) -> tuple[str, list[str]]:
    """(the image's path or URL, [why it cannot be read]) of ``JPEGImages/<filename>``."""
    name = f"JPEGImages/{filename}"
    path = remote_inside(root, name) if is_remote(root) else resolve_inside(Path(root), name, real_dirs)
    if path is None:
        return "", [f"<filename> {filename!r} resolves outside the dataset root {root}"]
    if images.get(str(path), "missing") == "missing":
        return str(path), [f"image {path} not found"]
    return str(path), []


def write_ground_truth(index: CocoIndex, truth: dict, folder: Path) -> str:
    """The split as COCO instances JSON (difficult objects as ``iscrowd`` 1, ``area`` = w * h)
    in ``folder``; returns the file's name."""
    images = [
        {"id": int(i), "file_name": str(p), "height": int(h), "width": int(w)}
        for i, (h, w), p in zip(index.image_ids, index.sizes, index.paths)
    ]
    rows = [(i, *t) for i in map(int, index.image_ids) for t in truth[i]]
    annotations = [
        {"id": n, "image_id": i, "category_id": c, "bbox": box, "area": box[2] * box[3], "iscrowd": crowd}
        for n, (i, c, box, crowd) in enumerate(rows, 1)
    ]
    categories = [{"id": int(c), "name": n} for c, n in zip(index.category_ids, index.category_names)]
    (folder / GROUND_TRUTH).write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": categories})
    )
    return GROUND_TRUTH
