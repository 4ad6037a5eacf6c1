"""Whether the copies' disk takes writes: after it refused one (full, over quota, read-only,
failing), copies are not attempted for DISK_RETRY_S: reads go to the store, the read-ahead
pauses; then one try again. Shared with the rank's forked workers.
"""

from __future__ import annotations

import logging
import multiprocessing
import shutil
import time
from pathlib import Path

from cocodet.units import mib

log = logging.getLogger(__name__)
DISK_RETRY_S = 30.0


class DiskRefusal:
    """The refusal state of the disk holding ``folder``."""

    def __init__(self, folder: Path):
        self.folder = folder
        # time.monotonic() until which the disk is taken to refuse copies (0: it takes them), for
        # this process and its workers: one double, written whole (a race sets a near time).
        self._refused_until = multiprocessing.Value("d", 0.0, lock=False)

    def writable(self) -> bool:
        """False for DISK_RETRY_S after the copies' disk refused a write."""
        return time.monotonic() >= self._refused_until.value

    def refused(self, path: Path, error: OSError) -> None:
        """Stop copying for DISK_RETRY_S; said once per refusal, by the process that met it,
        with the folder's disk and its free space: the disk is named, not an image."""
        was_writable = self.writable()
        self._refused_until.value = time.monotonic() + DISK_RETRY_S
        if was_writable:
            try:
                usage = shutil.disk_usage(self.folder)
                space = f"{mib(usage.free)} free of {mib(usage.total)}"
            except OSError:
                space = "free space unknown"
            log.warning(
                "read-ahead copies: writing %s failed (%s, errno %s) on the disk of %s (%s); no copy is kept "
                "for %g s: reads go to the store directly and the run goes on. Free space there or point "
                "dataset.remote.cache_dir at a larger disk",
                path.name,
                error.strerror or error,
                error.errno,
                self.folder,
                space,
                DISK_RETRY_S,
            )
