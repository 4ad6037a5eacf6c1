"""torchvision's reference presets (augment=hflip|multiscale|lsj, design §13): each sample as
the reference model sees it, its draws distributed as torchvision.transforms.v2 draws them,
and the model's own transform left with nothing to resize."""

from __future__ import annotations

from contextlib import contextmanager
from unittest import mock

import numpy as np
import pytest
import torch
from conftest import run_in_process
from scipy import stats
from torchvision import tv_tensors
from torchvision.models.detection.transform import GeneralizedRCNNTransform
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from cocodet.datasets.index import build_index
from cocodet.images.read import load_raw
from cocodet.loader.flat_batch import flatten, restore
from cocodet.models.zoo import LoaderSizedTransform, build_detector
from cocodet.sample import make_sample
from cocodet.transforms.model_resize import BUILDER_SIZES, builder_sizes
from cocodet.transforms.reference_presets import HFlip, LargeScaleJitter, ModelResize, MultiScale

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]  # every zoo model's (ImageNet) statistics
SIZES = (800, 1333)
PRESETS = {
    "hflip": lambda: HFlip(128, SIZES),
    "multiscale": lambda: MultiScale(128, SIZES),
    "lsj": lambda: LargeScaleJitter(128, SIZES),
}
N_IMAGES = 6


def reference_raws(coco_tiny):
    """coco_tiny train images with their boxes under the reference's rule (any positive extent)."""
    index = build_index(
        coco_tiny / "train2017", coco_tiny / "annotations" / "instances_train2017.json", keep_empty="reference"
    )
    return [load_raw(index, k, min_box_side=0.0) for k in range(N_IMAGES)]


@pytest.fixture(scope="module")
def raws(coco_tiny):
    return reference_raws(coco_tiny)


@contextmanager
def torch_draws_from(rng: np.random.Generator):
    """torch.rand / torch.randint answered from ``rng`` as float32 / ints: v2's transforms then
    draw exactly what the recipe drew from the same per-sample generator."""

    def rand(*size, **kw):
        return torch.tensor([np.float32(rng.random())], dtype=torch.float32).reshape(size if size != (1,) else (1,))

    def randint(high, size=(), **kw):
        return torch.tensor(int(rng.integers(high)))

    with mock.patch("torch.rand", rand), mock.patch("torch.randint", randint):
        yield


def fixed_size_crop(image, boxes, labels, size: int, fill):
    """The reference's FixedSizeCrop (references/detection/transforms.py at 3749cad2), which v2
    lacks, from v2's functional crop and pad: one torch.rand(1) for both offsets, drawn only
    when cropping; boxes shifted, clamped to the crop and kept with positive extent; padding
    bottom/right with ``fill``."""
    _, h, w = image.shape
    ch, cw = min(h, size), min(w, size)
    if (ch, cw) != (h, w):
        r = torch.rand(1)
        top, left = int(max(h - size, 0) * r), int(max(w - size, 0) * r)
        image = F.crop(image, top, left, ch, cw)
        b = boxes.as_subclass(torch.Tensor).clone()
        b[:, 0::2] -= left
        b[:, 1::2] -= top
        b[:, 0::2].clamp_(min=0, max=cw)
        b[:, 1::2].clamp_(min=0, max=ch)
        keep = (b[:, 0] < b[:, 2]) & (b[:, 1] < b[:, 3])
        boxes = tv_tensors.BoundingBoxes(b[keep], format="XYXY", canvas_size=(ch, cw))
        labels = labels[keep]
    image = F.pad(image, [0, 0, size - cw, size - ch], fill=list(fill))
    boxes = tv_tensors.BoundingBoxes(boxes.as_subclass(torch.Tensor), format="XYXY", canvas_size=(size, size))
    return image, boxes, labels


