"""The loader plan as a small fixed-width table for the log (design §3): ``LoaderPlan.table()``.
Read by attribute, so this module sits below ``records.py``, which imports it when asked."""

from __future__ import annotations

from cocodet.units import mib


def shm_split_text(split: dict) -> str:
    def part(name: str) -> str:
        return f"{name} {mib(split[name])}"

    return (
        f"{mib(split['budget'])} budget = {part('train')} + {part('val')} (each: in flight + 1 held by the main "
        f"process) + {mib(split['budget'] - split['train'] - split['val'])} spare"
    )


def side_text(side: int | None) -> str:
    return f" of up to {side}x{side} px" if side else ""


def plan_table(plan) -> str:
    """The plan (a ``records.LoaderPlan``, read by attribute: this module sits below it) as a
    small fixed-width table for the log."""
    rows = _train_loader_rows(plan) + _host_rows(plan)
    rows += [(f"cap {c.name}", _cap_text(c)) for c in plan.caps]
    if plan.shm_split:
        rows.append(("shm split", shm_split_text(plan.shm_split)))
    if plan.val is not None:
        rows += _val_loader_rows(plan.val)
    if plan.window_note:
        rows.append(
            (
                "window cache",
                f"{plan.window_slots} slots, {mib(plan.window_bytes)} in anonymous shared memory "
                f"(memfd, not /dev/shm): {plan.window_note}",
            )
        )
    rows += [("WARNING", w) for w in plan.warnings]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


def _train_loader_rows(plan) -> list[tuple[str, str]]:
    """The train loader: its workers, batches, queues and what it keeps in flight."""
    return [
        ("workers", f"{plan.num_workers} (source: {plan.source}, requested: {plan.requested})"),
        (
            "batch",
            f"{plan.batch_size} images{side_text(plan.image_side)}, {mib(plan.batch_bytes)} per FlatBatch"
            + (f", shipped in parts of {plan.part_images} images" if plan.part_images else ""),
        ),
        (
            "train batches",
            f"grouped by aspect ratio: {2 * plan.group_aspect_ratio + 2} bins "
            f"(loader.group_aspect_ratio={plan.group_aspect_ratio}), leftovers mixed"
            if plan.group_aspect_ratio
            else "in shuffled order (loader.group_aspect_ratio=null)",
        ),
        ("prefetch / pin / persistent", f"{plan.prefetch_factor} / {plan.pin_memory} / {plan.persistent_workers}"),
        ("in flight", f"{mib(plan.inflight_bytes)}, {plan.inflight_fds} fds/maps ({plan.fds_per_batch} per batch)"),
    ]


def _host_rows(plan) -> list[tuple[str, str]]:
    """What the host gives this rank: its share of the CPUs, /dev/shm and memory, and its limits."""
    return [
        (
            "local ranks on this host",
            f"{plan.local_ranks}" + (f" (ranks read from {plan.ranks_from})" if plan.ranks_from else ""),
        ),
        ("CPUs: host / per rank", f"{plan.host_cpus} / {plan.usable_cpus}"),
        ("/dev/shm: host free / rank budget", f"{mib(plan.shm_free_bytes)} / {mib(plan.shm_budget_bytes)}"),
        (
            "memory: host available / per rank",
            f"{mib(plan.memory_available_bytes)} / "
            f"{mib(plan.memory_available_bytes // max(1, plan.local_ranks))}; "
            f"worker footprint {mib(plan.worker_footprint_bytes)} ({plan.footprint_source})",
        ),
        ("RLIMIT_NOFILE / vm.max_map_count", f"{plan.nofile_soft} / {plan.max_map_count}"),
    ]


def _val_loader_rows(v) -> list[tuple[str, str]]:
    """The validation loader (``plan.val``): its workers and queue, and its shm cap."""
    shipped = f"parts of {v.part_images} images" if v.part_images else "whole batches"
    rows = [
        (
            "val loader",
            f"{v.num_workers} worker(s), prefetch {v.prefetch_factor}, {shipped} "
            f"({mib(v.batch_bytes)} per batch{side_text(v.image_side)}), "
            f"{mib(v.inflight_bytes)} in flight",
        )
    ]
    return rows + [(f"val cap {c.name}", _cap_text(c)) for c in v.caps if c.name == "shm"]


def _cap_text(c) -> str:
    """One cap (a ``records.WorkerCap``): its limit, whether it lowered the count, and why."""
    return f"<= {c.limit} [{'APPLIED' if c.applied else 'ok'}] {c.reason}"
