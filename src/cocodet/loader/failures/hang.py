"""Hangs: a loader that stops delivering ends in a LoaderFailure with every worker's stack.

Workers register ``faulthandler`` on SIGUSR1 at start (``register_stack_dump``), writing to
``<tmp>/cocodet-stacks-<main pid>/<worker pid>.txt``. When torch's ``timeout`` fires, the
diagnosis signals each registered worker of this process and reads what they wrote: the
Python stack at the blocking call (a read from a dead mount, a FIFO, a deadlock).

Torch ignores ``timeout`` without workers, so in-process loading gets a watchdog: SIGALRM
after ``timeout`` seconds raises :class:`LoaderTimeout` in the main thread, carrying its
stack. Signal handlers only run in the main thread; elsewhere the watchdog is off.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import tempfile
import threading
import time
import traceback
from contextlib import contextmanager
from pathlib import Path


class LoaderTimeout(RuntimeError):
    """In-process loading took longer than loader.timeout (the message says like torch's)."""


def stacks_dir(main_pid: int | None = None) -> Path:
    return Path(tempfile.gettempdir()) / f"cocodet-stacks-{main_pid or os.getpid()}"


def register_stack_dump() -> None:
    """In a worker: dump all threads' Python stacks on SIGUSR1 into the main process's folder."""
    folder = stacks_dir(os.getppid())
    folder.mkdir(parents=True, exist_ok=True)
    handle = open(folder / f"{os.getpid()}.txt", "w")  # kept open for the worker's life
    faulthandler.register(signal.SIGUSR1, file=handle, all_threads=True)


def worker_stacks(wait_s: float = 1.0) -> dict[int, str]:
    """Ask every live worker of this process for its stack; return pid -> stack text."""
    folder = stacks_dir()
    pids = []
    for path in folder.glob("*.txt") if folder.is_dir() else []:
        pid = int(path.stem)
        try:
            os.kill(pid, 0)
        except OSError:
            continue  # a worker of an earlier loader, gone
        if _parent_of(pid) == os.getpid():
            pids.append(pid)
            os.kill(pid, signal.SIGUSR1)
    time.sleep(wait_s if pids else 0)
    return {pid: (folder / f"{pid}.txt").read_text().strip() for pid in pids}


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


@contextmanager
def watchdog(timeout_s: float):
    """Raise LoaderTimeout in the main thread when the block runs longer than ``timeout_s``."""
    if timeout_s <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum, frame):
        stack = "".join(traceback.format_stack(frame))
        raise LoaderTimeout(
            f"DataLoader timed out after {timeout_s:g} seconds (in-process watchdog: loading in "
            f"the main process, no workers). Main thread stack:\n{stack}"
        )

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
