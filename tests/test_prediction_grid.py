"""The prediction grid drawn at every validation: a PNG in the run dir and a TensorBoard image."""

from __future__ import annotations

import cv2
import numpy as np
from conftest import NARROW_MODEL, run_in_process, synthetic_overrides
from tensorboard.backend.event_processing.event_accumulator import IMAGES, EventAccumulator

from cocodet.datasets.index import build_index
from cocodet.models.prediction_grid import GAP_RGB, TAG, class_colour, panel_origin


def bands(is_gap: np.ndarray) -> list[tuple[int, int]]:
    """Runs of False in a 1-D mask: the spans between gap lines."""
    spans, start = [], None
    for i, gap in enumerate([*is_gap, True]):
        if not gap and start is None:
            start = i
        elif gap and start is not None:
            spans.append((start, i))
            start = None
    return spans


def test_grid_png_and_tensorboard_image(tmp_path, synthetic_root):
    tile = 160
    run = tmp_path / "run"
    s = run_in_process(
        [
            *synthetic_overrides(synthetic_root),
            "dataset.image_size=64",
            "loader.batch_size=16",
            NARROW_MODEL,
            "trainer.max_epochs=2",
            "trainer.limit_train_batches=1",
            "trainer.limit_val_batches=1",
            "callbacks.prediction_grid.images=4",
            f"callbacks.prediction_grid.tile_px={tile}",
        ],
        run,
    )
    assert s["epochs"] == 2
    grid = cv2.imread(str(run / "val_predictions.png"))[:, :, ::-1]
    is_gap = np.all(grid == GAP_RGB, axis=2)
    rows, cols = bands(is_gap.all(axis=1)), bands(is_gap.all(axis=0))
    assert len(rows) * len(cols) == 8, (rows, cols)  # 4 tiles of two panels, 2 tiles to a row
    assert all(hi - lo == tile for lo, hi in cols)
    for r in range(2):
        for c in range(4):
            x, y = panel_origin(r * 2 + c // 2, c % 2, 2, tile)
            assert grid[y : y + tile, x : x + tile].std() > 10, (r, c)  # an image, not a flat fill

    index = build_index(synthetic_root / "val", synthetic_root / "annotations" / "instances_val.json")
    boxes, labels = index.targets(0)
    biggest = int(np.argmax((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])))
    x0, y0 = panel_origin(0, 0, 2, tile)
    x1, y1, x2, y2 = (boxes[biggest] * tile / max(index.sizes[0])).round().astype(int)
    left_edge = grid[y0 + y1 + 3 : y0 + y2 - 3, x0 + x1]
    on_colour = np.all(np.abs(left_edge.astype(int) - class_colour(int(labels[biggest]))) <= 2, axis=1)
    assert on_colour.mean() > 0.8, left_edge[:5]

    (event_file,) = (run / "tensorboard").rglob("events.out.tfevents.*")
    events = EventAccumulator(str(event_file), size_guidance={IMAGES: 0})
    events.Reload()
    assert TAG in events.Tags()["images"]
    assert len(events.Images(TAG)) == 2  # one per validation
