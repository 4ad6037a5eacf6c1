"""The attempts of one run, in its folder (``attempts.json``, written by rank 0): when each began,
the step it resumed from, the furthest step it reached, and how it ended. The summary's
``attempts`` comes from it: how many times the run was restarted and how many steps the
restarts trained again.

An attempt that began after one that never ended (a SIGKILL, a lost node, a crash: no summary
was written) is a restart, whoever started it: torchrun's ``--max-restarts``, a Job's new pod,
a user's second command. Its steps redone are the steps the one before had reached past the
checkpoint this one resumed from (at most ``checkpoint.every_n_steps``). An attempt after one
that ended (``preempted``, ``interrupted``, a stop) is a resume, not a restart.

``steps_redone`` needs the step a killed attempt reached, to the step: any step may be the
last. The ledger itself (a few hundred bytes, written atomically: a temporary file renamed into
place) is written when an attempt starts, at each checkpoint and at the end; the step reached
goes, at every step, into ``attempts.step`` beside it: one fixed-width record rewritten in place
by a single ``pwrite`` on a file kept open (no rename, no JSON, no new file), which outlives a
SIGKILL of the process as any written page does. Where the checkpoints are kept off this machine
(a bucket: ``checkpoint.dir``), the ledger is copied beside them at each checkpoint, and a run
resumed on a machine without the ledger starts from that copy (its killed attempt's step is then
the one of its last checkpoint: the steps redone are counted from there).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import lightning as L

from cocodet.models.checkpoint_store import copy_record, restore_record

log = logging.getLogger(__name__)

FILENAME = "attempts.json"
STEP_FILENAME = "attempts.step"
STEP_RECORD = "{attempt:>10} {step:>20}\n"  # fixed width: each pwrite replaces the whole record


class AttemptLedger(L.Callback):
    def __init__(self, run_dir: str | Path, checkpoint_dir: str | None = None):
        self.path = Path(run_dir) / FILENAME
        self.checkpoint_dir = checkpoint_dir  # a copy beside the checkpoints when they are kept elsewhere
        self.attempts: list[dict] = []
        self.unwritten = False  # a write failed (warned once)
        self._step_fd: int | None = None  # attempts.step, open for this attempt's records

    def on_train_start(self, trainer, pl_module):
        if not trainer.is_global_zero:
            return
        if not self.path.exists():  # a run resumed on another machine: the copy beside its checkpoints
            restore_record(self.path, self.checkpoint_dir)
        self.attempts = read_attempts(self.path)
        before = self.attempts[-1] if self.attempts else None
        restart = before is not None and before.get("ended") is None
        step = int(trainer.global_step)
        self.attempts.append(
            {
                "attempt": len(self.attempts),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "resumed_step": step,
                "reached_step": step,
                "restart": restart,
                "steps_redone": max(0, int(before["reached_step"]) - step) if restart else 0,
                "ended": None,
            }
        )
        self._close_step()  # on_train_start again (another fit in this process): a fresh record
        try:  # truncated before the ledger names this attempt: no older record is ever read as its
            self._step_fd = os.open(self.path.with_name(STEP_FILENAME), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError:
            self._step_fd = None  # the ledger's own write warns about the disk
        self._write()
        self._write_step()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.attempts and trainer.is_global_zero and trainer.global_step > self.attempts[-1]["reached_step"]:
            self.attempts[-1]["reached_step"] = int(trainer.global_step)
            self._write_step()

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        if self.attempts and trainer.is_global_zero:
            self._write()
            copy_record(self.path, self.checkpoint_dir)  # beside the checkpoints, when those are kept elsewhere

    def close(self, status: str) -> dict | None:
        """Record how this attempt ended; the summary's ``attempts`` (rank 0; None elsewhere)."""
        if not self.attempts:
            return None
        self.attempts[-1]["ended"] = status
        self._write()
        copy_record(self.path, self.checkpoint_dir)
        self._close_step()
        return summarize(self.attempts)

    def teardown(self, trainer, pl_module, stage):
        self._close_step()  # a fit that ended in an error never reaches close(): its fd too

    def _close_step(self) -> None:
        if self._step_fd is not None:
            os.close(self._step_fd)
            self._step_fd = None

    def _write_step(self) -> None:
        if self._step_fd is None:
            return
        last = self.attempts[-1]
        record = STEP_RECORD.format(attempt=last["attempt"], step=last["reached_step"]).encode()
        try:
            os.pwrite(self._step_fd, record, 0)
        except OSError:
            pass  # bookkeeping never stops a run; the ledger's own write warns once about the disk

    def _write(self) -> None:
        """Bookkeeping never stops a run: a full disk is the checkpoints' to report (``disk_full``)."""
        temporary = self.path.with_name(f".{FILENAME}.{os.getpid()}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary.write_text(json.dumps(self.attempts, indent=1))
            os.replace(temporary, self.path)
        except OSError as e:
            temporary.unlink(missing_ok=True)
            if not self.unwritten:
                log.warning("%s not written (%s): a restart of this run will not be counted", self.path, e)
            self.unwritten = True


def read_attempts(path: Path) -> list[dict]:
    """The ledger's attempts, the last one's ``reached_step`` taken from ``attempts.step`` when
    that record is newer; none for a run without a ledger (or with an unreadable one: a fresh count)."""
    try:
        attempts = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if not (isinstance(attempts, list) and all(isinstance(a, dict) for a in attempts)):
        return []
    try:
        attempt, step = (int(v) for v in path.with_name(STEP_FILENAME).read_text().split())
    except (OSError, ValueError):
        return attempts
    if attempts and attempts[-1].get("attempt") == attempt:
        attempts[-1]["reached_step"] = max(int(attempts[-1].get("reached_step") or 0), step)
    return attempts


def summarize(attempts: list[dict]) -> dict:
    """``{"count", "restarts", "steps_redone", "resumed_steps"}`` of a run's attempts."""
    return {
        "count": len(attempts),
        "restarts": sum(bool(a.get("restart")) for a in attempts),
        "steps_redone": sum(int(a.get("steps_redone") or 0) for a in attempts),
        "resumed_steps": [int(a.get("resumed_step") or 0) for a in attempts],
    }
