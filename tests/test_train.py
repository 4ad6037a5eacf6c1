"""Training end to end through train.py: fast_dev_run, real COCO images, resume."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import NARROW_MODEL, run_in_process, run_train, synthetic_overrides


def test_fast_dev_run_synthetic(tmp_path, synthetic_root, caplog):
    caplog.set_level("INFO")
    s = run_in_process([*synthetic_overrides(synthetic_root), "debug=fast"], tmp_path / "run")
    assert s["mode"] == "train" and s["steps"] == 1
    assert {"map", "map50", "map75", "best_map", "epochs", "steps", "wall_s", "last_ckpt", "plan"} <= set(s)
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == json.loads(json.dumps(s, default=str))
    assert "COCOeval" in caplog.text and "loader plan" in caplog.text
    assert s["loader_wait"]["batches"] == 1 and "h2d_mean_ms" in s["loader_wait"]


def test_fast_dev_run_coco_tiny(tmp_path, coco_tiny):
    args = [
        "dataset=coco",
        f"dataset.root={coco_tiny}",
        "dataset.image_size=256",
        "loader.batch_size=4",
        "debug=fast",
        "callbacks=none",
        "logger=none",
    ]
    s = run_in_process(args, tmp_path / "run")
    assert s["steps"] == 1 and s["plan"]["batch_size"] == 4
    assert s["last_ckpt"] is None and not (tmp_path / "run" / "csv").exists()  # the groups really are off


def test_resume_continues_at_saved_step(tmp_path, synthetic_root):
    base = [
        *synthetic_overrides(synthetic_root),
        "dataset.image_size=64",
        "loader.batch_size=16",
        "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1",
    ]
    first = run_in_process([*base, "trainer.max_epochs=1"], tmp_path / "first")
    assert first["steps"] == 2 and first["last_ckpt"]
    saved = torch.load(first["last_ckpt"], map_location="cpu", weights_only=False)
    assert saved["global_step"] == 2
    second = run_in_process([*base, "trainer.max_epochs=2", f"ckpt_path={first['last_ckpt']}"], tmp_path / "second")
    assert second["steps"] == 4 and second["epochs"] == 2  # continued from step 2, not from 0


@pytest.mark.slow
def test_coco_tiny_as_yolo_one_epoch_prints_cocoeval(tmp_path, coco_tiny):
    """Issue 73's acceptance command: python train.py dataset=yolo dataset.yaml=<coco_tiny written
    as YOLO>/data.yaml trainer.max_epochs=1, at 320 px (at 160 px the one-epoch detector scores
    nothing, so COCOeval prints no table), on the narrow FPN: this tests the layout, training
    and evaluation end to end; what the default model learns is test_use_checkpoint.py's. COCO's
    own layout trains on coco_tiny in test_overfit_real.py, whose evaluation prints the same table."""
    from yolo_layout import coco_as_yolo, write_data_yaml

    for split in ("train2017", "val2017"):
        names = coco_as_yolo(
            coco_tiny / "annotations" / f"instances_{split}.json", coco_tiny / split, tmp_path / "yolo", split
        )
    data_yaml = write_data_yaml(tmp_path / "yolo", "images/train2017", "images/val2017", names)
    args = ["dataset=yolo", f"dataset.yaml={data_yaml}", "trainer.max_epochs=1", "dataset.image_size=320", NARROW_MODEL]
    proc, s = run_train(args, tmp_path / "run", timeout=1800)
    assert "Average Precision  (AP) @[ IoU=0.50:0.95" in proc.stdout + proc.stderr  # printed once it detects anything
    assert s["epochs"] == 1 and s["steps"] == 10  # 80 train images, batch 8
    assert s["bad_samples"]["val"]["seen"] == 80


def test_eval_max_images_limits_what_cocoeval_sees(tmp_path, synthetic_root, caplog):
    caplog.set_level("INFO")
    run_in_process(
        [
            *synthetic_overrides(synthetic_root),
            "debug=fast",
            "model.eval_max_images=3",
            "callbacks=none",
            "logger=none",
        ],
        tmp_path / "run",
    )
    assert "COCOeval (epoch 0, 3 images" in caplog.text
