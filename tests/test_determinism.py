"""Determinism contract (design §5) and box correctness through the train recipe."""

from __future__ import annotations

import hashlib

import cv2
import numpy as np
import pytest
from conftest import run_in_process
from hypothesis import given, settings
from hypothesis import strategies as st

from cocodet.loader.flat_batch import update_digest
from cocodet.transforms.augment import Basic, Mosaic


def bench_args(coco_tiny, *extra):
    return [
        "mode=bench",
        "dataset=coco",
        f"dataset.root={coco_tiny}",
        "dataset.image_size=192",
        "loader.batch_size=4",
        "bench.batches=20",
        "bench.warmup=0",
        "bench.digest_batches=20",
        "bench.decode_probe=0",
        *extra,
    ]


def test_batch_digest_is_independent_of_workers_runs_and_policy(coco_tiny, tmp_path):
    digests = {}
    for workers in (0, 1, 2, 4):
        s = run_in_process(
            bench_args(coco_tiny, "loader=explicit", f"loader.num_workers={workers}"), tmp_path / f"w{workers}"
        )
        assert s["digest_batches"] == 20 and s["num_workers"] == workers
        digests[f"explicit{workers}"] = s["batch_digest"]
    again = run_in_process(bench_args(coco_tiny, "loader=explicit", "loader.num_workers=2"), tmp_path / "again")
    auto = run_in_process(bench_args(coco_tiny), tmp_path / "auto")
    assert auto["source"] == "auto"
    digests.update(again=again["batch_digest"], auto=auto["batch_digest"])
    assert len(set(digests.values())) == 1, digests
    seeded = run_in_process(bench_args(coco_tiny, "seed=1"), tmp_path / "seed1")
    assert seeded["batch_digest"] != auto["batch_digest"]


def test_batch_digest_is_independent_of_parts_and_pixel_cache(coco_tiny, tmp_path):
    """Batches of 8 shipped in parts of 3 (which split the partner pools of 8), and images
    read from the pixel cache instead of decoded: the same stream as whole, decoded batches.
    25 batches span three epochs, which workers stream across (in-process loading does not)."""
    digests, decodes = {}, {}
    for name, extra in {
        "whole0": ["loader.num_workers=0"],
        "whole2": ["loader.num_workers=2"],
        "parts1": ["loader.num_workers=1", "loader.part_images=3"],
        "parts4": ["loader.num_workers=4", "loader.part_images=3"],
        "ram": ["loader.num_workers=2", "dataset.cache=ram"],
        "disk_parts": ["loader.num_workers=2", "dataset.cache=disk", "loader.part_images=5"],
    }.items():
        s = run_in_process(
            bench_args(
                coco_tiny,
                "loader=explicit",
                "loader.batch_size=8",
                "bench.batches=25",
                "bench.digest_batches=25",
                "augment.partner_pool=8",
                *extra,
            ),
            tmp_path / name,
        )
        assert s["digest_batches"] == 25 and s["examples"] == 200 and len(s["epochs"]) == 3, (name, s["examples"])
        assert (s["part_images"] is not None) == ("part_images=" in " ".join(extra))
        digests[name], decodes[name] = s["batch_digest"], s["decodes_per_sample"]
    assert len(set(digests.values())) == 1, digests
    assert decodes["whole2"] == 1.0  # pools of 8 in batches of 8: each image decoded once
    assert decodes["parts1"] > 1.0  # parts that split a pool decode the partners they draw again
    assert decodes["ram"] == 0 and decodes["disk_parts"] == 0


def test_whole_dataset_partners_keep_the_stream_contract(coco_tiny, tmp_path):
    """augment.partners=dataset (partners from the whole dataset, issue #28's other side): the
    same stream for any worker count, for parts, and for the pixel cache; it differs from the
    pooled stream, and decodes each sample's partners too (about four decodes per sample)."""
    digests, decodes = {}, {}
    for name, extra in {
        "whole0": ["loader.num_workers=0"],
        "whole2": ["loader.num_workers=2"],
        "parts3": ["loader.num_workers=2", "loader.part_images=3"],
        "ram": ["loader.num_workers=2", "dataset.cache=ram"],
    }.items():
        s = run_in_process(
            bench_args(
                coco_tiny,
                "loader=explicit",
                "loader.batch_size=8",
                "bench.batches=12",
                "bench.digest_batches=12",
                "augment.partners=dataset",
                *extra,
            ),
            tmp_path / name,
        )
        assert s["digest_batches"] == 12, name
        digests[name], decodes[name] = s["batch_digest"], s["decodes_per_sample"]
    assert len(set(digests.values())) == 1, digests
    pooled = run_in_process(
        bench_args(
            coco_tiny,
            "loader=explicit",
            "loader.batch_size=8",
            "bench.batches=12",
            "bench.digest_batches=12",
            "loader.num_workers=2",
            "augment.partner_pool=8",
        ),
        tmp_path / "pooled",
    )
    assert pooled["batch_digest"] != digests["whole2"]
    assert decodes["whole2"] > 2.5 and decodes["ram"] == 0, decodes


