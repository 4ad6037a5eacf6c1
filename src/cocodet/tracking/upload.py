"""An MLflow artifact upload bounded as a whole: a checkpoint (100-300 MB) has per-socket
timeouts only, so a slow link could hold the run's end past a preemption's grace period."""

from __future__ import annotations

import threading
import time
from pathlib import Path


class UploadTooSlow(Exception):
    """An artifact upload that did not finish within its bound: not an outage, but not sent."""


def upload_within(client, args: tuple, kwargs: dict, deadline: float | None, uploads_within: float, unsent_path: Path):
    """``client.log_artifact(*args, **kwargs)`` until ``deadline`` (``time.monotonic()``; None:
    no bound); one that does not finish raises :class:`UploadTooSlow` (it is listed in
    ``unsent_path`` and may still finish in the background before the process ends).
    ``uploads_within``: the uploads' budget in seconds, for the message."""
    box: dict = {}

    def upload():
        try:
            box["value"] = client.log_artifact(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - handed to the caller below
            box["error"] = e

    thread = threading.Thread(target=upload, daemon=True, name="cocodet-mlflow-upload")
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()) if deadline is not None else None)
    if thread.is_alive():
        raise UploadTooSlow(
            f"uploading {args[1]} did not finish within logger.mlflow.artifacts_within_s="
            f"{uploads_within:g} s; it is listed in {unsent_path}"
        )
    if "error" in box:
        raise box["error"]
    return box.get("value")
