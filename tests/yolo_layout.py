"""Test helpers for the YOLO layout: a COCO split written as Ultralytics' folders, and the
reverse, an independent converter from YOLO labels to COCO JSON (not cocodet's reader: it shares
no code with ``cocodet/datasets/yolo_*.py``, so a fault there cannot cancel out in a parity test)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import yaml
from PIL import Image


def link_or_copy(src: Path, dst: Path) -> None:
    """The image under the YOLO folder (a hard link: a symlink out of the dataset would be refused)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:  # another filesystem
        shutil.copyfile(src, dst)


def coco_as_yolo(ann_file: Path, image_dir: Path, out: Path, split: str, by_category_id: bool = False) -> dict:
    """Write ``out/images/<split>/`` and ``out/labels/<split>/*.txt`` from a COCO split (crowd
    regions left out, coordinates at full precision); returns the ``names`` for data.yaml: class
    indices 0..K-1 in category-id order, or, with ``by_category_id``, the category ids themselves."""
    data = json.loads(ann_file.read_text())
    cats = sorted(data["categories"], key=lambda c: c["id"])
    cls = {c["id"]: (c["id"] if by_category_id else k) for k, c in enumerate(cats)}
    boxes: dict[int, list] = {}
    for a in data["annotations"]:
        if not a.get("iscrowd", 0):
            boxes.setdefault(a["image_id"], []).append(a)
    for im in data["images"]:
        link_or_copy(image_dir / im["file_name"], out / "images" / split / im["file_name"])
        w, h = im["width"], im["height"]
        lines = [
            f"{cls[a['category_id']]} {(x + bw / 2) / w!r} {(y + bh / 2) / h!r} {bw / w!r} {bh / h!r}"
            for a in boxes.get(im["id"], [])
            for x, y, bw, bh in [a["bbox"]]
        ]
        if lines:
            label = out / "labels" / split / (Path(im["file_name"]).stem + ".txt")
            label.parent.mkdir(parents=True, exist_ok=True)
            label.write_text("\n".join(lines) + "\n")
    return {cls[c["id"]]: c["name"] for c in cats}


def write_data_yaml(out: Path, train: str, val: str, names: dict) -> Path:
    path = out / "data.yaml"
    path.write_text(yaml.safe_dump({"path": ".", "train": train, "val": val, "names": names}))
    return path


def yolo_as_coco(root: Path, split: str, names: dict, out: Path) -> Path:
    """The independent converter: every image of ``root/images/<split>`` (ids from numeric
    stems), its label lines as COCO boxes in pixels (``area`` = w * h, no crowd regions)."""
    images, annotations = [], []
    for path in sorted((root / "images" / split).iterdir()):
        with Image.open(path) as im:
            w, h = im.size
        image_id = int(path.stem)
        images.append({"id": image_id, "file_name": path.name, "width": w, "height": h})
        label = root / "labels" / split / f"{path.stem}.txt"
        for line in label.read_text().split("\n") if label.exists() else []:
            if line.strip():
                c, cx, cy, bw, bh = line.split()
                box = [(float(cx) - float(bw) / 2) * w, (float(cy) - float(bh) / 2) * h, float(bw) * w, float(bh) * h]
                annotations.append(
                    {
                        "id": len(annotations) + 1,
                        "image_id": image_id,
                        "category_id": int(c),
                        "bbox": box,
                        "area": box[2] * box[3],
                        "iscrowd": 0,
                    }
                )
    categories = [{"id": int(k), "name": v} for k, v in names.items()]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return out