def test_digest_changes_with_epoch(coco_tiny):
    from cocodet.data.dataset import DetectionDataset
    from cocodet.datasets.index import build_index
    from cocodet.loader.epoch_sampler import EpochSampler
    from cocodet.loader.flat_batch import flatten

    index = build_index(coco_tiny / "train2017", coco_tiny / "annotations" / "instances_train2017.json")
    dataset = DetectionDataset(index, Mosaic(128), seed=0)
    sampler = EpochSampler(len(dataset), 0, shuffle=True)

    def digest(epoch: int) -> str:
        sampler.set_epoch(epoch)
        keys = list(sampler)[:8]
        h = hashlib.sha256()
        update_digest(h, flatten([dataset[k] for k in keys]))
        return h.hexdigest()

    assert digest(0) == digest(0)
    assert digest(0) != digest(1)


# Every colour has a 255 channel, so no colour is a blend of another with the black background.
PALETTE = [
    (255, 0, 0),
    (0, 255, 0),
    (0, 0, 255),
    (255, 255, 0),
    (255, 0, 255),
    (0, 255, 255),
    (255, 128, 0),
    (255, 0, 128),
    (128, 255, 0),
    (0, 255, 128),
    (128, 0, 255),
    (0, 128, 255),
    (255, 255, 255),
    (255, 128, 128),
    (128, 255, 128),
    (128, 128, 255),
]


def coloured_image(rng: np.random.Generator, first_label: int, n: int, h: int = 160, w: int = 192):
    """Non-overlapping filled rectangles of unique colours (label k has colour PALETTE[k-1])."""
    image = np.zeros((h, w, 3), dtype=np.uint8)
    boxes, labels = [], []
    cols = 4
    cell_w, cell_h = w // cols, h // 2
    for j in range(n):
        cx, cy = (j % cols) * cell_w, (j // cols) * cell_h
        bw, bh = int(rng.integers(14, cell_w - 2)), int(rng.integers(14, cell_h - 2))
        x1, y1 = cx + int(rng.integers(0, cell_w - bw)), cy + int(rng.integers(0, cell_h - bh))
        label = first_label + j
        image[y1 : y1 + bh, x1 : x1 + bw] = PALETTE[label - 1]
        boxes.append([x1, y1, x1 + bw, y1 + bh])
        labels.append(label)
    return image, np.array(boxes, np.float32), np.array(labels, np.int64)


def assert_boxes_enclose_colours(image: np.ndarray, boxes: np.ndarray, labels: np.ndarray, tol: int = 2):
    for box, label in zip(boxes, labels):
        x1, y1, x2, y2 = box
        if (x2 - x1) * (y2 - y1) < 16:
            continue  # a sliver after clipping: too few pixels to locate its colour reliably
        colour = np.array(PALETTE[label - 1], np.int16)
        mask = np.all(np.abs(image.astype(np.int16) - colour) <= 40, axis=2).astype(np.uint8)
        # Opening drops 1-px seams where interpolation blends neighbouring colours.
        mask = cv2.morphologyEx(mask, cv2.MORPH_OPEN, np.ones((3, 3), np.uint8))
        ys, xs = np.nonzero(mask)
        if not len(xs) and min(x2 - x1, y2 - y1) < 4:
            continue  # a clipped sliver thinner than the opening
        assert len(xs), f"label {label}: no pixels of its colour left for box {box}"
        assert xs.min() >= x1 - tol and xs.max() + 1 <= x2 + tol, (label, box, xs.min(), xs.max())
        assert ys.min() >= y1 - tol and ys.max() + 1 <= y2 + tol, (label, box, ys.min(), ys.max())
        # and the box is not much larger than what it encloses
        assert xs.min() <= x1 + tol and xs.max() + 1 >= x2 - tol and ys.min() <= y1 + tol and ys.max() + 1 >= y2 - tol


def colour_extent(image: np.ndarray, label: int) -> tuple[int, int]:
    """Width and height of the pixels of ``label``'s colour (0, 0 when none survive)."""
    colour = np.array(PALETTE[label - 1], np.int16)
    mask = np.all(np.abs(image.astype(np.int16) - colour) <= 40, axis=2).astype(np.uint8)
    mask = cv2.morphologyEx(mask, cv2.MORPH_OPEN, np.ones((3, 3), np.uint8))
    ys, xs = np.nonzero(mask)
    return (int(xs.max() - xs.min() + 1), int(ys.max() - ys.min() + 1)) if len(xs) else (0, 0)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), recipe=st.sampled_from(["mosaic", "mosaic_noflip", "single", "basic"]))
