"""What the loader plan decides for each rank of a multi-GPU host: computed by the policy
(``plan_loader``) from simulated host resources, not measured on such a host.

    python benchmarks/scaling_table.py                       # 8 ranks, 64 cores, 64 MB vs 8 GB /dev/shm
    python benchmarks/scaling_table.py --ranks 4 --cores 32 --memory-gb 256 --batch 32

Prints a Markdown table (docs/reference.md "Scaling out").
"""

from __future__ import annotations

import argparse

from cocodet.loader.plan.flat_layout import batch_bytes
from cocodet.loader.plan.policy import plan_loader
from cocodet.loader.plan.records import BatchGeometry, LoaderRequest
from cocodet.loader.plan.resources import HostResources
from cocodet.units import MiB


def host(cores: int, ranks: int, shm_bytes: int, memory_bytes: int) -> HostResources:
    return HostResources(
        affinity_cpus=cores,
        cgroup_cpus=None,
        local_world_size=ranks,
        usable_cpus=max(1, cores // ranks),
        shm_path="/dev/shm",
        shm_total_bytes=shm_bytes,
        shm_free_bytes=shm_bytes,
        nofile_soft=1 << 20,
        nofile_hard=1 << 20,
        max_map_count=65530,
        memory_available_bytes=memory_bytes,
        memory_source="simulated",
    )


def row(label: str, res: HostResources, batch: int, size: int) -> str:
    plan = plan_loader(
        LoaderRequest("auto"), BatchGeometry(batch, batch_bytes(batch, size), partner_pool=8), res, cuda=True
    )
    shipped = f"parts of {plan.part_images}" if plan.part_images else "whole batches"
    applied = ", ".join(c.name for c in plan.caps if c.applied) or "none"
    return (
        f"| {label} | {batch} x {size} px ({plan.batch_bytes / MiB:.1f} MiB) | {plan.usable_cpus} | "
        f"{plan.shm_budget_bytes / MiB:.1f} MiB | {plan.num_workers} | {plan.prefetch_factor} | {shipped} | "
        f"{plan.inflight_bytes / MiB:.1f} MiB | {plan.num_workers * res.local_world_size} | {applied} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--cores", type=int, default=64)
    parser.add_argument("--memory-gb", type=int, default=512)
    parser.add_argument("--batch", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--size", type=int, default=640)
    args = parser.parse_args()
    print(
        f"Simulated host: {args.cores} cores, {args.memory_gb} GiB available, {args.ranks} local ranks "
        f"(one per GPU), loader=auto, prefetch 2, partner pool 8; per rank:\n"
    )
    print(
        "| /dev/shm | batch per rank | CPUs per rank | shm budget per rank | workers | prefetch | shipped as "
        "| in flight per rank | workers on the host | caps applied |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, shm in (("64 MB (Docker default)", 64 * MiB), ("8 GB (`--shm-size=8g`)", 8192 * MiB)):
        for batch in args.batch:
            print(row(label, host(args.cores, args.ranks, shm, args.memory_gb << 30), batch, args.size))


if __name__ == "__main__":
    main()
