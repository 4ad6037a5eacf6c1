"""torchvision's single-shot reference presets (augment=ssd|ssdlite, design §13): each sample as
the reference's SSD sees it after its fixed-size resize, every draw distributed as
torchvision.transforms.v2 draws it, and the model's own transform left with nothing to do."""

from __future__ import annotations

from contextlib import contextmanager
from unittest import mock

import numpy as np
import pytest
import torch
from conftest import run_in_process
from scipy import stats
from test_reference_presets import N_IMAGES, reference_raws
from torchvision import tv_tensors
from torchvision.models.detection.transform import GeneralizedRCNNTransform
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from cocodet.loader.flat_batch import flatten, restore
from cocodet.models.zoo import LoaderSizedTransform, build_detector
from cocodet.sample import make_sample
from cocodet.transforms.model_resize import FIXED_SIZES, ModelSizeError
from cocodet.transforms.ssd_kernels import DISTORT_RANGES
from cocodet.transforms.ssd_presets import IOU_OPTIONS, FixedResize, SingleShotPreset

SIZE = (320, 320)
MEAN = STD = [0.5, 0.5, 0.5]  # ssdlite320_mobilenet_v3_large's statistics
PRESETS = {
    "ssd": lambda: SingleShotPreset(128, SIZE, photometric=True, zoom_out=True),
    "ssdlite": lambda: SingleShotPreset(128, SIZE, photometric=False, zoom_out=False),
}
N_SEEDS = 4  # x N_IMAGES: 24 samples per preset, zoom, crop and no crop all occur


@pytest.fixture(scope="module")
def raws(coco_tiny):
    """The same six coco_tiny images as the reference presets' tests."""
    return reference_raws(coco_tiny)


@contextmanager
def torch_draws_from(rng: np.random.Generator):
    """Every draw v2's transforms make, answered from ``rng`` as the recipe draws it: torch.rand
    (any shape) as float32 uniforms, torch.randint and torch.randperm as integers and
    permutations, ColorJitter's factor as lo + u (hi - lo) in float32."""

    def rand(*size, **kw):
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
        n = int(np.prod(shape)) if shape else 1
        return torch.tensor([np.float32(rng.random()) for _ in range(n)], dtype=torch.float32).reshape(shape)

    def randint(*args, low=0, high=None, size=(), **kw):
        low, high = (0, args[0]) if len(args) == 1 else args[:2] if args else (low, high)
        return torch.tensor(int(rng.integers(low, high))).reshape(size)

    def randperm(n, **kw):
        return torch.from_numpy(rng.permutation(n))

    def factor(lo, hi):
        return float(np.float32(lo) + np.float32(rng.random()) * np.float32(hi - lo))

    with (
        mock.patch("torch.rand", rand),
        mock.patch("torch.randint", randint),
        mock.patch("torch.randperm", randperm),
        mock.patch("torchvision.transforms.v2._color.ColorJitter._generate_value", staticmethod(factor)),
    ):
        yield


def oracle(name: str, raw, rng):
    """What the reference (v2 transforms, tensor backend) hands its SSD for ``raw`` given
    ``rng``'s draws, before the model's transform: uint8 CHW image, boxes, labels."""
    image = torch.from_numpy(np.ascontiguousarray(raw[0])).permute(2, 0, 1).contiguous()
    sample = (
        image,
        {
            "boxes": tv_tensors.BoundingBoxes(
                torch.from_numpy(raw[1].copy()), format="XYXY", canvas_size=image.shape[1:]
            ),
            "labels": torch.from_numpy(raw[2].copy()),
        },
    )
    steps = [v2.RandomPhotometricDistort(), v2.RandomZoomOut(fill=[123.0, 117.0, 104.0])] if name == "ssd" else []
    steps += [v2.RandomIoUCrop(), v2.RandomHorizontalFlip(0.5), v2.SanitizeBoundingBoxes()]
    with torch_draws_from(rng):
        image, target = v2.Compose(steps)(*sample)
    return image, target["boxes"].as_subclass(torch.Tensor), target["labels"]


def ssd_transform(train: bool, loader_sized: bool):
    cls = LoaderSizedTransform if loader_sized else GeneralizedRCNNTransform
    return cls(320, 320, MEAN, STD, size_divisible=1, fixed_size=SIZE).train(train)


def through_the_model(samples, train: bool):
    flat = flatten(
        [
            make_sample(s.image, s.boxes, s.labels, (0, k), k, np.ones(4, np.float32), np.zeros(4))
            for k, s in enumerate(samples)
        ]
    )
    images, targets = restore(flat)
    return ssd_transform(train, loader_sized=True)(images, [dict(t) for t in targets] if train else None)


