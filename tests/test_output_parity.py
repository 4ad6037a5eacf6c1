"""The published recipes at the model's output (issue 57): cocodet's scoring of a checkpoint
against torchvision's public way of scoring the same weights, for the three resize kinds.

Gated, same input tensors and two output paths: the tensors cocodet's val loader produced go
through cocodet's `mode=eval` (pycocotools) and through torchvision's own model built by its
builder with the checkpoint's weights, in `eval()`, its transform kept from resizing again.
The public path then maps boxes back to the stored image's frame as the reference's transform
does (`resize_boxes`, per axis, from the network input to the original size; the letterbox,
which torchvision has no transform for, by its scale), drops label 0 (background here),
converts labels to the JSON's category ids, writes COCO results (xywh) and scores them with
pycocotools' COCOeval. Compared per detection (boxes within 1e-2 px, scores within 1e-4, the
same labels) and on the 12 stats within 1e-4.

The checkpoints have learned something (mAP@0.5 at least 0.2 on what they are scored on),
since comparing zeros proves nothing: each kind memorises 4 coco_tiny images
(`benchmarks/overfit_subset.py`). The letterbox kind is test_overfit_real's checkpoint, which
calls `gated_mismatches` itself; this file trains the shortest-side and fixed-size kinds.

The reference never shares cocodet's model code or values, so that a fault there cannot be in
both: fcos_resnet18_fpn, which torchvision has no builder for, is composed here from
torchvision's public classes, never copied from cocodet's module; its weights come from the
checkpoint file, its normalisation from torchvision's defaults, its sizes from the builder or
from the sizes this test passes to the recipe, its categories and each image's stored size
from the annotation file, the letterbox scale from that size and the recipe's side. The
reference also checks each input tensor's size: what torchvision's resize would give the
stored image (the letterbox: the recipe's square). Each kind proves the comparison can fail,
with a fault planted in what cocodet builds: a changed anchor size, normalisation mean or
standard deviation, and resize (the model's transform's for the letterbox; for the kinds whose
loader resizes as the model would, the sizes the loader is given).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.models.detection as tvd
from conftest import REPO, run_in_process
from torchvision.models.detection.transform import resize_boxes

KINDS = {  # resize kind: (overrides, epochs)
    "shortest_side": (
        [
            "model=fcos_resnet18_fpn",
            "model.detector.fpn_channels=64",
            "augment=hflip",
            "+model.detector.min_size=256",
            "+model.detector.max_size=427",
        ],
        30,
    ),
    "fixed_size": (["model=ssdlite320_mobilenet_v3_large", "augment=ssdlite"], 150),
}


def subset(coco_tiny: Path, out: Path) -> Path:
    import importlib.util

    spec = importlib.util.spec_from_file_location("overfit_subset", REPO / "benchmarks" / "overfit_subset.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_subset(coco_tiny, out, images=4, image_size=256)


def dataset_args(coco_tiny: Path, ann: Path) -> list[str]:
    return [
        "dataset=coco",
        f"dataset.root={coco_tiny}",
        "dataset.train_images=train2017",
        f"dataset.train_ann={ann}",
        "dataset.val_images=train2017",
        f"dataset.val_ann={ann}",
        "dataset.image_size=256",
        "loader.batch_size=4",
        "trainer.enable_progress_bar=false",
        "model.eval_backend=pycocotools",
    ]


def cocodet_eval(args: list[str], ckpt: str, run_dir: Path, monkeypatch) -> tuple[dict, dict, list]:
    """`mode=eval` in this process: (summary, the module's detections by image id, the val
    batches its loader produced, restored: (images, targets) each)."""
    import cocodet.inference.evaluate as evaluate
    from cocodet.loader.flat_batch import restore

    seen = {}
    real = evaluate.evaluate_checkpoint

    def keep(trainer, module, datamodule, *rest):
        seen["module"], seen["datamodule"] = module, datamodule
        return real(trainer, module, datamodule, *rest)

    monkeypatch.setattr(evaluate, "evaluate_checkpoint", keep)
    summary = run_in_process(
        [*args, "mode=eval", f"ckpt_path={ckpt}", "loader=explicit", "loader.num_workers=0"], run_dir
    )
    monkeypatch.undo()
    batches = [restore(flat) for flat in seen["datamodule"].val_dataloader()]
    return summary, seen["module"].last_detections, batches, seen["module"]


def reference(args: list[str], ann: Path) -> dict:
    """What the reference knows of a run, none of it from cocodet: the recipe's side and the
    model's resize sizes this test passes on the command line (None: the builder's), the
    annotation file's categories (label k is the k-th id in ascending order, 0 background) and
    each image's stored (height, width)."""
    import json

    given = dict(a.lstrip("+").split("=", 1) for a in args if "=" in a)
    data = json.loads(ann.read_text())
    side = int(given["dataset.image_size"])
    sizes = (
        (int(given["model.detector.min_size"]), int(given["model.detector.max_size"]))
        if "model.detector.min_size" in given
        else None
    )
    return {
        "name": given["model"],
        "side": side,
        "sizes": sizes,
        "category_ids": np.array(sorted(c["id"] for c in data["categories"]), dtype=np.int64),
        "stored_hw": {im["id"]: (im["height"], im["width"]) for im in data["images"]},
    }


