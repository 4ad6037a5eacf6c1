"""The one DataLoader builder: training, validation, bench and preview all load through it."""

from __future__ import annotations

import torch.utils.data

from cocodet.data.flat_batch import flatten
from cocodet.loader.policy import LoaderPlan
from cocodet.loader.worker import worker_init_fn


def build_loader(dataset: torch.utils.data.Dataset, sampler: torch.utils.data.Sampler, batch_size: int,
                 plan: LoaderPlan) -> torch.utils.data.DataLoader:
    """FlatBatch collate, worker hygiene and the plan's worker settings; batches never mix
    epochs because the sampler's keys carry them (DESIGN §5)."""
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=flatten,
                                       worker_init_fn=worker_init_fn, drop_last=False, **plan.dataloader_kwargs())
