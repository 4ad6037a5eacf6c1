"""Write the annotation file of a small subset of a COCO split, for the real-image overfit proof.

    python benchmarks/overfit_subset.py --src ../shared/data/coco_tiny --out /tmp/overfit --images 16 --image-size 320

Keeps objects a detector trained from scratch on a CPU can learn in minutes: crowd regions and
boxes under ``--min-side`` pixels on a side at the training size (``--image-size`` on the long
side) are dropped, then the first ``--images`` images (by id) holding 1 to ``--max-objects`` kept
boxes are chosen, and only the categories they use are kept. The images stay where they are:

    python train.py dataset=coco dataset.root=<src> dataset.train_images=train2017 \\
        dataset.train_ann=<out>/instances_subset.json dataset.val_images=train2017 \\
        dataset.val_ann=<out>/instances_subset.json dataset.image_size=320 ...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def kept_annotations(data: dict, image_size: int, min_side: float) -> dict[int, list[dict]]:
    """Non-crowd annotations at least ``min_side`` on both sides at the training scale, by image id."""
    images = {im["id"]: im for im in data["images"]}
    kept: dict[int, list[dict]] = {}
    for a in data["annotations"]:
        im = images[a["image_id"]]
        scale = image_size / max(im["width"], im["height"])
        if not a.get("iscrowd", 0) and min(a["bbox"][2:]) * scale >= min_side:
            kept.setdefault(a["image_id"], []).append(a)
    return kept


def build_subset(
    src: Path,
    out: Path,
    split: str = "train2017",
    images: int = 16,
    image_size: int = 320,
    min_side: float = 32.0,
    max_objects: int = 4,
) -> Path:
    """Write ``out``/instances_subset.json and return its path."""
    data = json.loads((src / "annotations" / f"instances_{split}.json").read_text())
    kept = kept_annotations(data, image_size, min_side)
    chosen = sorted(i for i, anns in kept.items() if len(anns) <= max_objects)[:images]
    if len(chosen) < images:
        raise SystemExit(
            f"only {len(chosen)} images of {split} have 1..{max_objects} objects of at least "
            f"{min_side} px at {image_size} px; lower --images or --min-side"
        )
    annotations = [a for i in chosen for a in kept[i]]
    used = {a["category_id"] for a in annotations}
    subset = {
        "images": [im for im in data["images"] if im["id"] in set(chosen)],
        "annotations": annotations,
        "categories": [c for c in data["categories"] if c["id"] in used],
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / "instances_subset.json"
    path.write_text(json.dumps(subset))
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", type=Path, required=True, help="a COCO root with annotations/instances_<split>.json")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--split", default="train2017")
    p.add_argument("--images", type=int, default=16)
    p.add_argument("--image-size", type=int, default=320)
    p.add_argument("--min-side", type=float, default=32.0)
    p.add_argument("--max-objects", type=int, default=4)
    args = p.parse_args()
    path = build_subset(args.src, args.out, args.split, args.images, args.image_size, args.min_side, args.max_objects)
    subset = json.loads(path.read_text())
    print(
        f"{path}: {len(subset['images'])} images, {len(subset['annotations'])} boxes, "
        f"{len(subset['categories'])} categories"
    )


if __name__ == "__main__":
    main()
