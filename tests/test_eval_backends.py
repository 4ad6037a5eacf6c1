"""model.eval_backend: faster-coco-eval equals pycocotools to 1e-4 on a set that is not trivial
(jittered detections and false positives, many categories, crowd regions, images without
annotations, up to 100 detections per image): all 12 stats and the full precision array."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO

from cocodet.models.evaluation import ALL_STAT_NAMES, EvalBackendError, backend_classes, evaluate, load_ground_truth

sys.path.insert(0, str(REPO / "benchmarks"))
from bench_cocoeval import detections  # noqa: E402  (the benchmark's own jittered detections)


@pytest.fixture(scope="module")
def hard_set(coco_tiny, tmp_path_factory):
    gt = json.loads((coco_tiny / "annotations" / "instances_val2017.json").read_text())
    assert any(a.get("iscrowd") for a in gt["annotations"])  # crowd regions are in it
    base = max(im["id"] for im in gt["images"])
    gt["images"] += [{"id": base + k, "file_name": f"empty{k}.jpg", "height": 480, "width": 640} for k in (1, 2, 3)]
    path = tmp_path_factory.mktemp("gt") / "instances.json"
    path.write_text(json.dumps(gt))
    dets = detections(gt, per_image=100, seed=3)
    assert {d["image_id"] for d in dets} >= {base + 1, base + 2, base + 3}  # false positives on empty images
    assert len({d["category_id"] for d in dets}) > 50
    return path, dets


def both(path: Path, dets: list[dict], image_ids=None) -> tuple[dict, dict]:
    return tuple(evaluate(load_ground_truth(path, b), dets, image_ids, backend=b) for b in ("pycocotools", "faster"))


def test_backends_agree_on_every_stat_and_the_precision_array(hard_set):
    ref, fast = both(*hard_set)
    for name in ALL_STAT_NAMES:
        assert abs(ref[name] - fast[name]) <= 1e-4, (name, ref[name], fast[name])
    assert 0.05 < ref["map"] < 0.95  # neither empty nor perfect
    p_ref, p_fast = ref["coco_eval"].eval["precision"], fast["coco_eval"].eval["precision"]
    assert p_ref.shape == p_fast.shape and np.abs(p_ref - p_fast).max() <= 1e-4
    assert list(ref["coco_eval"].params.catIds) == list(fast["coco_eval"].params.catIds)


def test_backends_agree_on_a_subset_of_images(hard_set):
    path, dets = hard_set
    ids = sorted({d["image_id"] for d in dets})[::3]
    ref, fast = both(path, [d for d in dets if d["image_id"] in set(ids)], ids)
    assert all(abs(ref[n] - fast[n]) <= 1e-4 for n in ALL_STAT_NAMES)


def test_an_import_failure_names_the_backend(monkeypatch):
    monkeypatch.setitem(sys.modules, "faster_coco_eval", None)  # what a broken install looks like to import
    with pytest.raises(
        EvalBackendError, match=r"model.eval_backend=faster: importing it failed \((ModuleNotFound|Import)Error"
    ):
        backend_classes("faster")
    assert backend_classes("pycocotools")[1].__module__.startswith("pycocotools")
    assert importlib.util.find_spec("pycocotools") is not None
