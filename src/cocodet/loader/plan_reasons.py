"""The loader plan's words (design §3): each cap's reason, the warnings, the shm split and the
log table. Text only; the numbers come from ``budget.py`` and the plan."""

from __future__ import annotations

from cocodet.loader.budget import MAIN_PROCESS_HEADROOM, Budget, LoaderDraft
from cocodet.loader.resources import HostResources
from cocodet.units import MiB, mib


def cpu_reason(res: HostResources) -> str:
    return (f"{res.usable_cpus} usable CPUs for this rank (affinity {res.affinity_cpus}, "
            f"quota {res.cgroup_cpus}, {res.local_world_size} local ranks)")


def no_shm_reason(res: HostResources) -> str:
    return f"no shm filesystem at {res.shm_path}: not capped"


def shm_reason(d: LoaderDraft, share: int, share_text: str, res: HostResources) -> str:
    """``share_text``: how the share was cut from the budget ("" for the whole budget; it may
    name the budget as ``{budget}``)."""
    budget = f"half of {res.shm_free_bytes / MiB:.1f} MiB free shm / {res.local_world_size} ranks"
    return (f"(workers x prefetch {d.prefetch} + 1 held by the main process) x {d.ship_bytes / MiB:.1f} MiB <= "
            f"{share / MiB:.1f} MiB" + (f" = {share_text.format(budget=budget)}" if share_text else f" ({budget})"))


PREFETCH_ONE = "; one worker at prefetch 1 fits, so prefetch lowered to 1"


def in_parts(d: LoaderDraft, shm_size: int) -> str:
    return (f"; one batch ({d.batch_bytes / MiB:.1f} MiB) exceeds it, so workers ship it in "
            f"parts of {d.part_images} images ({d.ship_bytes / MiB:.1f} MiB) at prefetch 1, joined "
            f"before the step; --shm-size >= {shm_size}m ships whole batches")


def in_process(batch_bytes: int, shm_size: int) -> str:
    return (f"; one batch ({batch_bytes / MiB:.1f} MiB) exceeds it, so batches are loaded in the main "
            f"process (no shm); give the container --shm-size >= {shm_size}m or lower the batch size to use "
            "workers")


def memory_reason(b: Budget, res: HostResources) -> str:
    return (f"{'2 (train + val, persistent) x ' if b.worker_sets == 2 else ''}workers x "
            f"({b.footprint / MiB:.0f} MiB footprint + prefetch x {b.largest_batch / MiB:.1f} MiB, the "
            f"larger of the train and val batches) <= "
            f"{res.memory_available_bytes / MiB:.0f} MiB available ({res.memory_source}) "
            f"{f'/ {b.ranks} local ranks ' if b.ranks > 1 else ''}"
            f"- {MAIN_PROCESS_HEADROOM / MiB:.0f} MiB main-process headroom")


def over_cpus(workers: int, res: HostResources) -> str:
    return (f"{workers} workers on {res.usable_cpus} usable CPUs: workers will contend for cores and "
            "each step may get slower")


def over_shm(d: LoaderDraft, val: LoaderDraft, b: Budget, res: HostResources, part_images: int) -> str:
    needed = d.shm_bytes() + val.shm_bytes()
    return (f"the train and val loaders need {d.shm_bytes() / MiB:.1f} + {val.shm_bytes() / MiB:.1f} = "
            f"{needed / MiB:.1f} MiB of shm ({d.workers} workers x prefetch {d.prefetch}, plus the batch the "
            f"main process holds, each) but the budget is {b.shm / MiB:.1f} MiB "
            f"({res.shm_free_bytes / MiB:.1f} MiB free at {res.shm_path}); expect 'Bus error' or "
            f"'No space left on device'. Fix: loader=auto, a lower loader.prefetch_factor, "
            f"loader.part_images={part_images}, or --shm-size")


def over_memory(d: LoaderDraft, b: Budget, res: HostResources) -> str:
    return (f"{b.worker_sets * d.workers} workers (train and val) x "
            f"~{(b.footprint + d.prefetch * b.largest_batch) / MiB:.0f} MiB may exceed the "
            f"{res.memory_available_bytes / MiB:.0f} MiB available; the OOM killer would end workers "
            "with SIGKILL")


