"""logger=mlflow with no server named (issue #59): the runs go to the checkout's SQLite store,
which the README's `mlflow ui` lists; a -m sweep there is one parent run with a child per job,
all of them writing the one file at once. (Sweeps to a server, a server killed mid-run:
test_mlflow_runs.py; a server down from the start: test_mlflow_guard.py.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from mlflow_server import MlflowServer
from mlflow_sweep import children_of, run_sweep
from moto_store import free_port

pytestmark = pytest.mark.slow


def test_without_a_server_a_sweep_goes_to_the_checkouts_sqlite_store_that_mlflow_ui_lists(synthetic_root, tmp_path):
    """local_parallel (joblib): both jobs and the parent write one SQLite file at once."""
    checkout = tmp_path / "checkout"  # the program's files, so that its mlflow.db is not the real checkout's
    checkout.mkdir()
    for name in ("train.py", "conf"):
        (checkout / name).symlink_to(REPO / name)
    root = tmp_path / "data"  # one truncated image: a bad sample, so each job sends bad_samples.jsonl
    shutil.copytree(synthetic_root, root)
    victim = sorted((root / "train").iterdir())[0]
    victim.write_bytes(victim.read_bytes()[:200])
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "COCODET_MLFLOW_DB")}
    sweep_dir = tmp_path / "sweep"
    run_sweep(root, sweep_dir, "local_parallel", checkout, env, "dataset.on_bad_sample=skip")
    summaries = [json.loads((sweep_dir / job / "summary.json").read_text()) for job in ("0", "1")]
    assert {s["mlflow"]["tracking_uri"] for s in summaries} == {f"sqlite:///{checkout}/mlflow.db"}
    assert [s["mlflow"]["unsent"] for s in summaries] == [0, 0]
    readme = (REPO / "README.md").read_text()
    command = re.search(r"^(mlflow ui --backend-store-uri \S+)$", readme, re.M).group(1)
    port = free_port()
    path = f"{Path(sys.executable).parent}:{env['PATH']}"  # the venv's `mlflow`, as after `source .venv/bin/activate`
    ui = subprocess.Popen(
        ["bash", "-c", f"exec {command} --host 127.0.0.1 --port {port} --workers 1"],
        cwd=checkout,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**env, "PATH": path},
    )
    server = MlflowServer(tmp_path / "ui", port=port)
    server.proc = ui
    try:
        server.wait_until_it_answers()
        client = server.client()
        by_id = {c.info.run_id: c for c in children_of(client, sweep_dir)}
        assert sorted(by_id) == sorted(s["mlflow"]["run_id"] for s in summaries)
        for summary in summaries:
            run = by_id[summary["mlflow"]["run_id"]]
            assert run.data.metrics["examples_per_s"] == summary["examples_per_s"]
            assert run.data.tags["cocodet.batch_digest"] == summary["batch_digest"]
            artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
            assert artifacts == {"summary.json", "loader_plan.txt", "bad_samples.jsonl"}
    finally:
        server.stop()
    # the sweep read back from the store its parent file names (no variable, no --tracking-uri)
    report = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "sweep_report.py"), str(sweep_dir), "--mlflow"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert report.returncode == 0, report.stderr[-2000:]
    rows = [ln for ln in report.stdout.splitlines() if re.match(r"\| [01] \|", ln)]
    assert [r.split("|")[2].strip() for r in rows] == ["loader.num_workers=0", "loader.num_workers=1"]
