"""The loader plan: how many workers, and why (design §3).

``plan_loader`` is a pure function of its records, so every branch is testable without a
machine that has the condition. Sources:
    auto       min(usable CPUs, batch size), then the shm and memory caps.
    explicit   the user's own count for this run, honoured; warnings give the numbers.
    inherited  a count from outside this run (scheduler variable, preset): a ceiling under the
               CPU, shm and memory caps.
The records are ``plan_record.py``, the arithmetic ``budget.py``, the words ``plan_reasons.py``;
here are the steps, in the order they apply.
"""

from __future__ import annotations

from cocodet import schema
from cocodet.loader import plan_reasons as words
from cocodet.loader.budget import (DEFAULT_WORKER_FOOTPRINT, TENSORS_PER_BATCH, Budget, LoaderDraft, WorkerCap,
                                   explicit_part_images, host_budget, inflight_fds, loader_draft, memory_limit,
                                   parts_that_fit, shm_size_for, worker_memory)
from cocodet.loader.plan_record import BatchGeometry, LoaderPlan, LoaderRequest
from cocodet.loader.resources import HostResources
from cocodet.loader.window_plan import slot_bytes, window_slots
from cocodet.units import MiB


def plan_loader(request: LoaderRequest, batches: BatchGeometry, resources: HostResources, cuda: bool) -> LoaderPlan:
    """Decide the worker counts and DataLoader settings of the train and val loaders, recording
    every cap and warning. ``cuda``: batches go to a CUDA device (``pin_memory="auto"`` pins
    only then).

    The train workers stream on into the next epoch while validation runs, so both loaders
    share one shm budget (``plan.shm_split``; ``plan.val`` is the val plan); the memory cap
    budgets each worker's queue at the larger batch, and both worker sets.
    """
    _check_request(request)
    policy, requested = request.policy, request.requested
    val_bytes, val_size = batches.val_batch_bytes or batches.batch_bytes, batches.val_batch_size or batches.batch_size
    budget = host_budget(resources, request.worker_footprint_bytes or DEFAULT_WORKER_FOOTPRINT + batches.worker_working_bytes,
                         max(batches.batch_bytes, batches.val_batch_bytes or 0), request.persistent_workers)
    part_images = request.part_images if request.part_images is None or request.part_images < batches.batch_size else None
    train = loader_draft(batches.batch_bytes, batches.batch_size, request.prefetch_factor, part_images)
    val = loader_draft(val_bytes, val_size, request.prefetch_factor,
                part_images if part_images is not None and part_images < val_size else None)
    if policy == "explicit":
        train.workers = val.workers = requested
    else:
        train.workers = min(resources.usable_cpus, batches.batch_size) if policy == "auto" else requested
        if policy == "inherited":
            _cap_cpu(train, resources)
        _share_shm(train, val, budget, resources, batches.partner_pool)
        _cap_memory(train, budget, resources)
        val.workers = min(val.workers, max(1, train.workers))
    _warn(train, val, policy, budget, resources)
    plan = _final_plan(train, request, batches.batch_size, batches.batch_bytes, resources, budget, cuda)
    plan.val = _final_plan(val, request, val_size, val_bytes, resources, budget, cuda)
    plan.image_side, plan.val.image_side = batches.image_side, batches.val_image_side or batches.image_side
    plan.group_aspect_ratio = batches.group_aspect_ratio
    if batches.group_note:
        plan.warnings.append(batches.group_note)
    if budget.shm is not None:
        plan.shm_split = {"budget": budget.shm, "train": train.shm_bytes(), "val": val.shm_bytes()}
    if batches.partner_window and batches.image_side:
        plan.window_slots, plan.window_note = window_slots(batches.partner_window, batches.image_side,
                                                           batches.batch_size, train, budget)
        plan.window_bytes = plan.window_slots * slot_bytes(batches.image_side)
    return plan


def _check_request(request: LoaderRequest) -> None:
    schema.check("loader.policy", request.policy)
    schema.check("loader.prefetch_factor", request.prefetch_factor)
    if request.policy != "auto" and (request.requested is None or request.requested < 0):
        raise ValueError(f"loader policy {request.policy!r} needs a worker count >= 0, got {request.requested!r}")


