"""Pretrained weights from local files (``model.detector.weights_backbone_path``,
``weights_path``): what ``pretrained_backbone=true`` / ``pretrained=true`` download, for hosts
that cannot download (air-gapped GPU hosts, CI, image layers).

torchvision takes pretrained weights only as a ``WeightsEnum`` member, which it downloads
(``WeightsEnum.get_state_dict`` -> ``load_state_dict_from_url``). Here the builder is given
that member while the download is answered from the file, read like every checkpoint
(``torch.load(weights_only=True)``, ``models/checkpoint_file.py``). So everything the builder
does with real pretrained weights follows unchanged: frozen batch norm, the trainable-layer
count, SSDlite's full (not reduced) tail, the strict load.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torchvision.models as tvm
import torchvision.models._api as tv_api

from cocodet.models.checkpoint_file import CheckpointError, load_checkpoint

# Each zoo model's ImageNet backbone, as its builder's weights_backbone takes it.
BACKBONES: dict[str, tuple[str, object]] = {
    **{
        name: ("resnet50", tvm.ResNet50_Weights.IMAGENET1K_V1)
        for name in (
            "fasterrcnn_resnet50_fpn",
            "fasterrcnn_resnet50_fpn_v2",
            "retinanet_resnet50_fpn",
            "retinanet_resnet50_fpn_v2",
            "fcos_resnet50_fpn",
        )
    },
    **{
        name: ("mobilenet_v3_large", tvm.MobileNet_V3_Large_Weights.IMAGENET1K_V1)
        for name in (
            "fasterrcnn_mobilenet_v3_large_fpn",
            "fasterrcnn_mobilenet_v3_large_320_fpn",
            "ssdlite320_mobilenet_v3_large",
        )
    },
    "fcos_resnet18_fpn": ("resnet18", tvm.ResNet18_Weights.IMAGENET1K_V1),
    "ssd300_vgg16": ("vgg16", tvm.VGG16_Weights.IMAGENET1K_FEATURES),
}


@contextmanager
def answered_from(state_dict: dict):
    """While open, torchvision's weight download returns ``state_dict`` instead."""
    original = tv_api.load_state_dict_from_url
    tv_api.load_state_dict_from_url = lambda *args, **kwargs: state_dict
    try:
        yield
    finally:
        tv_api.load_state_dict_from_url = original


def read_state_dict(path: str, option: str) -> dict[str, torch.Tensor]:
    """A file's tensors (a bare state dict, or a training checkpoint's ``state_dict`` with the
    ``model.`` prefix cocodet's module adds), refused in one line if it asks for more."""
    data = load_checkpoint(path, weights_only=True, option=option)
    if "state_dict" in data and isinstance(data["state_dict"], dict):
        data = {k.removeprefix("model."): v for k, v in data["state_dict"].items()}
    tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise CheckpointError(f"{option}={path} holds no tensors (keys {sorted(data)[:5]})")
    return tensors


def backbone_state_dict(model: str, path: str) -> tuple[object, dict]:
    """(the builder's weights_backbone member, the file's state dict checked against that
    classification architecture)."""
    if model not in BACKBONES:
        raise CheckpointError(f"model.detector.weights_backbone_path: {model} has no ImageNet backbone to load")
    arch, member = BACKBONES[model]
    state = read_state_dict(path, "model.detector.weights_backbone_path")
    expected = shapes_of(lambda: getattr(tvm, arch)())
    if arch == "vgg16":
        state = _vgg16_features(state, expected, path)
    _check_fits(state, expected, path, "model.detector.weights_backbone_path", f"torchvision's {arch}")
    return member, state


def shapes_of(build) -> dict:
    """The state dict ``build()`` would have, as shapes only: built on the meta device, so no
    memory is allocated and nothing initialised (vgg16: 0.01 s instead of 1.8 s and 0.5 GB)."""
    with torch.device("meta"):
        return build().state_dict()


def _vgg16_features(state: dict, expected: dict, path: str) -> dict:
    """SSD300's backbone file is torchvision's ``vgg16_features`` (VGG16_Weights.IMAGENET1K_FEATURES):
    a vgg16 state dict whose classifier is NaN (only ``features`` was trained, on 0-255 inputs
    with the mean subtracted, which is how SSD300's transform normalises). It is recognised by
    that classifier: NaN, or absent (then filled with NaN). A vgg16 with a finite classifier is
    the ImageNet classification file, trained on another normalisation: refused."""
    classifier = [k for k in expected if k.startswith("classifier.")]
    present = [k for k in classifier if k in state]
    if present and all(torch.isfinite(state[k]).all() for k in present):
        raise CheckpointError(
            f"model.detector.weights_backbone_path={path} is torchvision's ImageNet vgg16 "
            "classifier (its classifier weights are finite), trained on inputs normalised another "
            "way; ssd300_vgg16 takes vgg16_features (VGG16_Weights.IMAGENET1K_FEATURES, "
            "vgg16_features-amdegroot-88682ab5.pth, classifier NaN)"
        )
    return {**{k: torch.full(expected[k].shape, float("nan")) for k in classifier}, **state}


def _check_fits(state: dict, expected: dict, path: str, option: str, what: str) -> None:
    """One line naming what differs; batch norm's ``num_batches_tracked`` counters are left out
    (torchvision's files predate them, and frozen batch norm drops them)."""

    def keys(d: dict) -> set:
        return {k for k in d if not k.endswith("num_batches_tracked")}

    missing, unexpected = sorted(keys(expected) - keys(state)), sorted(keys(state) - keys(expected))
    shapes = sorted(k for k in expected.keys() & state.keys() if tuple(expected[k].shape) != tuple(state[k].shape))
    if missing or unexpected or shapes:
        raise CheckpointError(
            f"{option}={path} is not {what}: {len(missing)} tensors missing (e.g. {missing[:2]}), "
            f"{len(unexpected)} unexpected (e.g. {unexpected[:2]}), {len(shapes)} of another shape "
            f"(e.g. {shapes[:2]})"
        )


def detector_state_dict(model: str, path: str) -> tuple[object, dict]:
    """(the builder's COCO weights member, the file's state dict checked against the detector
    that member builds: torchvision's COCO files, 91 classes)."""
    import torchvision.models.detection as tvd

    member = tvm.get_model_weights(model).DEFAULT if model != "fcos_resnet18_fpn" else None
    if member is None:
        raise CheckpointError(
            "model.detector.weights_path: fcos_resnet18_fpn has no torchvision detection file; use "
            "model.detector.weights_backbone_path (a resnet18 state dict)"
        )
    state = read_state_dict(path, "model.detector.weights_path")
    expected = shapes_of(
        lambda: getattr(tvd, model)(weights=None, weights_backbone=None, num_classes=len(member.meta["categories"]))
    )
    _check_fits(
        state,
        expected,
        path,
        "model.detector.weights_path",
        f"a {model} with torchvision's {len(member.meta['categories'])} COCO classes",
    )
    return member, state
