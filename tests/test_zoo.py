"""The zoo's own model, fcos_resnet18_fpn: its default is torchvision's FCOS at width 256, and
model.detector.fpn_channels narrows the FPN and the head together."""

from __future__ import annotations

import pytest
import torch
import torchvision.models.detection as tvd
from torchvision.models import resnet18
from torchvision.models.detection.backbone_utils import _resnet_fpn_extractor
from torchvision.ops.feature_pyramid_network import LastLevelP6P7

from cocodet.models.zoo import build_detector


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_the_default_width_is_torchvisions_fcos_bit_for_bit():
    """The default builds what torchvision's own pieces build (the model before the option
    existed): the same modules in the same order, so the same initial weights for a seed, and
    make train's run is unchanged."""
    torch.manual_seed(0)
    ours = build_detector("fcos_resnet18_fpn", num_classes=4, image_size=64)
    torch.manual_seed(0)
    backbone = _resnet_fpn_extractor(resnet18(), 5, returned_layers=[2, 3, 4], extra_blocks=LastLevelP6P7(256, 256))
    stock = tvd.FCOS(backbone, num_classes=4, min_size=64, max_size=64)
    assert ours.backbone.out_channels == 256 and round(n_params(ours) / 1e6, 1) == 19.1
    a, b = ours.state_dict(), stock.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_narrower_width_reaches_the_fpn_and_the_head_and_trains():
    model = build_detector("fcos_resnet18_fpn", num_classes=4, image_size=64, fpn_channels=64)
    assert model.backbone.out_channels == 64 and round(n_params(model) / 1e6, 1) == 11.7
    assert model.head.classification_head.conv[0].in_channels == 64
    assert model.head.classification_head.cls_logits.out_channels == 4
    images = [torch.rand(3, 64, 64) for _ in range(2)]
    targets = [{"boxes": torch.tensor([[4.0, 4.0, 40.0, 40.0]]), "labels": torch.tensor([1])} for _ in range(2)]
    losses = model(images, targets)
    assert set(losses) == {"classification", "bbox_regression", "bbox_ctrness"}
    sum(losses.values()).backward()
    model.eval()
    [out] = model(images[:1])
    assert out["boxes"].shape[1] == 4


def test_a_width_the_groupnorm_cannot_split_is_refused():
    with pytest.raises(ValueError, match="fpn_channels=48.*multiple of 32"):
        build_detector("fcos_resnet18_fpn", num_classes=4, image_size=64, fpn_channels=48)
