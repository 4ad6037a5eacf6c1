"""The loader plan's words (design §3): each cap's reason, the warnings and the window cache's
note, written once the numbers are final (``explain``); the numbers come from ``budget.py``.
The log table is ``table.py``."""

from __future__ import annotations

from dataclasses import replace

from cocodet.loader.plan.budget import MAIN_PROCESS_HEADROOM
from cocodet.loader.plan.records import Budget, LoaderDraft, LoaderPlan, ShmCheck, Window
from cocodet.loader.plan.resources import HostResources
from cocodet.loader.plan.shm_rule import rank_shm_share_words
from cocodet.units import MiB


def explain(
    plan: LoaderPlan,
    train: LoaderDraft,
    val: LoaderDraft,
    b: Budget,
    res: HostResources,
    window: Window | None,
    batches,
) -> None:
    """The words of a decided plan: each cap's reason (train's and val's), the train loader's
    alarms as warnings, and the window cache's note. ``batches``: the plan's ``BatchGeometry``."""
    for p, d in ((plan, train), (plan.val, val)):
        p.caps = [replace(c, reason=_cap_reason(c.name, d, b, res)) for c in d.caps]
    plan.warnings = [_alarm(what, figure, train, val, b, res) for what, figure in train.alarms]
    if window is not None:
        plan.window_note = window_note(batches.partner_window, window, batches.batch_size, train)


def _cap_reason(name: str, d: LoaderDraft, b: Budget, res: HostResources) -> str:
    if name == "cpu":
        return cpu_reason(res)
    if name == "memory":
        return memory_reason(b, res)
    if d.shm_check is None:
        return no_shm_reason(res)
    return shm_reason(d.shm_check, res) + _gave_up(d, d.shm_check.gave_up)


def _gave_up(d: LoaderDraft, what: str) -> str:
    """What the shm cap gave up when not one worker's queue fitted (``d`` as it ended)."""
    if what == "prefetch":
        return PREFETCH_ONE
    if what == "parts":
        return in_parts(d, shm_size_for(d.batch_bytes))
    return in_process(d.batch_bytes, shm_size_for(d.batch_bytes)) if what == "main process" else ""


def _alarm(what: str, figure: int, train: LoaderDraft, val: LoaderDraft, b: Budget, res: HostResources) -> str:
    if what == "over_cpus":
        return over_cpus(figure, res)
    if what == "over_shm":
        return over_shm(train, val, b, res, figure)
    if what == "over_memory":
        return over_memory(train, b, res)
    return near_nofile(figure, res) if what == "near_nofile" else near_max_map_count(figure, res)


def shm_size_for(batch_bytes: int) -> int:
    """The container's --shm-size, in MiB, that ships this batch whole (4 batches' worth)."""
    return -(-4 * batch_bytes // MiB)


def cpu_reason(res: HostResources) -> str:
    return (
        f"{res.usable_cpus} usable CPUs for this rank (affinity {res.affinity_cpus}, "
        f"quota {res.cgroup_cpus}, {res.local_world_size} local ranks)"
    )


def no_shm_reason(res: HostResources) -> str:
    return f"no shm filesystem at {res.shm_path}: not capped"


def shm_reason(c: ShmCheck, res: HostResources) -> str:
    budget = rank_shm_share_words(res.shm_free_bytes, res.local_world_size)
    return (
        f"(workers x prefetch {c.prefetch} + 1 held by the main process) x {c.ship_bytes / MiB:.1f} MiB <= "
        f"{c.share / MiB:.1f} MiB" + (f" = {c.share_text.format(budget=budget)}" if c.share_text else f" ({budget})")
    )


PREFETCH_ONE = "; one worker at prefetch 1 fits, so prefetch lowered to 1"


def in_parts(d: LoaderDraft, shm_size: int) -> str:
    return (
        f"; one batch ({d.batch_bytes / MiB:.1f} MiB) exceeds it, so workers ship it in "
        f"parts of {d.part_images} images ({d.ship_bytes / MiB:.1f} MiB) at prefetch 1, joined "
        f"before the step; --shm-size >= {shm_size}m ships whole batches"
    )


def in_process(batch_bytes: int, shm_size: int) -> str:
    return (
        f"; one batch ({batch_bytes / MiB:.1f} MiB) exceeds it, so batches are loaded in the main "
        f"process (no shm); give the container --shm-size >= {shm_size}m or lower the batch size to use "
        "workers"
    )


def memory_reason(b: Budget, res: HostResources) -> str:
    return (
        f"{'2 (train + val, persistent) x ' if b.worker_sets == 2 else ''}workers x "
        f"({b.footprint / MiB:.0f} MiB footprint + prefetch x {b.largest_batch / MiB:.1f} MiB, the "
        f"larger of the train and val batches) <= "
        f"{res.memory_available_bytes / MiB:.0f} MiB available ({res.memory_source}) "
        f"{f'/ {b.ranks} local ranks ' if b.ranks > 1 else ''}"
        f"- {MAIN_PROCESS_HEADROOM / MiB:.0f} MiB main-process headroom"
    )


def over_cpus(workers: int, res: HostResources) -> str:
    return (
        f"{workers} workers on {res.usable_cpus} usable CPUs: workers will contend for cores and "
        "each step may get slower"
    )


def over_shm(d: LoaderDraft, val: LoaderDraft, b: Budget, res: HostResources, part_images: int) -> str:
    needed = d.shm_bytes() + val.shm_bytes()
    return (
        f"the train and val loaders need {d.shm_bytes() / MiB:.1f} + {val.shm_bytes() / MiB:.1f} = "
        f"{needed / MiB:.1f} MiB of shm ({d.workers} workers x prefetch {d.prefetch}, plus the batch the "
        f"main process holds, each) but the budget is {b.shm / MiB:.1f} MiB "
        f"({res.shm_free_bytes / MiB:.1f} MiB free at {res.shm_path}); expect 'Bus error' or "
        f"'No space left on device'. Fix: loader=auto, a lower loader.prefetch_factor, "
        f"loader.part_images={part_images}, or --shm-size"
    )


def over_memory(d: LoaderDraft, b: Budget, res: HostResources) -> str:
    return (
        f"{b.worker_sets * d.workers} workers (train and val) x "
        f"~{(b.footprint + d.prefetch * b.largest_batch) / MiB:.0f} MiB may exceed the "
        f"{res.memory_available_bytes / MiB:.0f} MiB available; the OOM killer would end workers "
        "with SIGKILL"
    )


def near_nofile(fds: int, res: HostResources) -> str:
    return f"{fds} fds in flight near RLIMIT_NOFILE {res.nofile_soft}: raise `ulimit -n`"


def near_max_map_count(fds: int, res: HostResources) -> str:
    return (
        f"{fds} memory maps in flight against vm.max_map_count {res.max_map_count}: "
        "expect 'unable to mmap N bytes'; lower loader.prefetch_factor or workers (the sysctl is "
        "the host's to raise)"
    )


def window_note(window: int, w: Window, batch_size: int, train: LoaderDraft) -> str:
    """How the window cache's slots were counted (``budget.window_cache``)."""
    why = (
        f"partner_window {window} + {w.in_flight} positions in flight ((workers {max(1, train.workers)} x prefetch "
        f"{train.prefetch} + 1) x batch {batch_size}) = {w.want} slots of {w.slot_bytes / MiB:.2f} MiB"
    )
    if w.slots < w.want:
        why += (
            f"; {w.fit} fit the {max(0, w.room) / MiB:.0f} MiB of memory the workers leave: fewer partners are "
            "read, more decoded"
        )
    return why
