"""COCO 2017 scale (118,287 train images, about a million boxes) from coco_tiny by repetition:
the index is built once, cached, and a short bench runs on it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO, run_in_process


@pytest.mark.slow
def test_coco_scale_index_builds_once_and_feeds_a_bench(coco_tiny, tmp_path, monkeypatch):
    root = tmp_path / "coco_scale"
    subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "make_scale_coco.py"), "--src", str(coco_tiny), "--out", str(root)],
        check=True,
        capture_output=True,
        timeout=900,
    )
    monkeypatch.setenv("COCODET_CACHE_DIR", str(tmp_path / "cache"))
    plan = run_in_process(["mode=plan", "dataset=coco", f"dataset.root={root}"], tmp_path / "plan")
    assert plan["train_images"] == 118_287 and plan["val_images"] == 5_000
    assert len(list((tmp_path / "cache").glob("index-instances_train2017-*/boxes.npy"))) == 1
    bench = run_in_process(
        [
            "mode=bench",
            "dataset=coco",
            f"dataset.root={root}",
            "bench.batches=1",
            "bench.warmup=0",
            "bench.decode_probe=0",
            "loader.batch_size=4",
            "dataset.image_size=256",
        ],
        tmp_path / "bench",
    )
    assert bench["measured_batches"] == 1 and bench["examples"] == 4
    assert len(list((tmp_path / "cache").glob("index-instances_train2017-*/meta.json"))) == 1  # not rebuilt
