"""The loader plan's arithmetic (design §3): what the host allows one rank's loaders, what a
worker costs, and how many workers fit. Numbers in, numbers out; the words that explain them
are ``plan_reasons.py``."""

from __future__ import annotations

from dataclasses import dataclass, field

from cocodet.loader.resources import HostResources
from cocodet.units import MiB

# Unique memory of one worker process (torch + cv2 + albumentations imported, dataset index
# shared copy-on-write), estimated from the USS of workers on this stack (~250-300 MiB) plus
# the decode/augment working set. `mode=bench` prints the measured value next to it.
DEFAULT_WORKER_FOOTPRINT = 400 * MiB
MAIN_PROCESS_HEADROOM = 2048 * MiB
TENSORS_PER_BATCH = 8  # FlatBatch: each storage is one fd and one mmap while in flight


@dataclass(frozen=True)
class WorkerCap:
    """One cap the plan evaluated: at most ``limit`` workers (None: not capped), whether it
    lowered the count, and the arithmetic behind it."""

    name: str
    limit: int | None
    applied: bool
    reason: str


def shm_budget(res: HostResources) -> int | None:
    """Bytes of /dev/shm this rank's loaders may hold: half the free bytes over the local ranks
    (None: no shm filesystem, not capped)."""
    if res.shm_free_bytes is None:
        return None
    return res.shm_free_bytes // 2 // max(1, res.local_world_size)


@dataclass(frozen=True)
class Budget:
    """What the host allows this rank's loaders, and what one worker costs."""
    shm: int | None  # bytes of /dev/shm (None: no shm filesystem, not capped)
    mem_room: int  # bytes of memory for workers after the main process's headroom
    footprint: int  # one worker's own memory
    largest_batch: int  # the larger of a train and a val batch, in a worker's queue
    worker_sets: int  # 2 with persistent workers: the train and the val workers live side by side
    ranks: int


def host_budget(res: HostResources, footprint: int, largest_batch: int, persistent_workers: bool) -> Budget:
    """The rank's budget; each local rank plans alone, so each gets its share of the memory."""
    ranks = max(1, res.local_world_size)
    return Budget(shm=shm_budget(res), mem_room=res.memory_available_bytes // ranks - MAIN_PROCESS_HEADROOM,
                  footprint=footprint, largest_batch=largest_batch, worker_sets=2 if persistent_workers else 1,
                  ranks=ranks)


@dataclass
class LoaderDraft:
    """One loader's plan as the steps of ``plan_loader`` shape it."""
    workers: int
    prefetch: int
    part_images: int | None
    ship_bytes: int  # bytes of one shm transfer: a batch, or a part of one
    per_image: float
    batch_bytes: int  # bytes of one whole batch
    caps: list[WorkerCap] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def shm_limit(self, share: int | None, prefetch: int) -> int | None:
        """Workers whose transfers, plus the one the main process holds, fit ``share``."""
        return None if share is None else max(0, share // self.ship_bytes - 1) // prefetch

    def shm_bytes(self) -> int:
        """What this loader holds in shm at most: its transfers in flight and the one in the main process."""
        return (self.workers * self.prefetch + 1) * self.ship_bytes if self.workers > 0 else 0


def loader_draft(batch_bytes: int, batch_size: int, prefetch: int, part_images: int | None) -> LoaderDraft:
    """A loader's draft before any cap: no workers yet, whole batches unless parts are asked."""
    per_image = batch_bytes / batch_size
    return LoaderDraft(workers=0, prefetch=prefetch, part_images=part_images, per_image=per_image, batch_bytes=batch_bytes,
                 ship_bytes=batch_bytes if part_images is None else int(per_image * part_images))


def parts_that_fit(d: LoaderDraft, share: int, partner_pool: int) -> tuple[int, int] | None:
    """(workers, images per part) when a batch does not fit ``share`` whole: one part per
    worker in flight and one being joined, parts of whole partner pools when two pools fit (a
    part that splits a pool decodes the partners it draws from the other part again), fewer
    workers if need be. None when not two images fit."""
    fit = int(share // d.per_image)  # whole images that fit the share at once
    if d.part_images is not None or fit < 2:
        return None
    if partner_pool > 1 and fit >= 2 * partner_pool:
        workers = min(d.workers, fit // partner_pool - 1)
        return workers, (fit // (workers + 1)) // partner_pool * partner_pool
    if partner_pool > 1:  # not two pools: one worker, the largest parts (the fewest pools split)
        return 1, fit // 2
    workers = min(d.workers, fit - 1)
    return workers, fit // (workers + 1)


def shm_size_for(batch_bytes: int) -> int:
    """The container's --shm-size, in MiB, that ships this batch whole (4 batches' worth)."""
    return -(-4 * batch_bytes // MiB)


def memory_limit(d: LoaderDraft, b: Budget) -> int:
    """Workers (both sets when persistent) whose footprint and queues fit the rank's memory."""
    return max(0, b.mem_room // (b.worker_sets * (b.footprint + d.prefetch * b.largest_batch)))


def worker_memory(workers: int, prefetch: int, b: Budget) -> int:
    """Bytes ``workers`` workers of each set take with their queues."""
    return b.worker_sets * workers * (b.footprint + prefetch * b.largest_batch)


def inflight_fds(train: LoaderDraft, val: LoaderDraft) -> int:
    """Storages (each one fd and one map) both loaders keep in flight."""
    return (train.workers * train.prefetch + val.workers * val.prefetch) * TENSORS_PER_BATCH


def explicit_part_images(b: Budget, d: LoaderDraft) -> int:
    """Images per part that would let an explicit count's queues fit half the shm budget."""
    return max(1, int(b.shm / 2 // ((d.workers + 1) * d.per_image)))