def _share_shm(train: LoaderDraft, val: LoaderDraft, b: Budget, res: HostResources, partner_pool: int) -> None:
    """One shm budget for both loaders: validation is reserved the least that keeps one val
    worker (within a quarter of the budget: validation is the shorter stage, and training's
    parts then stay large enough for whole partner pools), training is capped in the rest, and
    validation then takes what training left, up to training's worker count."""
    if b.shm is None:
        _cap_shm(train, None, "", res, 0)
        val.workers, val.prefetch = max(1, train.workers), train.prefetch
        return
    probe = loader_draft(val.batch_bytes, max(1, round(val.batch_bytes / val.per_image)), 1, val.part_images)
    probe.workers = 1
    _cap_shm(probe, b.shm // 4, "", res, 0)
    reserve = probe.shm_bytes()
    whole = f"{b.shm / MiB:.1f} MiB budget ({{budget}})"
    _cap_shm(train, b.shm - reserve, f"{whole} - {reserve / MiB:.1f} MiB kept for one val worker", res, partner_pool)
    val.workers = max(1, train.workers)
    left = b.shm - train.shm_bytes()
    _cap_shm(val, left, f"{whole} - {train.shm_bytes() / MiB:.1f} MiB of the train loader", res, 0)


def _cap_cpu(d: LoaderDraft, res: HostResources) -> None:
    """An inherited count is a ceiling: no more workers than this rank's usable CPUs."""
    d.caps.append(WorkerCap("cpu", res.usable_cpus, d.workers > res.usable_cpus, words.cpu_reason(res)))
    d.workers = min(d.workers, res.usable_cpus)


def _cap_shm(d: LoaderDraft, share: int | None, share_text: str, res: HostResources, partner_pool: int) -> None:
    """In-flight transfers, and the one the main process holds, fit ``share`` of the rank's shm
    budget; when not one worker's queue does, lower prefetch, then ship batches in parts, then
    load in the main process."""
    limit = d.shm_limit(share, d.prefetch)
    if limit is None:
        d.caps.append(WorkerCap("shm", None, False, words.no_shm_reason(res)))
        return
    applied = d.workers > max(1, limit)
    reason = words.shm_reason(d, share, share_text, res)
    if d.workers > 0 and limit == 0:
        limit, more = _shrink_to_fit_shm(d, share, partner_pool)
        applied, reason = True, reason + more
    d.caps.append(WorkerCap("shm", max(limit, 0), applied, reason))
    d.workers = min(d.workers, max(1, limit)) if limit >= 1 else 0


def _shrink_to_fit_shm(d: LoaderDraft, share: int, partner_pool: int) -> tuple[int, str]:
    """Not even one worker's queue fits: shrink the queue before giving up on workers. Returns
    the shm limit on workers and the reason's addition."""
    if d.shm_limit(share, 1) >= 1:
        d.prefetch = 1
        return 1, words.PREFETCH_ONE
    parts = parts_that_fit(d, share, partner_pool)
    if parts is None:
        return 0, words.in_process(d.batch_bytes, shm_size_for(d.batch_bytes))
    d.workers, d.part_images = parts
    d.ship_bytes, d.prefetch = int(d.per_image * d.part_images), 1
    return d.workers, words.in_parts(d, shm_size_for(d.batch_bytes))


def _cap_memory(d: LoaderDraft, b: Budget, res: HostResources) -> None:
    """Workers (both sets when persistent) with their queues fit the rank's memory."""
    m = memory_limit(d, b)
    applied = d.workers > max(1, m)
    d.caps.append(WorkerCap("memory", m, applied, words.memory_reason(b, res)))
    if applied:
        d.workers = max(1, m)


def _warn(train: LoaderDraft, val: LoaderDraft, policy: str, b: Budget, res: HostResources) -> None:
    """Warnings with the numbers: an explicit count over a budget, fds and maps near their limits."""
    fds = inflight_fds(train, val)
    if policy == "explicit":  # honoured, by both loaders: say what it exceeds
        if train.workers > res.usable_cpus:
            train.warnings.append(words.over_cpus(train.workers, res))
        if b.shm is not None and train.workers > 0 and train.shm_bytes() + val.shm_bytes() > b.shm:
            train.warnings.append(words.over_shm(train, val, b, res, explicit_part_images(b, train)))
        if train.workers > 0 and worker_memory(train.workers, train.prefetch, b) > b.mem_room:
            train.warnings.append(words.over_memory(train, b, res))
    if train.workers > 0 and fds + 64 > res.nofile_soft:
        train.warnings.append(words.near_nofile(fds, res))
    # Every in-flight storage is also one memory map; the process's other maps (libraries,
    # allocator arenas) take thousands more, so warn at half of vm.max_map_count.
    if train.workers > 0 and res.max_map_count and fds > res.max_map_count // 2:
        train.warnings.append(words.near_max_map_count(fds, res))


def _final_plan(d: LoaderDraft, request: LoaderRequest, batch_size: int, batch_bytes: int, res: HostResources,
                b: Budget, cuda: bool) -> LoaderPlan:
    """The LoaderPlan of a finished draft; nothing PyTorch rejects at num_workers=0."""
    with_workers = d.workers > 0
    inflight = d.workers * d.prefetch
    pin = request.pin_memory
    return LoaderPlan(
        num_workers=d.workers, source=request.policy, requested=request.requested, batch_size=batch_size,
        batch_bytes=batch_bytes, part_images=d.part_images if with_workers else None,
        prefetch_factor=d.prefetch if with_workers else None,
        pin_memory=bool(cuda) if pin == "auto" else bool(pin),
        persistent_workers=bool(request.persistent_workers and with_workers),
        shm_free_bytes=res.shm_free_bytes, shm_budget_bytes=b.shm,
        inflight_bytes=inflight * d.ship_bytes if with_workers else 0, fds_per_batch=TENSORS_PER_BATCH,
        inflight_fds=inflight * TENSORS_PER_BATCH if with_workers else 0, nofile_soft=res.nofile_soft,
        max_map_count=res.max_map_count, usable_cpus=res.usable_cpus,
        memory_available_bytes=res.memory_available_bytes, worker_footprint_bytes=b.footprint,
        footprint_source="given" if request.worker_footprint_bytes else "estimated", timeout_s=float(request.timeout_s),
        local_ranks=b.ranks, host_cpus=min(res.affinity_cpus, int(res.cgroup_cpus or res.affinity_cpus)),
        caps=d.caps, warnings=d.warnings,
    )
