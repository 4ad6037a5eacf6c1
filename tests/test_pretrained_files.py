"""Pretrained weights from local files (model.detector.weights_backbone_path / weights_path):
loaded exactly as torchvision's downloads would be, refused in one line when they are for
another architecture or ask for more than tensors."""

from __future__ import annotations

import torch
import torchvision.models as tvm
import torchvision.models.detection as tvd
from torchvision.ops.misc import FrozenBatchNorm2d
import pytest

from cocodet.models.checkpoint_file import CheckpointError
from cocodet.models.zoo import build_detector


def saved(tmp_path, name: str, state: dict) -> str:
    path = tmp_path / f"{name}.pth"
    torch.save(state, path)
    return str(path)


def test_a_resnet50_file_loads_bit_exactly_with_frozen_batch_norm(tmp_path):
    torch.manual_seed(0)
    state = tvm.resnet50().state_dict()
    model = build_detector("fasterrcnn_resnet50_fpn", num_classes=3, image_size=128,
                           weights_backbone_path=saved(tmp_path, "r50", state))
    body = model.backbone.body.state_dict()
    compared = [k for k in body if k in state and not k.endswith("num_batches_tracked")]
    assert len(compared) > 250 and all(torch.equal(body[k], state[k]) for k in compared)
    frozen = [m for m in model.backbone.body.modules() if isinstance(m, FrozenBatchNorm2d)]
    assert len(frozen) == 53 and not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.backbone.body.modules())
    trainable = {n.split(".")[0] for n, p in model.backbone.body.named_parameters() if p.requires_grad}
    assert trainable == {"layer2", "layer3", "layer4"}  # the builder's 3 trainable layers with pretrained weights


def test_a_mobilenet_v3_large_file_loads_bit_exactly_into_ssdlite(tmp_path):
    torch.manual_seed(1)
    state = tvm.mobilenet_v3_large().state_dict()
    model = build_detector("ssdlite320_mobilenet_v3_large", num_classes=3, image_size=128,
                           weights_backbone_path=saved(tmp_path, "mnv3", state))
    built = list(model.backbone.features.state_dict().values())
    features = [v for k, v in state.items() if k.startswith("features.")]
    # Every trained tensor of the file is in the backbone, in order (SSDlite splits `features` in two).
    assert len(features) == len(built) and all(torch.equal(a, b) for a, b in zip(features, built))


def test_a_file_for_another_architecture_is_refused_in_one_line(tmp_path):
    path = saved(tmp_path, "r18", tvm.resnet18().state_dict())
    with pytest.raises(CheckpointError) as e:
        build_detector("fasterrcnn_resnet50_fpn", num_classes=3, image_size=128, weights_backbone_path=path)
    text = str(e.value)
    assert "\n" not in text and "is not torchvision's resnet50" in text and "tensors missing" in text
    assert "of another shape" in text


class Payload:
    def __reduce__(self):
        import os

        return (os.system, ("touch PWNED_MARKER",))


def test_a_pickle_is_refused_and_nothing_it_holds_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = saved(tmp_path, "evil", {"conv1.weight": torch.zeros(1), "x": Payload()})
    with pytest.raises(CheckpointError, match="was refused: loading it needs the global"):
        build_detector("fasterrcnn_resnet50_fpn", num_classes=3, image_size=128, weights_backbone_path=path)
    assert not (tmp_path / "PWNED_MARKER").exists()


def test_a_coco_detector_file_loads_then_only_the_class_layer_is_replaced(tmp_path):
    """RetinaNet v1: the file's 91-class detector loads, and the head keeps its trained conv
    tower; only cls_logits is new (3 classes x 9 anchors)."""
    torch.manual_seed(2)
    state = tvd.retinanet_resnet50_fpn(weights=None, weights_backbone=None, num_classes=91).state_dict()
    model = build_detector("retinanet_resnet50_fpn", num_classes=3, image_size=128,
                           weights_path=saved(tmp_path, "retina", state))
    built = model.state_dict()
    kept = [k for k in state if "cls_logits" not in k and not k.endswith("num_batches_tracked") and k in built]
    assert any(k.startswith("head.classification_head.conv") for k in kept)
    assert all(torch.equal(built[k], state[k]) for k in kept)
    assert tuple(built["head.classification_head.cls_logits.weight"].shape) == (27, 256, 3, 3)
    assert model.head.classification_head.num_classes == 3


def test_ssd300_takes_vgg16_features_and_refuses_the_imagenet_classifier(tmp_path):
    torch.manual_seed(3)
    classifier = tvm.vgg16().state_dict()
    with pytest.raises(CheckpointError, match="ImageNet vgg16 classifier .* vgg16_features"):
        build_detector("ssd300_vgg16", num_classes=3, image_size=128,
                       weights_backbone_path=saved(tmp_path, "vgg16", classifier))
    features = {k: v for k, v in classifier.items() if k.startswith("features.")}  # the features file's trained part
    model = build_detector("ssd300_vgg16", num_classes=3, image_size=128,
                           weights_backbone_path=saved(tmp_path, "vgg16_features", features))
    assert torch.equal(model.backbone.features[0].weight, features["features.0.weight"])