def public_model(ckpt: str, ref: dict, letterbox: bool) -> torch.nn.Module:
    """torchvision's model for the checkpoint, built without cocodet's model code
    (``models/zoo.py``) or values, so a fault there cannot be copied into the reference:
    torchvision's builder (``ref["name"]``) with the annotation file's category count and its own
    normalisation, at the sizes the test gave the recipe (a letterbox: its side) or the builder's
    own; or for fcos_resnet18_fpn, which has no builder, :func:`torchvision_fcos_resnet18_fpn` from
    torchvision's public classes; then the checkpoint file's weights, in eval(). Its transform
    normalises, batches and post-processes as torchvision's does, and never resizes: cocodet's
    tensors are already the model's input (``reference_resize`` keeps the resize it would do)."""
    name, num_classes = ref["name"], len(ref["category_ids"]) + 1
    state = checkpoint_weights(ckpt)
    sizes = (ref["side"], ref["side"]) if letterbox else ref["sizes"]
    sized = {} if sizes is None else {"min_size": sizes[0], "max_size": sizes[1]}
    if hasattr(tvd, name):
        public = getattr(tvd, name)(weights=None, weights_backbone=None, num_classes=num_classes, **sized)
    else:
        assert name == "fcos_resnet18_fpn", name
        public = torchvision_fcos_resnet18_fpn(
            num_classes, width=state["backbone.fpn.inner_blocks.0.0.weight"].shape[0], **sized
        )
    public.load_state_dict(state)
    public.eval()
    public.reference_resize = public.transform.resize
    public.transform.resize = lambda image, target=None: (image, target)  # eval() would resize again
    return public


@functools.lru_cache(maxsize=1)
def checkpoint_weights(ckpt: str) -> dict:
    """The detector's weights in ``ckpt``, read once for the clean and the faulty comparisons
    (``load_state_dict`` copies them into each model)."""
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    return {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}


def torchvision_fcos_resnet18_fpn(num_classes: int, width: int, min_size: int, max_size: int) -> torch.nn.Module:
    """FCOS as torchvision composes ``fcos_resnet50_fpn``, on a ResNet-18 body: its ``FCOS``
    with its default anchors and normalisation, a ``BackboneWithFPN`` over torchvision's
    ``resnet18`` (C3-C5, with P6 and P7 from P5's output), an ``FCOSHead`` of one anchor per
    location, a stock ``GeneralizedRCNNTransform``. ``width``: the FPN's and head's channels,
    read from the checkpoint."""
    from torchvision.models import resnet18
    from torchvision.models.detection.backbone_utils import BackboneWithFPN
    from torchvision.ops.feature_pyramid_network import LastLevelP6P7

    backbone = BackboneWithFPN(
        resnet18(weights=None),
        {"layer2": "0", "layer3": "1", "layer4": "2"},
        [128, 256, 512],
        width,
        extra_blocks=LastLevelP6P7(width, width),
    )
    return tvd.FCOS(
        backbone, num_classes, min_size=min_size, max_size=max_size, head=tvd.fcos.FCOSHead(width, 1, num_classes)
    )


