"""mode=plan: the dataset's indexes (and a full scan with dataset.verify), the host preflight
and the loader plan; no torch, no Lightning, so it answers in about a second."""

from __future__ import annotations

import logging

import numpy as np

from cocodet.loader.plan.pod_requests import pod_requests, pod_requests_text
from cocodet.loader.plan.records import LoaderPlan
from cocodet.loader.plan.resources import HostResources
from cocodet.run_spec.records import RunSpec
from cocodet.storage.urls import is_remote

log = logging.getLogger(__name__)


def partner_words(spec: RunSpec) -> str:
    """What the mosaic partners add to a rank's object reads (none for pools: they are the batch's own)."""
    source = spec.recipe.shape.partners_from
    if source == "dataset":
        return ", plus the mosaic partners it draws from the whole dataset"
    if source == "window":
        return (
            f", plus the window partners of the first {spec.loader.batches.partner_window} positions of each epoch "
            "(later ones are read from the window cache, not the store)"
        )
    return ""


def dataset_splits(spec: RunSpec):
    """The run's splits (``datasets/layouts.py`` Splits), read as training reads them (cached,
    synthetic made), by the same loader the datamodule uses."""
    from cocodet.datasets.splits import SplitLoader

    return SplitLoader.from_dataset(spec.dataset.options).load()


def dataset_indexes(spec: RunSpec):
    """(train, val) indexes of the run's dataset."""
    splits = dataset_splits(spec)
    return splits.train, splits.val


def plan(spec: RunSpec, loader_plan: LoaderPlan, resources: HostResources) -> dict:
    d = spec.dataset.options
    splits = dataset_splits(spec)
    train, val = splits.train, splits.val
    if d.get("verify"):
        from cocodet.images.verify import verify_indexes

        verify_indexes(train, val, spec.run_dir, int(d["max_image_pixels"]))
    log.info("host preflight:\n%s", resources.table())
    log.info("pod requests, per node (Kubernetes, deploy/k8s/): %s", pod_requests_text(loader_plan))
    scaling = spec.model.config.get("lr_scaling") if spec.model is not None else None
    if scaling:  # what training will use (it logs the same from its trainer, models/optimization.py)
        from cocodet.models.reference_schedule import lr_words

        log.info(
            "learning rate: %s",
            lr_words(
                scaling,
                spec.loader.batches.batch_size,
                spec.ranks.world_size,
                int(spec.trainer.args.get("accumulate_grad_batches") or 1),
            ),
        )
    remote = remote_reads(spec, train, splits.train_images, loader_plan) if is_remote(str(d["root"])) else None
    return {
        "mode": "plan",
        **loader_plan.summary(),
        "pod": pod_requests(loader_plan),
        "host": resources.as_dict(),
        "train_images": len(train),
        "val_images": len(val),
        **({"remote": remote} if remote else {}),
    }


def remote_reads(spec: RunSpec, train, images: tuple[str, str], loader_plan: LoaderPlan) -> dict:
    """What one train epoch reads from a remote root for this rank: objects and bytes (from one
    listing of the train images' prefix, ``images``: (root, folder)), and the images two ranks
    share (the sampler's padding)."""
    from cocodet.loader.rank_share import padding, rank_indices
    from cocodet.storage.store import listing
    from cocodet.storage.urls import join

    ranks, root = spec.ranks, spec.dataset.root
    sizes = listing(join(*images))
    mine = rank_indices(len(train), spec.seed, 0, ranks.global_rank, ranks.world_size)
    grouped = loader_plan.group_aspect_ratio is not None  # grouped batches pad whole batches: about the same share
    objects = np.unique(mine)
    bytes_ = sum(sizes.get(str(train.paths[k]), {}).get("size", 0) for k in objects)
    shared = padding(len(train), ranks.world_size)
    partners = partner_words(spec)
    log.info(
        "remote root %s: this rank%s reads %s%d of %d train objects, %.1f MiB per epoch%s%s; each request waits "
        "at most dataset.remote.timeout_s=%g s",
        root,
        ranks.label(),
        "about " if grouped else "",
        len(objects),
        len(train),
        bytes_ / 2**20,
        f"; {shared} images of each epoch's order are read by two ranks (the sampler pads by wrapping)"
        if shared
        else "",
        partners,
        float(spec.dataset.get("remote")["timeout_s"]),
    )
    return {
        "root": root,
        "objects_per_epoch": int(len(objects)),
        "bytes_per_epoch": int(bytes_),
        "listed_objects": len(sizes),
        "shared_by_two_ranks": shared,
        "approximate": grouped,
        "read_ahead": read_ahead_plan(spec, sizes, train, loader_plan),
    }