def oracle(name: str, raw, rng) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """What the reference hands its model for ``raw`` given ``rng``'s draws: (uint8 CHW image,
    boxes, labels, whether the model's transform resizes it in training)."""
    image = torch.from_numpy(np.ascontiguousarray(raw[0])).permute(2, 0, 1).contiguous()
    boxes = tv_tensors.BoundingBoxes(torch.from_numpy(raw[1].copy()), format="XYXY", canvas_size=image.shape[1:])
    labels = torch.from_numpy(raw[2].copy())
    with torch_draws_from(rng):
        if name == "hflip":
            image, boxes = v2.RandomHorizontalFlip(0.5)(image, boxes)
        elif name == "multiscale":
            image, boxes = v2.RandomShortestSize(list(range(480, 801, 32)), 1333)(image, boxes)
            image, boxes = v2.RandomHorizontalFlip(0.5)(image, boxes)
        else:
            image, boxes = v2.ScaleJitter((1024, 1024), (0.1, 2.0))(image, boxes)
            image, boxes, labels = fixed_size_crop(image, boxes, labels, 1024, (123, 117, 104))
            image, boxes = v2.RandomHorizontalFlip(0.5)(image, boxes)
    return image, boxes.as_subclass(torch.Tensor), labels, name == "hflip"


def stock_transform(train: bool, resizes: bool) -> GeneralizedRCNNTransform:
    t = GeneralizedRCNNTransform(*SIZES, MEAN, STD)
    t._skip_resize = not resizes  # what references/detection/train.py sets for multiscale and lsj
    return t.train(train)


def ours_through_the_model(samples: list, train: bool):
    """cocodet's samples through the FlatBatch transport and the model's (loader-sized) transform."""
    flat = flatten(
        [
            make_sample(s.image, s.boxes, s.labels, (0, k), k, np.ones(4, np.float32), np.zeros(4))
            for k, s in enumerate(samples)
        ]
    )
    images, targets = restore(flat)
    return LoaderSizedTransform(*SIZES, MEAN, STD).train(train)(images, [dict(t) for t in targets]), flat


