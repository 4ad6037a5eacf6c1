"""COCOeval's cost at full-COCO validation size: 5,000 images with 100 detections each.

Detections are the ground truth jittered (so the numbers are not trivial) plus random false
positives up to 100 per image, scored at random. Times both ``model.eval_backend`` choices
(pycocotools and faster-coco-eval) on the same detections in one run, and prints the largest
difference between them over the 12 stats and the full precision array.

    python benchmarks/make_scale_coco.py --src ../shared/data/coco_tiny --out /tmp/coco_scale
    python benchmarks/bench_cocoeval.py /tmp/coco_scale/annotations/instances_val2017.json
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from cocodet.models.evaluation import ALL_STAT_NAMES, evaluate, load_ground_truth
from cocodet.schema import EVAL_BACKENDS


def detections(gt: dict, per_image: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    sizes = {im["id"]: (im["width"], im["height"]) for im in gt["images"]}
    cats = [c["id"] for c in gt["categories"]]
    by_image: dict[int, list[dict]] = {i: [] for i in sizes}
    for a in gt["annotations"]:
        x, y, w, h = a["bbox"]
        j = rng.normal(0, 0.05, 4) * [w, h, w, h]
        by_image[a["image_id"]].append(
            {
                "image_id": a["image_id"],
                "category_id": a["category_id"],
                "bbox": [x + j[0], y + j[1], max(1.0, w + j[2]), max(1.0, h + j[3])],
                "score": float(rng.uniform(0.3, 1.0)),
            }
        )
    out = []
    for image_id, dets in by_image.items():
        W, H = sizes[image_id]
        while len(dets) < per_image:
            w, h = rng.uniform(8, W / 2), rng.uniform(8, H / 2)
            dets.append(
                {
                    "image_id": image_id,
                    "category_id": int(rng.choice(cats)),
                    "bbox": [float(rng.uniform(0, W - w)), float(rng.uniform(0, H - h)), float(w), float(h)],
                    "score": float(rng.uniform(0.0, 0.5)),
                }
            )
        out.extend(dets[:per_image])
    return out


def run(backend: str, ann_file: str, dets: list[dict]) -> tuple[float, dict]:
    """Seconds for loadRes + evaluate + accumulate + summarize, and the result (stats, COCOeval)."""
    gt = load_ground_truth(ann_file, backend)
    t0 = time.perf_counter()
    result = evaluate(gt, dets, backend=backend)
    return time.perf_counter() - t0, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ann_file")
    parser.add_argument("--per-image", type=int, default=100)
    args = parser.parse_args()
    gt = json.loads(open(args.ann_file).read())
    dets = detections(gt, args.per_image)
    print(f"{len(gt['images'])} images, {len(dets)} detections")
    print("| model.eval_backend | loadRes + evaluate + accumulate + summarize (s) | mAP | mAP@0.5 |\n|---|---|---|---|")
    results = {}
    for backend in EVAL_BACKENDS[::-1]:  # pycocotools (the reference) first
        seconds, results[backend] = run(backend, args.ann_file, dets)
        print(f"| {backend} | {seconds:.1f} | {results[backend]['map']:.4f} | {results[backend]['map50']:.4f} |")
    ref, fast = results["pycocotools"], results["faster"]
    stat_diff = max(abs(ref[n] - fast[n]) for n in ALL_STAT_NAMES)
    p_ref, p_fast = ref["coco_eval"].eval["precision"], fast["coco_eval"].eval["precision"]
    precision_diff = float(np.abs(p_ref - p_fast).max()) if p_ref.shape == p_fast.shape else float("inf")
    print(
        f"largest difference: {stat_diff:.2e} over the 12 stats, {precision_diff:.2e} over the precision array "
        f"{list(p_ref.shape)} ({'equal' if max(stat_diff, precision_diff) <= 1e-4 else 'NOT equal'} to 1e-4)"
    )


if __name__ == "__main__":
    main()
