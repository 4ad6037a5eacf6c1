"""What the host gives this process, read from the kernel: the cgroup CPU quota and the memory
still available (the tighter of the cgroup limit and MemAvailable).

Bottom layer (no cocodet imports): the loader plan (``loader/resources``) and the pixel cache's
``ram`` check (``data/pixel_cache``) read memory the same way, so a memory-limited container
is judged by its limit, not by the host's free memory.
"""

from __future__ import annotations

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_cgroup_dirs() -> list[Path]:
    """cgroup v2 directories of this process, innermost first, up to the root."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return [CGROUP_ROOT]
    rel = next((ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")), "/")
    path = CGROUP_ROOT / rel.lstrip("/")
    dirs = [path, *path.parents]
    return [d for d in dirs if str(d).startswith(str(CGROUP_ROOT))]


def read_text_or_none(path: Path) -> str | None:
    """A small system file's text, stripped; None when it cannot be read."""
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_cpu_limit() -> float | None:
    """The tightest CPU quota in cores (cgroup v2 ``cpu.max`` or v1 CFS quota), None if unlimited."""
    limits = []
    for d in _own_cgroup_dirs():
        text = read_text_or_none(d / "cpu.max")
        if text and not text.startswith("max"):
            quota, period = text.split()[:2]
            limits.append(int(quota) / int(period))
    quota = read_text_or_none(CGROUP_ROOT / "cpu" / "cpu.cfs_quota_us")
    period = read_text_or_none(CGROUP_ROOT / "cpu" / "cpu.cfs_period_us")
    if quota and period and int(quota) > 0:
        limits.append(int(quota) / int(period))
    return min(limits) if limits else None


def memory_available() -> tuple[int, str]:
    """Bytes this process may still allocate: the tighter of the cgroup limit and MemAvailable."""
    mem_available = None
    for line in (read_text_or_none(Path("/proc/meminfo")) or "").splitlines():
        if line.startswith("MemAvailable:"):
            mem_available = int(line.split()[1]) * 1024
    candidates = []
    if mem_available is not None:
        candidates.append((mem_available, "MemAvailable"))
    for d in _own_cgroup_dirs():
        limit, current = read_text_or_none(d / "memory.max"), read_text_or_none(d / "memory.current")
        if limit and limit != "max" and current:
            candidates.append((int(limit) - int(current), f"cgroup v2 {d}/memory.max"))
    v1_limit = read_text_or_none(CGROUP_ROOT / "memory" / "memory.limit_in_bytes")
    v1_usage = read_text_or_none(CGROUP_ROOT / "memory" / "memory.usage_in_bytes")
    if v1_limit and v1_usage and int(v1_limit) < 1 << 60:
        candidates.append((int(v1_limit) - int(v1_usage), "cgroup v1 memory.limit_in_bytes"))
    if not candidates:
        import psutil

        return int(psutil.virtual_memory().available), "psutil"
    return min(candidates)