def test_surviving_boxes_enclose_their_colour(seed, recipe):
    rng = np.random.default_rng(seed)
    raws = [coloured_image(rng, 1 + 4 * k, int(rng.integers(1, 5))) for k in range(4)]
    if recipe == "basic":
        transform = Basic(160)
    else:  # HSV jitter off: it moves colours, not boxes; the geometry is what is checked
        transform = Mosaic(160, hsv=(0, 0, 0), flip_p=0.0 if recipe == "mosaic_noflip" else 0.5, min_visibility=0.0)
    partners = [] if recipe == "single" else raws[1:]
    out = transform(raws[0], rng, partners)
    image, boxes, labels = out.image, out.boxes, out.labels
    assert image.shape == (160, 160, 3) and boxes.shape[1] == 4 and len(boxes) == len(labels)
    assert np.all(boxes[:, 2] > boxes[:, 0]) and np.all(boxes[:, 3] > boxes[:, 1])
    assert np.all(boxes >= 0) and np.all(boxes <= 160)
    assert 0.0 <= out.pad_share < 1.0
    assert_boxes_enclose_colours(image, boxes, labels)
    # Dropped only by the documented rule (here min_box_px=2, visibility off): every colour
    # still visible over a few pixels each way kept its box.
    for label in {int(lb) for _, _, lbs in [raws[0], *partners] for lb in lbs} - set(labels.tolist()):
        w, h = colour_extent(image, label)
        assert min(w, h) < 2 + 3, (label, w, h)


def test_mosaic_visibility_rule_drops_mostly_hidden_boxes():
    recipe = Mosaic(100, min_box_px=2.0, min_visibility=0.25)
    mapped = np.array([[10, 10, 50, 50], [-30, 10, 10, 50], [90, 90, 130, 130], [20, 20, 21, 60]], np.float32)
    clipped, kept = recipe._clip_and_filter(mapped, np.broadcast_to(np.float32([0, 0, 100, 100]), (4, 4)))
    # whole; 1/4 visible (kept at the limit); 1/16 visible (dropped); 1 px wide (dropped)
    assert kept.tolist() == [0, 1]
    assert clipped[1].tolist() == [0, 10, 10, 50]


def test_mosaic_pad_share_matches_the_pixels():
    """pad_share comes from geometry; with a source that has no grey pixel the two agree."""
    rng = np.random.default_rng(3)
    raws = [(np.full((120, 160, 3), 200, np.uint8), np.zeros((0, 4), np.float32), np.zeros(0, np.int64))] * 4
    recipe = Mosaic(128, hsv=(0, 0, 0), flip_p=0.0)
    for _ in range(20):
        out = recipe(raws[0], rng, raws[1:])
        grey = np.all(out.image == 114, axis=2).mean()
        assert abs(grey - out.pad_share) < 1e-9, (grey, out.pad_share)


# The default train stream on coco_tiny (mosaic, 640 px, batch 8, seed 0), first 4 batches,
# hashed over content only (valid pixels, sizes, image ids, boxes, labels). Frozen so that a
# refactor of the pipeline is proven not to change what the model sees; a deliberate change
# of the recipe updates it in the same commit and says why.
# Refrozen on purpose when a study changes the default: mosaic's colour is one RGB matrix per
# sample (augment.colour=matrix) since its five-seed study put its mean mAP within 0.0009 of the
# HSV shifts', inside the bar 0.0324 (docs/studies.md). The stream's keys, boxes and labels are
# the same under both forms; its pixels are not. Partners come from a window of the epoch order
# (the default), the whole dataset (augment.partners=dataset) or pools of 8.
REFERENCE_DIGEST = "8d31ed39e966c49507fc375205d5dea10f1abcf7ccf742a91e0d90ec6a0be5b4"
WHOLE_DATASET_REFERENCE_DIGEST = "ac1851625afaefe7695933227001f14151fdb5a4eabc37727d5050651aa8ecde"
POOLED_REFERENCE_DIGEST = "22cf7c11d5f483b2e0679e469382d94c5114b1376aa19a5cdc550217c728548c"
# The same three streams under augment.colour=hsv (additive HSV shifts, the default before the
# matrix): frozen before the matrix existed, and still what that choice gives.
HSV_DIGESTS = {
    None: "1b44e6454ed069176e2dadf6daf314c1ecc2cb36da5c3e1ef680928cfa54d5b3",
    "augment.partners=dataset": "aa867de2fd25627216674c7ead9335fb15cd441f1c7f34070c7ac267826a2e34",
    "augment.partner_pool=8": "0cdfd22fdf330f420cb84c8647198fb781dd515695a50a4d4677c0e07ce2483d",
}


@pytest.mark.parametrize(
    "partners,colour,digest",
    [
        (None, None, REFERENCE_DIGEST),
        ("augment.partners=dataset", None, WHOLE_DATASET_REFERENCE_DIGEST),
        ("augment.partner_pool=8", None, POOLED_REFERENCE_DIGEST),
        *[(partners, "augment.colour=hsv", digest) for partners, digest in HSV_DIGESTS.items()],
    ],
)
def test_default_train_stream_matches_the_frozen_reference(coco_tiny, tmp_path, partners, colour, digest):
    extra = [x for x in (partners, colour) if x is not None]
    s = run_in_process(
        [
            "mode=bench",
            "dataset=coco",
            f"dataset.root={coco_tiny}",
            "bench.batches=4",
            "bench.warmup=0",
            "bench.digest_batches=4",
            "bench.decode_probe=0",
            *extra,
        ],
        tmp_path / "ref",
    )
    assert s["batch_size"] == 8 and s["digest_batches"] == 4
    assert s["batch_digest"] == digest