def read_ahead_plan(spec: RunSpec, objects: dict, train, loader_plan: LoaderPlan) -> dict | None:
    """The read-ahead's disk (refused when its folder cannot hold cache_bytes), memory and
    working set (this rank's first epoch, planned as training plans it: torch is imported for
    the sampler, only here), with a warning when the budget is below the working set."""
    from cocodet.read_ahead.budget import budget_origin, read_ahead_budget, read_ahead_folder, working_set_words

    remote, ranks, cache = spec.dataset.get("remote"), spec.ranks, spec.dataset.get("cache", "none")
    folder = read_ahead_folder(remote, spec.dataset.get("cache_dir"))
    if not folder or not remote.get("cache_bytes") or cache != "none":
        log.info(
            "read-ahead: off (%s)",
            "dataset.cache holds the pixels"
            if cache != "none"
            else "dataset.remote.cache_bytes=0"
            if folder
            else "no folder: dataset.cache_dir and remote.cache_dir null",
        )
        return None
    paths = [str(p) for p in train.paths]
    own = {p: objects[p] for p in paths if p in objects}
    working = first_epoch_working_set(spec, train, own, loader_plan)
    budget = read_ahead_budget(
        folder, remote["cache_bytes"], ranks.local_world_size, own, int(remote["concurrency"]), working[1]
    )
    line, warning = working_set_words(budget, working, ranks.local_world_size)
    log.info(
        "read-ahead: %s on disk for each of %d local rank(s) in %s%s (%s the %.0f MiB split); %s; %d GETs in "
        "flight, about %.0f MiB of memory",
        f"{budget['rank_budget_bytes'] / 2**20:.0f} MiB",
        ranks.local_world_size,
        folder,
        budget_origin(budget),
        "holds" if budget["holds_the_split"] else "a window of",
        budget["split_bytes"] / 2**20,
        line,
        budget["concurrency"],
        budget["memory_bytes"] / 2**20,
    )
    if warning:
        log.warning(warning)
    return {**budget, "working_set_objects": working[0]}


def first_epoch_working_set(spec: RunSpec, train, objects: dict, loader_plan: LoaderPlan) -> tuple[int, int]:
    """(objects, bytes) of this rank's working set over epochs 0 and 1 (``read_ahead/working_set.py``), from
    the reads the samples plan, with the window cache the plan sizes (a window partner read
    from it is no object read). Grouped batches are planned in the plain order: one read per
    sample either way."""
    from cocodet.data.dataset import DetectionDataset
    from cocodet.data.window_cache import WindowCache
    from cocodet.loader.epoch_sampler import EpochSampler
    from cocodet.loader.rank_share import RankOrder
    from cocodet.read_ahead.start import epoch_reads
    from cocodet.read_ahead.working_set import lead_samples, reach, working_set

    recipe, seed, ranks = spec.recipe.recipe, spec.seed, spec.ranks
    dataset = DetectionDataset(train, recipe, seed)
    window = getattr(recipe, "partner_window", 0) or 0
    cache = WindowCache(loader_plan.window_slots, recipe.decode_size) if window and loader_plan.window_slots else None
    try:
        if window:
            dataset.use_window(RankOrder(len(train), seed, ranks.global_rank, ranks.world_size), cache)
        sampler = EpochSampler(
            len(train),
            seed,
            True,
            ranks.global_rank,
            ranks.world_size,
            pool=getattr(recipe, "partner_pool", None),
            window=window,
        )
        sizes = np.array([objects.get(str(p), {}).get("size", 0) for p in train.paths], dtype=np.int64)
        lead = lead_samples(loader_plan.num_workers, loader_plan.prefetch_factor, spec.loader.batches.batch_size)
        return working_set([epoch_reads(sampler, dataset, e) for e in (0, 1)], sizes, reach(lead))
    finally:
        if cache is not None:
            cache.close()
