"""Claims decided by the kernel, never by a clock: a slow holder keeps its claim for as long as it
lives, and a killed one loses it at once (the kernel drops a dead process's locks).

- :class:`SlotClaims`: numbered slots of one open file (the window cache's), each a POSIX
  byte-range lock (``fcntl.lockf``) on the slot's byte. These locks belong to the process, not
  the thread: the window cache's users are one thread per process.
- :func:`claim_file`: one file (an object copy being written, ``storage/object_cache.py``), an
  ``flock`` on it, which belongs to the open file, so threads of one process exclude each other.
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


def claim_file(path: str | os.PathLike) -> int | None:
    """Claim the file at ``path`` (created if missing): an open descriptor holding an exclusive
    ``flock`` on it, or None at once when a live holder has it. ``flock`` belongs to the open
    file, not the process, so two threads of one process exclude each other too (the read-ahead's
    GET threads and a main-process reader). A holder that dies loses the claim with its last
    descriptor, so a claim left by a killed writer is taken over at once, never after a timeout.

    The claim is checked to be on the file named ``path`` now: a holder that renamed or
    unlinked it (publishing or giving up) between our open and our lock leaves us a lock on a
    file no longer there, which is no claim."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.fstat(fd).st_ino == os.stat(path).st_ino:
            return fd
    except (BlockingIOError, FileNotFoundError):
        pass
    os.close(fd)
    return None
