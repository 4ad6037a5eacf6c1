"""mode=preview: PNG grids of real train batches, drawn from the restored FlatBatches."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from cocodet.loader.plan_record import LoaderPlan
from cocodet.modes.wiring import build_datamodule


def preview(cfg: DictConfig, plan: LoaderPlan, resources, run_dir: Path) -> dict:
    from cocodet.preview import render_previews

    datamodule = build_datamodule(cfg, plan, run_dir)
    try:
        paths, batch_bins = render_previews(datamodule, run_dir / "previews", batches=int(cfg.preview.batches),
                                            epoch=int(cfg.preview.epoch))
    finally:
        datamodule.teardown("preview")  # a remote root's read-ahead thread
    return {"mode": "preview", "pngs": [str(p) for p in paths], "batch_bins": batch_bins, **plan.summary()}
