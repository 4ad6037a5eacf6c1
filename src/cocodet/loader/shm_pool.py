"""Batch image buffers a worker writes again once the main process has let go of them.

A fresh shared-memory segment costs a page fault and a zeroed page per 4 KiB the first time it
is written: for a batch of 32 at 640 px (39 MiB) that was about 0.6 ms per image, 30x the copy
of its pixels. So each worker keeps up to ``capacity`` image buffers (its prefetched batches and the one
the main process holds, where the shm budget has room for every worker to keep that many:
``LoaderPlan.reused_buffers``) and writes a buffer again once the main process no longer maps it.

How a buffer is known to be free. Each worker owns a ``board``: one shared uint8 per buffer,
Each worker owns a ``board`` of shared bytes; a shipped batch holds one entry of it,
1 while the batch may still be read. The worker sets it before shipping the batch, which carries
a :class:`Lease` (the board, the entry, and the images tensor itself). When the main process
unpickles the lease, it keeps a weak reference to the images' storage; once that has expired
(the batch, its parts' joined copy or its pinned copy taken and every view of its images
dropped), it sets the entry back to 0. Nothing waits on anything: a worker that finds
no free buffer allocates a fresh one, as before, and a lease never seen (a worker killed, a
stream shut down) only keeps its buffer out of use.
"""

from __future__ import annotations

import threading

import numpy as np
import torch
from torch.multiprocessing.reductions import StorageWeakRef

_FREE, _IN_USE = 0, 1


class Lease:
    """A batch's claim on its worker's buffer: ``board[slot]`` (the batch's board entry) stays 1
    until the main process holds no view of ``images`` any more."""

    def __init__(self, board: torch.Tensor, slot: int, images: torch.Tensor | None):
        self.board, self.slot, self.images = board, slot, images

    def __reduce__(self):
        return _received, (self.board, self.slot, self.images)


# The main process's leases still in use: (the images' storage, the board as numpy, the entry). The
# board is written through numpy: a batch received inside validation's inference mode rebuilds
# it as an inference tensor, which torch refuses to update in place once training resumes.
_held: list[tuple[StorageWeakRef, np.ndarray, int]] = []
_held_lock = threading.Lock()  # leases arrive on the pin-memory thread and the main thread


def _received(board: torch.Tensor, slot: int, images: torch.Tensor) -> Lease:
    """Unpickled in the main process: hand back the slots whose batches are gone, then hold
    this one by a weak reference only (a strong one would keep the batch's shm alive)."""
    release_expired()
    with _held_lock:
        _held.append((StorageWeakRef(images.untyped_storage()), board.numpy(), slot))
    return Lease(board, slot, None)


def release_expired() -> int:
    """Set the board slot of every lease whose images' storage has expired back to free; the
    count of those still held."""
    with _held_lock:
        keep = []
        for ref, board, slot in _held:
            if ref.expired():
                board[slot] = _FREE
            else:
                keep.append((ref, board, slot))
        _held[:] = keep
        return len(keep)


class BufferPool:
    """One worker's reusable batch image buffers (uint8 storages in shared memory).

    Each batch shipped from a pooled buffer holds one board entry of its own (a ring of
    ``BOARD_ENTRIES``), so an entry has one owner at a time: the worker while it reads 0, the
    main process's lease while it reads 1. A buffer whose batch is held for long is dropped from
    the pool (the main process's mapping keeps it alive) to make room for a fresh one.
    """

    BOARD_ENTRIES = 64

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.board: torch.Tensor | None = None
        self.pooled: list[tuple[torch.Tensor, int]] = []  # (buffer, its last batch's board entry), oldest first
        self._next_entry = 0

    def take(self, shape: tuple[int, ...], alloc) -> tuple[torch.Tensor, Lease | None]:
        """A uint8 tensor of ``shape`` and its lease: a free pooled buffer of a fitting size
        (at least ``numel`` bytes, at most twice that), else ``alloc(shape)``, pooled in place
        of the oldest buffer when the pool is full. A reused buffer holds its last batch's pixels."""
        numel = 1
        for d in shape:
            numel *= d
        if self.capacity <= 0 or numel == 0:
            return alloc(shape), None
        if self.board is None:
            self.board = alloc((self.BOARD_ENTRIES,))
        entry = self._free_entry()
        if entry is None:  # the main process holds a lease on every entry: nothing is pooled
            return alloc(shape), None
        reusable = [
            k
            for k, (buffer, last) in enumerate(self.pooled)
            if self.board[last] == _FREE and numel <= buffer.numel() <= 2 * numel
        ]
        if reusable:
            buffer, _ = self.pooled.pop(reusable[0])
            images = buffer.view(-1)[:numel].view(shape)
        else:
            buffer = images = alloc(shape)
            if len(self.pooled) >= self.capacity:
                free = [k for k, (_, last) in enumerate(self.pooled) if self.board[last] == _FREE]
                self.pooled.pop(free[0] if free else 0)  # a free buffer of another size, else the longest held
        self.pooled.append((buffer, entry))
        self.board[entry] = _IN_USE
        return images, Lease(self.board, entry, images)

    def _free_entry(self) -> int | None:
        for step in range(self.BOARD_ENTRIES):
            entry = (self._next_entry + step) % self.BOARD_ENTRIES
            if self.board[entry] == _FREE:
                self._next_entry = (entry + 1) % self.BOARD_ENTRIES
                return entry
        return None
