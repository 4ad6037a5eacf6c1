"""make train's recipe, trained once for 1 of its 6 epochs, and the checkpoint it leaves used
three ways: mode=eval, mode=predict, mode=export (+ its standalone script).

The one training run serves every test here (one file, so that the two xdist processes never
train it twice); the detector is weak after it, so predictions are taken at score 0 (all it
outputs), which is what validation scores too.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import REPO, run_in_process, run_train

from cocodet.models.evaluation import ALL_STAT_NAMES as STATS
from cocodet.models.evaluation import evaluate, load_ground_truth

pytestmark = pytest.mark.slow


N_VAL = 96  # the default synthetic set's val split
EPOCHS = 1  # of make train's 6: mAP@0.5 0.42 after it (0.75 after 2, 0.88-0.90 after 6), 95 s on one thread


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """`make train`'s recipe (the defaults; the synthetic set generated in a temp dir) for one
    epoch (its schedule then spans that epoch), as a user runs it (train.py in its own process)."""
    base = tmp_path_factory.mktemp("default_recipe")
    root = base / "synthetic"
    _, s = run_train([f"dataset.root={root}", f"trainer.max_epochs={EPOCHS}"], base / "run", timeout=1800)
    assert s["status"] == "completed" and s["last_ckpt"]
    yield {
        "root": root,
        "data": [f"dataset.root={root}"],
        "summary": s,
        "ckpt": s["last_ckpt"],
        "base": base,
        "run_dir": base / "run",
    }
    shutil.rmtree(base, ignore_errors=True)  # its checkpoints (about 0.2 GB each) go when the module ends


def test_default_training_reaches_map50(trained):
    """`make train`'s recipe for one epoch: the end-to-end proof that images, boxes, labels and
    evaluation line up. mAP@0.5 reads 0.42 after that epoch (a model that has learned nothing
    reads 0.00, misaligned boxes a small fraction of it) and 0.88-0.90 after `make train`'s 6
    (docs/benchmarks.md); the 6 epochs themselves are measured by `make train`."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        assert compose(config_name="config").trainer.max_epochs == 6  # what make train runs
    s = trained["summary"]
    assert s["map50"] >= 0.25, s
    assert s["epochs"] == EPOCHS and s["best_map"] is not None
    assert s["health"]["warnings"] == [] and s["health"]["skipped_nonfinite_steps"] == 0, s["health"]
    assert s["health"]["confident_predictions"] > 0
    assert (trained["run_dir"] / "val_predictions.png").stat().st_size > 0  # the last validation's grid


def use(trained, mode: str, name: str, *extra) -> dict:
    return run_in_process(
        [*trained["data"], f"mode={mode}", f"ckpt_path={trained['ckpt']}", *extra], trained["base"] / name
    )


def bare(trained, mode: str, name: str, *extra) -> dict:
    """``python train.py mode=<mode> ckpt_path=<the run's checkpoint>``, as README shows it: no
    dataset or model arguments (the checkpoint carries the groups it was trained with)."""
    proc, s = run_train([f"mode={mode}", f"ckpt_path={trained['ckpt']}", *extra], trained["base"] / name)
    assert "as the run was trained (from last.ckpt)" in proc.stdout + proc.stderr
    return s


def test_eval_reproduces_the_last_validation(trained):
    s = use(trained, "eval", "eval")
    train = trained["summary"]
    assert train["map"] > 0
    for key in ("map", "map50", "map75", "map_small", "map_medium", "map_large"):
        assert s[key] == train[key], key
    alone = bare(trained, "eval", "eval_bare")  # the 12 stats without repeating the run's dataset arguments
    assert {k: alone[k] for k in STATS} == {k: s[k] for k in STATS} and alone["images"] == s["images"]
    assert {"mar_1", "mar_10", "mar_100", "mar_large"} <= set(s) and s["images"] == N_VAL
    names = [r["name"] for r in s["per_category"]]
    assert sorted(names) == ["circle", "square", "triangle"]
    aps = [r["ap"] for r in s["per_category"]]
    assert aps == sorted(aps, reverse=True)
    csv = Path(s["per_category_csv"]).read_text().splitlines()
    assert csv[0] == "rank,category_id,name,ap,ap50" and len(csv) == 4
    png = cv2.imread(s["precision_recall_png"])
    assert png is not None and png.std() > 5


def test_predict_results_score_like_validation_and_standalone_export_matches(trained):
    root = trained["root"]
    s = use(
        trained,
        "predict",
        "predict",
        f"predict.source={root / 'val'}",
        "predict.score_threshold=0",
        "predict.draw=true",
    )
    results = json.loads(Path(s["predictions"]).read_text())
    assert s["images"] == N_VAL and s["bad_images"] == 0 and len(results) >= 50
    # Scored by pycocotools here, by the default faster backend in training's validation: a
    # trained checkpoint's predictions, the two backends equal to 1e-4.
    gt = load_ground_truth(root / "annotations" / "instances_val.json", "pycocotools")
    assert trained["summary"]["eval_backend"] == "faster"
    assert evaluate(gt, results, backend="pycocotools")["map"] == pytest.approx(trained["summary"]["map"], abs=1e-4)
    assert len(list(Path(s["drawn"]).glob("*.png"))) == N_VAL

    alone = bare(trained, "predict", "predict_bare", f"predict.source={root / 'val'}", "predict.score_threshold=0")
    same = json.loads(Path(alone["predictions"]).read_text()) == json.loads(Path(s["predictions"]).read_text())
    assert same  # no dataset arguments: the same results (``results`` gained COCOeval's fields above)

    images = json.loads(Path(s["images_json"]).read_text())[:4]
    for fmt in ("torchscript", "onnx"):  # ONNX proven on fcos_resnet18_fpn (the default model)
        e = use(trained, "export", f"export_{fmt}", f"export.format={fmt}")
        meta = json.loads(Path(e["metadata"]).read_text())
        if fmt == "torchscript":  # and without the dataset arguments: the same model and categories
            assert json.loads(Path(bare(trained, "export", "export_bare")["metadata"]).read_text()) == meta
        assert meta["format"] == fmt and meta["model"] == "fcos_resnet18_fpn" and meta["input"]["size"] == 128
        assert [c["name"] for c in meta["categories"]] == ["circle", "square", "triangle"]
        assert_standalone_matches(e, images, results)


