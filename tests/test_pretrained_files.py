"""Pretrained weights from local files (model.detector.weights_backbone_path / weights_path):
loaded exactly as torchvision's downloads would be, refused in one line when they are for
another architecture or ask for more than tensors."""

from __future__ import annotations

import math

import pytest
import torch
import torchvision.models as tvm
import torchvision.models.detection as tvd
from torchvision.ops.misc import FrozenBatchNorm2d

from cocodet.models.checkpoint_file import CheckpointError
from cocodet.models.zoo import build_detector


def saved(tmp_path, name: str, state: dict) -> str:
    path = tmp_path / f"{name}.pth"
    torch.save(state, path)
    return str(path)


def test_a_resnet50_file_loads_bit_exactly_with_frozen_batch_norm(tmp_path):
    torch.manual_seed(0)
    state = tvm.resnet50().state_dict()
    model = build_detector(
        "fasterrcnn_resnet50_fpn", num_classes=3, image_size=128, weights_backbone_path=saved(tmp_path, "r50", state)
    )
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
    model = build_detector(
        "ssdlite320_mobilenet_v3_large",
        num_classes=3,
        image_size=128,
        weights_backbone_path=saved(tmp_path, "mnv3", state),
    )
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
    model = build_detector(
        "retinanet_resnet50_fpn", num_classes=3, image_size=128, weights_path=saved(tmp_path, "retina", state)
    )
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
        build_detector(
            "ssd300_vgg16", num_classes=3, image_size=128, weights_backbone_path=saved(tmp_path, "vgg16", classifier)
        )
    features = {k: v for k, v in classifier.items() if k.startswith("features.")}  # the features file's trained part
    model = build_detector(
        "ssd300_vgg16", num_classes=3, image_size=128, weights_backbone_path=saved(tmp_path, "vgg16_features", features)
    )
    assert torch.equal(model.backbone.features[0].weight, features["features.0.weight"])


def test_a_pretrained_resnet18_backbone_keeps_frozen_batch_norm_in_fcos_resnet18_fpn(tmp_path):
    """As torchvision's builders do with a pretrained backbone: FrozenBatchNorm2d, so that small
    per-GPU batches cannot drift the trained statistics; from scratch, plain BatchNorm2d learns."""
    path = saved(tmp_path, "r18", tvm.resnet18().state_dict())
    body = build_detector("fcos_resnet18_fpn", num_classes=3, image_size=128, weights_backbone_path=path).backbone.body
    assert sum(isinstance(m, FrozenBatchNorm2d) for m in body.modules()) == 20
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in body.modules())
    scratch = build_detector("fcos_resnet18_fpn", num_classes=3, image_size=128).backbone.body
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in scratch.modules()) == 20


@pytest.mark.parametrize("name", ["retinanet_resnet50_fpn", "fcos_resnet50_fpn"])
def test_a_replaced_class_layer_starts_from_the_prior_probability(tmp_path, name):
    """The new cls_logits of RetinaNet and FCOS starts every class at probability 0.01, as
    torchvision's heads do: bias -log(0.99 / 0.01), not a bias one COCO class learned."""
    torch.manual_seed(4)
    state = getattr(tvd, name)(weights=None, weights_backbone=None, num_classes=91).state_dict()
    state["head.classification_head.cls_logits.bias"] = torch.linspace(
        0.5, 2.0, len(state["head.classification_head.cls_logits.bias"])
    )
    model = build_detector(name, num_classes=3, image_size=128, weights_path=saved(tmp_path, name, state))
    bias = model.head.classification_head.cls_logits.bias
    assert torch.allclose(bias, torch.full_like(bias, -math.log(0.99 / 0.01)))


def test_a_coco_ssdlite_file_gets_its_class_layers_replaced(tmp_path):
    """SSD's class convolutions are replaced for the dataset's categories, one per level (before
    issue 57 the check named tvd.SSD, which torchvision does not export: an AttributeError)."""
    torch.manual_seed(5)
    state = tvd.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=91).state_dict()
    model = build_detector(
        "ssdlite320_mobilenet_v3_large", num_classes=3, image_size=320, weights_path=saved(tmp_path, "ssdlite", state)
    )
    anchors = model.anchor_generator.num_anchors_per_location()
    assert [layer[-1].out_channels for layer in model.head.classification_head.module_list] == [a * 3 for a in anchors]
    kept = [k for k in state if "classification_head" not in k and not k.endswith("num_batches_tracked")]
    assert all(torch.equal(model.state_dict()[k], state[k]) for k in kept)
