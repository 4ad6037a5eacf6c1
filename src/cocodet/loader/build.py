"""The one DataLoader builder: training, validation, bench and preview all load through it."""

from __future__ import annotations

import torch.utils.data

from cocodet.config import UserError
from cocodet.data.flat_batch import BatchKeys, PartJoiner, flatten
from cocodet.loader.hang import watchdog
from cocodet.loader.policy import LoaderPlan
from cocodet.loader.worker import worker_init_fn


def build_loader(dataset: torch.utils.data.Dataset, sampler: torch.utils.data.Sampler, batch_size: int,
                 plan: LoaderPlan, position: "StreamPosition | None" = None,
                 across_epochs: bool = False) -> torch.utils.data.DataLoader:
    """FlatBatch collate, worker hygiene and the plan's worker settings; batches never mix
    epochs because the sampler's keys carry them (DESIGN §5). When the plan ships batches in
    parts (``plan.part_images``), workers build parts and the loader joins them. With
    ``across_epochs``, workers run on into the next epoch instead of idling at each epoch's
    end. With a ``position``, a :class:`ResumableLoader` that checkpoints where the stream stands."""
    kwargs = dict(collate_fn=flatten, worker_init_fn=worker_init_fn, **plan.dataloader_kwargs())
    part = plan.part_images if plan.num_workers > 0 and plan.part_images else batch_size
    across_epochs = across_epochs and plan.num_workers > 0  # in-process loading has nothing to overlap
    kwargs["batch_sampler"] = EpochBatchSampler(sampler, batch_size, min(part, batch_size), across_epochs)
    cls = ResumableLoader if position is not None else EpochLoader
    return cls(dataset, position=position, plan_timeout=plan.timeout_s, **kwargs)


class EpochBatchSampler(torch.utils.data.Sampler):
    """Batches of ``batch_size`` keys (an epoch's last may be short), each yielded as parts of at
    most ``part_size`` keys; the last batch of an epoch is marked. Which keys form a batch never
    depends on the part size. ``across_epochs``: after the epoch asked for (the sampler's
    ``epoch``), the batches of the following epochs, without end."""

    def __init__(self, sampler: torch.utils.data.Sampler, batch_size: int, part_size: int, across_epochs: bool = False):
        self.sampler, self.batch_size, self.part_size = sampler, batch_size, part_size
        self.across_epochs = across_epochs

    def batches(self) -> int:
        """Batches in a whole epoch."""
        return -(-len(self.sampler) // self.batch_size)

    def __len__(self) -> int:  # what torch counts: parts of one epoch
        full, rest = divmod(len(self.sampler), self.batch_size)
        return full * -(-self.batch_size // self.part_size) + -(-rest // self.part_size)

    def __iter__(self):
        epoch = self.sampler.epoch
        while True:
            keys = list(self.sampler.epoch_keys(epoch))
            for start in range(0, len(keys), self.batch_size):
                yield from self._split(keys[start:start + self.batch_size], start + self.batch_size >= len(keys))
            if not self.across_epochs:
                return
            epoch += 1

    def _split(self, batch: list, epoch_end: bool):
        n = -(-len(batch) // self.part_size)
        for k in range(n):
            part = (k, n) if n > 1 else ()
            yield BatchKeys(batch[k * self.part_size:(k + 1) * self.part_size], part, epoch_end and k == n - 1)


class EpochLoader(torch.utils.data.DataLoader):
    """A DataLoader that yields one epoch of whole batches per ``iter()``.

    Parts: when workers ship batches in parts (each fits the /dev/shm budget), they are joined
    here into ordinary (or pinned) memory. Across epochs: one worker iterator runs through all
    epochs, so while the model takes an epoch's last batches, workers already build the next
    epoch's first ones (on an 80-image set at batch 32 the start-up of each epoch was a third
    of the loading time). Each ``iter()`` continues that stream when the epoch asked for
    (``set_epoch``) is the one it stands at, and starts a new one otherwise (a resume, a
    stopped epoch), so the batches are always those of the epoch asked for.
    """

    def __init__(self, *args, position: "StreamPosition | None" = None, plan_timeout: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self._stream = _Stream()
        self.plan_timeout = plan_timeout

    def __len__(self) -> int:
        return self.batch_sampler.batches()

    def set_epoch(self, epoch: int) -> None:
        """Set the key sampler's epoch (``sampler`` is torch's default when a batch sampler is given)."""
        self.batch_sampler.sampler.set_epoch(epoch)

    def __iter__(self):
        wanted, stream = self.batch_sampler.sampler.epoch, self._stream
        across = self.batch_sampler.across_epochs
        if stream.batches is None or stream.next_epoch != wanted or not across:
            stream.batches = _joined(super().__iter__(), self.pin_memory)
        stream.next_epoch = None  # until this epoch is taken to its end
        # Torch applies its timeout only with workers; in-process loading gets the watchdog.
        watch = self.plan_timeout if self.num_workers == 0 else 0.0
        return _one_epoch(stream, wanted, across, watch)


class _Stream:
    """The running batch stream and the epoch it delivers next. Apart from the loader, so the
    generators do not reference it: a loader in a reference cycle is freed by the garbage
    collector, which closes the workers' queues before the workers are told to stop (each
    then takes torch's 5 s shutdown timeout)."""

    def __init__(self):
        self.batches = None
        self.next_epoch: int | None = None


def _one_epoch(stream: _Stream, epoch: int, across_epochs: bool, timeout_s: float = 0.0):
    batches = stream.batches if timeout_s <= 0 else _watched(stream.batches, timeout_s)
    for batch in batches:
        yield batch
        if batch.epoch_end and across_epochs:
            stream.next_epoch = epoch + 1
            return
    # Not across epochs: the worker iterator was taken to its end, which lets torch shut
    # non-persistent workers down now rather than when the next epoch replaces them.
    stream.batches = None


def _watched(batches, timeout_s: float):
    """``batches`` with each ``next()`` under the in-process watchdog."""
    while True:
        with watchdog(timeout_s):
            batch = next(batches, None)
        if batch is None:
            return
        yield batch


def _joined(parts_iter, pin_memory: bool):
    joiner = PartJoiner(pin_memory)
    for part in parts_iter:
        batch = joiner.add(part)
        if batch is not None:
            yield batch


class ResumableLoader(EpochLoader):
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
