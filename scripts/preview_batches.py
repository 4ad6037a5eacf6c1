"""PNG grids of real training batches after restore, boxes and class names drawn.

    python scripts/preview_batches.py --out previews dataset=coco dataset.root=../shared/data/coco_tiny
    python scripts/preview_batches.py --out previews --batches 3 augment=basic

Trailing arguments are ordinary train.py overrides; the batches come from the configured
datamodule (decode, augmentation, FlatBatch transport, restore), so what you see is what the
model sees.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cocodet.preview import render_previews


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--batches", type=int, default=2)
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("overrides", nargs="*", help="train.py overrides, e.g. dataset=coco dataset.root=...")
    args = p.parse_args()
    conf_dir = Path(__file__).resolve().parents[1] / "conf"
    paths = render_previews(args.out, args.overrides, conf_dir, batches=args.batches, epoch=args.epoch)
    for path in paths:
        sys.stdout.write(f"{path}\n")


if __name__ == "__main__":
    main()
