"""The five published recipes (experiment=tv_*) for 2 epochs on coco_tiny at reduced size on this
machine's CPU, from scratch (no pretrained file here): does the training loss fall? A smoke
test of the wiring, not of the recipes' accuracy (docs/reference.md "Published recipes").

    python benchmarks/recipe_smoke.py --root ../shared/data/coco_tiny

Reduced: one process (not 8 GPUs), fp32, 2 images per step (the learning rate scaled to that
global batch by the recipe's own rule), 2 epochs (not 26-660), the R-CNN family's 800/1333
resize at 256/416; the SSDs keep their 300 and 320. Prints each epoch's mean training loss.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPES = [
    "tv_fasterrcnn_resnet50_fpn",
    "tv_fcos_resnet50_fpn",
    "tv_retinanet_resnet50_fpn",
    "tv_ssd300_vgg16",
    "tv_ssdlite320_mobilenet_v3_large",
]


def epoch_losses(run: Path) -> list[float]:
    rows = list(csv.DictReader(next(run.glob("csv/*/metrics.csv")).open()))
    by_epoch: dict[int, list[float]] = {}
    for r in rows:
        if r.get("train/loss"):
            by_epoch.setdefault(int(r["epoch"]), []).append(float(r["train/loss"]))
    return [round(sum(v) / len(v), 4) for _, v in sorted(by_epoch.items())]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default="../shared/data/coco_tiny")
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in RECIPES:
            small = [] if "ssd" in name else ["+model.detector.min_size=256", "+model.detector.max_size=416"]
            run = Path(tmp) / name
            cmd = [
                sys.executable,
                str(REPO / "train.py"),
                f"experiment={name}",
                f"dataset.root={args.root}",
                "trainer=cpu",
                "trainer.precision=32-true",
                "loader.batch_size=2",
                f"trainer.max_epochs={args.epochs}",
                "trainer.log_every_n_steps=1",
                "trainer.enable_progress_bar=false",
                *small,
                f"hydra.run.dir={run}",
            ]
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
            summary = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {}
            losses = epoch_losses(run) if proc.returncode == 0 else []
            results[name] = {
                "status": summary.get("status", f"exit {proc.returncode}"),
                "epoch_loss": losses,
                "falling": len(losses) > 1 and losses[-1] < losses[0],
                "map50": summary.get("map50"),
                "global_batch": summary.get("global_batch"),
                "effective_lr": summary.get("effective_lr"),
                "wall_s": summary.get("wall_s"),
            }
            print(json.dumps({name: results[name]}), flush=True)


if __name__ == "__main__":
    main()
