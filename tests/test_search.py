"""Sweeps that search (hydra/sweeper=study): each trial's figure is its own summary's, a failed
trial is recorded and the sweep goes on, a killed launcher's study continues where it stopped,
two launchers share one journal, and the winner is written, printed and tagged."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import NARROW_MODEL, REPO, synthetic_overrides

# Trials where only the study's storage is under test: a bench of a sleeping producer, 3 batches.
SLEEPING = [
    "hparams_search=loader_throughput",
    "bench.producer=sleep",
    "bench.producer_ms=1",
    "bench.batches=3",
    "bench.warmup=0",
    "bench.decode_probe=0",
    "bench.producer_samples=64",
    "hydra.sweeper.heartbeat_s=1",
]


def sweep(args: list[str], sweep_dir: Path, **popen) -> subprocess.Popen:
    cmd = [sys.executable, str(REPO / "train.py"), "-m", *args, f"hydra.sweep.dir={sweep_dir}"]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def finished(proc: subprocess.Popen, timeout: int = 600) -> tuple[str, str]:
    stdout, stderr = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, stderr[-3000:]
    return stdout, stderr


def study_trials(storage: str, name: str = "loader_throughput") -> list:
    if storage.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        storage = optuna.storages.JournalStorage(JournalFileBackend(storage[len("journal:") :]))
    return optuna.load_study(study_name=name, storage=storage).get_trials()


@pytest.mark.slow
def test_a_loader_search_finds_its_trials_figures_and_records_a_refused_setting(coco_tiny, tmp_path):
    """Six trials on real images, one setting validation refuses among the choices: each trial
    that completed was told its own summary's examples_per_s, the refused one failed with the
    rule's words, and best.yaml, the reuse line and every trial's row are written."""
    sweep_dir = tmp_path / "sweep"
    args = [
        "hparams_search=loader_throughput",
        "experiment=coco_tiny",
        f"dataset.root={coco_tiny}",
        "bench.batches=3",
        "bench.warmup=1",
        "bench.decode_probe=0",
        "hydra.sweeper.n_trials=6",
        "loader.prefetch_factor=choice(0,2)",
        "loader.num_workers=choice(0,1,2)",
    ]  # sweeps: searched too
    stdout, stderr = finished(sweep(args, sweep_dir))
    trials = study_trials(f"sqlite:///{sweep_dir / 'study.db'}")
    assert len(trials) == 6
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert complete and failed, [(t.number, t.state, t.params) for t in trials]
    for t in complete:
        summary = json.loads((sweep_dir / str(t.number) / "summary.json").read_text())
        assert t.value == summary["examples_per_s"] and summary["prefetch_factor"] == t.params["loader.prefetch_factor"]
    for t in failed:
        assert t.params["loader.prefetch_factor"] == 0
        assert "loader.prefetch_factor=0" in t.user_attrs["failure"], t.user_attrs
    best = yaml.safe_load((sweep_dir / "best.yaml").read_text())
    winner = max(complete, key=lambda t: t.value)
    assert best["trial"] == winner.number and best["examples_per_s"] == winner.value
    assert f"loader.num_workers={winner.params['loader.num_workers']}" in best["overrides"]
    assert f"best: trial {winner.number}, examples_per_s = " in stdout and "reuse it: python train.py " in stdout
    rows = (sweep_dir / "trials.md").read_text()
    assert all(f"| {t.number} | {t.state.name.lower()} |" in rows for t in trials), rows
    assert (sweep_dir / "history.png").stat().st_size > 0 and (sweep_dir / "importance.png").stat().st_size > 0


@pytest.mark.slow
def test_a_killed_launcher_continues_without_running_a_finished_trial_again(synthetic_root, tmp_path):
    """SIGKILL of the launching process during trial 4 of 6, then the same command again: the
    study ends with 6 finished trials; trials 0-2 ran once; the killed trial's parameters were
    asked again, in a folder of their own."""
    sweep_dir = tmp_path / "sweep"
    args = [*SLEEPING, *synthetic_overrides(synthetic_root), "hydra.sweeper.n_trials=6"]
    first = sweep(args, sweep_dir, start_new_session=True)
    deadline = time.monotonic() + 300
    while not (sweep_dir / "3" / ".hydra").is_dir() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.poll() is None, first.communicate()[1][-3000:]
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    written = {n: (sweep_dir / str(n) / "summary.json").stat().st_mtime_ns for n in range(3)}
    finished(sweep(args, sweep_dir))
    trials = study_trials(f"sqlite:///{sweep_dir / 'study.db'}")
    states = {t.number: t.state.name for t in trials}
    assert sum(s == "COMPLETE" for s in states.values()) == 6 and states[3] == "FAIL", states
    assert trials[3].user_attrs["failure"].startswith("stale"), trials[3].user_attrs
    retry = next(t for t in trials if t.user_attrs.get("retry_of") == 3)
    assert retry.params == trials[3].params and retry.state.name == "COMPLETE"
    assert written == {n: (sweep_dir / str(n) / "summary.json").stat().st_mtime_ns for n in range(3)}


@pytest.mark.slow
def test_two_launchers_on_one_journal_share_the_study(synthetic_root, tmp_path):
    """Two launchers started together on one journal file finish the study's 6 trials between
    them: 6 trials in all, each launched once, by one of the two."""
    journal = tmp_path / "shared" / "study.log"
    args = [
        *SLEEPING,
        *synthetic_overrides(synthetic_root),
        "hydra.sweeper.n_trials=6",
        f"hydra.sweeper.storage=journal:{journal}",
    ]
    procs = [sweep(args, tmp_path / f"launcher-{i}") for i in range(2)]
    for proc in procs:
        finished(proc)
    trials = study_trials(f"journal:{journal}")
    assert [t.state.name for t in trials] == ["COMPLETE"] * 6, [(t.number, t.state.name) for t in trials]
    launched = [
        n for i in range(2) for n in range(6) if (tmp_path / f"launcher-{i}" / str(n) / "summary.json").exists()
    ]
    assert sorted(launched) == list(range(6)), launched


def test_a_parallel_local_launcher_is_refused_for_a_bench_search(synthetic_root, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "train.py",
            "-m",
            *SLEEPING,
            *synthetic_overrides(synthetic_root),
            "hydra/launcher=local_parallel",
            f"hydra.sweep.dir={tmp_path}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and lines[-1].startswith("error: this search measures the host's cores"), proc.stderr
    assert "local_parallel (n_jobs=2)" in lines[-1]


def test_every_mode_hands_its_figure_back(synthetic_root):
    """train() returns the summary's figure: examples_per_s for a bench, a named key otherwise;
    a single run whose status is not completed is not a trial and keeps its exit status."""
    from cocodet.search.objective import TrialFailed, direction, figure

    assert figure({"status": "completed", "map50": 0.5, "map": 0.3}, "train", "auto") == 0.5
    assert figure({"examples_per_s": 41.0}, "bench", "auto") == 41.0
    assert figure({"examples_per_s": 41.0, "wait_fraction": 0.1}, "bench", "wait_fraction") == 0.1
    assert figure({"mode": "plan"}, "plan", "auto") is None
    assert direction("map50", "auto") == "maximize" and direction("wait_p95_ms", "auto") == "minimize"
    with pytest.raises(TrialFailed, match="ended diverged"):
        figure({"status": "diverged", "map50": math.nan}, "train", "auto")
    with pytest.raises(TrialFailed, match="numeric keys: examples_per_s"):
        figure({"examples_per_s": 1.0, "note": "x"}, "bench", "map50")


@pytest.mark.slow
def test_a_recipe_search_scores_trials_by_map50_as_child_runs_of_one_parent(synthetic_root, tmp_path):
    """hparams_search=recipe, 2 trials of a short training run under logger=mlflow with a real
    server: each trial's value is its summary's map50, each is a child run of the sweep's parent,
    and the parent names the best trial."""
    from mlflow_server import MlflowServer

    server = MlflowServer(tmp_path / "mlflow").start()
    try:
        sweep_dir = tmp_path / "sweep"
        args = [
            "hparams_search=recipe",
            *synthetic_overrides(synthetic_root),
            "dataset.image_size=64",
            "loader.batch_size=8",
            NARROW_MODEL,
            "trainer.max_epochs=1",
            "+trainer.limit_train_batches=2",
            "model.eval_max_images=8",
            "callbacks.prediction_grid.images=0",
            "trainer.enable_progress_bar=false",
            "hydra.sweeper.n_trials=2",
            "logger=mlflow",
        ]
        finished(sweep(args, sweep_dir, env={**os.environ, "MLFLOW_TRACKING_URI": server.uri}))
        trials = study_trials(f"sqlite:///{sweep_dir / 'study.db'}", "recipe")
        assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
        for t in trials:
            assert t.value == json.loads((sweep_dir / str(t.number) / "summary.json").read_text())["map50"]
        client = server.client()
        parent_id = json.loads((sweep_dir / "mlflow_parent.json").read_text())["run_id"]
        parent = client.get_run(parent_id)
        children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'")
        assert sorted(c.data.tags["cocodet.job"] for c in children) == ["0", "1"]
        best = max(trials, key=lambda t: t.value)
        assert parent.data.tags["cocodet.best_trial"] == str(best.number)
        assert float(parent.data.tags["cocodet.best_value"]) == best.value
    finally:
        server.stop()


@pytest.mark.slow
def test_a_grid_sweep_runs_every_job_past_a_refused_one_then_says_why(synthetic_root, tmp_path):
    """A grid sweep (Hydra's basic sweeper) whose first job's setting is refused: the second job
    still runs, and the sweep ends with the refusal's one line, exit 2."""
    args = [a for a in SLEEPING if not a.startswith(("hparams_search", "hydra.sweeper"))]
    proc = subprocess.run(
        [
            sys.executable,
            "train.py",
            "-m",
            "mode=bench",
            "loader=explicit",
            "loader.num_workers=0",
            *args,
            *synthetic_overrides(synthetic_root),
            "loader.prefetch_factor=0,2",
            f"hydra.sweep.dir={tmp_path}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: loader.prefetch_factor=0"), proc.stderr[-2000:]
    assert not (tmp_path / "0" / "summary.json").exists() and (tmp_path / "1" / "summary.json").is_file()