def plant_anchor_fault(monkeypatch) -> None:
    """A fault in cocodet's own model code: every model ``models/zoo.py`` builds gets anchors
    of another size (AnchorGenerator's sizes doubled; SSD's default boxes at 1.5x their
    scales). Its weights load as before; only the parity comparison can see it."""
    from torchvision.models.detection.anchor_utils import AnchorGenerator, DefaultBoxGenerator

    import cocodet.models.zoo as zoo

    real = zoo.build_detector

    def faulty(*args, **kwargs):
        model = real(*args, **kwargs)
        g = model.anchor_generator
        if isinstance(g, AnchorGenerator):
            model.anchor_generator = AnchorGenerator(
                tuple(tuple(2 * s for s in level) for level in g.sizes), g.aspect_ratios
            )
        else:
            assert isinstance(g, DefaultBoxGenerator), type(g)
            model.anchor_generator = DefaultBoxGenerator(
                g.aspect_ratios, scales=[1.5 * s for s in g.scales], steps=g.steps, clip=g.clip
            )
        return model

    monkeypatch.setattr(zoo, "build_detector", faulty)


def plant_transform_fault(monkeypatch, change) -> None:
    """``change(transform)`` applied to the transform of every model ``models/zoo.py`` builds."""
    import cocodet.models.zoo as zoo

    real = zoo.build_detector

    def faulty(*args, **kwargs):
        model = real(*args, **kwargs)
        change(model.transform)
        return model

    monkeypatch.setattr(zoo, "build_detector", faulty)


def plant_mean_fault(monkeypatch) -> None:
    """The normalisation's mean off by 0.05 in each channel (about a fifth of the std it divides by)."""
    plant_transform_fault(monkeypatch, lambda t: setattr(t, "image_mean", [m + 0.05 for m in t.image_mean]))


def plant_std_fault(monkeypatch) -> None:
    """The normalisation's standard deviation 10% too large."""
    plant_transform_fault(monkeypatch, lambda t: setattr(t, "image_std", [v * 1.1 for v in t.image_std]))


def plant_size_fault(monkeypatch) -> None:
    """The model's resize 32 px short: the sizes of the model's own transform (which resizes
    in the letterbox kind), and those the loader is given to resize as the model would (the
    reference presets' and SSD's; their model transform never resizes)."""
    import cocodet.transforms.model_resize as model_resize

    def smaller(t):
        t.min_size, t.max_size = tuple(m - 32 for m in t.min_size), t.max_size - 32

    plant_transform_fault(monkeypatch, smaller)
    builder, fixed = model_resize.builder_sizes, model_resize.fixed_sizes
    monkeypatch.setattr(model_resize, "builder_sizes", lambda *a: tuple(v - 32 for v in builder(*a)))
    monkeypatch.setattr(model_resize, "fixed_sizes", lambda *a: tuple(v - 32 for v in fixed(*a)))


FAULTS = {
    "anchor size": plant_anchor_fault,
    "image_mean": plant_mean_fault,
    "image_std": plant_std_fault,
    "resize": plant_size_fault,
}


def unseen_faults(args: list[str], ckpt: str, ann: Path, run_dir: Path, monkeypatch, letterbox: bool) -> list[str]:
    """The FAULTS that the parity comparison did not see, each planted alone for a mode=eval
    (which undoes it once run) of the first image: one is enough to see a fault, at a quarter
    of the forward passes."""
    import json

    data = json.loads(ann.read_text())
    first = min(im["id"] for im in data["images"])
    data["images"] = [im for im in data["images"] if im["id"] == first]
    data["annotations"] = [a for a in data["annotations"] if a["image_id"] == first]  # every category kept
    run_dir.mkdir(parents=True, exist_ok=True)
    one = run_dir / "one_image.json"
    one.write_text(json.dumps(data))
    args = [a for a in args if not a.startswith("dataset.val_ann=")] + [f"dataset.val_ann={one}"]
    unseen = []
    for name, plant in FAULTS.items():
        plant(monkeypatch)
        _, wrong, _, _ = output_parity(args, ckpt, one, run_dir / name.replace(" ", "_"), monkeypatch, letterbox)
        if not wrong:
            unseen.append(name)
    return unseen


