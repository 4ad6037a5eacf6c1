"""A resume reads its checkpoint once: the run id and step, the weight check and Lightning's
restore all take what that one read gave (a checkpoint is 100-300 MB, maybe on a network volume)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import NARROW_MODEL, REPO, run_train, synthetic_overrides

pytestmark = pytest.mark.slow


def test_a_resume_opens_its_checkpoint_once(synthetic_root, tmp_path):
    base = [
        *synthetic_overrides(synthetic_root),
        "dataset.image_size=64",
        "loader.batch_size=8",
        NARROW_MODEL,
        "trainer.enable_progress_bar=false",
        "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1",
        "callbacks.prediction_grid.images=2",
    ]
    run_train([*base, "trainer.max_epochs=1"], tmp_path / "first")
    ckpt = tmp_path / "first" / "checkpoints" / "last.ckpt"
    args = [*base, "trainer.max_epochs=2", f"ckpt_path={ckpt}", f"hydra.run.dir={tmp_path / 'second'}"]
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "count_opens.py"), str(ckpt), str(REPO / "train.py"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["status"] == "completed" and summary["steps"] == 4, summary  # resumed at step 2, trained 2 more
    assert summary["attempts"]["resumed_steps"] == [2]
    assert proc.stderr.strip().splitlines()[-1] == f"opens of {ckpt}: 1"
