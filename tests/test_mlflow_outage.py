"""logger=mlflow (issue #59): a -m sweep is one parent run with a child per job, with either
launcher's local form; with no server the runs go to the checkout's SQLite store, which the
README's `mlflow ui` lists. (A server killed mid-run: test_mlflow_runs.py, beside the run it is
timed against; a server down from the start: test_mlflow_guard.py.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, synthetic_overrides
from mlflow_server import MlflowServer
from moto_store import free_port

pytestmark = pytest.mark.slow

def bench_args(root: Path, *extra: str) -> list[str]:
    return ["mode=bench", *synthetic_overrides(root), "logger=mlflow", "bench.batches=6", "bench.warmup=1",
            "bench.decode_probe=4", *extra]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = MlflowServer(tmp_path_factory.mktemp("mlflow_server")).start()
    yield srv
    srv.stop()


# local_parallel is conf/hydra/launcher's joblib launcher; submitit_local runs jobs the way the
# slurm launcher does (submitit's pickled job in a process of its own), without SLURM.
@pytest.mark.parametrize("launcher", ["local_parallel", "submitit_local"])
def test_a_sweep_is_one_parent_with_a_child_per_job(synthetic_root, tmp_path, launcher, server):
    sweep_dir = tmp_path / "sweep"
    cmd = [sys.executable, str(REPO / "train.py"), "-m", *bench_args(synthetic_root), "loader.num_workers=0,1",
           f"hydra/launcher={launcher}", f"hydra.sweep.dir={sweep_dir}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "MLFLOW_TRACKING_URI": server.uri})
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = server.client()
    parent_id = json.loads((sweep_dir / "mlflow_parent.json").read_text())["run_id"]
    parent = client.get_run(parent_id)
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'")
    assert parent.info.status == "FINISHED" and parent.info.run_name == str(sweep_dir)
    assert sorted(c.data.tags["cocodet.job"] for c in children) == ["0", "1"]
    assert {c.info.status for c in children} == {"FINISHED"}
    assert sorted(c.data.params["loader.num_workers"] for c in children) == ["0", "1"]
    if launcher != "local_parallel":
        return
    report = subprocess.run([sys.executable, str(REPO / "scripts" / "sweep_report.py"), str(sweep_dir), "--mlflow"],
                            capture_output=True, text=True, timeout=300, env={**os.environ, "MLFLOW_TRACKING_URI": server.uri})
    assert report.returncode == 0, report.stderr[-2000:]
    rows = [ln for ln in report.stdout.splitlines() if re.match(r"\| [01] \|", ln)]
    assert [r.split("|")[2].strip() for r in rows] == ["loader.num_workers=0", "loader.num_workers=1"]


def test_without_a_server_runs_go_to_the_checkouts_sqlite_store_that_mlflow_ui_lists(synthetic_root, tmp_path):
    checkout = tmp_path / "checkout"  # the program's files, so that its mlflow.db is not the real checkout's
    checkout.mkdir()
    for name in ("train.py", "conf"):
        (checkout / name).symlink_to(REPO / name)
    root = tmp_path / "data"  # one truncated image: a bad sample, so bad_samples.jsonl is an artifact
    shutil.copytree(synthetic_root, root)
    victim = sorted((root / "train").iterdir())[0]
    victim.write_bytes(victim.read_bytes()[:200])
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "COCODET_MLFLOW_DB")}
    proc = subprocess.run([sys.executable, "train.py", *bench_args(root), "dataset.on_bad_sample=skip",
                           "bench.batches=null", "hydra.run.dir=outputs/bench"],
                          cwd=checkout, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["mlflow"]["tracking_uri"] == f"sqlite:///{checkout}/mlflow.db" and summary["mlflow"]["unsent"] == 0
    readme = (REPO / "README.md").read_text()
    command = re.search(r"^(mlflow ui --backend-store-uri \S+)$", readme, re.M).group(1)
    port = free_port()
    path = f"{Path(sys.executable).parent}:{env['PATH']}"  # the venv's `mlflow`, as after `source .venv/bin/activate`
    ui = subprocess.Popen(["bash", "-c", f"exec {command} --host 127.0.0.1 --port {port} --workers 1"], cwd=checkout,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                          env={**env, "PATH": path})
    server = MlflowServer(tmp_path / "ui", port=port)
    server.proc = ui
    try:
        server.wait_until_it_answers()
        client = server.client()
        experiment = client.get_experiment_by_name("cocodet")
        runs = client.search_runs([experiment.experiment_id])
        assert [r.info.run_id for r in runs] == [summary["mlflow"]["run_id"]]
        assert runs[0].data.metrics["examples_per_s"] == summary["examples_per_s"]
        assert runs[0].data.tags["cocodet.batch_digest"] == summary["batch_digest"]
        artifacts = {a.path for a in client.list_artifacts(runs[0].info.run_id)}
        assert artifacts == {"summary.json", "loader_plan.txt", "bad_samples.jsonl"}
    finally:
        server.stop()