def public_full_eval(ckpt: str, ref: dict, images: Path, ann: Path) -> np.ndarray:
    """Reported, not gated: torchvision's path with its own input, as the reference evaluates:
    CocoDetection, ToImage and ToDtype (float [0, 1]), the model's own float resize and its
    postprocess back to the stored size; then the same results conversion and COCOeval."""
    from torchvision.datasets import CocoDetection
    from torchvision.transforms import v2

    public = public_model(ckpt, ref, letterbox=False)
    del public.transform.resize  # torchvision's own resize again
    dataset = CocoDetection(str(images), str(ann))
    to_input = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])
    label_ids, results = ref["category_ids"], []
    with torch.no_grad():
        for k, image_id in enumerate(dataset.ids):
            out = public([to_input(dataset[k][0])])[0]
            keep = out["labels"] > 0
            for box, score, label in zip(
                out["boxes"][keep].tolist(), out["scores"][keep].tolist(), out["labels"][keep].tolist()
            ):
                results.append(
                    {
                        "image_id": int(image_id),
                        "category_id": int(label_ids[label - 1]),
                        "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]],
                        "score": score,
                    }
                )
    return coco_stats(ann, results, list(dataset.ids))


def public_results(model, batches, ref: dict, letterbox: bool) -> tuple[list[dict], list[str]]:
    """COCO results of ``model`` on cocodet's val tensors, the reference's way: boxes from the
    network input back to the stored image (``resize_boxes`` per axis from the input's size, as
    GeneralizedRCNNTransform.postprocess does; a letterbox by its scale, the recipe's side over
    the stored long side, since the reference has none), label 0 dropped, labels to the
    annotation file's category ids, boxes to xywh. Also each input whose size is not the
    reference's: torchvision's resize of the stored image, or the letterbox's square."""
    results, wrong = [], []
    with torch.no_grad():
        for images, targets in batches:
            for out, image, target in zip(model(images), images, targets):
                image_id = int(target["image_id"])
                stored_h, stored_w = ref["stored_hw"][image_id]
                expected = (
                    (ref["side"], ref["side"])
                    if letterbox
                    else tuple(model.reference_resize(torch.zeros(3, stored_h, stored_w))[0].shape[-2:])
                )
                if tuple(image.shape[-2:]) != expected:
                    wrong.append(f"image {image_id}: input {tuple(image.shape[-2:])}, the reference's {expected}")
                boxes = out["boxes"]
                if letterbox:
                    boxes = boxes * max(stored_h, stored_w) / ref["side"]
                    boxes[:, 0::2] = boxes[:, 0::2].clamp(0, stored_w)
                    boxes[:, 1::2] = boxes[:, 1::2].clamp(0, stored_h)
                else:
                    boxes = resize_boxes(boxes, tuple(image.shape[-2:]), (stored_h, stored_w))
                keep = out["labels"] > 0
                for box, score, label in zip(
                    boxes[keep].tolist(), out["scores"][keep].tolist(), out["labels"][keep].tolist()
                ):
                    results.append(
                        {
                            "image_id": image_id,
                            "category_id": int(ref["category_ids"][label - 1]),
                            "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]],
                            "score": score,
                        }
                    )
    return results, wrong


def coco_stats(ann: Path, results: list[dict], image_ids: list[int]) -> np.ndarray:
    """pycocotools' 12 stats of ``results`` on ``image_ids``."""
    import contextlib
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(ann))
        e = COCOeval(gt, gt.loadRes(results) if results else COCO(), "bbox")
        e.params.imgIds = sorted(image_ids)
        e.evaluate(), e.accumulate(), e.summarize()
    return np.asarray(e.stats)


