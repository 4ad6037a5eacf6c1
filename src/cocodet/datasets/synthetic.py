"""The embedded default dataset: coloured shapes on textured backgrounds, written as real COCO.

The generator writes JPEG files plus ``instances_{split}.json`` so the training run
exercises exactly the code path a real COCO dataset takes (pycocotools, non-contiguous
category ids, ``iscrowd``/``area``, images without objects).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import cv2
import numpy as np

log = logging.getLogger(__name__)

# Non-contiguous ids on purpose, as in COCO (1..90 with gaps), so the label mapping is exercised.
CATEGORIES = [
    {"id": 3, "name": "circle", "supercategory": "shape"},
    {"id": 7, "name": "square", "supercategory": "shape"},
    {"id": 12, "name": "triangle", "supercategory": "shape"},
]
# A hue family per class keeps the task learnable from scratch within minutes on a CPU;
# the shape itself still has to be found among texture and overlaps.
_HUE = {3: 0, 7: 60, 12: 120}
_FORMAT_VERSION = 2


def _background(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Low-frequency colour noise plus a gradient and fine grain: texture without objects."""
    coarse = rng.integers(40, 200, size=(max(2, h // 24), max(2, w // 24), 3), dtype=np.uint8)
    img = cv2.resize(coarse, (w, h), interpolation=cv2.INTER_CUBIC).astype(np.float32)
    ramp = np.linspace(-25, 25, w, dtype=np.float32)[None, :, None]
    img += ramp * rng.choice([-1.0, 1.0])
    img += rng.normal(0, 8, size=img.shape).astype(np.float32)
    img = cv2.cvtColor(np.clip(img, 0, 255).astype(np.uint8), cv2.COLOR_BGR2HSV)
    img[..., 1] = (img[..., 1] * 0.35).astype(np.uint8)  # desaturate: objects stand out by colour
    return cv2.cvtColor(img, cv2.COLOR_HSV2BGR)


def _colour(rng: np.random.Generator, category_id: int) -> tuple[int, int, int]:
    hue = (_HUE[category_id] + int(rng.integers(-12, 13))) % 180
    hsv = np.uint8([[[hue, int(rng.integers(170, 256)), int(rng.integers(150, 256))]]])
    b, g, r = cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)[0, 0]
    return int(b), int(g), int(r)


def _draw(rng: np.random.Generator, img: np.ndarray, category_id: int) -> list[float]:
    """Draw one shape; return its COCO box [x, y, w, h] clipped to the image."""
    h, w = img.shape[:2]
    size = int(rng.integers(14, max(15, min(h, w) // 2)))
    x0 = int(rng.integers(-size // 4, w - 3 * size // 4))
    y0 = int(rng.integers(-size // 4, h - 3 * size // 4))
    colour = _colour(rng, category_id)
    if category_id == 3:
        r = size // 2
        cv2.circle(img, (x0 + r, y0 + r), r, colour, -1, lineType=cv2.LINE_AA)
        x1, y1, x2, y2 = x0, y0, x0 + 2 * r, y0 + 2 * r
    elif category_id == 7:
        aspect = rng.uniform(0.7, 1.4)
        sw, sh = size, max(8, int(size * aspect))
        cv2.rectangle(img, (x0, y0), (x0 + sw, y0 + sh), colour, -1)
        x1, y1, x2, y2 = x0, y0, x0 + sw + 1, y0 + sh + 1
    else:
        pts = np.array([[x0 + size // 2, y0], [x0, y0 + size], [x0 + size, y0 + size]], np.int32)
        cv2.fillPoly(img, [pts], colour, lineType=cv2.LINE_AA)
        x1, y1, x2, y2 = x0, y0, x0 + size + 1, y0 + size + 1
    x1, y1, x2, y2 = max(0, x1), max(0, y1), min(w, x2), min(h, y2)
    return [float(x1), float(y1), float(x2 - x1), float(y2 - y1)]


def _write_split(root: Path, split: str, n_images: int, rng: np.random.Generator, start_id: int) -> None:
    image_dir = root / split
    image_dir.mkdir(parents=True)
    images, annotations = [], []
    ann_id = 1
    for k in range(n_images):
        image_id = start_id + k * 3 + 1  # sparse ids, like COCO's
        h, w = int(rng.integers(112, 177)), int(rng.integers(128, 193))
        img = _background(rng, h, w)
        n_objects = 0 if rng.random() < 0.06 else int(rng.integers(1, 5))
        for _ in range(n_objects):
            category_id = int(rng.choice([c["id"] for c in CATEGORIES]))
            box = _draw(rng, img, category_id)
            if box[2] < 4 or box[3] < 4:
                continue
            annotations.append(
                {
                    "id": ann_id,
                    "image_id": image_id,
                    "category_id": category_id,
                    "bbox": box,
                    "area": box[2] * box[3],
                    "iscrowd": 0,
                    "segmentation": [],
                }
            )
            ann_id += 1
        file_name = f"{image_id:012d}.jpg"
        cv2.imwrite(str(image_dir / file_name), img, [cv2.IMWRITE_JPEG_QUALITY, 92])
        images.append({"id": image_id, "file_name": file_name, "height": h, "width": w})
    ann_dir = root / "annotations"
    ann_dir.mkdir(exist_ok=True)
    coco = {
        "info": {"description": "cocodet synthetic shapes"},
        "licenses": [],
        "images": images,
        "annotations": annotations,
        "categories": CATEGORIES,
    }
    (ann_dir / f"instances_{split}.json").write_text(json.dumps(coco))


def ensure_synthetic(root: str | os.PathLike, seed: int, n_train: int, n_val: int) -> Path:
    """Generate the dataset at ``root`` unless an identical one is already there.

    Generation happens in a temporary sibling folder renamed into place, so concurrent
    multirun jobs never see a half-written dataset.
    """
    root = Path(root)
    spec = {"version": _FORMAT_VERSION, "seed": seed, "n_train": n_train, "n_val": n_val}
    marker = root / "synthetic.json"
    if marker.exists() and json.loads(marker.read_text()) == spec:
        return root
    if root.exists() and not marker.exists() and any(root.iterdir()):
        raise FileExistsError(
            f"dataset.root={root} exists and is not a cocodet synthetic dataset (no synthetic.json); "
            "refusing to overwrite it. Point dataset.root at an empty or new folder, or use dataset=coco."
        )
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".synthetic-", dir=root.parent))
    log.info("generating synthetic dataset (%d train, %d val, seed %d) at %s", n_train, n_val, seed, root)
    rng = np.random.default_rng(seed)
    _write_split(tmp, "train", n_train, rng, start_id=1000)
    _write_split(tmp, "val", n_val, rng, start_id=900000)
    (tmp / "synthetic.json").write_text(json.dumps(spec))
    if root.exists():
        if marker.exists() and json.loads(marker.read_text()) == spec:  # another job won the race
            shutil.rmtree(tmp)
            return root
        stale = root.with_name(root.name + f".stale-{os.getpid()}")
        root.rename(stale)
        shutil.rmtree(stale, ignore_errors=True)
    try:
        tmp.rename(root)
    except OSError:  # a concurrent job renamed its copy first; theirs is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return root
