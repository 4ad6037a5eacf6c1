"""Send a run's ``mlflow_unsent.jsonl`` to its MLflow run, once the server answers again.

    python -m cocodet.tracking replay RUN_DIR [--tracking-uri URI]

The file holds, in call order, every call a run could not send (``tracking/guard.py``): the
run's creation with its parameters and tags when the server was down from the start, metrics
by step, tags, texts, artifact files by path, and the status. Replaying is idempotent: a metric
is sent only for the steps the run does not hold yet, a parameter only if the run lacks it,
tags, texts and artifacts overwrite themselves, and a run created by a replay is noted in the
file (``{"call": "replayed", "run_id": ...}``), so a second replay adds nothing. The server is
``--tracking-uri``, else ``MLFLOW_TRACKING_URI``, else the one the run's ``summary.json``
names; credentials come from the environment, as for a run.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from cocodet.credentials import redact
from cocodet.errors import UserError
from cocodet.tracking.unsent import UNSENT_NAME


def replay(run_dir: str | Path, tracking_uri: str | None = None) -> dict:
    """Replay ``run_dir``'s unsent calls; what was sent, as a dict (one line of JSON on stdout)."""
    from mlflow.tracking import MlflowClient

    run_dir = Path(run_dir)
    path = run_dir / UNSENT_NAME
    if not path.is_file():
        raise UserError(f"{path} does not exist: this run sent every call (or it did not use logger=mlflow)")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or _uri_of(run_dir)
    client = MlflowClient(tracking_uri=uri)
    run_id = next((r["run_id"] for r in records if r.get("run_id")), None)
    sent = {
        "run_id": run_id,
        "tracking_uri": redact(uri),
        "created": False,
        "params": 0,
        "metrics": 0,
        "tags": 0,
        "texts": 0,
        "artifacts": 0,
        "missing_files": [],
        "status": None,
    }
    if run_id is None:
        run_id = _create(client, records)
        sent.update(run_id=run_id, created=True)
        with path.open("a") as f:  # a second replay goes to this run
            f.write(
                json.dumps({"seq": len(records), "call": "replayed", "run_id": run_id, "time": round(time.time(), 3)})
                + "\n"
            )
    _Sender(client, run_id, sent).send(records)
    if sent["status"]:  # last: the run ends as it ended, once everything else is there
        client.set_terminated(run_id, sent["status"])
    return sent


class _Sender:
    """Sends records to one run, skipping what the run already holds; counts into ``sent``."""

    def __init__(self, client, run_id: str, sent: dict):
        self.client, self.run_id, self.sent = client, run_id, sent
        self.params = dict(client.get_run(run_id).data.params)
        self.steps: dict[str, set[int]] = {}  # metric -> the steps the run holds

    def held_steps(self, key: str) -> set[int]:
        if key not in self.steps:
            self.steps[key] = {m.step for m in self.client.get_metric_history(self.run_id, key)}
        return self.steps[key]

    def send(self, records: list[dict]) -> None:
        from mlflow.entities import Param, RunTag

        for r in records:
            call = r["call"]
            fresh_params = {k: v for k, v in (r.get("params") or {}).items() if k not in self.params}
            if fresh_params:
                self.client.log_batch(self.run_id, params=[Param(k, str(v)) for k, v in fresh_params.items()])
                self.params.update(fresh_params)
                self.sent["params"] += len(fresh_params)
            if call == "log_batch" and "metrics" in r:
                self.metrics(r)
            elif call == "log_batch" and "tags" in r:
                self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in r["tags"].items()])
                self.sent["tags"] += len(r["tags"])
            elif call == "log_text" and "text" in r:
                self.client.log_text(self.run_id, r["text"], r["artifact"])
                self.sent["texts"] += 1
            elif call == "log_artifact":
                self.artifact(r)
            elif call == "set_terminated":
                self.sent["status"] = r["status"]

    def metrics(self, r: dict) -> None:
        from mlflow.entities import Metric

        step = int(r["step"])
        fresh = {k: float(v) for k, v in r["metrics"].items() if step not in self.held_steps(k)}
        if fresh:
            stamp = int(r.get("time", time.time()) * 1000)
            self.client.log_batch(self.run_id, metrics=[Metric(k, v, stamp, step) for k, v in fresh.items()])
            for k in fresh:
                self.held_steps(k).add(step)
            self.sent["metrics"] += len(fresh)

    def artifact(self, r: dict) -> None:
        if Path(r["artifact"]).is_file():
            self.client.log_artifact(self.run_id, r["artifact"], r.get("folder"))
            self.sent["artifacts"] += 1
        else:
            self.sent["missing_files"].append(r["artifact"])


def _uri_of(run_dir: Path) -> str:
    try:
        uri = json.loads((run_dir / "summary.json").read_text())["mlflow"]["tracking_uri"]
    except (OSError, ValueError, KeyError, TypeError):
        uri = None
    if not uri or "***" in uri:  # redacted: the user must say where, with the credentials in the environment
        raise UserError(
            f"which MLflow server: {run_dir / 'summary.json'} does not name one that can be used; pass "
            "--tracking-uri URI or set MLFLOW_TRACKING_URI"
        )
    return uri


def _create(client, records: list[dict]) -> str:
    """The run the server never saw: its experiment (created if missing), name and tags."""
    create = next((r for r in records if r["call"] == "create_run"), None)
    if create is None:
        raise UserError("the unsent calls name no run and hold no run creation: nothing to replay them into")
    name = create.get("experiment") or "cocodet"
    experiment = client.get_experiment_by_name(name)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
    run = client.create_run(experiment_id, run_name=create.get("run_name"), tags=create.get("tags") or {})
    return run.info.run_id
