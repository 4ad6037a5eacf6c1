"""Re-plan on resource death: a run whose workers die of shm, segments or memory continues
on a smaller plan from the exact batch that failed (``loader.on_failure=replan``).

One :class:`Replanner` is shared by a run's loaders (train and val): it holds the plan now
in force, so a loader built or re-entered after a re-plan takes the smaller plan too. The
ladder is fewer workers (halved), then prefetch 1, then in-process; each rung is planned
again against the host as probed after the failed workers are gone (free shm, memory), so a
rung can land lower than asked when the host has less than at start.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import replace
from typing import Callable

from cocodet import schema
from cocodet.loader.failures.classify import failure_kind
from cocodet.loader.failures.diagnose import LoaderFailure, explain
from cocodet.loader.plan.records import LoaderPlan

log = logging.getLogger(__name__)

# What a smaller plan can cure. Not: a hang (a read that never returns blocks at any worker
# count), a segfault (native code, see the diagnosis), a sample's own exception (raise mode).
RESOURCE_KINDS = ("shm", "segments", "memory")

# (workers, prefetch) -> a plan against the host probed now, with the run's other plan_loader arguments.
PlanFn = Callable[[int, int], LoaderPlan]


def default_on_failure(source: str) -> str:
    """An explicit count is honoured (design §3): raise unless the user asks for replan."""
    return "raise" if source == "explicit" else "replan"


def next_rung(plan: LoaderPlan) -> tuple[int, int] | None:
    """(workers, prefetch) one step below ``plan``; None when it already loads in-process."""
    if plan.num_workers == 0:
        return None
    prefetch = plan.prefetch_factor or 1
    if plan.num_workers > 1:
        return plan.num_workers // 2, prefetch
    if prefetch > 1:
        return 1, 1
    return 0, 1


def describe(plan: LoaderPlan) -> str:
    """One loader's plan in words; a run's plan also names its val loader's when that differs."""
    if plan.num_workers == 0:
        text = "in-process (0 workers)"
    else:
        shipped = f"parts of {plan.part_images}" if plan.part_images else "whole batches"
        workers = f"{plan.num_workers} worker{'s' if plan.num_workers > 1 else ''}"
        text = f"{workers}, prefetch {plan.prefetch_factor}, {shipped}"
    val = plan.val
    if val is not None and (val.num_workers, val.prefetch_factor, val.part_images) != (
        plan.num_workers,
        plan.prefetch_factor,
        plan.part_images,
    ):
        text += f" (val: {describe(val)})"
    return text


class Replanner:
    """The plan in force for a run's loaders, and what to do when their workers fail.

    Args:
        plan: the plan the run started with.
        plan_fn: builds a plan for (workers, prefetch) against the host probed now; None
            never re-plans.
        on_failure: "replan" or "raise"; None: the default for the plan's source.
        max_replans: re-plans allowed in one run.
        shm_path: the /dev/shm the diagnosis measures.
    """

    def __init__(
        self,
        plan: LoaderPlan,
        plan_fn: PlanFn | None = None,
        on_failure: str | None = None,
        max_replans: int = 3,
        shm_path: str = "/dev/shm",
    ):
        self.plan, self.plan_fn, self.max_replans, self.shm_path = plan, plan_fn, max_replans, shm_path
        self.on_failure = on_failure or (default_on_failure(plan.source) if plan is not None else "raise")
        schema.check("loader.on_failure", self.on_failure)
        self.records: list[dict] = []
        self.step_fn: Callable[[], int | None] = lambda: None  # the trainer's global step, when one runs
        # The run's loaders (weakly: a loader's life is the trainer's business). A re-plan shuts
        # them all down before the probe: the other loader's persistent workers hold prefetched
        # batches in /dev/shm (the val loader's since the sanity check, say), and a probe that
        # counts them as taken plans both loaders smaller than the host allows.
        self.loaders: weakref.WeakSet = weakref.WeakSet()

    def failure(self, error: BaseException) -> tuple[str, str] | None:
        """(resource, diagnosis) when ``error`` says workers died of a resource this run re-plans
        on; None otherwise (the error then propagates and is explained as before). Raises
        LoaderFailure when the re-plans allowed are used up. Call while handling ``error``:
        the diagnosis reads the failed workers from its traceback."""
        if self.on_failure != "replan" or self.plan_fn is None or next_rung(self.plan) is None:
            return None
        kind = failure_kind(error)
        if kind not in RESOURCE_KINDS:
            return None
        diagnosis = explain(error, self.plan, self.shm_path) or str(error)
        if len(self.records) >= self.max_replans:
            tried = "; ".join(f"{r['cause']}: {r['old_plan']} -> {r['new_plan']}" for r in self.records)
            raise LoaderFailure(
                f"{diagnosis}\nGave up after loader.max_replans={self.max_replans} re-plans ({tried})."
            ) from error
        return kind, diagnosis

    def replan(self, kind: str, diagnosis: str, stage: str, epoch: int, batch: int) -> LoaderPlan:
        """Record and log the failure, then return the smaller plan now in force. Call after
        the failed workers and what they delivered are released, so the probe counts the shm
        they held as free."""
        for loader in list(self.loaders):
            loader.release_workers()
        old = self.plan
        workers, prefetch = next_rung(old)
        new = replace(self.plan_fn(workers, prefetch), source="replan", requested=workers)
        record = {
            "step": self.step_fn(),
            "stage": stage,
            "epoch": epoch,
            "batch": batch,
            "cause": kind,
            "old_workers": old.num_workers,
            "new_workers": new.num_workers,
            "new_val_workers": new.for_stage("val").num_workers,
            "shm_split": new.shm_split,
            "old_plan": describe(old),
            "new_plan": describe(new),
            "diagnosis": diagnosis.splitlines()[1] if "\n" in diagnosis else diagnosis,
        }
        self.records.append(record)
        log.warning(
            "loader re-plan %d/%d at step %s (%s epoch %d, batch %d): workers died of %s.\n%s\n"
            "Old plan: %s. New plan: %s; continuing from that batch.\n%s",
            len(self.records),
            self.max_replans,
            record["step"],
            stage,
            epoch,
            batch,
            kind,
            diagnosis,
            record["old_plan"],
            record["new_plan"],
            new.table(),
        )
        self.plan = new
        return new
