"""Side by side in one process: the mosaic recipe against the same recipe as a generic
albumentations Compose (A.Mosaic -> LongestMaxSize -> PadIfNeeded -> Affine -> HSV -> flip),
on the same decoded images, one core, ms per sample and padding share.

The padding share of both comes from geometry: the albumentations pipeline carries a
validity mask (ones on every source pixel) through the same transforms.

    python benchmarks/bench_mosaic.py --root ../shared/data/coco_tiny --size 640 --samples 300
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import albumentations as A
import cv2
import numpy as np

from cocodet.datasets.index import build_index
from cocodet.images.read import load_raw
from cocodet.transforms.augment import Mosaic
from cocodet.transforms.recipe import PAD_VALUE


def albumentations_mosaic(s: int) -> A.Compose:
    bbox = A.BboxParams(
        format="pascal_voc",
        label_fields=["labels"],
        min_width=2.0,
        min_height=2.0,
        min_visibility=0.1,
        clip=True,
        filter_invalid_bboxes=True,
    )
    return A.Compose(
        [
            A.Mosaic(
                grid_yx=(2, 2),
                target_size=(s, s),
                cell_shape=(s, s),
                center_range=(0.3, 0.7),
                fit_mode="contain",
                fill=PAD_VALUE,
                fill_mask=0,
                p=1.0,
            ),
            A.LongestMaxSize(max_size=s, p=1.0),
            A.PadIfNeeded(
                min_height=s,
                min_width=s,
                position="top_left",
                border_mode=cv2.BORDER_CONSTANT,
                fill=PAD_VALUE,
                fill_mask=0,
                p=1.0,
            ),
            A.Affine(
                scale=(0.5, 1.5),
                translate_percent=(-0.1, 0.1),
                fill=PAD_VALUE,
                fill_mask=0,
                border_mode=cv2.BORDER_CONSTANT,
                p=1.0,
            ),
            A.HueSaturationValue(hue_shift_limit=10, sat_shift_limit=40, val_shift_limit=30, p=1.0),
            A.HorizontalFlip(p=0.5),
        ],
        bbox_params=bbox,
        seed=0,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("../shared/data/coco_tiny"))
    parser.add_argument("--size", type=int, default=640)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument(
        "--colour",
        default="matrix",
        help="cocodet's colour jitter (the default: matrix; hsv: the same operation as the other side's)",
    )
    args = parser.parse_args()
    cv2.setNumThreads(0)  # one core, as in a DataLoader worker
    index = build_index(args.root / "train2017", args.root / "annotations" / "instances_train2017.json")
    raws = [load_raw(index, k) for k in range(len(index))]
    focused, generic = Mosaic(args.size, colour=args.colour), albumentations_mosaic(args.size)
    rows = {"focused (cocodet Mosaic)": ([], []), "albumentations Compose": ([], [])}
    for i in range(args.samples):
        rng = np.random.default_rng(i)
        picks = [raws[j] for j in rng.integers(0, len(raws), 4)]
        t0 = time.perf_counter()
        out = focused(picks[0], rng, picks[1:])
        rows["focused (cocodet Mosaic)"][0].append(time.perf_counter() - t0)
        rows["focused (cocodet Mosaic)"][1].append(out.pad_share)
        meta = [{"image": im, "bboxes": bx, "labels": lb} for im, bx, lb in picks[1:]]
        generic.set_random_seed(i)
        t0 = time.perf_counter()
        generic(image=picks[0][0], bboxes=picks[0][1], labels=picks[0][2], mosaic_metadata=meta)
        rows["albumentations Compose"][0].append(time.perf_counter() - t0)
        # The same draw again, untimed, with a validity mask carried through for the pad share.
        ones = [np.ones(im.shape[:2], np.uint8) for im, _, _ in picks]
        for m, item in zip(ones[1:], meta):
            item["mask"] = m
        generic.set_random_seed(i)
        res = generic(image=picks[0][0], mask=ones[0], bboxes=picks[0][1], labels=picks[0][2], mosaic_metadata=meta)
        rows["albumentations Compose"][1].append(1.0 - float(res["mask"].mean()))
    base = np.median(rows["focused (cocodet Mosaic)"][0])
    print(f"mosaic recipe at {args.size} px, {args.samples} samples, one core, coco_tiny train images")
    print("| recipe | ms per sample (median) | vs focused | pad share (mean) |")
    print("|---|---|---|---|")
    for name, (times, pads) in rows.items():
        med = np.median(times)
        print(f"| {name} | {1000 * med:.2f} | {med / base:.2f}x | {np.mean(pads):.3f} |")


if __name__ == "__main__":
    main()
