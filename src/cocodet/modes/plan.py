"""mode=plan: the dataset's indexes (and a full scan with dataset.verify), the host preflight
and the loader plan; no torch, no Lightning, so it answers in about a second."""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from cocodet.loader.plan_record import LoaderPlan
from cocodet.loader.resources import HostResources

log = logging.getLogger(__name__)


def plan(cfg: DictConfig, loader_plan: LoaderPlan, resources: HostResources, run_dir: Path) -> dict:
    from cocodet.data.splits import load_splits
    from cocodet.modes.wiring import train_keep_empty

    d = OmegaConf.to_container(cfg.dataset, resolve=True)
    train, val = load_splits(d["root"], d["train_images"], d["train_ann"], d["val_images"], d["val_ann"],
                             train_keep_empty(cfg), d["on_bad_sample"], d.get("synthetic"), d.get("cache_dir"))
    if cfg.dataset.verify:
        from cocodet.data.verify import verify_indexes

        verify_indexes(train, val, run_dir, int(d["max_image_pixels"]))
    log.info("host preflight:\n%s", resources.table())
    return {"mode": "plan", **loader_plan.summary(), "host": resources.as_dict(), "train_images": len(train),
            "val_images": len(val)}
