"""Shared fixtures: a small synthetic dataset, the coco_tiny path, a train.py runner."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The shared data folder sits beside the checkout (../shared), also in CI; override with
# COCODET_COCO_TINY when the checkout lives elsewhere.
COCO_TINY = Path(os.environ.get("COCODET_COCO_TINY", REPO.parent / "shared" / "data" / "coco_tiny")).resolve()


@pytest.fixture(scope="session", autouse=True)
def isolated_index_cache(tmp_path_factory):
    """Tests (and the train.py processes they start) cache indexes in a folder of their own,
    not in the user's ~/.cache/cocodet."""
    previous = os.environ.get("COCODET_CACHE_DIR")
    os.environ["COCODET_CACHE_DIR"] = str(tmp_path_factory.mktemp("index_cache"))
    yield
    if previous is None:
        os.environ.pop("COCODET_CACHE_DIR", None)
    else:
        os.environ["COCODET_CACHE_DIR"] = previous


@pytest.fixture(scope="session")
def coco_tiny() -> Path:
    if not (COCO_TINY / "annotations" / "instances_val2017.json").is_file():
        pytest.skip(f"coco_tiny not found at {COCO_TINY}")
    return COCO_TINY


@pytest.fixture(scope="session")
def synthetic_root(tmp_path_factory) -> Path:
    from cocodet.data.synthetic import ensure_synthetic

    return ensure_synthetic(tmp_path_factory.mktemp("synthetic") / "ds", seed=0, n_train=48, n_val=16)


def synthetic_overrides(root: Path) -> list[str]:
    return [f"dataset.root={root}", "dataset.synthetic.n_train=48", "dataset.synthetic.n_val=16"]


def run_train(args: list[str], run_dir: Path, env: dict | None = None, timeout: int = 600,
              prefix: list[str] | None = None, check: bool = True) -> tuple[subprocess.CompletedProcess, dict | None]:
    """Run train.py as a user would; return the process and the summary (last stdout line)."""
    cmd = [*(prefix or []), sys.executable, str(REPO / "train.py"), *args, f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    summary = None
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.strip()]
    if lines:
        try:
            summary = json.loads(lines[-1])
        except json.JSONDecodeError:
            summary = None
    if check and proc.returncode != 0:
        raise AssertionError(f"train.py failed ({proc.returncode}):\nSTDOUT:\n{proc.stdout[-3000:]}\nSTDERR:\n{proc.stderr[-5000:]}")
    return proc, summary


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def run_in_process(overrides: list[str], run_dir: Path) -> dict:
    """Compose the config as train.py would (Hydra's compose API) and run it in this process:
    for wiring tests where a subprocess adds nothing but start-up time."""
    from hydra import compose, initialize_config_dir

    from cocodet.app import run

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*overrides, f"output_dir={run_dir}"])
    return run(cfg)


@pytest.fixture(scope="session")
def default_recipe_run(tmp_path_factory):
    """`make train`'s recipe (the defaults; the synthetic set generated in a temp dir) for its
    first 2 of 6 epochs, trained once a session: test_train checks what it learnt,
    test_use_checkpoint evaluates, predicts and exports with its checkpoint."""
    base = tmp_path_factory.mktemp("default_recipe")
    root = base / "synthetic"
    _, s = run_train([f"dataset.root={root}", "trainer.max_epochs=2"], base / "run", timeout=1800)
    yield {"root": root, "data": [f"dataset.root={root}"], "summary": s, "ckpt": s["last_ckpt"], "base": base,
           "run_dir": base / "run"}
    shutil.rmtree(base, ignore_errors=True)  # its checkpoints (about 0.2 GB each) go when the session ends
