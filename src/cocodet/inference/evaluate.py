"""mode=eval: COCOeval of a checkpoint on a split, with per-category AP and a PR curve."""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import lightning as L

from cocodet.models.evaluation import ALL_STAT_NAMES, per_category_ap, precision_recall
from cocodet.ranks_in_trainer import finish_ranks

log = logging.getLogger(__name__)


def evaluate_checkpoint(trainer: L.Trainer, module, datamodule, ckpt_path: str, split: str, run_dir: Path) -> dict:
    """Validate the checkpoint's weights exactly as training validates (same loader, same
    letterbox, same COCOeval) on ``split``; write the per-category table (log + CSV) and the
    precision-recall plot."""
    if split == "train":
        datamodule.validate_on_train_split()
        module.val_ann_file = datamodule.val_ann_file
    trainer.validate(module, datamodule=datamodule, verbose=False)
    finish_ranks(trainer)
    ev = module.last_coco_eval
    stats = module.last_metrics
    names = dict(zip(datamodule.val_index.category_ids.tolist(), datamodule.val_index.category_names))
    summary = {
        "mode": "eval",
        "checkpoint": str(ckpt_path),
        "split": split,
        "eval_backend": module.eval_backend,
        **{k: round(float(stats.get(k, 0.0)), 4) for k in ALL_STAT_NAMES},
    }
    if not trainer.is_global_zero:  # COCOeval ran on rank 0, which writes the tables
        return summary
    summary.update(images=module.val_images_evaluated, padded_repeats_removed=module.val_repeats_removed)
    if ev is None:
        log.warning("no detections on the %s split: every AP is 0", split)
        return {**summary, "per_category": []}
    rows = per_category_ap(ev, names)
    csv_path = run_dir / "per_category_ap.csv"
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["rank", "category_id", "name", "ap", "ap50"])
        writer.writeheader()
        for rank, row in enumerate(rows, start=1):
            writer.writerow({"rank": rank, **row})
    log.info("per-category AP (%s split, ranked):\n%s", split, _table(rows))
    png = _plot_pr(precision_recall(ev), run_dir / "precision_recall.png", summary)
    return {**summary, "per_category": rows, "per_category_csv": str(csv_path), "precision_recall_png": str(png)}


def _table(rows: list[dict]) -> str:
    width = max([len(r["name"]) for r in rows] + [8])
    lines = [f"  {'rank':>4}  {'category':<{width}}  {'AP':>6}  {'AP50':>6}"]
    for rank, r in enumerate(rows, start=1):
        ap = "-" if r["ap"] is None else f"{r['ap']:.4f}"
        ap50 = "-" if r["ap50"] is None else f"{r['ap50']:.4f}"
        lines.append(f"  {rank:>4}  {r['name']:<{width}}  {ap:>6}  {ap50:>6}")
    return "\n".join(lines)


def _plot_pr(curves: dict, path: Path, summary: dict) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5))
    for key, label in (
        ("iou50", f"IoU 0.50 (AP {summary['map50']:.3f})"),
        ("iou75", f"IoU 0.75 (AP {summary['map75']:.3f})"),
        ("iou50_95", f"IoU 0.50:0.95 (AP {summary['map']:.3f})"),
    ):
        ax.plot(curves["recall"], curves[key], label=label)
    ax.set(
        xlabel="recall",
        ylabel="precision (mean over classes)",
        xlim=(0, 1),
        ylim=(0, 1.02),
        title=f"precision-recall, all classes, {summary['split']} split",
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
