"""COCO index, label mapping and evaluation against real COCO annotations (coco_tiny)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cocodet.data.dataset import DetectionDataset
from cocodet.datasets.index import build_index
from cocodet.loader.flat_batch import flatten, restore
from cocodet.models.evaluation import detections_to_coco, evaluate, load_ground_truth, to_original_frame
from cocodet.transforms.recipe import Letterbox


@pytest.fixture(scope="module")
def val(coco_tiny):
    return build_index(coco_tiny / "val2017", coco_tiny / "annotations" / "instances_val2017.json")


def test_labels_map_back_to_the_original_category_ids(val, coco_tiny):
    assert len(val.category_ids) == 80 and val.num_classes == 81
    assert val.category_ids[0] == 1 and val.category_ids[-1] == 90  # COCO ids have gaps
    assert sorted(set(val.labels.tolist())) == list(range(1, 81))  # contiguous 1..K, 0 is background
    raw = json.loads((coco_tiny / "annotations" / "instances_val2017.json").read_text())
    for k in (0, 17, 79):
        image_id = int(val.image_ids[k])
        expected = sorted(
            a["category_id"]
            for a in raw["annotations"]
            if a["image_id"] == image_id and not a["iscrowd"] and a["bbox"][2] > 0 and a["bbox"][3] > 0
        )
        assert sorted(val.label_to_category(val.targets(k)[1]).tolist()) == expected


def test_index_is_compact_and_excludes_crowd(val, coco_tiny):
    raw = json.loads((coco_tiny / "annotations" / "instances_val2017.json").read_text())
    crowd = sum(a["iscrowd"] for a in raw["annotations"])
    assert crowd > 0 and val.dropped["crowd"] == crowd
    assert len(val.boxes) == len(raw["annotations"]) - crowd - val.dropped["degenerate_box"]
    assert isinstance(val.boxes, np.ndarray) and val.boxes.dtype == np.float32
    # xywh -> xyxy
    first = min((a for a in raw["annotations"] if not a["iscrowd"]), key=lambda a: (a["image_id"], a["id"]))
    k = int(np.searchsorted(val.image_ids, first["image_id"]))
    x, y, w, h = first["bbox"]
    assert np.allclose(val.targets(k)[0][0], [x, y, x + w, y + h], atol=1e-3)


def test_ground_truth_as_predictions_scores_map_one(val, coco_tiny):
    """Through the real path: decode, letterbox, FlatBatch, restore, map back, category ids."""
    dataset = DetectionDataset(val, Letterbox(640), seed=0)
    results, ids = [], []
    for start in range(0, len(dataset), 16):
        flat = flatten([dataset[i] for i in range(start, min(start + 16, len(dataset)))])
        _, targets = restore(flat)
        for t in targets:
            boxes = to_original_frame(t["boxes"].numpy(), t["to_original"].numpy())
            cats = val.label_to_category(t["labels"].numpy())
            results += detections_to_coco(int(t["image_id"]), boxes, np.ones(len(cats)), cats)
            ids.append(int(t["image_id"]))
    gt = load_ground_truth(coco_tiny / "annotations" / "instances_val2017.json")
    stats = evaluate(gt, results, ids)
    assert stats["map"] > 0.99 and stats["map50"] > 0.99 and stats["map75"] > 0.99


def test_empty_predictions_score_zero(val, coco_tiny):
    gt = load_ground_truth(coco_tiny / "annotations" / "instances_val2017.json")
    assert evaluate(gt, [])["map"] == 0.0


def test_images_without_annotations_are_kept_or_dropped(tmp_path, coco_tiny):
    raw = json.loads((coco_tiny / "annotations" / "instances_val2017.json").read_text())
    empty_id = raw["images"][0]["id"]
    raw["annotations"] = [a for a in raw["annotations"] if a["image_id"] != empty_id]
    ann = tmp_path / "ann.json"
    ann.write_text(json.dumps(raw))
    kept = build_index(coco_tiny / "val2017", ann, keep_empty=True)
    dropped = build_index(coco_tiny / "val2017", ann, keep_empty=False)
    assert empty_id in kept.image_ids and empty_id not in dropped.image_ids
    assert dropped.dropped["empty_image"] >= 1
    assert len(kept) == len(dropped) + dropped.dropped["empty_image"]
