"""Ending a DataLoader iterator's workers when one of them died (torch's ``_shutdown_workers``
with one hazard removed).

torch's shutdown first sets the workers' done event, a ``multiprocessing.Event`` whose lock
every worker takes each time it checks the event. A worker SIGKILLed while it held that lock
(the OOM killer, a test's kill) leaves the lock taken for good, and the shutdown then waits
forever: seen once as a hung CI run in test_replan's give-up case. When a worker is known dead,
the survivors are ended here and the shutdown sets an event of its own, which nobody holds.
"""

from __future__ import annotations

import multiprocessing


def shut_down_workers(iterator) -> None:
    """End ``iterator``'s workers (a ``_MultiProcessingDataLoaderIter``); any other iterator has none."""
    if not hasattr(iterator, "_shutdown_workers"):
        return
    workers = getattr(iterator, "_workers", [])
    if not getattr(iterator, "_shutdown", True) and any(not w.is_alive() for w in workers):
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
        for worker in workers:
            worker.join(timeout=5)
        iterator._workers_done_event = multiprocessing.get_context("fork").Event()
    iterator._shutdown_workers()
