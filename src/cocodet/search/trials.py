"""The study's trials across launchers: who is alive, what counts, what is asked again.

Each running trial carries its launcher's host and pid and a heartbeat (a time stamp in its user
attributes, renewed every ``heartbeat_s`` by a thread of the launcher that runs it). A RUNNING
trial is stale when its heartbeat is older than ``STALE_BEATS`` beats, or at once when its
launcher ran on this host and that process is gone: a launcher that was killed. A stale trial
is failed (``failure: stale``) and its parameters are enqueued again, so that they are asked
again; the storage's own state change lets only one launcher do it. Works the same on every
storage (SQLite, a journal file, a database server).

``n_trials`` counts the study's finished trials: completed ones and those that failed for a
reason of their own (a refused setting, a loader failure, a diverged run), not the stale ones
asked again.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

log = logging.getLogger(__name__)

STALE_BEATS = 3
HOST, PID, BEAT, FAILURE = "launcher_host", "launcher_pid", "heartbeat", "failure"
STALE = "stale: its launcher stopped beating (killed, or its host lost)"
SURPLUS = "surplus: the study held its n_trials when this trial was asked (another launcher asked at the same moment)"


class Heartbeat:
    """Stamps ``trial_ids`` every ``interval_s`` while the block runs."""

    def __init__(self, storage, trial_ids: list[int], interval_s: float):
        self.storage, self.trial_ids, self.interval_s = storage, trial_ids, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="cocodet-study-heartbeat")

    def __enter__(self) -> Heartbeat:
        for trial_id in self.trial_ids:
            self.storage.set_trial_user_attr(trial_id, HOST, socket.gethostname())
            self.storage.set_trial_user_attr(trial_id, PID, os.getpid())
        self._stamp()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._stamp()
            except Exception as e:  # noqa: BLE001 - a storage hiccup: the next beat tries again
                log.warning("study: heartbeat not recorded (%s)", " ".join(str(e).split())[:200])

    def _stamp(self) -> None:
        for trial_id in self.trial_ids:
            self.storage.set_trial_user_attr(trial_id, BEAT, time.time())


def is_stale(trial, interval_s: float, now: float | None = None) -> bool:
    attrs = trial.user_attrs
    beat = attrs.get(BEAT)
    if attrs.get(HOST) == socket.gethostname() and attrs.get(PID) is not None and not _alive(int(attrs[PID])):
        return True
    started = beat if beat is not None else (trial.datetime_start.timestamp() if trial.datetime_start else None)
    return started is not None and (now or time.time()) - started > STALE_BEATS * interval_s


def fail_stale(study, storage, interval_s: float) -> int:
    """Fail the study's stale RUNNING trials and ask their parameters again; how many.
    ``storage``: the study's storage object (its state change is the arbiter between launchers)."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    failed = 0
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not is_stale(trial, interval_s):
            continue
        try:
            storage.set_trial_user_attr(trial._trial_id, FAILURE, STALE)
            if not storage.set_trial_state_values(trial._trial_id, TrialState.FAIL):
                continue
        except UpdateFinishedTrialError:
            continue  # another launcher failed it first
        study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
        log.warning(
            "study: trial %d was left running by a launcher that stopped; its parameters are asked again", trial.number
        )
        failed += 1
    return failed


def counted(trial) -> bool:
    """A finished trial that counts towards ``n_trials`` (stale ones are asked again)."""
    from optuna.trial import TrialState

    return trial.state == TrialState.COMPLETE or (
        trial.state == TrialState.FAIL and trial.user_attrs.get(FAILURE) not in (STALE, SURPLUS)
    )


def tally(study) -> tuple[int, int]:
    """(finished trials that count, trials running). Waiting ones (asked again) are not in
    flight: the next ask takes them first."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    return sum(counted(t) for t in trials), sum(t.state == TrialState.RUNNING for t in trials)


def surplus(study, number: int, n_trials: int) -> bool:
    """Whether trial ``number``, just asked, is beyond ``n_trials``: two launchers that tallied
    the study at the same moment may both ask its last trial; the later number gives way."""
    from optuna.trial import TrialState

    before = [t for t in study.get_trials(deepcopy=False) if t.number < number]
    return sum(counted(t) or t.state == TrialState.RUNNING for t in before) >= n_trials


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