def assert_standalone_matches(e: dict, images: list[dict], results: list[dict], at_least: int = 50) -> None:
    files = [im["file_name"] for im in images]
    # A fresh interpreter that runs the shipped script and proves cocodet was never imported.
    code = (
        "import runpy, sys; sys.argv = ['predict.py', '--model', sys.argv[1], *sys.argv[2:]]; "
        "runpy.run_path(%r, run_name='__main__'); "
        "assert not [m for m in sys.modules if m.startswith('cocodet')], 'cocodet was imported'"
    ) % e["predict_script"]
    proc = subprocess.run(
        [sys.executable, "-c", code, e["model_file"], *files],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(e["predict_script"]).parent,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    standalone = json.loads(proc.stdout)
    compared = 0
    for im in images:
        ours = np.array([r["bbox"] for r in results if r["image_id"] == im["id"]])
        theirs = np.array([r["bbox"] for r in standalone if r["file"] == im["file_name"]])
        assert len(ours) == len(theirs) > 0
        for box in theirs:  # each standalone box has its twin in mode=predict's results
            assert np.abs(ours - box).max(axis=1).min() <= 1e-3
            compared += 1
    assert compared >= at_least, compared


def test_predict_handles_corrupt_grayscale_and_huge_images(trained, tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    rng = np.random.default_rng(0)
    big = rng.integers(0, 255, size=(3000, 4000, 3), dtype=np.uint8)
    cv2.imwrite(str(folder / "huge.jpg"), big)
    cv2.imwrite(str(folder / "gray.png"), rng.integers(0, 255, size=(90, 150), dtype=np.uint8))
    good = cv2.imencode(".jpg", big[:200, :300])[1].tobytes()
    (folder / "corrupt.jpg").write_bytes(good[: len(good) // 2])  # truncated
    s = use(
        trained,
        "predict",
        "mixed",
        f"predict.source={folder}",
        "predict.score_threshold=0",
        "dataset.on_bad_sample=skip",
    )
    assert s["images"] == 3 and s["bad_images"] == 1
    results = json.loads(Path(s["predictions"]).read_text())
    ids = {im["file_name"].rsplit("/", 1)[-1]: im["id"] for im in json.loads(Path(s["images_json"]).read_text())}
    by_image = {i: [r for r in results if r["image_id"] == i] for i in ids.values()}
    # the huge and the grayscale image were read and predicted on (random noise may score no box:
    # whether it does is the model's, not the pipeline's); the corrupt one has no results
    assert {"huge.jpg", "gray.png", "corrupt.jpg"} <= set(ids) and by_image[ids["corrupt.jpg"]] == []
    for r in by_image[ids["huge.jpg"]]:  # in the original 4000 x 3000 frame
        x, y, w, h = r["bbox"]
        assert 0 <= x <= x + w <= 4000 and 0 <= y <= y + h <= 3000
    bad = [json.loads(line) for line in (trained["base"] / "mixed" / "bad_samples.jsonl").read_text().splitlines()]
    assert bad[0]["file"].endswith("corrupt.jpg") and "truncated" in bad[0]["reason"]
    from cocodet.errors import BadSampleError

    with pytest.raises(BadSampleError, match="corrupt.jpg"):
        use(trained, "predict", "mixed_raise", f"predict.source={folder}", "loader=explicit", "loader.num_workers=0")


def test_two_rank_validation_equals_one_process(trained):
    """COCOeval on rank 0 over both ranks' detections, padded repeat removed: the numbers of
    one process, on a val set that does not divide by two (95 of the 96 images)."""
    gt = json.loads((trained["root"] / "annotations" / "instances_val.json").read_text())
    keep = {im["id"] for im in gt["images"][: N_VAL - 1]}
    gt["images"] = [im for im in gt["images"] if im["id"] in keep]
    gt["annotations"] = [a for a in gt["annotations"] if a["image_id"] in keep]
    subset = trained["base"] / "instances_val95.json"
    subset.write_text(json.dumps(gt))
    common = [
        *trained["data"],
        "mode=eval",
        f"ckpt_path={trained['ckpt']}",
        f"dataset.val_ann={subset}",
        "trainer.enable_progress_bar=false",
    ]
    one = run_in_process(common, trained["base"] / "eval1")
    proc, two = run_train([*common, "trainer=ddp_cpu"], trained["base"] / "eval2", timeout=900)
    assert one["map"] > 0 and one["images"] == two["images"] == N_VAL - 1
    assert one["padded_repeats_removed"] == 0 and two["padded_repeats_removed"] == 1
    for key in ("map", "map50", "map75", "map_small", "map_medium", "map_large", "mar_100"):
        assert round(two[key], 4) == round(one[key], 4), key
    assert two["per_category"] == one["per_category"]
    assert sum(ln.startswith("{") for ln in proc.stdout.splitlines()) == 1
