"""``logger=mlflow``: a Lightning logger that records a training run in MLflow (rank 0 only).

Built from ``conf/logger/mlflow.yaml`` beside CSV and TensorBoard. ``modes/wiring.py`` hands it
the parameters, tags, sweep parent and resumed run id before ``fit``; ``modes/train.py`` closes it
with the run's summary (``close_tracking``), so the run's status, its artifacts and the
``mlflow`` block of ``summary.json`` agree. Lightning's own ``finalize`` ends nothing: it calls
every exception "failed", a SIGTERM included.
"""

from __future__ import annotations

import json
import signal
import threading
from contextlib import contextmanager
from pathlib import Path

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers.logger import Logger, rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only

from cocodet.credentials import redact
from cocodet.tracking.guard import GuardedClient, bound_requests
from cocodet.tracking.run_record import end_tags
from cocodet.tracking.store import artifact_root
from cocodet.tracking.tracked_run import TrackedRun
from cocodet.tracking.unsent import UNSENT_NAME

CHECKPOINT_KEY = "mlflow_run_id"


class MlflowLogger(Logger):
    """Args (``logger.mlflow.*``): tracking_uri (a server, or ``sqlite:///<absolute path>``),
    experiment_name, run_name (None: the run folder's name), log_model (the best checkpoint as an
    artifact), run_dir (where mlflow_unsent.jsonl goes), request_timeout_s and
    request_max_retries (each request's bound unless MLFLOW_HTTP_REQUEST_* are set),
    close_end_within_s (the last calls' budget at a run's end: tags, texts, the status, and calls
    held from an outage; long enough for a server restart), close_within_s (the same budget after
    a SIGTERM, which must fit the grace period), artifacts_within_s (the artifact uploads'
    budget, after the status: a checkpoint is large)."""

    def __init__(
        self,
        tracking_uri: str,
        experiment_name: str = "cocodet",
        run_name: str | None = None,
        log_model: bool = False,
        run_dir: str = ".",
        request_timeout_s: int = 5,
        request_max_retries: int = 1,
        close_within_s: float = 5.0,
        artifacts_within_s: float = 60.0,
        close_end_within_s: float = 60.0,
    ):
        super().__init__()
        bound_requests(request_timeout_s, request_max_retries)
        self.run_dir = Path(run_dir)
        self.log_model, self.close_within_s = bool(log_model), float(close_within_s)
        self.artifacts_within_s, self.close_end_within_s = float(artifacts_within_s), float(close_end_within_s)
        self.run_name = run_name or self.run_dir.name
        guard = GuardedClient(tracking_uri, self.run_dir / UNSENT_NAME)
        self.tracked = TrackedRun(guard, experiment_name, artifact_root(tracking_uri))
        self.start_args: dict = {"params": {}, "tags": {}}
        self.best_path: str | None = None
        self._started = False

    def prepare(self, params: dict, tags: dict, parent_id: str | None, resume_id: str | None) -> None:
        """What the run starts with (wiring, before fit)."""
        self.start_args = {"params": params, "tags": tags, "parent_id": parent_id, "resume_id": resume_id}

    @property
    def name(self) -> str:
        return self.tracked.experiment_name

    @property
    def version(self) -> str | None:
        return self.tracked.run_id

    @property
    @rank_zero_experiment
    def experiment(self) -> TrackedRun:
        self._ensure_started()
        return self.tracked

    def _ensure_started(self) -> None:
        if not self._started:
            self._started = True
            self.tracked.start(self.run_name, **self.start_args)

    @rank_zero_only
    def log_hyperparams(self, params, *args, **kwargs) -> None:
        self._ensure_started()  # the resolved config was logged at start; Lightning's hparams add nothing

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self._ensure_started()
        self.tracked.log_metrics({k: float(v) for k, v in metrics.items()}, int(step or 0))

    def after_save_checkpoint(self, checkpoint_callback) -> None:
        if getattr(checkpoint_callback, "monitor", None) and checkpoint_callback.best_model_path:
            self.best_path = checkpoint_callback.best_model_path

    @rank_zero_only
    def close(self, summary: dict, artifacts: list[Path], plan_table: str) -> dict:
        """End the run with the summary's status: tags, texts and the status within
        ``close_end_within_s`` (``close_within_s`` after a SIGTERM: what a preemption's grace
        allows), then the artifact files within ``artifacts_within_s``. Returns the ``mlflow``
        block of the summary."""
        self._ensure_started()
        run = self.tracked
        signalled = summary.get("status") in ("preempted", "interrupted")
        key = "close_within_s" if signalled else "close_end_within_s"
        with self._sigterm_cuts_the_wait():  # around the waits, which run as each closing block ends
            with run.guard.closing(getattr(self, key), f"logger.mlflow.{key}"):
                run.set_tags(end_tags(summary))
                if plan_table:
                    run.log_text(plan_table + "\n", "loader_plan.txt")
                # summary.json as the run folder gets it, with the count of calls not sent so far
                # (without "ended": the status is sent after this record)
                record = {**summary, "mlflow": {k: v for k, v in run.summary().items() if k != "ended"}}
                run.log_text(redact(json.dumps(record, default=str)) + "\n", "summary.json")
                run.end(str(summary.get("status")))
            with run.guard.closing(self.artifacts_within_s, "logger.mlflow.artifacts_within_s", uploads=True):
                for path in artifacts:
                    run.log_file(path)
                # a checkpoint in a bucket stays there: a tag of the run names it (run_record.end_tags)
                if self.log_model and self.best_path and "://" not in self.best_path and Path(self.best_path).is_file():
                    run.log_file(self.best_path, "checkpoints")
        run.guard.finish()
        return run.summary()

    @contextmanager
    def _sigterm_cuts_the_wait(self):
        """While the closing calls wait for a server (up to ``close_end_within_s``), a SIGTERM
        (``docker stop``'s grace) cuts what is left to ``close_within_s`` instead of killing
        the process before its summary is written. Main thread only, where signals are handled."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        guard = self.tracked.guard
        previous = signal.signal(
            signal.SIGTERM, lambda *_: guard.cut_to(self.close_within_s, "logger.mlflow.close_within_s")
        )
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)

    def finalize(self, status: str) -> None:
        """Nothing: ``close`` ends the run, once the summary says how it ended."""


class RunIdInCheckpoint(Callback):
    """Writes the MLflow run id into every checkpoint, so a resume (``ckpt_path=last`` too, when
    Hydra made a new folder) continues the same MLflow run."""

    def __init__(self, logger: MlflowLogger):
        self.logger = logger

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        if self.logger.version is not None:
            checkpoint[CHECKPOINT_KEY] = self.logger.version
