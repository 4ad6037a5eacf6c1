"""The loader plan: how many workers, and why (design §3).

``plan_loader`` is a pure function of its records, so every branch is testable without a
machine that has the condition. Sources:
    auto       min(usable CPUs, batch size), then the shm and memory caps.
    explicit   the user's own count for this run, honoured; warnings give the numbers.
    inherited  a count from outside this run (scheduler variable, preset): a ceiling under the
               CPU, shm and memory caps.
Decide, then explain: the records are ``records.py``; the numbers, caps and alarms
``budget.py`` (``decide_workers``); the words ``reasons.py`` (``explain``), once the
numbers are final; here the steps in their order, and the finished plan.
"""

from __future__ import annotations

from cocodet.loader.plan.budget import (
    DEFAULT_WORKER_FOOTPRINT,
    decide_workers,
    finished_plan,
    host_budget,
    loader_draft,
    window_cache,
)
from cocodet.loader.plan.reasons import explain
from cocodet.loader.plan.records import BatchGeometry, LoaderPlan, LoaderRequest
from cocodet.loader.plan.resources import HostResources


def plan_loader(request: LoaderRequest, batches: BatchGeometry, resources: HostResources, cuda: bool) -> LoaderPlan:
    """Decide the worker counts and DataLoader settings of the train and val loaders, then
    explain them: every cap and warning with its numbers. ``cuda``: batches go to a CUDA device
    (``pin_memory="auto"`` pins only then). The request checked itself when it was made
    (``LoaderRequest``).

    The train workers stream on into the next epoch while validation runs, so both loaders
    share one shm budget (``plan.shm_split``; ``plan.val`` is the val plan); the memory cap
    budgets each worker's queue at the larger batch, and both worker sets.
    """
    val_bytes, val_size = batches.val_batch_bytes or batches.batch_bytes, batches.val_batch_size or batches.batch_size
    budget = host_budget(
        resources,
        request.worker_footprint_bytes or DEFAULT_WORKER_FOOTPRINT + batches.worker_working_bytes,
        max(batches.batch_bytes, batches.val_batch_bytes or 0),
        request.persistent_workers,
    )
    part_images = (
        request.part_images if request.part_images is None or request.part_images < batches.batch_size else None
    )
    train = loader_draft(batches.batch_bytes, batches.batch_size, request.prefetch_factor, part_images)
    val = loader_draft(
        val_bytes,
        val_size,
        request.prefetch_factor,
        part_images if part_images is not None and part_images < val_size else None,
    )
    decide_workers(
        request.policy, request.requested, train, val, budget, resources, batches.batch_size, batches.partner_pool
    )
    plan = finished_plan(train, request, batches.batch_size, batches.batch_bytes, resources, budget, cuda)
    plan.val = finished_plan(val, request, val_size, val_bytes, resources, budget, cuda)
    window = (
        window_cache(batches.partner_window, batches.image_side, batches.batch_size, train, budget)
        if batches.partner_window and batches.image_side
        else None
    )
    explain(plan, train, val, budget, resources, window, batches)
    plan.image_side, plan.val.image_side = batches.image_side, batches.val_image_side or batches.image_side
    plan.group_aspect_ratio = batches.group_aspect_ratio
    if batches.group_note:
        plan.warnings.append(batches.group_note)
    if budget.shm is not None:
        plan.shm_split = {"budget": budget.shm, "train": train.shm_bytes(), "val": val.shm_bytes()}
    if window is not None:
        plan.window_slots, plan.window_bytes = window.slots, window.slots * window.slot_bytes
    return plan
