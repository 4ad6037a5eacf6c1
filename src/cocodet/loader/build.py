"""The one DataLoader builder: training, validation, bench and preview all load through it."""

from __future__ import annotations

import torch.utils.data

from cocodet.errors import UserError
from cocodet.loader.flat_batch import PartJoiner, flatten
from cocodet.loader.hang import watchdog
from cocodet.loader.policy import LoaderPlan
from cocodet.loader.worker import worker_init_fn
from cocodet.loader.worker_deaths import fetching
from cocodet.sample import BatchKeys


def build_loader(dataset: torch.utils.data.Dataset, sampler: torch.utils.data.Sampler, batch_size: int,
                 plan: LoaderPlan, position: "StreamPosition | None" = None, across_epochs: bool = False,
                 replanner: "Replanner | None" = None, stage: str = "",
                 start: tuple[int, int] | None = None) -> torch.utils.data.DataLoader:
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
    kwargs = dict(batch_sampler=batch_sampler, collate_fn=flatten, worker_init_fn=worker_init_fn, plan=plan,
                  replanner=replanner, stage=stage, across_epochs=across_epochs,
                  **plan.for_stage(stage).dataloader_kwargs())
    if position is not None:
        return ResumableLoader(dataset, position=position, **kwargs)
    return EpochLoader(dataset, **kwargs)


