"""logger=mlflow against a real tracking server (issue #59), one for the module: what a training
run records, read back with MlflowClient; no credential anywhere; SIGTERM and resume continue one
MLflow run; a -m sweep is a parent with a child per job; the first run again with its server
killed mid-way, timed against it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import NARROW_MODEL, REPO, run_train
from mlflow_server import MlflowServer
from mlflow_sweep import children_of, run_sweep

from cocodet.models.evaluation import ALL_STAT_NAMES

pytestmark = pytest.mark.slow

USER, PASSWORD, URI_PASSWORD = "cocouser", "Pw-7f3e91-distinctive", "Uri-2c8d44-distinctive"
STEPS = 4  # 2 epochs x limit_train_batches 2
LOG_EVERY = 2


def args(coco_tiny: Path, *extra: str) -> list[str]:
    return [
        "experiment=coco_tiny",
        f"dataset.root={coco_tiny}",
        "dataset.image_size=128",
        "loader.batch_size=4",
        NARROW_MODEL,
        "trainer.max_epochs=2",
        "+trainer.limit_train_batches=2",
        "+trainer.limit_val_batches=2",
        f"trainer.log_every_n_steps={LOG_EVERY}",
        "trainer.enable_progress_bar=false",
        "logger=mlflow",
        *extra,
    ]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = MlflowServer(tmp_path_factory.mktemp("mlflow_server")).start()
    yield srv
    srv.stop()


def secret_env(server) -> dict:
    """Credentials as a user gives them: in the environment, one in the URI itself."""
    return {
        "MLFLOW_TRACKING_URI": server.uri.replace("http://", f"http://{USER}:{URI_PASSWORD}@"),
        "MLFLOW_TRACKING_USERNAME": USER,
        "MLFLOW_TRACKING_PASSWORD": PASSWORD,
    }


@pytest.fixture(scope="module")
def tracked(server, coco_tiny, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("tracked") / "run"
    started = time.monotonic()
    _, summary = run_train(args(coco_tiny), run_dir, env=secret_env(server))
    summary["test_seconds"] = time.monotonic() - started
    yield run_dir, summary, server.client().get_run(summary["mlflow"]["run_id"])
    shutil.rmtree(run_dir, ignore_errors=True)


def history(server, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in server.client().get_metric_history(run_id, key))


def test_a_run_reads_back_with_its_params_metrics_tags_and_artifacts(server, tracked):
    run_dir, summary, run = tracked
    assert run.info.status == "FINISHED" and summary["mlflow"]["unsent"] == 0
    params = run.data.params
    assert params["loader.batch_size"] == "4" and params["dataset.image_size"] == "128"
    assert params["model.detector.fpn_channels"] == "64" and len(params) > 100
    # every COCOeval stat at each of the 2 validations; the last val/map is summary.json's
    for name in ALL_STAT_NAMES:
        assert len(history(server, run.info.run_id, f"val/{name}")) == 2, name
    assert round(history(server, run.info.run_id, "val/map")[-1][1], 4) == summary["map"]
    # the train metrics at the logging cadence: steps 1, 3 (Lightning logs after every 2nd batch)
    assert [s for s, _ in history(server, run.info.run_id, "train/loss")] == list(
        range(LOG_EVERY - 1, STEPS, LOG_EVERY)
    )
    tags = run.data.tags
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert tags["cocodet.status"] == "completed" and tags["cocodet.stream_digest"] == summary["stream_digest"]
    assert tags["mlflow.source.git.commit"] == commit and tags["cocodet.preset"] == "coco_tiny"
    assert tags["cocodet.loader.workers"] == str(summary["plan"]["num_workers"])
    assert tags["cocodet.loader.source"] == summary["plan"]["source"]
    artifacts = {a.path for a in server.client().list_artifacts(run.info.run_id)}
    assert artifacts == {
        "summary.json",
        "loader_plan.txt",
        "val_predictions.png",
    }  # no bad samples: no bad_samples.jsonl
    sent = json.loads(
        Path(server.client().download_artifacts(run.info.run_id, "summary.json", str(run_dir))).read_text()
    )
    assert sent["map"] == summary["map"] and sent["mlflow"]["run_id"] == run.info.run_id


def test_no_credential_reaches_a_file_a_param_or_a_tag(server, tracked):
    run_dir, summary, run = tracked
    secrets = (PASSWORD, URI_PASSWORD)
    leaks = [str(p) for p in run_dir.rglob("*") if p.is_file() and any(s.encode() in p.read_bytes() for s in secrets)]
    assert leaks == []
    recorded = json.dumps([run.data.params, run.data.tags, summary])
    assert run.data.params["logger.mlflow.tracking_uri"].startswith("http://***@")
    assert not any(s in recorded for s in secrets)
    assert run.data.params["logger.mlflow.tracking_uri"] == server.uri.replace("http://", "http://***@")


def test_sigterm_then_resume_in_a_new_folder_continues_one_run(server, coco_tiny, tmp_path):
    env = {"PYTHONPATH": str(REPO / "tests")}  # the server named by the override this time, not the variable
    signal_at = [
        "+callbacks.signal_at._target_=signal_at_step.SignalAtStep",
        "+callbacks.signal_at.step=3",
        f"logger.mlflow.tracking_uri={server.uri}",
    ]
    _, first = run_train(args(coco_tiny, "trainer.log_every_n_steps=1", *signal_at), tmp_path / "first", env=env)
    run_id = first["mlflow"]["run_id"]
    between = server.client().get_run(run_id)
    assert first["status"] == "preempted" and first["steps"] == 3  # after the first validation
    assert between.info.status == "KILLED" and between.data.tags["cocodet.status"] == "preempted"
    params_before = between.data.params
    resume = str(tmp_path / "first" / "checkpoints" / "resume.ckpt")
    _, second = run_train(
        args(
            coco_tiny, "trainer.log_every_n_steps=1", f"ckpt_path={resume}", f"logger.mlflow.tracking_uri={server.uri}"
        ),
        tmp_path / "second",
        env=env,
    )
    after = server.client().get_run(run_id)
    assert second["mlflow"]["run_id"] == run_id and second["mlflow"]["resumed"] is True
    assert after.info.status == "FINISHED" and after.data.tags["cocodet.status"] == "completed"
    assert after.data.params == params_before  # logged once: the resumed command's ckpt_path is not re-logged
    assert after.data.tags["cocodet.resumed"] == "1"
    for key in after.data.metrics:
        steps = [s for s, _ in history(server, run_id, key)]
        assert len(steps) == len(set(steps)), f"{key} logged twice at a step: {steps}"
    assert [s for s, _ in history(server, run_id, "train/loss")] == list(range(STEPS))
    assert len(history(server, run_id, "val/map")) == 2


# submitit_local runs jobs the way conf/hydra/launcher's slurm launcher does (submitit's pickled
# job in a process of its own), without SLURM. (joblib's local_parallel: test_mlflow_default_store.py.)
def test_a_sweep_to_a_server_is_one_parent_with_a_child_per_job(server, synthetic_root, tmp_path):
    run_sweep(
        synthetic_root, tmp_path / "sweep", "submitit_local", REPO, {**os.environ, "MLFLOW_TRACKING_URI": server.uri}
    )
    children_of(server.client(), tmp_path / "sweep")


# Last in the file: it kills the module's server (uvicorn and all), which the tests above use.
def test_a_server_killed_mid_run_costs_no_training(server, tracked, coco_tiny, tmp_path):
    """The tracked run again, its server SIGKILLed after the 1st step, timed against it."""
    _, baseline, _ = tracked
    kill = [
        "+callbacks.kill_at._target_=signal_at_step.KillGroupAtStep",
        "+callbacks.kill_at.step=1",
        f"+callbacks.kill_at.pgid={server.proc.pid}",
        # the end's wait for a server restart (60 s by default) is its own bound, tested in
        # test_mlflow_close.py; here the training's time is what is measured
        "logger.mlflow.close_end_within_s=2",
    ]
    started = time.monotonic()
    proc, summary = run_train(
        args(coco_tiny, *kill), tmp_path / "run", env={**secret_env(server), "PYTHONPATH": str(REPO / "tests")}
    )
    seconds = time.monotonic() - started
    print(f"without the kill {baseline['test_seconds']:.1f} s, with it {seconds:.1f} s")
    assert summary["status"] == "completed" and summary["steps"] == baseline["steps"] == STEPS
    assert seconds <= baseline["test_seconds"] + 30
    warnings = re.findall(r"MLflow: \w+ to .* failed", proc.stdout + proc.stderr)  # the log: stdout and train.log
    assert len(warnings) == 1 and URI_PASSWORD not in proc.stdout + proc.stderr
    unsent = summary["mlflow"]["unsent"]
    records = [json.loads(line) for line in (tmp_path / "run" / "mlflow_unsent.jsonl").read_text().splitlines()]
    assert unsent > 0 and len(records) == unsent and summary["mlflow"]["unsent_file"].endswith("mlflow_unsent.jsonl")
    # not sent: the metrics of every logging step from the kill on (after the 1st batch, before
    # Lightning logged it at step 1), the end tags, artifacts and status
    assert {r["step"] for r in records if r["call"] == "log_batch" and "metrics" in r} == {1, 3}
    [ended] = [r for r in records if r["call"] == "set_terminated"]
    assert ended["status"] == "FINISHED"
    assert [r["seq"] for r in records] == sorted(r["seq"] for r in records)  # in the order they were made
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["mlflow"]["unsent"] == unsent
