"""How long a YOLO-layout dataset of COCO 2017 train's size takes to index, first and second
start (issue 73; docs/benchmarks.md, "A YOLO layout's index"). 118,287 images (hard links to
coco_tiny's train images under new numeric names: distinct paths, no copies) with one label
file each, written from coco_tiny's boxes; a val split of coco_tiny's val images.

    python benchmarks/yolo_index_start.py --out /tmp/yolo_scale

Each start runs in a fresh process (``python -c``): the time from the call to the (train, val)
indexes in hand, and the process's peak RSS. The first start builds and caches; the second
finds every file unchanged (it lists and stats them all) and maps the cached arrays.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
START = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from cocodet.datasets.splits import SplitLoader
splits = SplitLoader("yolo", keep_empty=True, on_bad_sample="raise", cache_dir=sys.argv[2], yaml=sys.argv[1]).load()
train, val = splits.train, splits.val
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": round(seconds, 2), "train": len(train), "val": len(val), "boxes": int(len(train.boxes)),
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))
"""


def write_layout(coco: Path, out: Path, images: int) -> Path:
    """``out``/data.yaml over ``images`` train images and coco_tiny's val images."""
    yolo = out / "yolo"
    for split, source, count in (("train", "train2017", images), ("val", "val2017", None)):
        data = json.loads((coco / "annotations" / f"instances_{source}.json").read_text())
        classes = {c["id"]: k for k, c in enumerate(sorted(data["categories"], key=lambda c: c["id"]))}
        lines: dict[int, list[str]] = {}
        by_id = {im["id"]: im for im in data["images"]}
        for a in data["annotations"]:
            im, (x, y, w, h) = by_id[a["image_id"]], a["bbox"]
            if not a.get("iscrowd"):
                lines.setdefault(a["image_id"], []).append(
                    f"{classes[a['category_id']]} {(x + w / 2) / im['width']:.6f} {(y + h / 2) / im['height']:.6f} "
                    f"{w / im['width']:.6f} {h / im['height']:.6f}"
                )
        (yolo / "images" / split).mkdir(parents=True, exist_ok=True)
        (yolo / "labels" / split).mkdir(parents=True, exist_ok=True)
        for n in range(count or len(data["images"])):
            im = data["images"][n % len(data["images"])]
            stem = f"{n + 1:012d}"
            link = yolo / "images" / split / f"{stem}.jpg"
            if not link.exists():
                os.link(coco / source / im["file_name"], link)
            (yolo / "labels" / split / f"{stem}.txt").write_text("\n".join(lines.get(im["id"], [])) + "\n")
        names = {k: next(c["name"] for c in data["categories"] if c["id"] == cid) for cid, k in classes.items()}
    (yolo / "data.yaml").write_text(
        yaml.safe_dump({"path": ".", "train": "images/train", "val": "images/val", "names": names})
    )
    return yolo / "data.yaml"


def start(data_yaml: Path, cache: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", START, str(data_yaml), str(cache)], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--coco", type=Path, default=ROOT.parent / "shared" / "data" / "coco_tiny")
    parser.add_argument("--images", type=int, default=118_287)
    args = parser.parse_args()
    data_yaml = write_layout(args.coco.resolve(), args.out.resolve(), args.images)
    cache = args.out.resolve() / "cache"
    first, second = start(data_yaml, cache), start(data_yaml, cache)
    print("| start | seconds | train images | val images | train boxes | peak RSS (MB) |\n|---|---|---|---|---|---|")
    for name, s in (("first (builds the cache)", first), ("second (cached)", second)):
        print(f"| {name} | {s['seconds']} | {s['train']} | {s['val']} | {s['boxes']} | {s['peak_rss_mb']} |")


if __name__ == "__main__":
    main()
