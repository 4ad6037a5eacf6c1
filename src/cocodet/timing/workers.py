"""Memory of a loader's worker processes, found by pid.

The one way to find a loader's workers is ``EpochLoader.worker_pids()`` (the stream it runs
itself). Torch's own ``DataLoader._iterator`` is kept only with persistent workers, so reading
it measured nothing with ``persistent_workers=false``.
"""

from __future__ import annotations

import psutil


def worker_memory(loader) -> list:
    """psutil full memory info (rss, uss) of the live workers of ``loader`` (an ``EpochLoader``);
    empty without workers or for a loader that does not name its workers."""
    out = []
    for pid in loader.worker_pids() if hasattr(loader, "worker_pids") else []:
        try:
            out.append(psutil.Process(pid).memory_full_info())
        except (psutil.Error, ValueError):
            continue
    return out
