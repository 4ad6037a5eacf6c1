"""The loader plan's arithmetic (design §3): what the host allows one rank's loaders, what a
worker costs, and how many workers fit (``decide_workers``, the caps in the order they apply).
Numbers in, numbers out: each cap and alarm keeps the figures its words need, and
``reasons.explain`` writes those words once the numbers are final."""

from __future__ import annotations

from cocodet.loader.plan.records import Budget, LoaderDraft, LoaderPlan, LoaderRequest, ShmCheck, Window, WorkerCap
from cocodet.loader.plan.resources import HostResources
from cocodet.loader.plan.shm_rule import rank_shm_share
from cocodet.loader.plan.window_slots import window_slots
from cocodet.units import MiB

# Unique memory of one worker process (torch + cv2 + albumentations imported, dataset index
# shared copy-on-write), estimated from the USS of workers on this stack (~250-300 MiB) plus
# the decode/augment working set. `mode=bench` prints the measured value next to it.
DEFAULT_WORKER_FOOTPRINT = 400 * MiB
MAIN_PROCESS_HEADROOM = 2048 * MiB
TENSORS_PER_BATCH = 8  # FlatBatch: each storage is one fd and one mmap while in flight


def shm_budget(res: HostResources) -> int | None:
    """Bytes of /dev/shm this rank's loaders may hold (``shm_rule.py``; None: no shm filesystem, not capped)."""
    if res.shm_free_bytes is None:
        return None
    return rank_shm_share(res.shm_free_bytes, res.local_world_size)


def host_budget(res: HostResources, footprint: int, largest_batch: int, persistent_workers: bool) -> Budget:
    """The rank's budget; each local rank plans alone, so each gets its share of the memory."""
    ranks = max(1, res.local_world_size)
    return Budget(
        shm=shm_budget(res),
        mem_room=res.memory_available_bytes // ranks - MAIN_PROCESS_HEADROOM,
        footprint=footprint,
        largest_batch=largest_batch,
        worker_sets=2 if persistent_workers else 1,
        ranks=ranks,
    )


def loader_draft(batch_bytes: int, batch_size: int, prefetch: int, part_images: int | None) -> LoaderDraft:
    """A loader's draft before any cap: no workers yet, whole batches unless parts are asked."""
    per_image = batch_bytes / batch_size
    return LoaderDraft(
        workers=0,
        prefetch=prefetch,
        part_images=part_images,
        per_image=per_image,
        batch_bytes=batch_bytes,
        ship_bytes=batch_bytes if part_images is None else int(per_image * part_images),
    )


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


def decide_workers(
    policy: str,
    requested: int | None,
    train: LoaderDraft,
    val: LoaderDraft,
    b: Budget,
    res: HostResources,
    batch_size: int,
    partner_pool: int,
) -> None:
    """Both loaders' worker counts and queues, in place: an explicit count is honoured (its
    excesses become alarms); auto and inherited counts go through the CPU, shm and
    memory caps; validation never has more workers than training."""
    if policy == "explicit":
        train.workers = val.workers = requested
    else:
        # auto starts at one worker per image of a batch; an inherited count is a ceiling. Either
        # way this rank's CPUs cap it, recorded so the plan says why it has that many workers.
        train.workers = batch_size if policy == "auto" else requested
        train.caps.append(cpu_cap(train.workers, res))
        train.workers = min(train.workers, res.usable_cpus)
        _share_shm(train, val, b, partner_pool)
        _cap_memory(train, b)
        val.workers = min(val.workers, max(1, train.workers))
    _raise_alarms(train, val, policy, b, res)


def cpu_cap(workers: int, res: HostResources) -> WorkerCap:
    """The CPU rule: at most one worker per CPU this rank may use (``usable_cpus``)."""
    return WorkerCap("cpu", res.usable_cpus, workers > res.usable_cpus)


