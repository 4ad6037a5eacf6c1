"""The one DataLoader builder: training, validation, bench and preview all load through it."""

from __future__ import annotations

import torch.utils.data

from cocodet.loader.batch_sampler import EpochBatchSampler
from cocodet.loader.epoch_loader import EpochLoader, ResumableLoader
from cocodet.loader.failures.replan import Replanner
from cocodet.loader.flat_batch import Collate
from cocodet.loader.plan.records import LoaderPlan
from cocodet.loader.stream_position import StreamPosition
from cocodet.loader.worker import worker_init_fn


def build_loader(
    dataset: torch.utils.data.Dataset,
    sampler: torch.utils.data.Sampler,
    batch_size: int,
    plan: LoaderPlan,
    position: StreamPosition | None = None,
    across_epochs: bool = False,
    replanner: Replanner | None = None,
    stage: str = "",
    start: tuple[int, int] | None = None,
) -> torch.utils.data.DataLoader:
    """FlatBatch collate, worker hygiene and the plan's worker settings; batches never mix
    epochs because the sampler's keys carry them (design §5). When the plan ships batches in
    parts (``plan.part_images``), workers build parts and the loader joins them. With
    ``across_epochs``, workers run on into the next epoch instead of idling at each epoch's
    end. With a ``position``, a :class:`ResumableLoader` that checkpoints where the stream
    stands; ``start=(epoch, batches)`` begins that epoch after its first ``batches``. With a
    ``replanner``, its plan (not ``plan``) is used, and workers that die of a resource are
    replaced by a smaller plan that continues from the batch that failed (``stage`` names the
    loader in the record)."""
    plan = replanner.plan if replanner is not None else plan  # the run's plan; the loader takes its stage's
    batch_sampler = EpochBatchSampler(sampler, batch_size, batch_size, across_epochs)
    if start is not None:
        batch_sampler.start_at(*start)
    kwargs = dict(
        batch_sampler=batch_sampler,
        collate_fn=Collate(),
        worker_init_fn=worker_init_fn,
        plan=plan,
        replanner=replanner,
        stage=stage,
        across_epochs=across_epochs,
        **plan.for_stage(stage).dataloader_kwargs(),
    )
    if position is not None:
        return ResumableLoader(dataset, position=position, **kwargs)
    return EpochLoader(dataset, **kwargs)