STATS = [
    "map",
    "map50",
    "map75",
    "map_small",
    "map_medium",
    "map_large",
    "mar_1",
    "mar_10",
    "mar_100",
    "mar_small",
    "mar_medium",
    "mar_large",
]


def gated_mismatches(ours: dict, by_image: dict, theirs: list[dict], stats: np.ndarray) -> list[str]:
    """Per image, detections by descending score: the same count and labels, boxes within 1e-2
    px, scores within 1e-4; then the 12 stats (``ours``: the module's, unrounded) within 1e-4."""
    wrong = []
    for image_id, detections in by_image.items():
        a = sorted(detections, key=lambda d: -d["score"])
        b = sorted([d for d in theirs if d["image_id"] == image_id], key=lambda d: -d["score"])
        if len(a) != len(b) or [d["category_id"] for d in a] != [d["category_id"] for d in b]:
            wrong.append(f"image {image_id}: {len(a)} detections against {len(b)}, or other labels")
            continue
        box = max((abs(x - y) for p, q in zip(a, b) for x, y in zip(p["bbox"], q["bbox"])), default=0.0)
        score = max((abs(p["score"] - q["score"]) for p, q in zip(a, b)), default=0.0)
        if box > 1e-2 or score > 1e-4:
            wrong.append(f"image {image_id}: boxes {box:.4f} px, scores {score:.6f} apart")
    ours_stats = np.asarray([ours[k] for k in STATS])
    if np.abs(ours_stats - stats).max() > 1e-4:
        wrong.append(f"stats {ours_stats.round(4).tolist()} != {stats.round(4).tolist()}")
    return wrong


def output_parity(args: list[str], ckpt: str, ann: Path, run_dir: Path, monkeypatch, letterbox: bool):
    """(cocodet's mode=eval summary, the gated mismatches, torchvision's stats, the module)."""
    summary, by_image, batches, module = cocodet_eval(args, ckpt, run_dir, monkeypatch)
    ref = reference(args, ann)
    theirs, wrong = public_results(public_model(ckpt, ref, letterbox), batches, ref, letterbox)
    stats = coco_stats(ann, theirs, list(by_image))
    return summary, wrong + gated_mismatches(module.last_metrics, by_image, theirs, stats), stats, module


@pytest.fixture(scope="module")
def overfit(coco_tiny, tmp_path_factory):
    """Each resize kind trained to memorise the 4 images: (dataset args, checkpoint)."""
    base = tmp_path_factory.mktemp("output_parity")
    ann = subset(coco_tiny, base / "subset")
    trained = {}
    for kind, (extra, epochs) in KINDS.items():
        args = [*dataset_args(coco_tiny, ann), *extra]
        s = run_in_process(
            [
                *args,
                f"trainer.max_epochs={epochs}",
                f"trainer.check_val_every_n_epoch={epochs}",
                f"+callbacks.last_checkpoint.every_n_epochs={epochs}",
            ],
            base / kind,
        )
        trained[kind] = (args, s["last_ckpt"], s)
    return ann, trained


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
def test_cocodet_scores_a_checkpoint_as_torchvisions_path_does(kind, overfit, tmp_path, monkeypatch):
    ann, trained = overfit
    args, ckpt, training = trained[kind]
    summary, wrong, stats, module = output_parity(args, ckpt, ann, tmp_path, monkeypatch, letterbox=False)
    assert summary["map50"] >= 0.2, summary["map50"]  # it learned something: zeros prove nothing
    assert wrong == []
    assert unseen_faults(args, ckpt, ann, tmp_path / "faults", monkeypatch, letterbox=False) == [], (
        "faults planted in cocodet's model went unseen"
    )
    own = public_full_eval(ckpt, reference(args, ann), coco_tiny_images(args), ann)
    print(
        f"{kind}: mode=eval {[round(summary[k], 4) for k in STATS]}; torchvision's path on the same tensors "
        f"{stats.round(4).tolist()}; on its own input {own.round(4).tolist()} (reported, not gated)"
    )


def coco_tiny_images(args: list[str]) -> Path:
    root = next(a.split("=", 1)[1] for a in args if a.startswith("dataset.root="))
    return Path(root) / "train2017"
