"""The one DataLoader builder: training, validation, bench and preview all load through it."""

from __future__ import annotations

import torch.utils.data

from cocodet.config import UserError
from cocodet.data.flat_batch import flatten
from cocodet.loader.policy import LoaderPlan
from cocodet.loader.worker import worker_init_fn


def build_loader(dataset: torch.utils.data.Dataset, sampler: torch.utils.data.Sampler, batch_size: int,
                 plan: LoaderPlan, position: "StreamPosition | None" = None) -> torch.utils.data.DataLoader:
    """FlatBatch collate, worker hygiene and the plan's worker settings; batches never mix
    epochs because the sampler's keys carry them (DESIGN §5). With a ``position``, a
    :class:`ResumableLoader` that checkpoints where the stream stands."""
    kwargs = dict(batch_size=batch_size, sampler=sampler, collate_fn=flatten, worker_init_fn=worker_init_fn,
                  drop_last=False, **plan.dataloader_kwargs())
    if position is not None:
        return ResumableLoader(dataset, position=position, **kwargs)
    return torch.utils.data.DataLoader(dataset, **kwargs)


class ResumableLoader(torch.utils.data.DataLoader):
    """The train DataLoader, stateful in Lightning's sense (``state_dict`` / ``load_state_dict``).

    ``position`` is the datamodule's count of batches the model consumed (not what the
    workers prefetched). The datamodule restores it and builds the resumed loader already
    positioned: Lightning 2.6 only hands a loader its saved state when it builds the loader
    after restoring the loops, which it does not when ``configure_optimizers`` asked for
    ``estimated_stepping_batches`` first (the loader is then built before the restore, and
    the resumed epoch's iterator with it). Here ``load_state_dict`` only checks agreement.
    """

    def __init__(self, *args, position: "StreamPosition", **kwargs):
        super().__init__(*args, **kwargs)
        self.position = position

    def state_dict(self) -> dict:
        return self.position.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.position.check(state)


class StreamPosition:
    """Where the train stream stands: epoch, batches consumed in it, and what must match to
    continue exactly (batch size, seed, rank count)."""

    def __init__(self, batch_size: int, seed: int, world_size: int):
        self.epoch, self.batches = 0, 0
        self.batch_size, self.seed, self.world_size = batch_size, seed, world_size

    def advance(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.batches = epoch, 0
        self.batches += 1

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batches": self.batches, "batch_size": self.batch_size, "seed": self.seed,
                "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        self.check(state)
        self.epoch, self.batches = int(state["epoch"]), int(state["batches"])

    def check(self, state: dict) -> None:
        """Refuse a saved position this run cannot continue exactly."""
        if state["world_size"] != self.world_size:
            raise ResumeError(f"the checkpoint was written by a run with {state['world_size']} rank(s) and this run has "
                              f"{self.world_size}: each rank's share of every epoch depends on the rank count, so the "
                              f"stream cannot continue exactly. Resume with {state['world_size']} rank(s) "
                              "(trainer.devices x trainer.num_nodes)")
        for key, name in (("batch_size", "loader.batch_size"), ("seed", "seed")):
            if state[key] != getattr(self, key):
                raise ResumeError(f"the checkpoint's {name} is {state[key]} and this run's is {getattr(self, key)}: the "
                                  f"remaining batches would differ. Resume with {name}={state[key]}")


class ResumeError(UserError):
    """A checkpoint this run cannot continue exactly (another rank count, batch size or seed)."""
