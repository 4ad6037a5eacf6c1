"""The same folder as YOLO and as COCO JSON gives the same stream (issue 73, item 4).

coco_tiny's train split is written as Ultralytics' layout (``yolo_layout.coco_as_yolo``), then
those labels are converted back to COCO JSON by an independent converter
(``yolo_layout.yolo_as_coco``: PIL sizes, its own parse). Both datasets go through cocodet's
datamodule with mosaic (the default recipe) and their epoch-0 train stream, drawn by the train
loader, and the val loader's batches must match at every position: the same images (pixels), labels and boxes to 1e-3 px.
A changed label line is seen. The ground truths are compared by one checkpoint's COCOeval in
``test_overfit_real.py``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import REPO
from yolo_layout import coco_as_yolo, write_data_yaml, yolo_as_coco

COMMON = ["dataset.image_size=192", "loader=explicit", "loader.num_workers=0", "loader.batch_size=8",
          "model.detector.fpn_channels=64"]


@pytest.fixture(scope="module")
def two_layouts(coco_tiny, tmp_path_factory) -> tuple[Path, Path]:
    """(YOLO folder with data.yaml, COCO JSON of its labels): train and val are coco_tiny's train."""
    out = tmp_path_factory.mktemp("yolo_tiny")
    names = coco_as_yolo(coco_tiny / "annotations" / "instances_train2017.json", coco_tiny / "train2017", out,
                         "train2017")
    write_data_yaml(out, "images/train2017", "images/train2017", names)
    return out, yolo_as_coco(out, "train2017", names, out / "instances_from_labels.json")


def stream(overrides: list[str], run_dir: Path) -> list:
    """Epoch 0's train batches as the train loader draws them, then the val loader's (the
    letterbox keeps every box, where mosaic's crop may not), restored: (images, targets)."""
    from hydra import compose, initialize_config_dir

    from cocodet.loader.flat_batch import restore
    from cocodet.modes.wiring import build_datamodule, build_plan
    from cocodet.run_spec.read import read_spec

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        spec = read_spec(compose(config_name="config", overrides=[*overrides, *COMMON, f"output_dir={run_dir}"]))
    dm = build_datamodule(spec, build_plan(spec)[0])
    return [restore(flat) for loader in (dm.train_dataloader(), dm.val_dataloader()) for flat in loader]


def differences(ours: list, theirs: list) -> list[str]:
    found = []
    for b, ((images_a, targets_a), (images_b, targets_b)) in enumerate(zip(ours, theirs, strict=True)):
        for i, (a, t) in enumerate(zip(targets_a, targets_b, strict=True)):
            if not np.array_equal(images_a[i].numpy(), images_b[i].numpy()):
                found.append(f"batch {b} image {i}: pixels differ")
            if t["image_id"] != a["image_id"] or not np.array_equal(a["labels"], t["labels"]):
                found.append(f"batch {b} image {i}: image id or labels differ")
            elif not np.allclose(a["boxes"].numpy(), t["boxes"].numpy(), atol=1e-3, rtol=0):
                found.append(f"batch {b} image {i}: boxes differ by {(a['boxes'] - t['boxes']).abs().max().item():.4f} px")
    return found


def test_yolo_and_its_coco_json_give_the_same_stream(two_layouts, coco_tiny, tmp_path):
    yolo_root, coco_json = two_layouts
    yolo = stream(["dataset=yolo", f"dataset.yaml={yolo_root / 'data.yaml'}"], tmp_path / "yolo")
    coco = stream(["dataset=coco", f"dataset.root={yolo_root}", "dataset.train_images=images/train2017",
                   f"dataset.train_ann={coco_json}", "dataset.val_images=images/train2017", f"dataset.val_ann={coco_json}"],
                  tmp_path / "coco")
    assert len(yolo) == 20 and sum(len(t) for _, t in yolo) == 160
    assert sum(len(t["boxes"]) for _, targets in yolo for t in targets) > 400  # mosaic's boxes, not empty samples
    assert differences(yolo, coco) == []

    label = sorted((yolo_root / "labels" / "train2017").iterdir())[3]
    lines = label.read_text().splitlines()
    c, cx, cy, w, h = lines[0].split()
    lines[0] = f"{c} {float(cx) + 0.01} {cy} {w} {h}"  # one box moved by 1% of the image's width
    label.write_text("\n".join(lines) + "\n")
    moved = stream(["dataset=yolo", f"dataset.yaml={yolo_root / 'data.yaml'}"], tmp_path / "moved")
    assert differences(moved, coco), "a changed label line went unseen"
