"""MLflow calls that never stop training: bounded, and after the first failure not made at all.

A tracking server that is down would otherwise cost MLflow's default 7 retries of up to 120 s
per call, on rank 0, with every DDP rank waiting for it at the next collective. Here every
request is bounded (``bound_requests``), the first failure ends all contact for the rest of the
run (one warning), and whatever a call would have sent is appended to
``<run>/mlflow_unsent.jsonl`` instead, one JSON object per call, so nothing is lost.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from contextlib import contextmanager
from pathlib import Path

from cocodet.credentials import redact  # noqa: F401  (re-exported for tracking's modules)

log = logging.getLogger(__name__)

UNSENT_NAME = "mlflow_unsent.jsonl"

def bound_requests(timeout_s: int, max_retries: int) -> None:
    """Bound MLflow's HTTP requests for this process, unless the user set the variables
    (MLflow reads them at every request). Telemetry stays off unless asked for: the hosts this
    runs on are often offline."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(timeout_s)))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(int(max_retries)))
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


class GuardedClient:
    """An ``MlflowClient`` whose calls go through :meth:`call`. ``unsent_path``: where the calls
    not made are kept (created on the first one)."""

    def __init__(self, tracking_uri: str, unsent_path: str | Path):
        self.tracking_uri = tracking_uri
        self.unsent_path = Path(unsent_path)
        self.unsent = 0        # calls kept in unsent_path instead of sent
        self.failure: str | None = None  # the first failure, in one line (None: every call went through)
        self._client = None
        self._deadline: float | None = None
        self._budget, self._timeout = 0.0, 120

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

    def call(self, method: str, *args, keep: dict | None = None, answers: tuple[str, ...] = (), **kwargs):
        """``MlflowClient.<method>(*args, **kwargs)``; None when it was not made or failed, and
        then ``keep`` (what the call carried, JSON-able) goes to the unsent file. ``answers``:
        MLflow error codes that are an answer, not a failure (None, and contact goes on)."""
        if self.failure is None and self._deadline is not None and time.monotonic() > self._deadline:
            self._stop(f"the closing calls ran out of their {self._budget:g} s (logger.mlflow.close_within_s)", method)
        if self.failure is None:
            try:
                if self._deadline is not None:  # the request may not outlast the closing budget
                    remaining = max(1, math.ceil(self._deadline - time.monotonic()))
                    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(min(remaining, self._timeout))
                return getattr(self.client, method)(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - any failure (network, server, store) ends contact alike
                if getattr(e, "error_code", None) in answers:
                    return None
                self._stop(f"{type(e).__name__}: {' '.join(str(e).split())[:300]}", method)
        self._keep(method, keep)
        return None

    @contextmanager
    def closing(self, within_s: float):
        """The run's last calls: they retry nothing, and each request's timeout is cut to what
        is left of ``within_s`` (at least 1 s), so that together they end within about
        ``within_s`` + 1 s, inside a preemption's grace period (``docker stop`` gives 10 s)."""
        names = ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")
        previous = {name: os.environ.get(name) for name in names}
        self._timeout = int(previous["MLFLOW_HTTP_REQUEST_TIMEOUT"] or 120)  # MLflow's default
        self._deadline, self._budget = time.monotonic() + within_s, within_s
        os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
        try:
            yield
        finally:
            self._deadline = None
            for name, value in previous.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    def _stop(self, reason: str, method: str) -> None:
        self.failure = redact(reason)
        log.warning("MLflow: %s to %s failed (%s); training goes on without MLflow for the rest of this run, and what "
                    "it would have sent is kept in %s", method, redact(self.tracking_uri), self.failure,
                    self.unsent_path)

    def _keep(self, method: str, keep: dict | None) -> None:
        record = {"call": method, "time": round(time.time(), 3), **(keep or {})}
        try:
            self.unsent_path.parent.mkdir(parents=True, exist_ok=True)
            with self.unsent_path.open("a") as f:
                f.write(redact(json.dumps(record, default=str)) + "\n")
        except OSError as e:  # a full disk: the count still says something was lost
            log.debug("MLflow: %s not written (%s)", self.unsent_path, e)
        self.unsent += 1

    def summary(self) -> dict:
        return {"unsent": self.unsent, "unsent_file": str(self.unsent_path) if self.unsent else None,
                "failure": self.failure}
