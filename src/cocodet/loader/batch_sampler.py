"""Which keys form each batch of an epoch, and how a batch is cut into parts (design §4, §5)."""

from __future__ import annotations

import torch.utils.data

from cocodet.sample import BatchKeys


class EpochBatchSampler(torch.utils.data.Sampler):
    """Batches of ``batch_size`` keys (an epoch's last may be short), each yielded as parts of at
    most ``part_size`` keys; the last batch of an epoch is marked. Which keys form a batch never
    depends on the part size. ``across_epochs``: after the epoch asked for (the sampler's
    ``epoch``), the batches of the following epochs, without end. ``start_at(epoch, n)``: the
    next pass begins that epoch at its batch n (a resume, a re-plan). ``end_at(epoch, n)``: the
    stream ends before batch n of that epoch (the run's last batch), so workers streaming on
    read nothing the run will not take (on a bucket: GETs for an epoch that never runs)."""

    def __init__(self, sampler: torch.utils.data.Sampler, batch_size: int, part_size: int, across_epochs: bool = False):
        self.sampler, self.batch_size, self.part_size = sampler, batch_size, part_size
        self.across_epochs = across_epochs
        self._start: tuple[int, int] | None = None
        self._end: tuple[int, int] | None = None

    def end_at(self, epoch: int, batches: int) -> None:
        self._end = (epoch, batches)

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
                if self._end is not None and (epoch, start // self.batch_size) >= self._end:
                    return
                yield from self._split(keys[start : start + self.batch_size], start + self.batch_size >= len(keys))
            if not self.across_epochs:
                return
            epoch, skip = epoch + 1, 0

    def _split(self, batch: list, epoch_end: bool):
        n = -(-len(batch) // self.part_size)
        for k in range(n):
            part = (k, n) if n > 1 else ()
            yield BatchKeys(batch[k * self.part_size : (k + 1) * self.part_size], part, epoch_end and k == n - 1)
