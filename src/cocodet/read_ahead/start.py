"""The read-ahead of a remote train split, started: this rank's plan of reads (the sampler's
keys through the dataset's partner sources), its working set and budget, the node-local copies
(``object_cache.py``) and the thread that fills them (``fetcher.py:ReadAhead``)."""

from __future__ import annotations

import logging
from functools import partial

import numpy as np

from cocodet.loader.stream_end import read_ahead_span
from cocodet.read_ahead.budget import (
    budget_origin,
    read_ahead_budget,
    read_ahead_folder,
    split_folder,
    working_set_words,
)
from cocodet.read_ahead.fetcher import ReadAhead
from cocodet.read_ahead.object_cache import ObjectCache
from cocodet.read_ahead.working_set import lead_samples, reach, working_set
from cocodet.storage.store import listing
from cocodet.storage.urls import is_remote, join

log = logging.getLogger(__name__)


def epoch_reads(sampler, dataset, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """(this rank's reads of ``epoch`` in order, offsets of each sample's reads): the sampler's
    keys, with ``dataset.planned_epoch_reads``."""
    reads = dataset.planned_epoch_reads(list(sampler.epoch_keys(epoch)))
    offsets = np.cumsum([0] + [len(r) for r in reads])
    return (np.concatenate(reads).astype(np.int64) if reads else np.zeros(0, np.int64)), offsets


def start_read_ahead(
    root: str,
    images: str,
    remote: dict,
    cache_dir: str | None,
    dataset,
    sampler,
    epoch: int,
    skip_samples: int,
    local_rank: int,
    local_ranks: int,
    lead_samples: int = 0,
    end: int | None = None,
) -> ReadAhead | None:
    """The read-ahead of a remote train split, started, or None where there is none: a local
    root, no folder (``dataset.remote.cache_dir`` and ``dataset.cache_dir`` null),
    ``cache_bytes=0``, or a pixel cache (which reads each object once, at its build). ``end``:
    the samples the run consumes from its start (None: unknown)."""
    folder = read_ahead_folder(remote, cache_dir)
    cache_bytes, concurrency = remote.get("cache_bytes", "auto"), int(remote.get("concurrency") or 16)
    if not is_remote(root) or not folder or not cache_bytes or dataset.pixel_cache is not None:
        return None
    listed = listing(join(root, images))
    paths = [str(p) for p in dataset.index.paths]
    objects = {p: listed[p] for p in paths if p in listed}  # the split's own: val copies never enter it
    sizes = np.array([objects.get(p, {}).get("size", 0) for p in paths], dtype=np.int64)
    plans = [epoch_reads(sampler, dataset, e) for e in (epoch, epoch + 1)]  # a pass over two epochs' keys: once
    working = working_set(plans, sizes, reach(lead_samples))
    mine, claim = split_folder(folder, local_rank, join(root, images))
    budget = read_ahead_budget(folder, cache_bytes, local_ranks, objects, concurrency, working[1], own=mine)
    cache = ObjectCache(mine, objects, budget["rank_budget_bytes"])
    cache.folder_claim = claim  # held (open) for the run: the folder is this run's
    dataset.reader.copies = cache  # before the workers fork: their reads of the split go through the copies
    read_ahead = ReadAhead(
        cache,
        paths,
        partial(epoch_reads, sampler, dataset),
        budget["rank_budget_bytes"],
        concurrency,
        lead_samples,
        end=end,
    )
    read_ahead.start(epoch, skip_samples, plans)
    line, warning = working_set_words(budget, working, local_ranks)
    log.info(
        "read-ahead: %s, %.0f MiB for this rank%s (%s the %.0f MiB split); %s; %d GETs in flight (about %.0f MiB "
        "of memory)",
        mine,
        budget["rank_budget_bytes"] / 2**20,
        budget_origin(budget),
        "holds" if budget["holds_the_split"] else "a window of",
        budget["split_bytes"] / 2**20,
        line,
        concurrency,
        budget["memory_bytes"] / 2**20,
    )
    if warning:
        log.warning(warning)
    read_ahead.working_set = working
    return read_ahead


def start_train_read_ahead(
    split: dict, dataset, sampler, start: tuple[int, int] | None, plan, batch_size: int, trainer, stream_batches
) -> ReadAhead | None:
    """:func:`start_read_ahead` for a datamodule's train loader: ``split`` its store keys
    (``root``, ``images``, ``remote``, ``cache_dir``); ``start`` (epoch, batch) where a resume
    begins (None: the trainer's epoch, or 0 without one); the lead (samples in flight ahead
    of the model) from the loader ``plan``; the end from the trainer's (or the bench's,
    ``stream_batches``) stream end."""
    epoch, first = start or (trainer.current_epoch if trainer is not None else 0, 0)
    lead = lead_samples(plan.num_workers, plan.prefetch_factor, batch_size)
    end = read_ahead_span(trainer, stream_batches, len(sampler), batch_size, epoch, first)
    return start_read_ahead(
        split["root"],
        split["images"],
        split["remote"],
        split["cache_dir"],
        dataset,
        sampler,
        epoch,
        first * batch_size,
        trainer.local_rank if trainer is not None else 0,
        plan.local_ranks,
        lead,
        end,
    )