def near_nofile(fds: int, res: HostResources) -> str:
    return f"{fds} fds in flight near RLIMIT_NOFILE {res.nofile_soft}: raise `ulimit -n`"


def near_max_map_count(fds: int, res: HostResources) -> str:
    return (f"{fds} memory maps in flight against vm.max_map_count {res.max_map_count}: "
            "expect 'unable to mmap N bytes'; lower loader.prefetch_factor or workers (the sysctl is "
            "the host's to raise)")


def shm_split_text(split: dict) -> str:
    def part(name: str) -> str:
        return f"{name} {mib(split[name])}"
    return (f"{mib(split['budget'])} budget = {part('train')} + {part('val')} (each: in flight + 1 held by the main "
            f"process) + {mib(split['budget'] - split['train'] - split['val'])} spare")


def side_text(side: int | None) -> str:
    return f" of up to {side}x{side} px" if side else ""


def plan_table(plan) -> str:
    """The plan (a ``plan_record.LoaderPlan``, read by attribute: this module sits below it) as a
    small fixed-width table for the log."""
    rows = [
        ("workers", f"{plan.num_workers} (source: {plan.source}, requested: {plan.requested})"),
        ("batch", f"{plan.batch_size} images{side_text(plan.image_side)}, {mib(plan.batch_bytes)} per FlatBatch"
                  + (f", shipped in parts of {plan.part_images} images" if plan.part_images else "")),
        ("train batches", f"grouped by aspect ratio: {2 * plan.group_aspect_ratio + 2} bins "
                          f"(loader.group_aspect_ratio={plan.group_aspect_ratio}), leftovers mixed"
                          if plan.group_aspect_ratio else "in shuffled order (loader.group_aspect_ratio=null)"),
        ("prefetch / pin / persistent", f"{plan.prefetch_factor} / {plan.pin_memory} / {plan.persistent_workers}"),
        ("in flight", f"{mib(plan.inflight_bytes)}, {plan.inflight_fds} fds/maps ({plan.fds_per_batch} per batch)"),
        ("local ranks on this host", str(plan.local_ranks)),
        ("CPUs: host / per rank", f"{plan.host_cpus} / {plan.usable_cpus}"),
        ("/dev/shm: host free / rank budget", f"{mib(plan.shm_free_bytes)} / {mib(plan.shm_budget_bytes)}"),
        ("memory: host available / per rank", f"{mib(plan.memory_available_bytes)} / "
                                              f"{mib(plan.memory_available_bytes // max(1, plan.local_ranks))}; "
                                              f"worker footprint {mib(plan.worker_footprint_bytes)} ({plan.footprint_source})"),
        ("RLIMIT_NOFILE / vm.max_map_count", f"{plan.nofile_soft} / {plan.max_map_count}"),
    ]
    rows += [(f"cap {c.name}", f"<= {c.limit} [{'APPLIED' if c.applied else 'ok'}] {c.reason}") for c in plan.caps]
    if plan.shm_split:
        rows.append(("shm split", shm_split_text(plan.shm_split)))
    if plan.val is not None:
        v = plan.val
        shipped = f"parts of {v.part_images} images" if v.part_images else "whole batches"
        rows.append(("val loader", f"{v.num_workers} worker(s), prefetch {v.prefetch_factor}, {shipped} "
                                   f"({mib(v.batch_bytes)} per batch{side_text(v.image_side)}), "
                                   f"{mib(v.inflight_bytes)} in flight"))
        rows += [(f"val cap {c.name}", f"<= {c.limit} [{'APPLIED' if c.applied else 'ok'}] {c.reason}")
                 for c in v.caps if c.name == "shm"]
    if plan.window_note:
        rows.append(("window cache", f"{plan.window_slots} slots, {mib(plan.window_bytes)} in anonymous shared memory "
                                     f"(memfd, not /dev/shm): {plan.window_note}"))
    rows += [("WARNING", w) for w in plan.warnings]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)
