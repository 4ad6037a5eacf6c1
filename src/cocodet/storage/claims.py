"""Claims decided by the kernel, never by a clock: a slow holder keeps its claim for as long as it
lives, and a killed one loses it at once (the kernel drops a dead process's locks).

- :class:`SlotClaims`: numbered slots of one open file (the window cache's), each a POSIX
  byte-range lock (``fcntl.lockf``) on the slot's byte. These locks belong to the process, not
  the thread: the window cache's users are one thread per process.
- :func:`claim_file`: one file (an object copy being written, ``read_ahead/object_cache.py``), an
  ``flock`` on it, which belongs to the open file, so threads of one process exclude each other.
- :class:`SharedLock`: a lock for shared memory that a process and the workers it forks take
  (the store's counters and give-up clock, the object cache's budget), in place of
  ``multiprocessing``'s, whose semaphore stays taken forever when its holder is SIGKILLed (the
  OOM killer inside a short section hangs the parent's next ``counts()``).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
import weakref


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


class SharedLock:
    """A lock shared with forked processes that the kernel releases when its holder dies: a
    POSIX record lock (``fcntl.lockf``) on one byte of an unlinked temporary file, inherited
    across fork (record locks belong to the process, so a forked worker contends with its
    parent on the same descriptor), and a thread lock in front of it, since record locks do not
    exclude two threads of one process (the read-ahead's GET threads). A thread lock held by
    another thread at fork time would stay held in the child, so each child starts with a new
    one. A context manager, like ``multiprocessing.Lock``."""

    _instances: "weakref.WeakSet[SharedLock]" = weakref.WeakSet()

    def __init__(self):
        self._file = tempfile.TemporaryFile()  # unlinked at once: nothing is left behind
        self._fd = self._file.fileno()
        self._threads = threading.Lock()
        SharedLock._instances.add(self)

    def __enter__(self) -> "SharedLock":
        self._threads.acquire()
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX, 1, 0, os.SEEK_SET)
        except BaseException:
            self._threads.release()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, 0, os.SEEK_SET)
        finally:
            self._threads.release()

    @classmethod
    def _after_fork_in_child(cls) -> None:
        for lock in list(cls._instances):
            lock._threads = threading.Lock()


os.register_at_fork(after_in_child=SharedLock._after_fork_in_child)
