"""Claims on numbered slots of one open file, decided by the kernel: a claim is a POSIX byte-range
lock (``fcntl.lockf``) on the slot's byte, held by this process until it releases it or dies
(the kernel drops a dead process's locks at once). Never decided by a clock, so a slow holder
keeps its claim for as long as it lives and a killed one loses it at once.

The locks belong to the process, not the thread: threads of one process must not share a
slot through these claims (the window cache's users are one thread per process).
"""

from __future__ import annotations

import fcntl
import os


class SlotClaims:
    """Exclusive claims on slots ``0..n-1`` of the file open as ``fd`` (one byte each, at
    ``offset + slot``; the bytes themselves are not touched)."""

    def __init__(self, fd: int, offset: int = 0):
        self.fd, self.offset = fd, offset

    def try_claim(self, slot: int) -> bool:
        """Claim ``slot`` if no live process holds it; False at once otherwise."""
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, self.offset + slot, os.SEEK_SET)
        except (BlockingIOError, PermissionError):
            return False
        return True

    def release(self, slot: int) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, self.offset + slot, os.SEEK_SET)
