"""A sweep read back from MLflow: the parent's child runs as the rows ``scripts/sweep_report.py``
tabulates (the same rows ``bench.report.load_sweep`` reads from the job folders)."""

from __future__ import annotations

import json
from pathlib import Path

from cocodet.tracking.sweep import PARENT_FILE


def parent_of(sweep_dir: Path) -> str:
    """The parent run id the sweep's callback wrote in ``sweep_dir``."""
    path = Path(sweep_dir) / PARENT_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: was the sweep run with logger=mlflow? (python train.py -m logger=mlflow ...)"
        )
    return json.loads(path.read_text())["run_id"]


def load_sweep_runs(parent_id: str, tracking_uri: str) -> list[dict]:
    """One row per child run of ``parent_id``: its metrics, status, job number and overrides."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    parent = client.get_run(parent_id)
    children = client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'", max_results=10000
    )
    rows = []
    for run in children:
        tags = run.data.tags
        row = {
            **run.data.metrics,
            "job": tags.get("cocodet.job", run.info.run_name),
            "status": tags.get("cocodet.status"),
            "overrides": tags.get("cocodet.overrides", ""),
            "run_id": run.info.run_id,
        }
        for key in ("num_workers", "prefetch_factor", "batch_size", "batches"):
            if key in row:
                row[key] = int(row[key])
        rows.append(row)
    if not rows:
        raise FileNotFoundError(f"parent run {parent_id} has no child runs in {tracking_uri}")
    rows.sort(key=lambda r: (len(str(r["job"])), str(r["job"])))
    common = set.intersection(*(set(r["overrides"].split()) for r in rows))
    for r in rows:
        r["overrides"] = " ".join(o for o in r["overrides"].split() if o not in common)
    return rows
