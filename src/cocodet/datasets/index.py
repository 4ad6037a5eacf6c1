"""The flat index every layout is read into, and COCO's instances JSON read into it (reading one
sample is ``images/read.py``; which annotations and images a split keeps is ``keep_rules.py``).

The index is built once in the main process from pycocotools and kept as flat numpy
buffers plus offsets (detectron2-style), so DataLoader workers that touch it on every
sample do not copy-on-read a graph of Python dicts epoch after epoch.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from cocodet.datasets.keep_rules import image_stays, training_boxes
from cocodet.datasets.paths import remote_inside, resolve_inside
from cocodet.errors import UserError
from cocodet.storage.store import is_dir
from cocodet.storage.urls import is_remote

log = logging.getLogger(__name__)


class DatasetConfigError(UserError, ValueError):
    """The dataset cannot be used at all (missing files, malformed annotations)."""


@dataclass
class CocoIndex:
    """Flat, picklable view of one split in COCO's form (ids, categories), whatever layout it was
    read from (``layouts.py``).

    Attributes:
        image_ids: [N] int64 COCO image ids.
        sizes: [N, 2] int32 (height, width) from the JSON.
        paths: one str per image (resolved absolute path or URL, or "" when it escapes the root).
        box_offsets: [N+1] int64; boxes of image k are boxes[box_offsets[k]:box_offsets[k+1]].
        boxes: [M, 4] float32 xyxy in stored pixel order (crowd regions excluded).
        labels: [M] int64 contiguous labels 1..K (0 is background).
        category_ids: [K] int64; label L maps to category_ids[L - 1].
        category_names: [K] names in label order.
        problems: per-image reason found while indexing (empty string when none).
        dropped: counts of annotations dropped while indexing, by reason.
    """

    image_ids: np.ndarray
    sizes: np.ndarray
    paths: np.ndarray
    box_offsets: np.ndarray
    boxes: np.ndarray
    labels: np.ndarray
    category_ids: np.ndarray
    category_names: list[str]
    problems: np.ndarray
    ann_file: str
    dropped: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.image_ids)

    @property
    def num_classes(self) -> int:
        """Detector classes including background."""
        return len(self.category_ids) + 1

    def targets(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = self.box_offsets[k], self.box_offsets[k + 1]
        return self.boxes[lo:hi], self.labels[lo:hi]

    def label_to_category(self, labels: np.ndarray) -> np.ndarray:
        return self.category_ids[np.asarray(labels, dtype=np.int64) - 1]

    def without(self, drop: set[int]) -> "CocoIndex":
        """This index without the images at positions ``drop`` (``dataset.verify`` found them bad)."""
        keep = np.array([k for k in range(len(self)) if k not in drop], dtype=np.int64)
        counts = np.diff(self.box_offsets)[keep]
        rows = np.concatenate(
            [np.arange(self.box_offsets[k], self.box_offsets[k + 1]) for k in keep] or [np.zeros(0, np.int64)]
        ).astype(np.int64)
        return CocoIndex(
            image_ids=np.asarray(self.image_ids)[keep],
            sizes=np.asarray(self.sizes)[keep],
            paths=np.asarray(self.paths)[keep],
            box_offsets=np.concatenate([[0], np.cumsum(counts)]),
            boxes=np.asarray(self.boxes)[rows],
            labels=np.asarray(self.labels)[rows],
            category_ids=self.category_ids,
            category_names=self.category_names,
            problems=np.asarray(self.problems)[keep],
            ann_file=self.ann_file,
            dropped=dict(self.dropped),
        )


def load_coco_json(ann_file: Path) -> dict:
    if not ann_file.is_file():
        raise DatasetConfigError(
            f"annotation file not found: {ann_file} (set dataset.root / dataset.{{train,val}}_ann)"
        )
    try:
        # The standard library, not orjson: orjson parses COCO 2017 train about 1.4x faster but
        # peaks 1.7 GB higher (5.1 against 3.4 GB), and the parse happens once per file (cached).
        with open(ann_file, "rb") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DatasetConfigError(f"annotation file {ann_file} is not valid JSON: {e}") from e
    missing = [
        k
        for k in ("images", "annotations", "categories")
        if not isinstance(data, dict) or not isinstance(data.get(k), list)
    ]
    if missing:
        raise DatasetConfigError(f"annotation file {ann_file} is not COCO instances format: missing lists {missing}")
    return data


def build_index(image_root: str | os.PathLike, ann_file: str | os.PathLike, keep_empty: bool | str = True) -> CocoIndex:
    """Read a COCO instances file and build the compact index; refuse what cannot be repaired.

    ``keep_empty``: True keeps images without a training box (negatives); False drops them;
    "reference" applies torchvision's reference rule (``coco_utils.py``,
    ``_coco_remove_images_without_annotations``): an image stays when it has an annotation,
    crowd regions included, and not every annotation is at most 1 px wide or high.

    A direct parse into flat arrays: pycocotools' ``COCO()`` would also build dicts of every
    annotation and category that the loader never reads (``benchmarks/bench_index.py`` measures
    both). Shows a progress bar for large files.
    """
    remote, ann_file, image_root = is_remote(image_root), Path(ann_file), _image_root(image_root)
    data = load_coco_json(ann_file)
    _check_ids(data, ann_file)
    anns_of, dropped = _annotations_by_image(data, ann_file)
    category_ids, category_names = _categories(data)
    label_of = {int(c): k + 1 for k, c in enumerate(category_ids)}

    image_ids, sizes, paths, problems, offsets = [], [], [], [], [0]
    boxes, labels = [], []
    real_dirs: dict[str, str] = {}
    dropped["degenerate_box"] = dropped["non_finite_box"] = dropped["crowd"] = dropped["empty_image"] = 0
    images = sorted(data["images"], key=lambda im: im["id"])
    for img in tqdm(
        images, desc=f"indexing {ann_file.name}", unit="image", disable=len(images) < 20_000, mininterval=2.0
    ):
        anns = anns_of.get(img["id"], [])
        kept = training_boxes(anns, label_of, dropped)
        if not image_stays(keep_empty, kept, anns):
            dropped["empty_image"] += 1
            continue
        path, problem = _image_path(img, image_root, remote, real_dirs)
        paths.append(path)
        problems.append(problem)
        image_ids.append(img["id"])
        sizes.append((img.get("height", 0), img.get("width", 0)))
        boxes.extend(b for b, _ in kept)
        labels.extend(lab for _, lab in kept)
        offsets.append(len(boxes))
    if not image_ids:
        raise DatasetConfigError(f"{ann_file}: no usable images (dataset.keep_empty={keep_empty})")
    return CocoIndex(
        image_ids=np.array(image_ids, dtype=np.int64),
        sizes=np.array(sizes, dtype=np.int32).reshape(-1, 2),
        paths=np.array(paths, dtype=np.str_),
        box_offsets=np.array(offsets, dtype=np.int64),
        boxes=np.array(boxes, dtype=np.float32).reshape(-1, 4),
        labels=np.array(labels, dtype=np.int64),
        category_ids=category_ids,
        category_names=category_names,
        problems=np.array(problems, dtype=np.str_),
        ann_file=str(ann_file),
        dropped=dropped,
    )


def _categories(data: dict) -> tuple[np.ndarray, list[str]]:
    """The declared category ids, sorted (label L is ``category_ids[L - 1]``), and their names in that order."""
    category_ids = np.array(sorted({c["id"] for c in data["categories"]}), dtype=np.int64)
    names = {c["id"]: c.get("name", str(c["id"])) for c in data["categories"]}
    return category_ids, [names[int(c)] for c in category_ids]


def _image_path(img: dict, image_root: str | Path, remote: bool, real_dirs: dict[str, str]) -> tuple[str, str]:
    """(the image's path or URL, "") for a ``file_name`` inside the image root; ("", why not) for one outside it."""
    name = str(img.get("file_name", ""))
    path = remote_inside(image_root, name) if remote else resolve_inside(image_root, name, real_dirs)
    if path is None:
        return "", f"file_name {img.get('file_name')!r} resolves outside the image root {image_root}"
    return str(path), ""


def _image_root(image_root: str | os.PathLike) -> str | Path:
    """The split's image folder as the index records it: a URL as given, a local folder as an
    absolute path (a cached index is then read from any working directory)."""
    if not is_dir(image_root):
        where = "no object under the prefix" if is_remote(image_root) else "no such folder"
        raise DatasetConfigError(
            f"image folder not found: {image_root} ({where}; set dataset.root / dataset.{{train,val}}_images)"
        )
    return image_root if is_remote(image_root) else Path(os.path.abspath(image_root))


def _check_ids(data: dict, ann_file: Path) -> None:
    """Refuse duplicate image ids and annotations of categories the file does not declare."""
    dup = sorted(i for i, n in Counter(img.get("id") for img in data["images"]).items() if n > 1)
    if dup:
        raise DatasetConfigError(
            f"{ann_file}: duplicate image ids {dup[:10]} ({len(dup)} in all); "
            "COCO requires unique ids — deduplicate the 'images' list"
        )
    known_cats = {c["id"] for c in data["categories"]}
    unknown = sorted({a["category_id"] for a in data["annotations"]} - known_cats)
    if unknown:
        raise DatasetConfigError(
            f"{ann_file}: annotations use category ids {unknown} that are not in "
            f"'categories' {sorted(known_cats)}; fix the file or remove those annotations"
        )


def _annotations_by_image(data: dict, ann_file: Path) -> tuple[dict[int, list[dict]], dict[str, int]]:
    """Annotations grouped by image id (segmentations freed), and the count of those whose
    image id is not among the images (dropped)."""
    anns_of: dict[int, list[dict]] = {}
    for a in data["annotations"]:
        a.pop("segmentation", None)  # most of the parsed JSON; freed now so the arrays below reuse it
        anns_of.setdefault(a["image_id"], []).append(a)
    image_id_set = {img.get("id") for img in data["images"]}
    dropped = {"missing_image": sum(len(v) for k, v in anns_of.items() if k not in image_id_set)}
    if dropped["missing_image"]:
        log.warning(
            "%s: %d annotations point at image ids not in 'images'; dropped", ann_file, dropped["missing_image"]
        )
    return anns_of, dropped