def levels(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs() * torch.tensor(STD)[:, None, None] * 255).max())


@pytest.mark.parametrize("name", list(PRESETS))
def test_samples_match_the_reference_given_the_same_draws(name, raws):
    """Up to 1 level per pixel: the model's resize interpolates the reference's float image and
    this loader's uint8 one (the tolerance of the R-CNN presets' hflip, tests/test_reference_presets.py);
    every other pixel operation is v2's own kernel or an exact copy."""
    recipe = PRESETS[name]()
    seeds = [(s, 0, k) for s in range(N_SEEDS) for k in range(N_IMAGES)]
    crops = []
    with recording(crops):
        ours = [recipe(raws[k[2]], np.random.default_rng(k), []) for k in seeds]
    assert any(c is None for c in crops) and sum(c is not None for c in crops) >= 6, crops  # both paths ran
    ref = [oracle(name, raws[k[2]], np.random.default_rng(k)) for k in seeds]
    ref_list, ref_targets = ssd_transform(True, loader_sized=False)(
        [F.to_dtype(im, torch.float32, scale=True) for im, _, _ in ref],
        [{"boxes": b.float(), "labels": lab} for _, b, lab in ref],
    )
    ours_list, ours_targets = through_the_model(ours, train=True)
    assert ours_list.image_sizes == ref_list.image_sizes == [SIZE] * len(seeds)
    assert ours_list.tensors.shape == ref_list.tensors.shape
    for k in range(len(seeds)):
        assert levels(ours_list.tensors[k], ref_list.tensors[k]) <= 1.01, (name, seeds[k])
        assert torch.equal(ours_targets[k]["labels"], ref_targets[k]["labels"]), (name, seeds[k])
        assert torch.allclose(ours_targets[k]["boxes"], ref_targets[k]["boxes"], atol=1e-3, rtol=0), (name, seeds[k])


@contextmanager
def recording(crops: list):
    """Record each crop_params result (None: the image left as is)."""
    original = SingleShotPreset.crop_params

    def recorded(self, *args):
        crops.append(original(self, *args))
        return crops[-1]

    with mock.patch.object(SingleShotPreset, "crop_params", recorded):
        yield


def test_a_perturbed_draw_breaks_parity(raws):
    """The parity test can fail: ssdlite with a narrower crop scale draws other regions."""
    recipe = SingleShotPreset(128, SIZE, photometric=False, zoom_out=False, crop_scale=(0.4, 1.0))
    ours = [recipe(raws[k], np.random.default_rng((0, 0, k)), []) for k in range(N_IMAGES)]
    ref = [oracle("ssdlite", raws[k], np.random.default_rng((0, 0, k))) for k in range(N_IMAGES)]
    ref_list, _ = ssd_transform(False, loader_sized=False)(
        [F.to_dtype(im, torch.float32, scale=True) for im, _, _ in ref]
    )
    ours_list, _ = through_the_model(ours, train=False)
    assert max(levels(ours_list.tensors[k], ref_list.tensors[k]) for k in range(N_IMAGES)) > 10


def test_evaluation_resize_matches_the_models_own(raws):
    recipe = FixedResize(128, SIZE)
    ours = [recipe(raw, None, []) for raw in raws]
    ours_list, _ = through_the_model(ours, train=False)
    ref_list, _ = ssd_transform(False, loader_sized=False)(
        [F.to_dtype(torch.from_numpy(r[0]).permute(2, 0, 1), torch.float32, scale=True) for r in raws]
    )
    assert ours_list.image_sizes == ref_list.image_sizes and ours_list.tensors.shape == ref_list.tensors.shape
    for k in range(len(raws)):
        assert levels(ours_list.tensors[k], ref_list.tensors[k]) <= 1.01
    for sample, raw in zip(ours, raws):  # boxes mapped back to the stored image
        sy, sx = sample.scale
        assert np.allclose(sample.boxes / np.float32([sx, sy, sx, sy]), raw[1], atol=1e-3)


# --- the draws' distributions against v2's own (torch's RNG seeded) ----------------------

N_DRAWS = 2000
P_MIN = 0.01


def ssd() -> SingleShotPreset:
    return PRESETS["ssd"]()


