"""The zoo's own model, fcos_resnet18_fpn: its default is torchvision's FCOS at width 256,
model.detector.fpn_channels narrows the FPN and the head together, and a checkpoint of another
width (or model, or number of categories) is refused in one line that says what differs."""

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


class Wrapped(torch.nn.Module):
    """The detector under ``model``, as DetectorModule holds it (its checkpoint keys)."""

    def __init__(self, **kwargs):
        super().__init__()
        self.model = build_detector(num_classes=4, image_size=64, **kwargs)


def test_a_checkpoint_of_another_width_or_model_is_refused_with_what_differs():
    from cocodet.inference.checkpoint import load_weights
    from cocodet.models.checkpoint_file import CheckpointError

    narrow = {"state_dict": Wrapped(name="fcos_resnet18_fpn", fpn_channels=64).state_dict()}
    with pytest.raises(CheckpointError) as caught:
        load_weights(Wrapped(name="fcos_resnet18_fpn"), "narrow.ckpt", True, narrow)
    line = str(caught.value)
    assert (
        "first model.backbone.fpn.inner_blocks.0.0.weight: [64, 128, 1, 1] saved, [256, 128, 1, 1] configured" in line
    )
    assert "trained with model.detector.fpn_channels=64" in line and "\n" not in line
    with pytest.raises(CheckpointError, match=r"tensors missing, first \['model.backbone.body.0.0.weight'\]"):
        load_weights(Wrapped(name="fasterrcnn_mobilenet_v3_large_fpn"), "narrow.ckpt", True, narrow)
    four = {"state_dict": Wrapped(name="fcos_resnet18_fpn").state_dict()}
    wider = Wrapped(name="fcos_resnet18_fpn")
    wider.model = build_detector("fcos_resnet18_fpn", num_classes=7, image_size=64)
    with pytest.raises(CheckpointError, match="cls_logits.weight.*another number of categories"):
        load_weights(wider, "four.ckpt", True, four)
