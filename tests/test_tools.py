"""dataset.verify, batch previews, and the model consumer of mode=bench."""

from __future__ import annotations

import json
import shutil

import cv2
from conftest import NARROW_MODEL, run_in_process, synthetic_overrides


def test_verify_reports_problems_in_one_table(tmp_path, coco_tiny, caplog):
    root = tmp_path / "coco"
    shutil.copytree(coco_tiny, root)
    victim = sorted((root / "train2017").iterdir())[0]
    victim.write_bytes(victim.read_bytes()[:1000])  # truncated
    args = ["dataset=coco", f"dataset.root={root}", "dataset.verify=true", "dataset.on_bad_sample=skip", "mode=plan"]
    caplog.set_level("INFO")
    run_in_process(args, tmp_path / "run")
    out = caplog.text
    assert "dataset.verify" in out and "train: 80 images, 1 problems" in out and "val: 80 images, 0 problems" in out
    report = json.loads((tmp_path / "run" / "verify.json").read_text())
    assert len(report["train"]) == 1 and "truncated JPEG" in report["train"][0]["reason"]
    assert report["train"][0]["file"].endswith(victim.name)


def test_preview_pngs_exist_decode_and_are_not_blank(tmp_path, coco_tiny):
    s = run_in_process(
        [
            "mode=preview",
            "preview.batches=2",
            "dataset=coco",
            f"dataset.root={coco_tiny}",
            "dataset.image_size=256",
            "loader.batch_size=4",
        ],
        tmp_path / "run",
    )
    pngs = sorted((tmp_path / "run" / "previews").glob("*.png"))
    assert [str(p) for p in pngs] == s["pngs"]
    assert len(pngs) == 2
    for png in pngs:
        image = cv2.imread(str(png))
        assert image is not None and image.shape[0] >= 256 and image.shape[1] >= 4 * 256
        assert image.std() > 20  # real pixels, not a blank canvas


def test_bench_with_the_model_consumer(tmp_path, synthetic_root):
    args = [
        *synthetic_overrides(synthetic_root),
        "mode=bench",
        "bench.consumer=model",
        "bench.batches=3",
        "bench.warmup=1",
        "dataset.image_size=64",
        "loader.batch_size=4",
        "bench.decode_probe=0",
    ]
    s = run_in_process(args, tmp_path / "run")
    assert s["consumer"] == "model" and s["measured_batches"] == 3 and s["work_mean_ms"] > 1.0


def test_weights_only_resume(tmp_path, synthetic_root):
    base = [
        *synthetic_overrides(synthetic_root),
        "dataset.image_size=64",
        "loader.batch_size=16",
        NARROW_MODEL,
        "trainer.limit_train_batches=1",
        "trainer.limit_val_batches=1",
    ]
    first = run_in_process([*base, "trainer.max_epochs=1"], tmp_path / "a")
    second = run_in_process(
        [*base, "trainer.max_epochs=2", f"ckpt_path={first['last_ckpt']}", "weights_only=true"], tmp_path / "b"
    )
    assert second["steps"] == 2
