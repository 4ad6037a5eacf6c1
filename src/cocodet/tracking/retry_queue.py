"""The outage half of the guarded MLflow client (``tracking/guard.py:GuardedClient``): a call
not sent is kept in the unsent file, and one that writes to a known run is queued, in call
order, for a background thread that sends the queue again with a back-off until it is empty;
then the server is used directly again, said in one line.
"""

from __future__ import annotations

import logging
import threading
import time

from cocodet.credentials import redact
from cocodet.tracking.upload import UploadTooSlow

log = logging.getLogger(__name__)

RETRY_FIRST_S, RETRY_CAP_S = 2.0, 30.0  # the background retry's back-off during an outage
# Calls that write to a run already created: kept in order and sent once the server answers.
QUEUED_CALLS = ("log_batch", "log_text", "log_artifact", "set_terminated")


class RetryQueue:
    """What :class:`~cocodet.tracking.guard.GuardedClient` does with a call it does not send:
    it reads and updates the client's outage state (``failure``, ``sent_late``, ``_down_at``)
    and queue (``_pending``, ``_retry``, ``_stop``) under its ``_lock``, sends through its
    ``_send``, and the queue has one sender at a time (``_sending``: the retry or the close)."""

    def _hold(self, method: str, args: tuple, kwargs: dict, keep: dict | None, queue: bool = True) -> None:
        """Under the lock: keep the call in the unsent file; queue it for the retry when it
        writes to a known run."""
        seq = self._unsent.add(method, keep)
        if queue and method in QUEUED_CALLS and (keep or {}).get("run_id") and not self._stop.is_set():
            self._pending.append((seq, method, args, kwargs))
            if self._retry is None:
                self._retry = threading.Thread(target=self._retry_loop, daemon=True, name="cocodet-mlflow-retry")
                self._retry.start()
        return None

    def _retry_loop(self) -> None:
        delay = RETRY_FIRST_S
        while not self._stop.wait(delay):
            with self._sending:
                emptied = self._drain()
            if emptied and self._back():
                return
            delay = min(2 * delay, RETRY_CAP_S)

    def _drain(self) -> bool:
        """Send the queue's calls in order until one fails (holding ``_sending``); True when
        it is empty."""
        while True:
            with self._lock:
                if not self._pending:
                    return True
                if self._stop.is_set() and threading.current_thread() is self._retry:
                    return False  # the run has finished: what is left stays unsent, as the file says
                seq, method, args, kwargs = self._pending[0]
            try:
                self._send(method, args, kwargs)
            except UploadTooSlow:
                pass  # listed as unsent; the queue goes on
            except Exception as e:  # noqa: BLE001 - still down: try again later
                log.debug("MLflow: still failing (%s)", e)
                return False
            else:
                self._unsent.sent(seq)
                self.sent_late += 1
            with self._lock:
                self._pending.popleft()

    def _back(self) -> bool:
        """The queue is empty: the server is used directly again (True), unless a call was
        queued meanwhile (False: drain again). Only the first of the retry and the close says so."""
        with self._lock:
            if self._pending:
                return False
            if self.failure is None:
                return True
            down_for, self.failure, self._retry = time.monotonic() - self._down_at, None, None
        log.warning(
            "MLflow: %s answers again after %.0f s; %d calls sent late, in order",
            redact(self.tracking_uri),
            down_for,
            self.sent_late,
        )
        return True