def _share_shm(train: LoaderDraft, val: LoaderDraft, b: Budget, partner_pool: int) -> None:
    """One shm budget for both loaders: validation is reserved the least that keeps one val
    worker (within a quarter of the budget: validation is the shorter stage, and training's
    parts then stay large enough for whole partner pools), training is capped in the rest, and
    validation then takes what training left, up to training's worker count."""
    if b.shm is None:
        _cap_shm(train, None, "", 0)
        val.workers, val.prefetch = max(1, train.workers), train.prefetch
        return
    probe = loader_draft(val.batch_bytes, max(1, round(val.batch_bytes / val.per_image)), 1, val.part_images)
    probe.workers = 1
    _cap_shm(probe, b.shm // 4, "", 0)
    reserve = probe.shm_bytes()
    whole = f"{b.shm / MiB:.1f} MiB budget ({{budget}})"
    _cap_shm(train, b.shm - reserve, f"{whole} - {reserve / MiB:.1f} MiB kept for one val worker", partner_pool)
    val.workers = max(1, train.workers)
    _cap_shm(val, b.shm - train.shm_bytes(), f"{whole} - {train.shm_bytes() / MiB:.1f} MiB of the train loader", 0)


def _cap_shm(d: LoaderDraft, share: int | None, share_text: str, partner_pool: int) -> None:
    """In-flight transfers, and the one the main process holds, fit ``share`` of the rank's shm
    budget; when not one worker's queue does, lower prefetch, then ship batches in parts, then
    load in the main process."""
    limit = d.shm_limit(share, d.prefetch)
    if limit is None:
        d.caps.append(WorkerCap("shm", None, False))
        return
    queue, gave_up = (d.prefetch, d.ship_bytes), ""  # as checked, before any shrinking
    applied = d.workers > max(1, limit)
    if d.workers > 0 and limit == 0:
        limit, gave_up = _shrink_to_fit_shm(d, share, partner_pool)
        applied = True
    d.shm_check = ShmCheck(share, share_text, *queue, gave_up)
    d.caps.append(WorkerCap("shm", max(limit, 0), applied))
    d.workers = min(d.workers, max(1, limit)) if limit >= 1 else 0


def _shrink_to_fit_shm(d: LoaderDraft, share: int, partner_pool: int) -> tuple[int, str]:
    """Not even one worker's queue fits: shrink the queue before giving up on workers. Returns
    the shm limit on workers and what was given up."""
    if d.shm_limit(share, 1) >= 1:
        d.prefetch = 1
        return 1, "prefetch"
    parts = parts_that_fit(d, share, partner_pool)
    if parts is None:
        return 0, "main process"
    d.workers, d.part_images = parts
    d.ship_bytes, d.prefetch = int(d.per_image * d.part_images), 1
    return d.workers, "parts"


def _cap_memory(d: LoaderDraft, b: Budget) -> None:
    """Workers (both sets when persistent) with their queues fit the rank's memory."""
    m = memory_limit(d, b)
    applied = d.workers > max(1, m)
    d.caps.append(WorkerCap("memory", m, applied))
    if applied:
        d.workers = max(1, m)


def _raise_alarms(train: LoaderDraft, val: LoaderDraft, policy: str, b: Budget, res: HostResources) -> None:
    """What the plan warns of, as (what, figure): an explicit count over a budget, fds and maps near their limits."""
    fds = inflight_fds(train, val)
    alarms = train.alarms
    if policy == "explicit":  # honoured, by both loaders: say what it exceeds
        if train.workers > res.usable_cpus:
            alarms.append(("over_cpus", train.workers))
        if b.shm is not None and train.workers > 0 and train.shm_bytes() + val.shm_bytes() > b.shm:
            alarms.append(("over_shm", explicit_part_images(b, train)))
        if train.workers > 0 and worker_memory(train.workers, train.prefetch, b) > b.mem_room:
            alarms.append(("over_memory", train.workers))
    if train.workers > 0 and fds + 64 > res.nofile_soft:
        alarms.append(("near_nofile", fds))
    # Every in-flight storage is also one memory map; the process's other maps (libraries,
    # allocator arenas) take thousands more, so warn at half of vm.max_map_count.
    if train.workers > 0 and res.max_map_count and fds > res.max_map_count // 2:
        alarms.append(("near_max_map_count", fds))


def window_cache(window: int, side: int, batch_size: int, train: LoaderDraft, b: Budget) -> Window:
    """The window cache's slots: the window plus every position the workers may hold in flight
    (each worker its prefetched batches, and the batch the main process holds), within the
    memory the workers leave this rank (``window_slots.window_slots``)."""
    in_flight = (max(1, train.workers) * train.prefetch + 1) * batch_size
    room = b.mem_room - worker_memory(train.workers, train.prefetch, b)
    return window_slots(window, in_flight, side, room)


def finished_plan(
    d: LoaderDraft, request: LoaderRequest, batch_size: int, batch_bytes: int, res: HostResources, b: Budget, cuda: bool
) -> LoaderPlan:
    """The LoaderPlan of a decided draft (its caps' and alarms' words come after, from
    ``reasons.explain``); nothing PyTorch rejects at num_workers=0."""
    with_workers = d.workers > 0
    inflight = d.workers * d.prefetch
    return LoaderPlan(
        num_workers=d.workers,
        source=request.policy,
        requested=request.requested,
        batch_size=batch_size,
        batch_bytes=batch_bytes,
        part_images=d.part_images if with_workers else None,
        prefetch_factor=d.prefetch if with_workers else None,
        pin_memory=bool(cuda) if request.pin_memory == "auto" else bool(request.pin_memory),
        persistent_workers=bool(request.persistent_workers and with_workers),
        shm_free_bytes=res.shm_free_bytes,
        shm_budget_bytes=b.shm,
        inflight_bytes=inflight * d.ship_bytes if with_workers else 0,
        fds_per_batch=TENSORS_PER_BATCH,
        inflight_fds=inflight * TENSORS_PER_BATCH if with_workers else 0,
        nofile_soft=res.nofile_soft,
        max_map_count=res.max_map_count,
        usable_cpus=res.usable_cpus,
        memory_available_bytes=res.memory_available_bytes,
        worker_footprint_bytes=b.footprint,
        footprint_source="given" if request.worker_footprint_bytes else "estimated",
        timeout_s=float(request.timeout_s),
        local_ranks=b.ranks,
        host_cpus=min(res.affinity_cpus, int(res.cgroup_cpus or res.affinity_cpus)),
        caps=list(d.caps),
    )