def test_distort_draws_are_distributed_as_v2s():
    """Each operation's on/off (binomial, p = 0.5, and against v2's count), each factor (KS),
    the contrast order and the channel shuffle."""
    ours = [ssd().distort_params(np.random.default_rng((4, 0, k))) for k in range(N_DRAWS)]
    torch.manual_seed(4)
    t, image = v2.RandomPhotometricDistort(), [torch.zeros(3, 8, 8, dtype=torch.uint8)]
    theirs = [t.make_params(image) for _ in range(N_DRAWS)]
    renames = {
        "brightness": "brightness_factor",
        "contrast": "contrast_factor",
        "saturation": "saturation_factor",
        "hue": "hue_factor",
        "permutation": "channel_permutation",
        "contrast_before": "contrast_before",
    }
    for key, (lo, hi) in [*DISTORT_RANGES, ("permutation", (None, None)), ("contrast_before", (None, None))]:
        on_ours = [p[key] is not None and p[key] is not False for p in ours]
        on_theirs = [p[renames[key]] is not None and p[renames[key]] is not False for p in theirs]
        assert stats.binomtest(sum(on_ours), N_DRAWS, 0.5).pvalue > P_MIN, key
        assert (
            stats.fisher_exact(
                [[sum(on_ours), N_DRAWS - sum(on_ours)], [sum(on_theirs), N_DRAWS - sum(on_theirs)]]
            ).pvalue
            > P_MIN
        ), key
        if lo is not None:
            a = [p[key] for p in ours if p[key] is not None]
            b = [p[renames[key]] for p in theirs if p[renames[key]] is not None]
            assert lo <= min(a) and max(a) < hi
            assert stats.ks_2samp(a, b).pvalue > P_MIN, key
    perms = [tuple(p["permutation"].tolist()) for p in ours if p["permutation"] is not None]
    assert len(set(perms)) == 6 and stats.chisquare([perms.count(q) for q in sorted(set(perms))]).pvalue > P_MIN


def test_zoom_out_draws_are_distributed_as_v2s():
    """Applied with p = 0.5 (the draw v2 makes in forward), the canvas side and the offsets."""
    h, w = 48, 64
    ours = [ssd().zoom_params(h, w, np.random.default_rng((5, 0, k))) for k in range(N_DRAWS)]
    torch.manual_seed(5)
    t, image = v2.RandomZoomOut(), torch.zeros(3, h, w, dtype=torch.uint8)
    theirs = []
    for _ in range(N_DRAWS):
        out = t(image)
        theirs.append(None if out.shape == image.shape else tuple(out.shape[1:]))
    applied_ours, applied_theirs = sum(z is not None for z in ours), sum(z is not None for z in theirs)
    assert stats.binomtest(applied_ours, N_DRAWS, 0.5).pvalue > P_MIN
    assert stats.binomtest(applied_theirs, N_DRAWS, 0.5).pvalue > P_MIN
    torch.manual_seed(6)
    pads = [t.make_params([image])["padding"] for _ in range(N_DRAWS)]  # left, top, right, bottom
    zoomed = [z for z in ours if z is not None]
    assert stats.ks_2samp([z[1] for z in zoomed], [w + p[0] + p[2] for p in pads]).pvalue > P_MIN  # canvas width
    assert (
        stats.ks_2samp(
            [z[3] / (z[1] - w) for z in zoomed if z[1] > w], [p[0] / (p[0] + p[2]) for p in pads if p[0] + p[2]]
        ).pvalue
        > P_MIN
    )  # left offset share
    assert max(z[1] for z in zoomed) <= 4 * w and min(z[1] for z in zoomed) >= w


@pytest.mark.parametrize("boxes", [[[10, 10, 40, 40]], [[30, 20, 34, 26]]], ids=["large_box", "small_box"])
def test_iou_crop_draws_are_distributed_as_v2s(boxes):
    """RandomIoUCrop's choice of minimum IoU and its retries, through what they decide: how
    often the image is left as is, and the crops' sizes and offsets. With a small box the high
    minimum IoUs exhaust their 40 trials, so the retry rule shapes the outcome."""
    h, w = 60, 80
    b = np.float32(boxes)
    ours = [ssd().crop_params(h, w, b, np.random.default_rng((7, 0, k))) for k in range(N_DRAWS)]
    torch.manual_seed(7)
    t = v2.RandomIoUCrop()
    inputs = [
        torch.zeros(3, h, w, dtype=torch.uint8),
        tv_tensors.BoundingBoxes(torch.tensor(b), format="XYXY", canvas_size=(h, w)),
    ]
    theirs = [t.make_params(inputs) for _ in range(N_DRAWS)]
    none_ours, none_theirs = sum(c is None for c in ours), sum(not c for c in theirs)
    assert stats.fisher_exact([[none_ours, N_DRAWS - none_ours], [none_theirs, N_DRAWS - none_theirs]]).pvalue > P_MIN
    for i, key in enumerate(["top", "left", "height", "width"]):
        assert stats.ks_2samp([c[i] for c in ours if c], [c[key] for c in theirs if c]).pvalue > P_MIN, key
    assert len(IOU_OPTIONS) == 7


