"""Helpers for the -m sweep tests of logger=mlflow (test_mlflow_runs.py to a server,
test_mlflow_default_store.py to the checkout's SQLite file): a 2-job bench sweep, and its parent
and children read back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import synthetic_overrides


def bench_args(root: Path, *extra: str) -> list[str]:
    return [
        "mode=bench",
        *synthetic_overrides(root),
        "logger=mlflow",
        "bench.batches=6",
        "bench.warmup=1",
        "bench.decode_probe=4",
        *extra,
    ]


def run_sweep(root: Path, sweep_dir: Path, launcher: str, cwd: Path, env: dict, *extra: str) -> None:
    """A 2-job -m bench sweep (loader.num_workers=0,1) with ``launcher``, run from ``cwd``."""
    cmd = [
        sys.executable,
        "train.py",
        "-m",
        *bench_args(root, *extra),
        "loader.num_workers=0,1",
        f"hydra/launcher={launcher}",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]


def children_of(client, sweep_dir: Path) -> list:
    """The sweep's child runs, after checking its parent (named after the sweep, FINISHED) and
    that they are one FINISHED run per job."""
    parent_id = json.loads((sweep_dir / "mlflow_parent.json").read_text())["run_id"]
    parent = client.get_run(parent_id)
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'")
    assert parent.info.status == "FINISHED" and parent.info.run_name == str(sweep_dir)
    assert sorted(c.data.tags["cocodet.job"] for c in children) == ["0", "1"]
    assert {c.info.status for c in children} == {"FINISHED"}
    assert sorted(c.data.params["loader.num_workers"] for c in children) == ["0", "1"]
    return children
