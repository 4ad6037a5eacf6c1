"""COCO 2017 scale (118,287 train images, about a million boxes) from coco_tiny by repetition:
the index is built once, cached, and a short bench runs on it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO, run_train


@pytest.mark.slow
def test_coco_scale_index_builds_once_and_feeds_a_bench(coco_tiny, tmp_path):
    root = tmp_path / "coco_scale"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_scale_coco.py"), "--src", str(coco_tiny), "--out",
                    str(root)], check=True, capture_output=True, timeout=900)
    env = {"COCODET_CACHE_DIR": str(tmp_path / "cache")}
    _, plan = run_train(["mode=plan", "dataset=coco", f"dataset.root={root}"], tmp_path / "plan", env=env, timeout=900)
    assert plan["train_images"] == 118_287 and plan["val_images"] == 5_000
    assert len(list((tmp_path / "cache").glob("index-instances_train2017-*/boxes.npy"))) == 1
    _, bench = run_train(["mode=bench", "dataset=coco", f"dataset.root={root}", "bench.batches=1", "bench.warmup=0",
                          "bench.decode_probe=0", "loader.batch_size=4", "dataset.image_size=256"], tmp_path / "bench",
                         env=env, timeout=900)
    assert bench["measured_batches"] == 1 and bench["examples"] == 4
    assert len(list((tmp_path / "cache").glob("index-instances_train2017-*/meta.json"))) == 1  # not rebuilt
