"""MLflow calls that never stop training: bounded, and during an outage sent later, in order.

A tracking server that is down would otherwise cost MLflow's default 7 retries of up to 120 s
per call, on rank 0, with every DDP rank waiting for it at the next collective. Here every
request is bounded (``bound_requests``). The first failure starts an outage (one warning): from
then on the training thread never waits on the server. Calls that write to a known run (metrics,
tags, texts, artifacts, the status) are queued in order and sent again by a background thread,
with a back-off from 2 s to 30 s; when the queue is empty the server is used directly again (one
line says it is back: ``tracking/retry_queue.py``). The run's last calls retry within
``close_end_within_s`` (long enough for a server restart), or ``close_within_s`` after a SIGTERM
(a preemption's grace period), artifact uploads within their own bound. Every call not sent by then, and
every call that could not be queued (a run never created, a read), is in
``<run>/mlflow_unsent.jsonl``, one JSON object per call, which
``python -m cocodet.tracking replay RUN_DIR`` sends later (``tracking/replay.py``).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path

from cocodet.credentials import redact
from cocodet.tracking.retry_queue import RetryQueue
from cocodet.tracking.unsent import UnsentCalls
from cocodet.tracking.upload import UploadTooSlow, upload_within

log = logging.getLogger(__name__)


def bound_requests(timeout_s: int, max_retries: int) -> None:
    """Bound MLflow's HTTP requests for this process, unless the user set the variables
    (MLflow reads them at every request). Telemetry stays off unless asked for: the hosts this
    runs on are often offline."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(timeout_s)))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(int(max_retries)))
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


