"""One MLflow run through a :class:`GuardedClient`: start (or reopen), metrics, tags, artifacts, end.

Shared by training (``lightning_logger``) and ``mode=bench`` (no Trainer). Each (metric, step)
is sent at most once: a reopened run first reads the last step of each metric it already holds,
so the steps a resumed run trains again (after a SIGKILL, since the last step checkpoint) keep
the values the first attempt logged, which the same stream produced.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from cocodet.credentials import redact
from cocodet.tracking.guard import GuardedClient
from cocodet.tracking.run_record import MLFLOW_STATUS, PARAM_BATCH

log = logging.getLogger(__name__)


class TrackedRun:
    def __init__(self, guard: GuardedClient, experiment_name: str, artifact_root: str | None = None):
        self.guard, self.experiment_name, self.artifact_root = guard, experiment_name, artifact_root
        self.run_id: str | None = None
        self.resumed = False
        self.end_called = False
        self.last_step: dict[str, int] = {}  # metric -> the last step sent (or held by the reopened run)

    def start(
        self,
        run_name: str,
        params: dict[str, str],
        tags: dict[str, str],
        parent_id: str | None = None,
        resume_id: str | None = None,
    ) -> None:
        """Reopen ``resume_id`` (parameters untouched: MLflow refuses a changed value, and a
        resumed command differs in ckpt_path and output_dir), or create a run and log ``params``."""
        if resume_id and self._reopen(resume_id, tags):
            return
        experiment_id = self._experiment_id()
        if parent_id:
            tags = {**tags, "mlflow.parentRunId": parent_id}
        run = self.guard.call(
            "create_run",
            experiment_id,
            run_name=run_name,
            tags=tags,
            keep={"experiment": self.experiment_name, "run_name": run_name, "tags": tags, "params": params},
        )
        if run is None:
            return
        self.run_id = run.info.run_id
        items = sorted(params.items())
        from mlflow.entities import Param

        for i in range(0, len(items), PARAM_BATCH):
            chunk = items[i : i + PARAM_BATCH]
            self.guard.call(
                "log_batch",
                self.run_id,
                params=[Param(k, v) for k, v in chunk],
                keep={"run_id": self.run_id, "params": dict(chunk)},
            )

    def _reopen(self, run_id: str, tags: dict[str, str]) -> bool:
        run = self.guard.call(
            "get_run", run_id, keep={"run_id": run_id, "reopen": True}, answers=("RESOURCE_DOES_NOT_EXIST",)
        )
        if run is None and not self.guard.alive:  # down: keep the id, so the next checkpoint still names it
            self.run_id = run_id
            return True
        if run is None:
            log.warning(
                "MLflow: run %s named in the checkpoint is not in %s; starting a new run",
                run_id,
                redact(self.guard.tracking_uri),
            )
            return False
        self.run_id, self.resumed = run_id, True
        for key in run.data.metrics:
            history = self.guard.call("get_metric_history", run_id, key) or []
            if history:
                self.last_step[key] = max(m.step for m in history)
        self.guard.call("update_run", run_id, status="RUNNING", keep={"run_id": run_id, "status": "RUNNING"})
        self.set_tags({**tags, "cocodet.resumed": str(int(run.data.tags.get("cocodet.resumed", "0")) + 1)})
        return True

    def _experiment_id(self) -> str | None:
        name = self.experiment_name
        experiment = self.guard.call("get_experiment_by_name", name, keep={"experiment": name})
        if experiment is not None:
            return experiment.experiment_id
        if not self.guard.alive:
            return None
        kwargs = {"artifact_location": self.artifact_root} if self.artifact_root else {}
        created = self.guard.call(
            "create_experiment", name, **kwargs, keep={"experiment": name}, answers=("RESOURCE_ALREADY_EXISTS",)
        )
        if created is None and self.guard.alive:  # created meanwhile by another job of the sweep
            experiment = self.guard.call("get_experiment_by_name", name, keep={"experiment": name})
            return experiment.experiment_id if experiment else None
        return created

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Send the metrics not yet sent at ``step`` (each (key, step) at most once)."""
        fresh = {k: float(v) for k, v in metrics.items() if step > self.last_step.get(k, -1)}
        if not fresh:
            return
        for key in fresh:
            self.last_step[key] = step
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.guard.call(
            "log_batch",
            self.run_id,
            metrics=[Metric(k, v, now, step) for k, v in fresh.items()],
            keep={"run_id": self.run_id, "step": step, "metrics": fresh},
        )

    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self.guard.call(
            "log_batch",
            self.run_id,
            tags=[RunTag(k, str(v)) for k, v in tags.items()],
            keep={"run_id": self.run_id, "tags": tags},
        )

    def log_text(self, text: str, name: str) -> None:
        self.guard.call(
            "log_text", self.run_id, text, name, keep={"run_id": self.run_id, "artifact": name, "text": text}
        )

    def log_file(self, path: str | Path, folder: str | None = None) -> None:
        self.guard.call(
            "log_artifact",
            self.run_id,
            str(path),
            folder,
            keep={"run_id": self.run_id, "artifact": str(Path(path).resolve()), "folder": folder},
        )

    def end(self, status: str) -> None:
        """End the run as the summary ``status`` says (an unknown one, an error: FAILED)."""
        mlflow_status = "KILLED" if status == "interrupted" else MLFLOW_STATUS.get(status, "FAILED")
        self.end_called = True
        self.guard.call(
            "set_terminated", self.run_id, status=mlflow_status, keep={"run_id": self.run_id, "status": mlflow_status}
        )

    def summary(self) -> dict:
        return {
            "run_id": self.run_id,
            "experiment": self.experiment_name,
            "tracking_uri": redact(self.guard.tracking_uri),
            "resumed": self.resumed,
            # the run's status reached the server (sent in time or late); false: it reads RUNNING there
            "ended": self.end_called and not self.guard.holds("set_terminated"),
            **self.guard.summary(),
        }