def levels(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest difference of two normalised images, in uint8 levels."""
    return float(((a - b).abs() * torch.tensor(STD)[:, None, None] * 255).max())


# Tolerances, each with its reason. Preset resizes call the very kernel v2 calls (uint8,
# antialiased bilinear): exact. The model's resize interpolates float images in the reference
# and uint8 here (torch's uint8 kernel computes in fixed point and rounds): at most 1 level,
# read back through float normalisation (0.01 of a level of float noise).
TOLERANCE = {"hflip": 1.01, "multiscale": 0.01, "lsj": 0.01}


@pytest.mark.parametrize("name", list(PRESETS))
def test_samples_match_the_reference_given_the_same_draws(name, raws):
    recipe = PRESETS[name]()
    ours = [recipe(raw, np.random.default_rng((0, 0, k)), []) for k, raw in enumerate(raws)]
    (ours_list, ours_targets), _ = ours_through_the_model(ours, train=True)
    ref = [oracle(name, raw, np.random.default_rng((0, 0, k))) for k, raw in enumerate(raws)]
    resizes = ref[0][3]
    ref_list, ref_targets = stock_transform(True, resizes)(
        [F.to_dtype(im, torch.float32, scale=True) for im, *_ in ref],
        [{"boxes": b.float(), "labels": lab} for _, b, lab, _ in ref],
    )
    assert ours_list.image_sizes == ref_list.image_sizes
    assert ours_list.tensors.shape == ref_list.tensors.shape  # the same padding to 32: nothing padded again
    for k, (h, w) in enumerate(ref_list.image_sizes):
        assert levels(ours_list.tensors[k, :, :h, :w], ref_list.tensors[k, :, :h, :w]) <= TOLERANCE[name], (name, k)
        assert torch.equal(ours_targets[k]["labels"], ref_targets[k]["labels"])
        assert torch.allclose(ours_targets[k]["boxes"], ref_targets[k]["boxes"], atol=1e-3, rtol=0), (name, k)


def test_evaluation_resize_matches_the_models_own(raws):
    """Validation, mode=eval and mode=predict: the loader's resize, and the model's transform in
    eval mode (which ignores _skip_resize and would resize again) leaves the sizes alone."""
    recipe = ModelResize(128, SIZES)
    ours = [recipe(raw, None, []) for raw in raws]
    (ours_list, _), _ = ours_through_the_model(ours, train=False)
    ref_list, _ = stock_transform(False, True)(
        [F.to_dtype(torch.from_numpy(r[0]).permute(2, 0, 1), torch.float32, scale=True) for r in raws]
    )
    assert ours_list.image_sizes == ref_list.image_sizes and ours_list.tensors.shape == ref_list.tensors.shape
    for k, (h, w) in enumerate(ref_list.image_sizes):
        assert levels(ours_list.tensors[k, :, :h, :w], ref_list.tensors[k, :, :h, :w]) <= TOLERANCE["hflip"]
    for sample, raw in zip(ours, raws):  # boxes mapped back to the stored image exactly
        sy, sx = sample.scale
        assert np.allclose(sample.boxes / np.float32([sx, sy, sx, sy]), raw[1], atol=1e-3)


def test_a_perturbed_draw_breaks_parity(raws):
    """The parity test can fail: the same preset with its shortest sides shifted by one step."""
    recipe = MultiScale(128, SIZES, min_sizes=tuple(range(512, 833, 32)))
    ours = [recipe(raw, np.random.default_rng((0, 0, k)), []) for k, raw in enumerate(raws)]
    ref = [oracle("multiscale", raw, np.random.default_rng((0, 0, k))) for k, raw in enumerate(raws)]
    assert [s.image.shape[:2] for s in ours] != [tuple(im.shape[1:]) for im, *_ in ref]


# --- the draws' distributions against v2's own (2,000 each, torch's RNG seeded) --------------

N_DRAWS = 2000


def test_multiscale_sizes_are_distributed_as_v2s():
    h, w = 480, 640
    ours = [MultiScale(128, SIZES).draw_hw(h, w, np.random.default_rng((1, 0, k))) for k in range(N_DRAWS)]
    torch.manual_seed(1)
    t = v2.RandomShortestSize(list(range(480, 801, 32)), 1333)
    theirs = [t.make_params([torch.zeros(3, h, w, dtype=torch.uint8)])["size"] for _ in range(N_DRAWS)]
    values = sorted({s[0] for s in ours + theirs})
    table = [[sum(s[0] == v for s in side) for v in values] for side in (ours, theirs)]
    assert len(values) == 11  # every shortest side drawn, none outside the range
    assert stats.chi2_contingency(table).pvalue > 0.01


def test_lsj_sizes_are_distributed_as_v2s():
    h, w = 427, 640
    recipe = LargeScaleJitter(128, SIZES)
    ours = [
        recipe.jitter_hw(h, w, float(np.float32(np.random.default_rng((2, 0, k)).random()))) for k in range(N_DRAWS)
    ]
    torch.manual_seed(2)
    t = v2.ScaleJitter((1024, 1024), (0.1, 2.0))
    theirs = [t.make_params([torch.zeros(3, h, w, dtype=torch.uint8)])["size"] for _ in range(N_DRAWS)]
    for axis in (0, 1):
        assert stats.ks_2samp([s[axis] for s in ours], [s[axis] for s in theirs]).pvalue > 0.01
    lo, hi = min(s[1] for s in ours), max(s[1] for s in ours)
    assert int(640 * 1024 / 640 * 0.1) <= lo < 120 and 1950 < hi <= 2048  # the whole range 0.1-2.0 of 1024


def test_flip_probability_is_v2s():
    image = torch.arange(6, dtype=torch.uint8).reshape(1, 2, 3)
    recipe = HFlip(128, SIZES)
    ours = sum(recipe.flip_decision(np.random.default_rng((3, 0, k))) for k in range(N_DRAWS))
    torch.manual_seed(3)
    flip = v2.RandomHorizontalFlip(0.5)
    theirs = sum(not torch.equal(flip(image), image) for _ in range(N_DRAWS))
    assert stats.binomtest(ours, N_DRAWS, 0.5).pvalue > 0.01
    assert stats.binomtest(theirs, N_DRAWS, 0.5).pvalue > 0.01
    assert stats.fisher_exact([[ours, N_DRAWS - ours], [theirs, N_DRAWS - theirs]]).pvalue > 0.01


# --- the model's transform ----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BUILDER_SIZES))
def test_the_models_transform_neither_resizes_nor_pads_again(name, raws):
    """Each zoo model that suits these presets: its builder's sizes are what model_resize
    records, and with the loader resizing, its transform keeps every batch's sizes in
    training and in evaluation."""
    stock = build_detector(name, num_classes=3, image_size=128, loader_resizes=True).transform
    assert isinstance(stock, LoaderSizedTransform)
    assert (stock.min_size, stock.max_size) == ((BUILDER_SIZES[name][0],), BUILDER_SIZES[name][1])
    samples = [
        HFlip(128, builder_sizes(name))(raw, np.random.default_rng((0, 0, k)), []) for k, raw in enumerate(raws[:3])
    ]
    flat = flatten(
        [
            make_sample(s.image, s.boxes, s.labels, (0, k), k, np.ones(4, np.float32), np.zeros(4))
            for k, s in enumerate(samples)
        ]
    )
    images, targets = restore(flat)
    for train in (True, False):
        out, _ = stock.train(train)(images, [dict(t) for t in targets] if train else None)
        assert out.image_sizes == [tuple(s.image.shape[:2]) for s in samples]
        assert tuple(out.tensors.shape) == tuple(flat.images.shape)


# --- the stream contract, for each preset ------------------------------------------------


def bench_digest(coco_tiny, tmp_path, preset: str, *extra: str) -> str:
    s = run_in_process(
        [
            "mode=bench",
            "dataset=coco",
            f"dataset.root={coco_tiny}",
            f"augment={preset}",
            "model=fasterrcnn_mobilenet_v3_large_fpn",
            "loader=explicit",
            "loader.batch_size=4",
            "bench.batches=6",
            "bench.warmup=0",
            "bench.digest_batches=6",
            "bench.decode_probe=0",
            *extra,
        ],
        tmp_path,
    )
    assert s["digest_batches"] == 6 and s["image_side"] == {"lsj": 1024}.get(preset, 1344)
    return s["batch_digest"]


@pytest.mark.parametrize("preset", list(PRESETS))
def test_stream_is_independent_of_workers_and_parts(preset, coco_tiny, tmp_path):
    digests = {
        name: bench_digest(coco_tiny, tmp_path / name, preset, *extra)
        for name, extra in {
            "w0": ["loader.num_workers=0"],
            "w2": ["loader.num_workers=2"],
            "parts": ["loader.num_workers=2", "loader.part_images=3"],
        }.items()
    }
    assert len(set(digests.values())) == 1, digests
    assert bench_digest(coco_tiny, tmp_path / "seed1", preset, "loader.num_workers=0", "seed=1") != digests["w0"]


def test_batches_are_padded_to_their_own_largest_image(coco_tiny):
    """multiscale: each batch has its own size, its largest image rounded up to 32."""
    from cocodet.data.dataset import DetectionDataset

    index = build_index(
        coco_tiny / "train2017", coco_tiny / "annotations" / "instances_train2017.json", keep_empty="reference"
    )
    dataset = DetectionDataset(index, MultiScale(128, SIZES), seed=0)
    shapes = set()
    for b in range(4):
        samples = dataset.__getitems__([(0, i) for i in range(4 * b, 4 * b + 4)])
        flat = flatten(samples)
        hs, ws = zip(*[s["image"].shape[:2] for s in samples])
        assert tuple(flat.images.shape[2:]) == (-(-max(hs) // 32) * 32, -(-max(ws) // 32) * 32)
        shapes.add(tuple(flat.images.shape[2:]))
    assert len(shapes) > 1, shapes


def test_pixel_cache_is_refused_in_one_line(coco_tiny, tmp_path):
    from cocodet.data.split_datasets import PixelCacheConfigError

    with pytest.raises(PixelCacheConfigError, match="dataset.cache=ram cannot hold what HFlip reads.*about 100 GB"):
        run_in_process(
            [
                "mode=preview",
                "dataset=coco",
                f"dataset.root={coco_tiny}",
                "augment=hflip",
                "dataset.cache=ram",
                "model=fasterrcnn_mobilenet_v3_large_fpn",
            ],
            tmp_path,
        )


def test_a_model_with_a_fixed_input_size_is_refused(coco_tiny, tmp_path):
    from cocodet.transforms.model_resize import ModelSizeError

    with pytest.raises(ModelSizeError, match="ssdlite320_mobilenet_v3_large fixes its input size"):
        run_in_process(
            [
                "mode=plan",
                "dataset=coco",
                f"dataset.root={coco_tiny}",
                "augment=lsj",
                "model=ssdlite320_mobilenet_v3_large",
            ],
            tmp_path,
        )


def test_reference_rule_for_train_images(tmp_path):
    """keep_empty=reference (the presets' default): torchvision's coco_utils rule. A crowd-only
    image stays (with no training box), one whose boxes are all at most 1 px wide or high goes,
    and so does one without annotations; keep_empty=false drops the crowd-only image too."""
    import json

    (tmp_path / "img").mkdir()
    images = [{"id": i, "file_name": f"{i}.jpg", "height": 100, "width": 100} for i in (1, 2, 3, 4)]
    anns = [
        {"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 50, 50], "iscrowd": 1},
        {"id": 2, "image_id": 2, "category_id": 1, "bbox": [0, 0, 1, 50], "iscrowd": 0},
        {"id": 3, "image_id": 4, "category_id": 1, "bbox": [5, 5, 20, 20], "iscrowd": 0},
    ]
    ann = tmp_path / "ann.json"
    ann.write_text(json.dumps({"images": images, "annotations": anns, "categories": [{"id": 1, "name": "a"}]}))
    assert build_index(tmp_path / "img", ann, keep_empty="reference").image_ids.tolist() == [1, 4]
    assert build_index(tmp_path / "img", ann, keep_empty=False).image_ids.tolist() == [2, 4]
    assert build_index(tmp_path / "img", ann, keep_empty=True).image_ids.tolist() == [1, 2, 3, 4]


# Small sizes so that a CPU trains them in seconds: the contract does not depend on the size.
MODEL_SMALL = ["+model.detector.min_size=96", "+model.detector.max_size=160"]  # train (hflip) and eval resize
SMALL = {
    "hflip": MODEL_SMALL,
    "multiscale": [*MODEL_SMALL, "augment.min_sizes=[64,96,128]", "augment.max_size=160"],
    "lsj": [*MODEL_SMALL, "augment.size=128"],
}


@pytest.mark.slow
@pytest.mark.parametrize("preset", list(PRESETS))
def test_mid_epoch_resume_is_exact(preset, synthetic_root, tmp_path):
    """SIGTERM mid-epoch at two workers (a real process and signal), resume at none: the
    stream of the uninterrupted run. The runs without a signal run in this process."""
    from conftest import NARROW_MODEL, REPO, run_train, synthetic_overrides

    common = [
        *synthetic_overrides(synthetic_root),
        f"augment={preset}",
        *SMALL[preset],
        NARROW_MODEL,
        "loader.batch_size=8",
        "trainer.max_epochs=1",
        "trainer.limit_val_batches=1",
        "trainer.enable_progress_bar=false",
        "loader=explicit",
    ]
    whole = run_in_process([*common, "loader.num_workers=2"], tmp_path / "whole")
    assert whole["status"] == "completed" and whole["steps"] == 6
    assert whole["plan"]["group_aspect_ratio"] == 3  # the presets' default: grouped batches resume exactly too
    signal = [
        "+callbacks.signal_at._target_=signal_at_step.SignalAtStep",
        "+callbacks.signal_at.step=3",
        "+callbacks.signal_at.signal_name=SIGTERM",
    ]
    _, first = run_train(
        [*common, "loader.num_workers=2", *signal],
        tmp_path / "cut",
        env={"PYTHONPATH": str(REPO / "tests")},
        timeout=600,
    )
    assert first["status"] == "preempted" and first["stream_position"]["batches"] == 3
    second = run_in_process([*common, "loader.num_workers=0", "ckpt_path=last"], tmp_path / "cut")
    assert second["steps"] == 6 and second["stream_digest"] == whole["stream_digest"]
    assert second["map50"] is not None


def test_preview_draws_preset_batches_at_their_sizes(tmp_path, coco_tiny):
    """mode=preview with multiscale: grids of batches whose tiles have the sizes drawn."""
    import cv2

    s = run_in_process(
        [
            "mode=preview",
            "preview.batches=3",
            "dataset=coco",
            f"dataset.root={coco_tiny}",
            "augment=multiscale",
            "model=fasterrcnn_mobilenet_v3_large_fpn",
            "loader.batch_size=4",
            "loader=explicit",
            "loader.num_workers=0",
        ],
        tmp_path / "run",
    )
    grids = [cv2.imread(p) for p in s["pngs"]]
    assert len(grids) == 3 and all(g is not None and g.std() > 20 for g in grids)
    assert all(g.shape[0] >= 480 and g.shape[1] >= 4 * 480 for g in grids)  # tiles at the drawn sizes, not 128
    assert len({g.shape for g in grids}) > 1  # each batch its own size
    assert s["group_aspect_ratio"] == 3 and len(s["batch_bins"]) == 3
    assert all(len(set(b)) == 1 for b in s["batch_bins"]), s["batch_bins"]  # grouped: one bin per batch
