"""Plot a run's validation mAP@0.5 (and mAP) per epoch from its CSV log.

    python scripts/plot_learning_curve.py <run dir> [--out curve.png] [--label "16 coco_tiny images"]

Reads <run dir>/csv/version_*/metrics.csv (the `csv` logger), one point per validation.
Several run dirs draw several curves (each labelled by --label, in order, or by its folder).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def curve(run_dir: Path, stat: str) -> tuple[list[int], list[float]]:
    """(epoch, value) of every validation that logged ``stat``, from the newest CSV version."""
    (metrics,) = sorted(run_dir.glob("csv/version_*/metrics.csv"))[-1:]
    points = {}
    with open(metrics) as f:
        for row in csv.DictReader(f):
            if row.get(stat):
                points[int(row["epoch"]) + 1] = float(row[stat])  # epochs counted from 1: "after epoch N"
    epochs = sorted(points)
    return epochs, [points[e] for e in epochs]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dirs", type=Path, nargs="+")
    p.add_argument("--out", type=Path, default=Path("learning_curve.png"))
    p.add_argument("--label", action="append", default=[])
    p.add_argument("--title", default="validation mAP per epoch")
    args = p.parse_args()
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for i, run_dir in enumerate(args.run_dirs):
        label = args.label[i] if i < len(args.label) else run_dir.name
        for stat, style in (("val/map50", "-o"), ("val/map", "--")):
            epochs, values = curve(run_dir, stat)
            ax.plot(
                epochs, values, style, markersize=3, label=f"{label}: {'mAP@0.5' if stat.endswith('50') else 'mAP'}"
            )
            if stat == "val/map50" and values:
                print(
                    f"{label}: mAP@0.5 best {max(values):.3f} (epoch {epochs[values.index(max(values))]}), "
                    f"last {values[-1]:.3f} (epoch {epochs[-1]})"
                )
    ax.set_xlabel("epoch")
    ax.set_ylabel("COCO AP")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.set_title(args.title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out)
    print(f"plot: {args.out}")


if __name__ == "__main__":
    main()
