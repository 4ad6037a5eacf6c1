"""mode=plan: the dataset's indexes (and a full scan with dataset.verify), the host preflight
and the loader plan; no torch, no Lightning, so it answers in about a second."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from cocodet.storage.store import is_remote

from cocodet.loader.plan_record import LoaderPlan
from cocodet.loader.resources import HostResources

log = logging.getLogger(__name__)


def partner_words(cfg) -> str:
    """What the mosaic partners add to a rank's object reads (none for pools: they are the batch's own)."""
    from cocodet.modes.wiring import partner_window
    from cocodet.transforms.augment import partner_source

    if cfg.augment.get("mosaic_p") is None:
        return ""
    aug = cfg.augment
    source = partner_source(aug.get("partners"), aug.get("partner_window"), aug.get("partner_pool"))
    if source == "dataset":
        return ", plus the mosaic partners it draws from the whole dataset"
    if source == "window":
        return (f", plus the window partners of the first {partner_window(cfg)} positions of each epoch (later ones are "
                "read from the window cache, not the store)")
    return ""


def plan(cfg: DictConfig, loader_plan: LoaderPlan, resources: HostResources, run_dir: Path) -> dict:
    from cocodet.coco.splits import load_splits
    from cocodet.modes.wiring import train_keep_empty

    d = OmegaConf.to_container(cfg.dataset, resolve=True)
    train, val = load_splits(d["root"], d["train_images"], d["train_ann"], d["val_images"], d["val_ann"],
                             train_keep_empty(cfg), d["on_bad_sample"], d.get("synthetic"), d.get("cache_dir"))
    if cfg.dataset.verify:
        from cocodet.images.verify import verify_indexes

        verify_indexes(train, val, run_dir, int(d["max_image_pixels"]))
    log.info("host preflight:\n%s", resources.table())
    remote = remote_reads(cfg, train, loader_plan) if is_remote(str(d["root"])) else None
    return {"mode": "plan", **loader_plan.summary(), "host": resources.as_dict(), "train_images": len(train),
            "val_images": len(val), **({"remote": remote} if remote else {})}


def remote_reads(cfg: DictConfig, train, loader_plan: LoaderPlan) -> dict:
    """What one train epoch reads from a remote root for this rank: objects and bytes (from one
    listing of the image prefix), and the images two ranks share (the sampler's padding)."""
    from cocodet.loader.rank_share import padding, rank_indices
    from cocodet.storage.store import listing
    from cocodet.modes.wiring import run_ranks

    ranks = run_ranks(cfg)
    sizes = listing(str(cfg.dataset.root).rstrip("/") + "/" + str(cfg.dataset.train_images))
    mine = rank_indices(len(train), int(cfg.seed), 0, ranks.global_rank, ranks.world_size)
    grouped = loader_plan.group_aspect_ratio is not None  # grouped batches pad whole batches: about the same share
    objects = np.unique(mine)
    bytes_ = sum(sizes.get(str(train.paths[k]), {}).get("size", 0) for k in objects)
    shared = padding(len(train), ranks.world_size)
    partners = partner_words(cfg)
    log.info("remote root %s: this rank%s reads %s%d of %d train objects, %.1f MiB per epoch%s%s; each request waits "
             "at most dataset.remote.timeout_s=%g s", cfg.dataset.root, ranks.label(), "about " if grouped else "",
             len(objects), len(train), bytes_ / 2**20,
             f"; {shared} images of each epoch's order are read by two ranks (the sampler pads by wrapping)"
             if shared else "", partners,
             float(cfg.dataset.remote.timeout_s))
    return {"root": str(cfg.dataset.root), "objects_per_epoch": int(len(objects)), "bytes_per_epoch": int(bytes_),
            "listed_objects": len(sizes), "shared_by_two_ranks": shared, "approximate": grouped,
            "read_ahead": read_ahead_plan(cfg, sizes, ranks.local_world_size)}


def read_ahead_plan(cfg: DictConfig, objects: dict, local_ranks: int) -> dict | None:
    """The read-ahead's disk (refused when its folder cannot hold cache_bytes) and memory."""
    from cocodet.storage.prefetch import budget_origin, read_ahead_budget, read_ahead_folder

    remote = OmegaConf.to_container(cfg.dataset.remote, resolve=True)
    folder = read_ahead_folder(remote, cfg.dataset.get("cache_dir"))
    if not folder or not remote.get("cache_bytes") or cfg.dataset.cache != "none":
        log.info("read-ahead: off (%s)", "dataset.cache holds the pixels" if cfg.dataset.cache != "none" else
                 "dataset.remote.cache_bytes=0" if folder else "no folder: dataset.cache_dir and remote.cache_dir null")
        return None
    budget = read_ahead_budget(folder, remote["cache_bytes"], local_ranks, objects, int(remote["concurrency"]))
    log.info("read-ahead: %s on disk for each of %d local rank(s) in %s%s (%s the %.0f MiB split), %d GETs in flight, "
             "about %.0f MiB of memory", f"{budget['rank_budget_bytes'] / 2**20:.0f} MiB", local_ranks, folder,
             budget_origin(budget),
             "holds" if budget["holds_the_split"] else "a window of", budget["split_bytes"] / 2**20,
             budget["concurrency"], budget["memory_bytes"] / 2**20)
    return budget
