"""Build a COCO-2017-sized annotation file from a small COCO slice by repetition: new image and
annotation ids, the same pixels (file names point at the slice's own images).

For start-up, memory and evaluation benchmarks and slow tests at full scale without 19 GB of
images. The output is a dataset root whose image folders are symlinks to the slice's:

    python benchmarks/make_scale_coco.py --src ../shared/data/coco_tiny --out /tmp/coco_scale
    python train.py mode=bench dataset=coco dataset.root=/tmp/coco_scale bench.batches=1

Never commit the generated files (about 620 MB of JSON for the train split).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

COCO_2017 = {"train": 118_287, "val": 5_000}


def repeat(data: dict, images: int) -> dict:
    """``data`` repeated until it holds ``images`` images; ids renumbered, everything else kept."""
    src_images, src_anns = data["images"], data["annotations"]
    by_image: dict[int, list[dict]] = {}
    for a in src_anns:
        by_image.setdefault(a["image_id"], []).append(a)
    out_images, out_anns = [], []
    next_ann = 1
    for k in range(images):
        src = src_images[k % len(src_images)]
        image_id = k + 1
        out_images.append({**src, "id": image_id})
        for a in by_image.get(src["id"], []):
            out_anns.append({**a, "id": next_ann, "image_id": image_id})
            next_ann += 1
    return {**data, "images": out_images, "annotations": out_anns}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, required=True, help="a COCO 2017 root (train2017/, val2017/, annotations/)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--train-images", type=int, default=COCO_2017["train"])
    parser.add_argument("--val-images", type=int, default=COCO_2017["val"])
    args = parser.parse_args()
    (args.out / "annotations").mkdir(parents=True, exist_ok=True)
    for split, count in (("train", args.train_images), ("val", args.val_images)):
        folder = args.out / f"{split}2017"
        if not folder.exists():
            os.symlink((args.src / f"{split}2017").resolve(), folder)
        data = json.loads((args.src / "annotations" / f"instances_{split}2017.json").read_text())
        big = repeat(data, count)
        target = args.out / "annotations" / f"instances_{split}2017.json"
        tmp = target.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write(json.dumps(big))  # dumps encodes in C; dump's chunked encoder is pure Python (5x slower here)
        os.replace(tmp, target)
        print(
            f"{target}: {len(big['images'])} images, {len(big['annotations'])} annotations, "
            f"{target.stat().st_size / 2**20:.0f} MiB"
        )


if __name__ == "__main__":
    main()
