"""``mode=bench`` with ``logger=mlflow``: one MLflow run of the bench's figures, through
``MlflowClient`` (a bench builds no Trainer): examples_per_s, the wait/work split and the rest
of the summary's numbers as metrics at step 0, ``batch_digest`` as a tag, the plan, the summary
and a non-empty bad_samples.jsonl as artifacts."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig

from cocodet.credentials import redact
from cocodet.datasets.bad_samples import JSONL_NAME as BAD_SAMPLES_FILE
from cocodet.tracking.guard import GuardedClient, bound_requests
from cocodet.tracking.run_record import end_tags, flat_params, start_tags, summary_metrics
from cocodet.tracking.store import artifact_root, checkout_dir
from cocodet.tracking.sweep import sweep_parent_id
from cocodet.tracking.tracked_run import TrackedRun
from cocodet.tracking.unsent import UNSENT_NAME


def track_bench(cfg: DictConfig, plan, summary: dict, run_dir: Path) -> dict:
    """Record a finished bench; the summary's ``mlflow`` block."""
    options = cfg.logger.mlflow
    uri = str(options.tracking_uri)
    bound_requests(int(options.request_timeout_s), int(options.request_max_retries))
    run = TrackedRun(GuardedClient(uri, run_dir / UNSENT_NAME), str(options.experiment_name), artifact_root(uri))
    run.start(
        str(options.run_name or run_dir.name),
        flat_params(cfg),
        start_tags(cfg, plan, Path(checkout_dir())),
        parent_id=sweep_parent_id(),
    )
    # A bench ends on its own, never by a SIGTERM's grace: its calls may wait for a server restart
    with run.guard.closing(float(options.close_end_within_s), "logger.mlflow.close_end_within_s"):
        run.log_metrics(summary_metrics(summary), step=0)
        run.set_tags(end_tags({"status": "completed", **summary}))
        run.log_text(plan.table() + "\n", "loader_plan.txt")
        bad_samples = run_dir / BAD_SAMPLES_FILE
        if bad_samples.is_file() and bad_samples.stat().st_size > 0:
            run.log_file(bad_samples)
        run.log_text(redact(json.dumps({**summary, "mlflow": run.summary()}, default=str)) + "\n", "summary.json")
        run.end("completed")
    run.guard.finish()
    return run.summary()
