"""What the host offers a DataLoader: CPUs, /dev/shm, file descriptors, maps, memory.

Every number is read at call time (free shm changes while a machine runs); nothing is cached.
"""

from __future__ import annotations

import logging
import os
import resource
from dataclasses import asdict, dataclass
from pathlib import Path

from cocodet.host import cgroup_cpu_limit, memory_available, read_text_or_none
from cocodet.units import mib

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostResources:
    affinity_cpus: int
    cgroup_cpus: float | None  # CPU quota in cores, None when unlimited
    local_world_size: int
    usable_cpus: int  # per local rank, floor 1
    shm_path: str
    shm_total_bytes: int | None  # None: no such filesystem (macOS, Windows, or a test's probe path)
    shm_free_bytes: int | None
    nofile_soft: int
    nofile_hard: int
    max_map_count: int | None
    memory_available_bytes: int
    memory_source: str

    def as_dict(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        """Host preflight: every resource the plan reads, with its number."""
        rows = [
            (
                "CPUs",
                f"{self.usable_cpus} usable per rank (affinity {self.affinity_cpus}, cgroup quota "
                f"{self.cgroup_cpus if self.cgroup_cpus is not None else 'none'}, {self.local_world_size} local ranks)",
            ),
            ("shm", f"{self.shm_path}: {mib(self.shm_free_bytes, 'none')} free of {mib(self.shm_total_bytes, 'none')}"),
            ("memory", f"{mib(self.memory_available_bytes)} available ({self.memory_source})"),
            ("RLIMIT_NOFILE", f"soft {self.nofile_soft}, hard {self.nofile_hard}"),
            ("vm.max_map_count", str(self.max_map_count)),
        ]
        return "\n".join(f"  {k:<16}  {v}" for k, v in rows)


def shm_space(shm_path: str) -> tuple[int | None, int | None]:
    """(total, free) bytes of the shm filesystem, or (None, None) when it does not exist."""
    try:
        st = os.statvfs(shm_path)
    except OSError:
        return None, None
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def probe(shm_path: str = "/dev/shm", ranks_per_host: int = 1) -> HostResources:
    """Read every resource the loader plan needs; ``ranks_per_host``: the local world size
    (``cocodet.ranks.read_ranks``), the processes that share this host's CPUs and shm."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_cpu_limit()
    cpus = min(affinity, int(quota)) if quota else affinity
    ranks = max(1, ranks_per_host)
    total, free = shm_space(shm_path)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    maps = read_text_or_none(Path("/proc/sys/vm/max_map_count"))
    mem, source = memory_available()
    return HostResources(
        affinity_cpus=affinity,
        cgroup_cpus=quota,
        local_world_size=ranks,
        usable_cpus=max(1, max(1, cpus) // ranks),
        shm_path=shm_path,
        shm_total_bytes=total,
        shm_free_bytes=free,
        nofile_soft=soft,
        nofile_hard=hard,
        max_map_count=int(maps) if maps and maps.isdigit() else None,
        memory_available_bytes=mem,
        memory_source=source,
    )


def raise_nofile_limit() -> None:
    """Raise the soft RLIMIT_NOFILE to the hard limit (received shm segments each hold an fd)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            log.info("raised RLIMIT_NOFILE soft limit %d -> %d (hard %d)", soft, target, hard)
        except (ValueError, OSError) as e:
            log.warning("could not raise RLIMIT_NOFILE from %d to %d: %s", soft, target, e)
