"""Mosaic's colour jitter: the matrix's meaning (grey axis, gains, hue turns), both forms drawing
the same numbers, the matrix stream independent of the worker count, and the keys' rules."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_in_process

from cocodet.errors import ConfigError
from cocodet.transforms.augment import Mosaic
from cocodet.transforms.colour import colour_matrix, jitter_matrix


def image(seed: int = 0, side: int = 64) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)


def test_no_rotation_and_unit_gains_leave_the_image_unchanged():
    original = image()
    out = original.copy()
    jitter_matrix(out, np.array([0.0, 0.0, 0.0]), hue_deg=30, saturation=(1.0, 1.0), value=(1.0, 1.0))
    assert np.array_equal(out, original)
    assert np.allclose(colour_matrix(360.0, 1.0, 1.0), np.eye(3), atol=1e-6)  # a whole turn is no turn


@pytest.mark.parametrize("u", [(-1.0, -1.0, 0.5), (0.7, 0.9, -0.3), (0.2, 0.0, 1.0)])
def test_grey_stays_grey_and_value_is_a_gain(u):
    grey = np.full((4, 4, 3), 100, np.uint8)
    jitter_matrix(grey, np.array(u), hue_deg=45, saturation=(0.5, 1.5), value=(0.8, 1.2))
    expected = round(100 * (0.8 + (u[2] + 1) / 2 * 0.4))
    assert np.all(np.abs(grey.astype(int) - expected) <= 1), (grey[0, 0], expected)


def test_hue_rotation_moves_colour_and_keeps_luma():
    red = np.zeros((2, 2, 3), np.uint8)
    red[..., 0] = 200
    m = colour_matrix(120.0, 1.0, 1.0)
    turned = red.reshape(-1, 3).astype(np.float64) @ m.T.astype(np.float64)
    luma = np.array([0.299, 0.587, 0.114])
    assert abs(turned[0] @ luma - red[0, 0] @ luma) < 1e-3  # a rotation about the grey axis
    assert np.argmax(turned[0]) != 0  # red is no longer the strongest channel after a third of a turn
    desaturated = red.reshape(-1, 3).astype(np.float64) @ colour_matrix(0.0, 0.0, 1.0).T.astype(np.float64)
    assert np.ptp(desaturated[0]) < 1e-3  # a saturation gain of 0 leaves grey of the same luma


def test_both_forms_draw_the_same_numbers():
    """Boxes and flips come from the same draws whichever colour form runs: only pixels differ."""
    raws = [(image(k, 96), np.array([[10, 10, 60, 50]], np.float32), np.array([1])) for k in range(4)]
    outs = {}
    for colour in ("hsv", "matrix"):
        recipe = Mosaic(64, colour=colour)
        outs[colour] = [recipe(raws[0], np.random.default_rng(seed), raws[1:]) for seed in range(12)]
    for a, b in zip(outs["hsv"], outs["matrix"]):
        assert np.array_equal(a.boxes, b.boxes) and np.array_equal(a.labels, b.labels)
    assert any(not np.array_equal(a.image, b.image) for a, b in zip(outs["hsv"], outs["matrix"]))
    assert all(s.colour_s > 0 for s in outs["matrix"])


def test_matrix_stream_is_the_same_for_any_worker_count(coco_tiny, tmp_path):
    args = [
        "mode=bench",
        "dataset=coco",
        f"dataset.root={coco_tiny}",
        "dataset.image_size=128",
        "loader=explicit",
        "loader.batch_size=4",
        "bench.batches=6",
        "bench.warmup=0",
        "bench.digest_batches=6",
        "bench.decode_probe=0",
        "augment.colour=matrix",
    ]
    digests = {w: run_in_process([*args, f"loader.num_workers={w}"], tmp_path / f"w{w}") for w in (0, 2)}
    hsv = run_in_process([*args, "loader.num_workers=0", "augment.colour=hsv"], tmp_path / "hsv")
    assert digests[0]["batch_digest"] == digests[2]["batch_digest"]
    assert hsv["batch_digest"] != digests[0]["batch_digest"]
    stages = digests[2]["stage_ms_per_sample"]
    assert set(stages) == {"read", "decode", "augment", "geometry", "colour", "collate"}
    assert stages["colour"] > 0 and stages["augment"] == pytest.approx(stages["geometry"] + stages["colour"], abs=2e-3)


@pytest.mark.parametrize(
    "key, value", [("colour", "rgb"), ("saturation", (1.3, 0.7)), ("value", (-0.1, 1.0)), ("hue_deg", 200)]
)
def test_out_of_rule_colour_keys_are_refused(key, value):
    with pytest.raises(ConfigError, match=f"augment.{key}="):
        Mosaic(64, **{key: value})
