"""Exported models are fed as they were trained (design §13): model.json records validation's
resize (the letterbox, a detector's shortest-side resize, an SSD's fixed square) and the shipped
predict.py applies it, so its detections equal mode=predict's on the same images."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import run_in_process, synthetic_overrides
from test_use_checkpoint import assert_standalone_matches

pytestmark = pytest.mark.slow

# One kind of resize each, with a model that trains a step in seconds (untrained detectors still
# output their top 100 boxes at score 0, which is what is compared).
KINDS = {
    "letterbox": ["model=ssdlite320_mobilenet_v3_large", "augment=basic"],
    "shortest_side": ["model=fasterrcnn_mobilenet_v3_large_320_fpn", "augment=hflip"],
    "fixed": ["model=ssdlite320_mobilenet_v3_large", "augment=ssdlite"],
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_standalone_export_matches_predict(kind, synthetic_root, coco_tiny, tmp_path):
    run = tmp_path / "run"
    common = [*synthetic_overrides(synthetic_root), *KINDS[kind], "loader=explicit", "loader.num_workers=0"]
    s = run_in_process(
        [
            *common,
            "trainer.max_epochs=1",
            "trainer.limit_train_batches=1",
            "trainer.limit_val_batches=1",
            "trainer.enable_progress_bar=false",
        ],
        run,
    )
    assert s["status"] == "completed"
    images = tmp_path / "images"  # three coco_tiny val images of different shapes
    images.mkdir()
    for name in sorted(p.name for p in (coco_tiny / "val2017").glob("*.jpg"))[:3]:
        shutil.copyfile(coco_tiny / "val2017" / name, images / name)
    # One image per batch, as the standalone script runs them: a batch of shortest-side inputs
    # is padded to its largest, which moves an untrained model's near-tied scores.
    p = run_in_process(
        [
            *common,
            "mode=predict",
            f"ckpt_path={s['last_ckpt']}",
            f"predict.source={images}",
            "predict.score_threshold=0",
            "loader.batch_size=1",
        ],
        tmp_path / "predict",
    )
    results = json.loads(Path(p["predictions"]).read_text())
    e = run_in_process([*common, "mode=export", f"ckpt_path={s['last_ckpt']}"], tmp_path / "export")
    meta = json.loads(Path(e["metadata"]).read_text())
    assert meta["input"]["resize"]["kind"] == kind, meta["input"]
    assert {"letterbox": "size", "shortest_side": "min_size", "fixed": "height"}[kind] in meta["input"]["resize"]
    listed = json.loads(Path(p["images_json"]).read_text())
    assert len(listed) == 3
    assert_standalone_matches(e, listed, results, at_least=30)
