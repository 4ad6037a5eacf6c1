"""COCOeval's cost at full-COCO validation size: 5,000 images with 100 detections each.

Detections are the ground truth jittered (so the numbers are not trivial) plus random false
positives up to 100 per image, scored at random. Times pycocotools (the implementation
cocodet uses) and, when installed, faster-coco-eval on the same detections, in one run.

    python scripts/make_scale_coco.py --src ../shared/data/coco_tiny --out /tmp/coco_scale
    python scripts/bench_cocoeval.py /tmp/coco_scale/annotations/instances_val2017.json
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import time

import numpy as np


def detections(gt: dict, per_image: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    sizes = {im["id"]: (im["width"], im["height"]) for im in gt["images"]}
    cats = [c["id"] for c in gt["categories"]]
    by_image: dict[int, list[dict]] = {i: [] for i in sizes}
    for a in gt["annotations"]:
        x, y, w, h = a["bbox"]
        j = rng.normal(0, 0.05, 4) * [w, h, w, h]
        by_image[a["image_id"]].append({"image_id": a["image_id"], "category_id": a["category_id"],
                                        "bbox": [x + j[0], y + j[1], max(1.0, w + j[2]), max(1.0, h + j[3])],
                                        "score": float(rng.uniform(0.3, 1.0))})
    out = []
    for image_id, dets in by_image.items():
        W, H = sizes[image_id]
        while len(dets) < per_image:
            w, h = rng.uniform(8, W / 2), rng.uniform(8, H / 2)
            dets.append({"image_id": image_id, "category_id": int(rng.choice(cats)),
                         "bbox": [float(rng.uniform(0, W - w)), float(rng.uniform(0, H - h)), float(w), float(h)],
                         "score": float(rng.uniform(0.0, 0.5))})
        out.extend(dets[:per_image])
    return out


def run(package: str, ann_file: str, dets: list[dict]) -> tuple[float, list[float]]:
    coco_mod = importlib.import_module(f"{package}.coco")
    eval_mod = importlib.import_module(f"{package}.cocoeval")
    with contextlib.redirect_stdout(io.StringIO()):
        gt = coco_mod.COCO(ann_file)
        t0 = time.perf_counter()
        ev = eval_mod.COCOeval(gt, gt.loadRes(dets), "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return time.perf_counter() - t0, [round(float(s), 4) for s in ev.stats[:12]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ann_file")
    parser.add_argument("--per-image", type=int, default=100)
    args = parser.parse_args()
    gt = json.loads(open(args.ann_file).read())
    dets = detections(gt, args.per_image)
    print(f"{len(gt['images'])} images, {len(dets)} detections")
    print("| implementation | loadRes + evaluate + accumulate + summarize (s) | mAP | mAP@0.5 |\n|---|---|---|---|")
    for package in ("pycocotools", "faster_coco_eval"):
        try:
            seconds, stats = run(package, args.ann_file, dets)
        except ImportError:
            print(f"| {package} | not installed | | |")
            continue
        print(f"| {package} | {seconds:.1f} | {stats[0]} | {stats[1]} |")


if __name__ == "__main__":
    main()