# --- the model's transform, the plan and the configs --------------------------------------


@pytest.mark.parametrize("name", sorted(FIXED_SIZES))
def test_the_models_transform_does_nothing_more(name, raws):
    stock = build_detector(name, num_classes=3, image_size=128)
    assert tuple(stock.transform.fixed_size) == FIXED_SIZES[name]  # model_resize records the builder's size
    sized = build_detector(name, num_classes=3, image_size=128, loader_resizes=True).transform
    assert isinstance(sized, LoaderSizedTransform) and sized.size_divisible == stock.transform.size_divisible
    recipe = SingleShotPreset(128, FIXED_SIZES[name], photometric=True, zoom_out=True)
    samples = [recipe(raw, np.random.default_rng((0, 0, k)), []) for k, raw in enumerate(raws[:3])]
    flat = flatten(
        [
            make_sample(s.image, s.boxes, s.labels, (0, k), k, np.ones(4, np.float32), np.zeros(4))
            for k, s in enumerate(samples)
        ]
    )
    images, targets = restore(flat)
    for train in (True, False):
        out, _ = sized.train(train)(images, [dict(t) for t in targets] if train else None)
        assert out.image_sizes == [FIXED_SIZES[name]] * 3 and tuple(out.tensors.shape[2:]) == FIXED_SIZES[name]


def plan(coco_tiny, tmp_path, *extra) -> dict:
    return run_in_process(
        ["mode=plan", "dataset=coco", f"dataset.root={coco_tiny}", "model=ssdlite320_mobilenet_v3_large", *extra],
        tmp_path,
    )


def test_plan_budgets_the_fixed_size_and_the_zoom_out_canvas(coco_tiny, tmp_path):
    """Batches at 320 x 320 whatever the stored sizes; the worker estimate grows by the zoom-out
    canvas of a stored_side-square image (16x its pixels, 3 bytes each) and the distort's floats."""
    lite = plan(coco_tiny, tmp_path / "lite", "augment=ssdlite")
    full = plan(coco_tiny, tmp_path / "ssd", "augment=ssd")
    big = plan(coco_tiny, tmp_path / "big", "augment=ssd", "augment.stored_side=1280")
    assert lite["image_side"] == full["image_side"] == 320 and lite["val"]["image_side"] == 320
    side = 640
    extra = 16 * side * side * 3 + side * side * 3 * 16
    assert full["worker_footprint_bytes"] - lite["worker_footprint_bytes"] == extra
    assert big["worker_footprint_bytes"] - lite["worker_footprint_bytes"] == 4 * extra


def test_a_model_without_a_fixed_size_is_refused_and_the_other_way_round(coco_tiny, tmp_path):
    with pytest.raises(
        ModelSizeError, match="augment=ssd\\|ssdlite resize every image .* fasterrcnn_mobilenet_v3_large_fpn"
    ):
        run_in_process(
            [
                "mode=plan",
                "dataset=coco",
                f"dataset.root={coco_tiny}",
                "augment=ssd",
                "model=fasterrcnn_mobilenet_v3_large_fpn",
            ],
            tmp_path / "a",
        )
    with pytest.raises(ModelSizeError, match="fixes its input size.*augment=ssd\\|ssdlite"):
        plan(coco_tiny, tmp_path / "b", "augment=hflip")


def bench_digest(coco_tiny, tmp_path, preset: str, *extra: str) -> str:
    s = run_in_process(
        [
            "mode=bench",
            "dataset=coco",
            f"dataset.root={coco_tiny}",
            f"augment={preset}",
            "model=ssdlite320_mobilenet_v3_large",
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
    assert s["digest_batches"] == 6 and s["image_side"] == 320
    return s["batch_digest"]


@pytest.mark.parametrize("preset", list(PRESETS))
def test_stream_is_independent_of_workers(preset, coco_tiny, tmp_path):
    w0 = bench_digest(coco_tiny, tmp_path / "w0", preset, "loader.num_workers=0")
    assert bench_digest(coco_tiny, tmp_path / "w2", preset, "loader.num_workers=2") == w0
    assert bench_digest(coco_tiny, tmp_path / "seed1", preset, "loader.num_workers=0", "seed=1") != w0