class EpochBatchSampler(torch.utils.data.Sampler):
    """Batches of ``batch_size`` keys (an epoch's last may be short), each yielded as parts of at
    most ``part_size`` keys; the last batch of an epoch is marked. Which keys form a batch never
    depends on the part size. ``across_epochs``: after the epoch asked for (the sampler's
    ``epoch``), the batches of the following epochs, without end. ``start_at(epoch, n)``: the
    next pass begins that epoch at its batch n (a resume, a re-plan)."""

    def __init__(self, sampler: torch.utils.data.Sampler, batch_size: int, part_size: int, across_epochs: bool = False):
        self.sampler, self.batch_size, self.part_size = sampler, batch_size, part_size
        self.across_epochs = across_epochs
        self._start: tuple[int, int] | None = None

    def start_at(self, epoch: int, batches: int) -> None:
        self._start = (epoch, batches)

    def first_batch(self, epoch: int) -> int:
        """The batch of ``epoch`` the next pass begins at."""
        return self._start[1] if self._start is not None and self._start[0] == epoch else 0

    def batches(self) -> int:
        """Batches in a whole epoch."""
        return -(-len(self.sampler) // self.batch_size)

    def __len__(self) -> int:  # what torch counts: parts of one epoch
        full, rest = divmod(len(self.sampler), self.batch_size)
        return full * -(-self.batch_size // self.part_size) + -(-rest // self.part_size)

    def __iter__(self):
        epoch = self.sampler.epoch
        skip, self._start = self.first_batch(epoch), None
        while True:
            # Whole batches are skipped from the whole epoch's keys, so pools stay as cut.
            keys = list(self.sampler.epoch_keys(epoch))
            for start in range(skip * self.batch_size, len(keys), self.batch_size):
                yield from self._split(keys[start:start + self.batch_size], start + self.batch_size >= len(keys))
            if not self.across_epochs:
                return
            epoch, skip = epoch + 1, 0

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

    Re-plan: with a ``replanner``, a wait that fails because workers died of a resource shuts
    the workers down, takes the replanner's smaller plan and starts a new stream at the batch
    that failed; a loader that finds the replanner's plan changed by another loader takes it
    at its next ``iter()``. A dead worker is noticed at the loader's own wait
    (``worker_deaths``), never in the middle of a training step.
    """

    def __init__(self, *args, plan: LoaderPlan, replanner: "Replanner | None" = None, stage: str = "",
                 across_epochs: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self._stream = _Stream()
        self.replanner, self.stage, self._across_asked = replanner, stage, across_epochs
        if replanner is not None:
            replanner.loaders.add(self)
        self._adopt(plan)

    def __len__(self) -> int:
        return self.batch_sampler.batches()

    def set_epoch(self, epoch: int) -> None:
        """Set the key sampler's epoch (``sampler`` is torch's default when a batch sampler is given)."""
        self.batch_sampler.sampler.set_epoch(epoch)

    def worker_pids(self) -> list[int]:
        """The pids of the workers now loading (none in-process or between streams)."""
        return [w.pid for w in _workers(self._stream.iterator)]

    def __iter__(self):
        if self.replanner is not None and self.replanner.plan is not self._run_plan:
            self._shut_down()  # another loader of this run re-planned: take its plan
            self._adopt(self.replanner.plan)
        wanted, stream = self.batch_sampler.sampler.epoch, self._stream
        first = 0
        if stream.batches is None or stream.next_epoch != wanted or not self.batch_sampler.across_epochs:
            first = self.batch_sampler.first_batch(wanted)
            self._start_stream_at(wanted, first)
        stream.next_epoch = None  # until this epoch is taken to its end
        return self._one_epoch(wanted, first)

    def _adopt(self, run_plan: LoaderPlan) -> None:
        """Take the worker settings ``run_plan`` gives this loader's stage (the stream must be shut down)."""
        self._run_plan = run_plan
        plan = run_plan.for_stage(self.stage)
        self.plan, self.num_workers = plan, plan.num_workers
        self.prefetch_factor = plan.prefetch_factor if plan.num_workers > 0 else None
        # Torch applies its timeout only with workers; in-process loading gets the watchdog.
        self.timeout = plan.timeout_s if plan.num_workers > 0 else 0
        sampler = self.batch_sampler
        part = plan.part_images if plan.num_workers > 0 and plan.part_images else sampler.batch_size
        sampler.part_size = min(part, sampler.batch_size)
        sampler.across_epochs = self._across_asked and plan.num_workers > 0  # in-process has nothing to overlap

    def _start_stream(self) -> None:
        self._stream.iterator = super().__iter__()
        self._stream.batches = _joined(self._stream.iterator, self.pin_memory)

    def _start_stream_at(self, epoch: int, batch: int) -> None:
        """Start the stream (positioned at ``batch`` of ``epoch``). A persistent iterator's restart
        waits on every worker, so a worker that died between epochs fails here, not at a fetch;
        it is re-planned the same way."""
        while True:
            failure = None
            try:
                self._start_stream()
                return
            except Exception as error:
                failure = self.replanner.failure(error) if self.replanner is not None else None
                if failure is None:
                    raise
            self._replan(failure, epoch, batch)

    def release_workers(self) -> None:
        """Shut this loader's workers down (before a re-plan probes the host); its next
        ``iter()`` starts them again on the plan then in force."""
        self._shut_down()
        self._stream.next_epoch = None

    def _replan(self, failure: tuple[str, str], epoch: int, batch: int) -> None:
        """Shut the failed workers down and take the smaller plan, positioned at the failed batch."""
        self._shut_down()
        self._resume_at(self.replanner.replan(*failure, self.stage, epoch, batch), epoch, batch, start=False)

    def _resume_at(self, run_plan: LoaderPlan, epoch: int, batch: int, start: bool = True) -> None:
        """Take ``run_plan`` with the sampler positioned at ``batch`` of ``epoch``."""
        self._adopt(run_plan)
        self.batch_sampler.sampler.set_epoch(epoch)
        self.batch_sampler.start_at(epoch, batch)
        if start:
            self._start_stream_at(epoch, batch)

    def _shut_down(self) -> None:
        """End the worker stream (the workers of a failed one, after a re-plan elsewhere)."""
        iterator = self._stream.iterator
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
            # Batches that arrived ahead of the failed one hold shm until dropped.
            getattr(iterator, "_task_info", {}).clear()
        self._iterator = None  # torch's persistent iterator: the next one is built for the new plan
        self._stream.iterator = self._stream.batches = None

    def _one_epoch(self, epoch: int, batch: int):
        """The batches of ``epoch`` from its batch ``batch`` on. Holds the loader only while the
        epoch runs; the loader never holds this generator (see _Stream)."""
        stream = self._stream
        while True:
            if stream.batches is None:  # another loader's re-plan released the workers mid-epoch
                self._resume_at(self.replanner.plan, epoch, batch)
            failure = None
            try:
                item = self._fetch()
            except Exception as error:
                failure = self.replanner.failure(error) if self.replanner is not None else None
                if failure is None:
                    raise
            if failure is not None:  # out of the except block: the error's frames are released
                self._replan(failure, epoch, batch)
                self._start_stream_at(epoch, batch)
                continue
            if item is None:
                break
            batch += 1
            yield item
            if item.epoch_end and self.batch_sampler.across_epochs:
                stream.next_epoch = epoch + 1
                return
        # Not across epochs: the worker iterator was taken to its end, which lets torch shut
        # non-persistent workers down now rather than when the next epoch replaces them.
        stream.batches = stream.iterator = None

    def _fetch(self):
        """The next batch of the stream (None at its end), noticing dead workers and hangs."""
        stream = self._stream
        workers = _workers(stream.iterator)
        if workers:
            with fetching(workers):
                return next(stream.batches, None)
        if self.num_workers == 0 and self.plan.timeout_s > 0:
            with watchdog(self.plan.timeout_s):
                return next(stream.batches, None)
        return next(stream.batches, None)


def _workers(iterator) -> list:
    return list(getattr(iterator, "_workers", None) or [])


class _Stream:
    """The running batch stream (torch's iterator and the joined batches) and the epoch it
    delivers next. Apart from the loader, so the stream does not reference it: a loader in a
    reference cycle is freed by the garbage collector, which closes the workers' queues before
    the workers are told to stop (each then takes torch's 5 s shutdown timeout)."""

    def __init__(self):
        self.iterator = None
        self.batches = None
        self.next_epoch: int | None = None


def _joined(parts_iter, pin_memory: bool):
    joiner = PartJoiner(pin_memory)
    for part in parts_iter:
        batch = joiner.add(part)
        # A part held by this frame while the batch is out would keep its shm for the whole
        # step (and a validation): 9.4 MiB of Docker's 64 MB at batch 64, 640 px.
        del part
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
