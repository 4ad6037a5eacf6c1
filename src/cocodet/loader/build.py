"""The one DataLoader builder: training, validation, bench and preview all load through it."""

from __future__ import annotations

import torch.utils.data

from cocodet.config import UserError
from cocodet.data.flat_batch import PartJoiner, PartKeys, flatten
from cocodet.loader.policy import LoaderPlan
from cocodet.loader.worker import worker_init_fn


def build_loader(dataset: torch.utils.data.Dataset, sampler: torch.utils.data.Sampler, batch_size: int,
                 plan: LoaderPlan, position: "StreamPosition | None" = None) -> torch.utils.data.DataLoader:
    """FlatBatch collate, worker hygiene and the plan's worker settings; batches never mix
    epochs because the sampler's keys carry them (DESIGN §5). When the plan ships batches in
    parts (``plan.part_images``), workers build parts and the loader joins them. With a
    ``position``, a :class:`ResumableLoader` that checkpoints where the stream stands."""
    kwargs = dict(collate_fn=flatten, worker_init_fn=worker_init_fn, **plan.dataloader_kwargs())
    part = plan.part_images if plan.num_workers > 0 and plan.part_images else batch_size
    kwargs["batch_sampler"] = PartedBatchSampler(sampler, batch_size, min(part, batch_size))
    cls = ResumableLoader if position is not None else PartJoiningLoader
    return cls(dataset, position=position, **kwargs)


class PartedBatchSampler(torch.utils.data.Sampler):
    """Batches of ``batch_size`` keys (the last may be short), each yielded as parts of at
    most ``part_size`` keys. Which keys form a batch never depends on the part size."""

    def __init__(self, sampler: torch.utils.data.Sampler, batch_size: int, part_size: int):
        self.sampler, self.batch_size, self.part_size = sampler, batch_size, part_size

    def batches(self) -> int:
        return -(-len(self.sampler) // self.batch_size)

    def __len__(self) -> int:  # what torch counts: parts
        full, rest = divmod(len(self.sampler), self.batch_size)
        return full * -(-self.batch_size // self.part_size) + -(-rest // self.part_size)

    def __iter__(self):
        batch = []
        for key in self.sampler:
            batch.append(key)
            if len(batch) == self.batch_size:
                yield from self._split(batch)
                batch = []
        if batch:
            yield from self._split(batch)

    def _split(self, batch: list):
        n = -(-len(batch) // self.part_size)
        if n == 1:
            yield batch
            return
        for k in range(n):
            yield PartKeys(batch[k * self.part_size:(k + 1) * self.part_size], (k, n))


class PartJoiningLoader(torch.utils.data.DataLoader):
    """A DataLoader that yields whole batches when its workers ship them in parts: each part
    fits the /dev/shm budget, and the joined batch lives in ordinary (or pinned) memory."""

    def __init__(self, *args, position: "StreamPosition | None" = None, **kwargs):
        super().__init__(*args, **kwargs)

    def __len__(self) -> int:
        return self.batch_sampler.batches()

    def set_epoch(self, epoch: int) -> None:
        """Set the key sampler's epoch (``sampler`` is torch's default when a batch sampler is given)."""
        self.batch_sampler.sampler.set_epoch(epoch)

    def __iter__(self):
        parts_iter = super().__iter__()
        if self.batch_sampler.part_size >= self.batch_sampler.batch_size:
            return parts_iter
        return self._joined(parts_iter)

    def _joined(self, parts_iter):
        joiner = PartJoiner(self.pin_memory)
        for part in parts_iter:
            batch = joiner.add(part)
            if batch is not None:
                yield batch


class ResumableLoader(PartJoiningLoader):
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
