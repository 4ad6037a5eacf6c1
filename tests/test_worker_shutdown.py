"""A loader whose worker died holding the workers' done-event lock still shuts down: real
DataLoader workers, a real process that takes the lock and is SIGKILLed, a killed worker."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import torch.utils.data

from cocodet.loader.failures.worker_shutdown import shut_down_workers


def hold(event) -> None:
    event._cond.acquire()  # what a worker does inside done_event.is_set(), killed before it lets go
    time.sleep(600)


def test_shutdown_returns_after_a_worker_died_holding_the_done_event_lock():
    loader = torch.utils.data.DataLoader(
        range(1000), batch_size=1, num_workers=2, persistent_workers=True, multiprocessing_context="fork"
    )
    iterator = iter(loader)
    next(iterator)
    holder = multiprocessing.get_context("fork").Process(target=hold, args=(iterator._workers_done_event,))
    holder.start()
    time.sleep(1.0)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join()
    try:  # torch's SIGCHLD handler raises in this thread when a worker is killed
        os.kill(iterator._workers[0].pid, signal.SIGKILL)
        iterator._workers[0].join(timeout=10)
        time.sleep(0.5)
    except RuntimeError as e:
        assert "is killed by signal" in str(e)
    iterator._workers[0].join(timeout=10)
    done = threading.Thread(target=shut_down_workers, args=(iterator,), daemon=True)
    done.start()
    done.join(timeout=60)
    assert not done.is_alive(), "the shutdown waited on the dead worker's lock"
    assert not any(w.is_alive() for w in iterator._workers)
