"""Dead workers, reported where a loader can act on them: at its own wait for a batch.

Torch's SIGCHLD handler raises in the main thread wherever that thread happens to be (in
the model's forward, in Lightning's loop), so a worker death could only end the run. This
handler replaces it and raises only while a loader waits for a batch (``fetching``), and
only when one of that loader's own workers has died. Before each wait the loader also checks
its workers itself: one that died while the model trained has no SIGCHLD left to deliver,
and the wait would otherwise last until ``loader.timeout``.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator, Sequence


class WorkerDied(RuntimeError):
    """A loader's worker ended; the message uses torch's words, so the diagnosis reads it
    as it reads torch's own. ``worker_signals``: pid -> signal name."""

    def __init__(self, message: str, worker_signals: dict[int, str]):
        super().__init__(message)
        self.worker_signals = worker_signals


_waiting: list[Sequence] = []  # the workers of the loader now waiting for a batch


def dead_worker_error(workers: Sequence) -> WorkerDied | None:
    """A WorkerDied naming every worker of ``workers`` (multiprocessing Processes) that ended
    abnormally, or None while all run."""
    reports, signals = [], {}
    for w in workers:
        code = w.exitcode  # polls without blocking; reaps the worker if it ended
        if code is None or code == 0:
            continue
        if code < 0:
            try:
                name, words = signal.Signals(-code).name, signal.strsignal(-code)
            except ValueError:
                name, words = f"signal {-code}", f"signal {-code}"
            signals[w.pid] = name
            reports.append(f"DataLoader worker (pid {w.pid}) is killed by signal: {words}.")
        else:
            reports.append(f"DataLoader worker (pid {w.pid}) exited unexpectedly with exit code {code}.")
    return WorkerDied(" ".join(reports), signals) if reports else None


@contextmanager
def fetching(workers: Sequence) -> Iterator[None]:
    """Wait for a batch from a loader whose workers are ``workers``: raise WorkerDied now if
    one has died, or as soon as one dies during the wait."""
    _install()
    _waiting.append(workers)
    try:
        error = dead_worker_error(workers)
        if error is not None:
            raise error
        yield
    finally:
        _waiting.pop()


def _on_child_exit(signum, frame) -> None:
    if _waiting:
        error = dead_worker_error(_waiting[-1])
        if error is not None:
            raise error


def _install() -> None:
    """Take SIGCHLD over from torch (it installs its handler with its first worker
    iterator, once per process); signal handlers can only be set from the main thread."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGCHLD) is not _on_child_exit:
        signal.signal(signal.SIGCHLD, _on_child_exit)
