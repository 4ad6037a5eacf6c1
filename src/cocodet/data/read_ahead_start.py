"""The train loader's read-ahead, started for a datamodule (``storage/read_ahead.py``): where its
stream starts, the samples in flight ahead of the model (its lead), and where the run ends."""

from __future__ import annotations

from cocodet.loader.stream_end import read_ahead_span
from cocodet.storage.read_ahead import start_read_ahead
from cocodet.storage.working_set import lead_samples


def start_train_read_ahead(dm, sampler, start: tuple[int, int] | None):
    """The prefetcher of ``dm``'s remote train split, or None where there is none; ``start``:
    (epoch, batch) a resume begins at."""
    trainer = dm.trainer
    epoch = start[0] if start else (trainer.current_epoch if trainer is not None else 0)
    first = start[1] if start else 0
    return start_read_ahead(dm.root, dm.train_images, dm.remote, dm.cache_dir, dm.train_set, sampler, epoch,
                            first * dm.batch_size, trainer.local_rank if trainer is not None else 0,
                            dm.plan.local_ranks,
                            lead_samples(dm.plan.num_workers, dm.plan.prefetch_factor, dm.batch_size),
                            read_ahead_span(trainer, dm.stream_batches, len(sampler), dm.batch_size, epoch, first))