class GuardedClient(RetryQueue):
    """An ``MlflowClient`` whose calls go through :meth:`call`. ``unsent_path``: where the calls
    not sent are kept (created on the first one); what is kept, queued and sent again:
    :class:`~cocodet.tracking.retry_queue.RetryQueue`."""

    def __init__(self, tracking_uri: str, unsent_path: str | Path):
        self.tracking_uri = tracking_uri
        self._unsent = UnsentCalls(Path(unsent_path))
        self.failure: str | None = None  # the current outage's first failure, in one line (None: in contact)
        self.outages = 0  # outages met in this run
        self.sent_late = 0  # calls the background retry sent after an outage
        self._client = None
        self._deadline: float | None = None
        self._uploads_within: float | None = None
        self._budget, self._timeout = 0.0, 120
        self._budget_key = ""  # the config key of the closing budget, for the line that says it ran out
        self._pending: deque = deque()  # (seq, method, args, kwargs) queued for the retry, in call order
        self._lock = threading.Lock()  # the outage state and the queue
        self._sending = threading.Lock()  # one sender of the queue at a time (the retry or the close)
        self._stop = threading.Event()
        self._retry: threading.Thread | None = None
        self._down_at = 0.0

    def __getstate__(self) -> dict:
        # A sweep's launcher pickles its Hydra callbacks (the parent run's client among them):
        # the threads, locks and queue of this process stay here; a copy starts without them.
        state = dict(self.__dict__)
        for name in ("_lock", "_sending", "_stop", "_retry", "_pending"):
            state.pop(name)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock, self._sending, self._stop = threading.Lock(), threading.Lock(), threading.Event()
        self._retry, self._pending = None, deque()

    @property
    def client(self):
        if self._client is None:
            from mlflow.tracking import MlflowClient

            from cocodet.tracking.store import store_created_once

            with store_created_once(self.tracking_uri):  # the client creates the store
                self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    @property
    def alive(self) -> bool:
        return self.failure is None

    @property
    def unsent_path(self) -> Path:
        return self._unsent.path

    @property
    def unsent(self) -> int:
        """Calls not sent (so far): written to ``unsent_path`` and not sent late since."""
        return self._unsent.count

    def call(self, method: str, *args, keep: dict | None = None, answers: tuple[str, ...] = (), **kwargs):
        """``MlflowClient.<method>(*args, **kwargs)``; None when it was not made or failed, and
        then ``keep`` (what the call carried, JSON-able) goes to the unsent file, and the call to
        the retry queue if it writes to a known run. ``answers``: MLflow error codes that are an
        answer, not a failure (None, and contact goes on)."""
        with self._lock:
            if self.failure is not None or self._pending:  # never wait on a server that failed; keep the order
                return self._hold(method, args, kwargs, keep)
        if self._deadline is not None and time.monotonic() > self._deadline:
            self._outage(f"the closing calls ran out of their {self._budget:g} s ({self._budget_key})", method)
            with self._lock:
                return self._hold(method, args, kwargs, keep)
        try:
            return self._send(method, args, kwargs)
        except UploadTooSlow as e:  # listed, not queued: another try would be as slow
            log.warning("MLflow: %s", e)
            with self._lock:
                return self._hold(method, args, kwargs, keep, queue=False)
        except Exception as e:  # noqa: BLE001 - any failure (network, server, store) starts an outage alike
            if getattr(e, "error_code", None) in answers:
                return None
            self._outage(f"{type(e).__name__}: {' '.join(str(e).split())[:300]}", method)
        with self._lock:
            return self._hold(method, args, kwargs, keep)

    def _send(self, method: str, args: tuple, kwargs: dict):
        if self._deadline is not None:  # the request may not outlast the closing budget
            remaining = max(1, math.ceil(self._deadline - time.monotonic()))
            os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(min(remaining, self._timeout))
        if method == "log_artifact" and self._uploads_within is not None:
            return upload_within(self.client, args, kwargs, self._deadline, self._uploads_within, self.unsent_path)
        return getattr(self.client, method)(*args, **kwargs)

    def _outage(self, reason: str, method: str) -> None:
        with self._lock:
            if self.failure is not None:
                return
            self.failure, self._down_at = redact(reason), time.monotonic()
            self.outages += 1
        log.warning(
            "MLflow: %s to %s failed (%s); training goes on, and what it sends meanwhile is kept in order "
            "and sent again once the server answers (whatever is left at the end stays in %s)",
            method,
            redact(self.tracking_uri),
            self.failure,
            self.unsent_path,
        )

    @contextmanager
    def closing(self, within_s: float, key: str, uploads: bool = False):
        """The run's last calls: they retry nothing on their own, and each request's timeout is
        cut to what is left of ``within_s`` (at least 1 s), so that together they end within
        about ``within_s`` + 1 s: inside a preemption's grace period (``docker stop`` gives 10 s)
        with ``close_within_s``, past a server restart with ``close_end_within_s``. At the end,
        calls still queued from an outage (and these) are sent again until the budget is spent;
        what is left stays in the unsent file. ``key``: the config key ``within_s`` comes from.
        ``uploads``: the phase of the artifact uploads, each bounded as a whole by what is left,
        and not tried again when the server is down (they are listed as unsent at once)."""
        names = ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")
        previous = {name: os.environ.get(name) for name in names}
        self._timeout = int(previous["MLFLOW_HTTP_REQUEST_TIMEOUT"] or 120)  # MLflow's default
        self._deadline, self._budget, self._budget_key = time.monotonic() + within_s, within_s, key
        self._uploads_within = within_s if uploads else None
        os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
        try:
            yield
            if not uploads:  # uploads are not retried: a server down now would spend the whole budget
                self._flush()
        finally:
            self._deadline, self._uploads_within = None, None
            for name, value in previous.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    def cut_to(self, within_s: float, key: str) -> None:
        """A SIGTERM during a long closing budget: what is left of it becomes ``within_s``."""
        if self._deadline is not None and time.monotonic() + within_s < self._deadline:
            self._deadline, self._budget, self._budget_key = time.monotonic() + within_s, within_s, key
            log.warning("MLflow: SIGTERM while the run's last calls wait; they get %g s more (%s)", within_s, key)

    def _flush(self) -> None:
        """Send the queue again until the closing budget is spent (every half second)."""
        if self._pending:
            log.warning(
                "MLflow: %d calls wait for %s; trying them again for up to %.0f s (%s)",
                len(self._pending),
                redact(self.tracking_uri),
                max(0.0, self._deadline - time.monotonic()),
                self._budget_key,
            )
        while self._pending and time.monotonic() < self._deadline:
            if self._sending.acquire(timeout=max(0.0, self._deadline - time.monotonic())):
                try:
                    emptied = self._drain()
                finally:
                    self._sending.release()
                if emptied:
                    self._back()
                    return
            time.sleep(min(0.5, max(0.0, self._deadline - time.monotonic())))

    def finish(self) -> None:
        """The run is over: no more retries, and the unsent file holds exactly the calls not
        sent (removed when every one was sent late)."""
        self._stop.set()
        # A send of the background retry still in flight ends before the file is rewritten, so
        # the file, the count and the last line agree with what the server got.
        if self._sending.acquire(timeout=float(os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT") or 5) + 1):
            self._sending.release()
        self._unsent.rewrite()

    def holds(self, call: str) -> bool:
        """Whether an MLflow ``call`` (a method's name) was left unsent so far."""
        return self._unsent.holds(call)

    def summary(self) -> dict:
        return {
            "unsent": self.unsent,
            "unsent_file": str(self.unsent_path) if self.unsent else None,
            "failure": self.failure,
            "outages": self.outages,
            "sent_late": self.sent_late,
        }
