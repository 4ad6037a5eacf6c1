"""The file of MLflow calls a run did not send (``<run>/mlflow_unsent.jsonl``): one JSON object per
call, in call order, credentials redacted; what ``python -m cocodet.tracking replay RUN_DIR``
sends later (``tracking/replay.py``)."""

from __future__ import annotations

import json
import logging
import os
import shlex
import time
from pathlib import Path

from cocodet.credentials import redact

log = logging.getLogger(__name__)

UNSENT_NAME = "mlflow_unsent.jsonl"


class UnsentCalls:
    """The calls not sent so far: each is appended to ``path`` when it is held back (so a killed
    run still leaves them), and the file is rewritten at the end without those sent late."""

    def __init__(self, path: Path):
        self.path = path
        self._records: list[dict] = []  # every call written to path, with its "seq"
        self._sent: set[int] = set()  # seqs of held calls sent since

    @property
    def count(self) -> int:
        return sum(1 for r in self._records if r["seq"] not in self._sent)

    def add(self, method: str, keep: dict | None) -> int:
        """Append the call (``keep``: what it carried, JSON-able); its sequence number."""
        seq = len(self._records)
        record = {"seq": seq, "call": method, "time": round(time.time(), 3), **(keep or {})}
        self._records.append(record)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(redact(json.dumps(record, default=str)) + "\n")
        except OSError as e:  # a full disk: the count still says something was not sent
            log.debug("MLflow: %s not written (%s)", self.path, e)
        return seq

    def holds(self, call: str) -> bool:
        """Whether a ``call`` (an MLflow method's name) is among the calls not sent."""
        return any(r["call"] == call and r["seq"] not in self._sent for r in self._records)

    def sent(self, seq: int) -> None:
        self._sent.add(seq)

    def rewrite(self) -> None:
        """The file holds exactly the calls not sent (removed when every one was sent late)."""
        if not self._records:
            return
        left = [r for r in self._records if r["seq"] not in self._sent]
        try:
            if left:
                tmp = self.path.with_name(self.path.name + ".tmp")
                tmp.write_text("".join(redact(json.dumps(r, default=str)) + "\n" for r in left))
                os.replace(tmp, self.path)
            else:
                self.path.unlink(missing_ok=True)
        except OSError as e:
            log.debug("MLflow: %s not rewritten (%s)", self.path, e)


def unsent_line(block: dict | None) -> str | None:
    """The last line a run whose calls were left unsent prints to stderr (None when none were):
    how many, where they were to go, what the run reads there, and the command that sends them
    (``block``: the summary's ``mlflow`` block; the command names the unsent file's folder)."""
    if not block or not block.get("unsent"):
        return None
    if not block.get("run_id"):
        where = "the run was never created there (the replay creates it)"
    elif not block.get("ended"):
        where = f"run {block['run_id']} is still RUNNING there"
    else:
        where = f"run {block['run_id']} ended there without them"
    folder = Path(block["unsent_file"]).parent if block.get("unsent_file") else Path(".")
    return (
        f"MLflow: {block['unsent']} calls were not sent to {block.get('tracking_uri')} (listed in "
        f"{block.get('unsent_file')}); {where}; send them with: python -m cocodet.tracking replay "
        f"{shlex.quote(str(folder))}"
    )
