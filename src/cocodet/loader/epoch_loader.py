"""The DataLoader every stage loads through: one epoch of whole batches per ``iter()``, parts
joined, workers streaming across epochs, re-planned when they die of a resource (design §4,
§7.2); and its resumable form for training (design §5)."""

from __future__ import annotations

import torch.utils.data

from cocodet.loader.failures.hang import watchdog
from cocodet.loader.failures.replan import Replanner
from cocodet.loader.failures.worker_deaths import fetching
from cocodet.loader.failures.worker_shutdown import shut_down_workers
from cocodet.loader.part_joiner import PartJoiner
from cocodet.loader.plan.records import LoaderPlan
from cocodet.loader.stream_position import StreamPosition


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

    def __init__(
        self,
        *args,
        plan: LoaderPlan,
        replanner: Replanner | None = None,
        stage: str = "",
        across_epochs: bool = False,
        **kwargs,
    ):
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
        if hasattr(self.collate_fn, "capacity"):
            self.collate_fn.capacity = run_plan.reused_buffers(self.stage)
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
            _, failure = self._healable(self._start_stream)
            if failure is None:
                return
            self._replan(failure, epoch, batch)

    def _healable(self, step):
        """(``step()``, None), or (None, the failure) when it failed in a way a re-plan heals
        (workers dead of a resource); any other error propagates. The failure is returned out
        of the except block, so the error's frames (and the batches they hold) are released
        before the re-plan."""
        try:
            return step(), None
        except Exception as error:
            failure = self.replanner.failure(error) if self.replanner is not None else None
            if failure is None:
                raise
        return None, failure

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
            shut_down_workers(iterator)  # never waits on a lock a dead worker held
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
            item, failure = self._healable(self._fetch)
            if failure is not None:
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
