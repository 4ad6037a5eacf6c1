"""Torchvision detectors by name (the ``model`` config group)."""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Callable, Optional

import torch
import torchvision.models.detection as tvd
from torch import Tensor
from torchvision.models import resnet18
from torchvision.models.detection.backbone_utils import BackboneWithFPN, _resnet_fpn_extractor
from torchvision.models.detection.transform import GeneralizedRCNNTransform
from torchvision.ops.feature_pyramid_network import LastLevelP6P7
from torchvision.ops.misc import FrozenBatchNorm2d

from cocodet.models.pretrained_files import answered_from, backbone_state_dict, detector_state_dict


def _fcos_resnet18_fpn(
    *, weights=None, weights_backbone=None, num_classes: int, fpn_channels: int = 256, **kwargs
) -> tvd.FCOS:
    """FCOS on a ResNet-18 FPN (P3-P7): torchvision's FCOS head and losses on a backbone
    small enough to train from scratch on a CPU in minutes. ``weights`` has no checkpoint.

    ``fpn_channels`` is the width of the FPN and of the head's convolutions (torchvision's 256 by
    default). The head runs 8 convolutions at every level, so at small inputs it costs more than
    the backbone: 64 channels make a 64 px step 2.2x cheaper on a CPU (11.7 M parameters, not
    19.1 M), for smoke runs and tests that check the pipeline rather than the detector."""
    if weights is not None:
        raise ValueError("fcos_resnet18_fpn has no detection checkpoint; use weights_backbone=DEFAULT instead")
    if fpn_channels < 32 or fpn_channels % 32:
        raise ValueError(
            f"model.detector.fpn_channels={fpn_channels}: the head's GroupNorm has 32 groups, so use "
            "a multiple of 32 (256 is torchvision's width)"
        )
    # As torchvision's builders: a pretrained backbone keeps its batch-norm statistics frozen
    # (at small per-GPU batches they would drift), one from scratch learns them.
    norm_layer = torch.nn.BatchNorm2d if weights_backbone is None else FrozenBatchNorm2d
    backbone = resnet18(weights=weights_backbone, norm_layer=norm_layer)
    trainable = 5 if weights_backbone is None else 3  # from scratch every stage must learn
    backbone = _resnet_fpn_extractor(
        backbone, trainable, returned_layers=[2, 3, 4], extra_blocks=LastLevelP6P7(256, 256)
    )
    if fpn_channels != 256:
        # torchvision's extractor (which also freezes the stages not trained) fixes the FPN at 256
        # channels: the same FPN on its body (C3-C5: 128, 256, 512 channels) at this width, and
        # the head FCOS would build for it (one anchor per location).
        backbone = BackboneWithFPN(
            backbone.body,
            {"layer2": "0", "layer3": "1", "layer4": "2"},
            [128, 256, 512],
            fpn_channels,
            extra_blocks=LastLevelP6P7(fpn_channels, fpn_channels),
        )
        kwargs["head"] = tvd.fcos.FCOSHead(fpn_channels, 1, num_classes)
    return tvd.FCOS(backbone, num_classes=num_classes, **kwargs)


BUILDERS: dict[str, Callable[..., torch.nn.Module]] = {
    "ssdlite320_mobilenet_v3_large": tvd.ssdlite320_mobilenet_v3_large,
    "ssd300_vgg16": tvd.ssd300_vgg16,
    "fasterrcnn_resnet50_fpn": tvd.fasterrcnn_resnet50_fpn,
    "retinanet_resnet50_fpn": tvd.retinanet_resnet50_fpn,
    "fasterrcnn_mobilenet_v3_large_fpn": tvd.fasterrcnn_mobilenet_v3_large_fpn,
    "fasterrcnn_mobilenet_v3_large_320_fpn": tvd.fasterrcnn_mobilenet_v3_large_320_fpn,
    "fasterrcnn_resnet50_fpn_v2": tvd.fasterrcnn_resnet50_fpn_v2,
    "retinanet_resnet50_fpn_v2": tvd.retinanet_resnet50_fpn_v2,
    "fcos_resnet50_fpn": tvd.fcos_resnet50_fpn,
    "fcos_resnet18_fpn": _fcos_resnet18_fpn,
}
PRIOR_PROBABILITY = 0.01  # RetinaNetClassificationHead's and FCOSClassificationHead's default
# SSD fixes its own input size in the builder; the others take min/max size for their transform.
_FIXED_SIZE = {"ssdlite320_mobilenet_v3_large", "ssd300_vgg16"}


class LoaderSizedTransform(GeneralizedRCNNTransform):
    """The model's transform when the loader has already resized each image exactly as this
    transform would (the reference presets, ``transforms/model_resize.py``): it normalises and
    batches (padding to 32, as before), and never resizes, in training or evaluation.

    Without it, evaluation would resize again whatever ``_skip_resize`` says, and a 1-pixel
    rounding difference in the recomputed scale would resample every image."""

    def resize(
        self, image: Tensor, target: Optional[dict[str, Tensor]] = None
    ) -> tuple[Tensor, Optional[dict[str, Tensor]]]:
        return image, target


def build_detector(
    name: str,
    num_classes: int,
    image_size: int,
    pretrained: bool = False,
    pretrained_backbone: bool = False,
    loader_resizes: bool = False,
    weights_path: str | None = None,
    weights_backbone_path: str | None = None,
    **kwargs,
) -> torch.nn.Module:
    """Build a torchvision detector.

    Args:
        name: a key of BUILDERS.
        num_classes: classes including background (contiguous labels 1..K, 0 = background).
        image_size: the letterboxed input side; the detector's own transform is set not to resize.
        loader_resizes: the loader resizes as the builder's transform would (the reference
            presets; an SSD's fixed size with ``ssd|ssdlite``): its sizes stay the builder's (or
            min_size / max_size in kwargs), and the transform becomes a :class:`LoaderSizedTransform`.
        pretrained: COCO detection weights (downloads; the head is re-initialised for num_classes).
        pretrained_backbone: ImageNet backbone weights (downloads).
        weights_path / weights_backbone_path: the same weights from a local file
            (``models/pretrained_files.py``).
        kwargs: passed to the torchvision builder (e.g. box_score_thresh, detections_per_img).
    """
    if name not in BUILDERS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(BUILDERS)}")
    if name not in _FIXED_SIZE and not loader_resizes:
        kwargs.setdefault("min_size", image_size)
        kwargs.setdefault("max_size", image_size)
    weights = "DEFAULT" if pretrained else None
    weights_backbone = "DEFAULT" if pretrained_backbone or pretrained else None
    answer = None  # a file standing in for torchvision's download
    if weights_path:
        weights, answer = detector_state_dict(name, weights_path)
        weights_backbone = None
    elif weights_backbone_path:
        weights_backbone, answer = backbone_state_dict(name, weights_backbone_path)
    regression_bias = kwargs.pop("regression_bias", None)
    if regression_bias is not None and not name.startswith("fcos_"):
        raise ValueError(f"model.detector.regression_bias is FCOS's box-regression prior; {name} has none")
    with answered_from(answer) if answer is not None else nullcontext():
        if weights is not None and name != "fcos_resnet18_fpn":
            # Torchvision refuses num_classes != 91 with detection weights: load at 91, then swap heads.
            model = BUILDERS[name](weights=weights, weights_backbone=weights_backbone, **kwargs)
            model = _replace_head(model, num_classes)
        else:
            model = BUILDERS[name](
                weights=weights, weights_backbone=weights_backbone, num_classes=num_classes, **kwargs
            )
    if regression_bias is not None and weights is None:  # a detection checkpoint brings its own bias
        set_regression_prior(model, regression_bias)
    return _loader_sized(model) if loader_resizes else model


def set_regression_prior(model: tvd.FCOS, bias: float) -> None:
    """Start FCOS's box regression at ``bias`` anchor sizes a side.

    torchvision decodes ``relu(bbox_reg(x))`` as each side's distance in anchor sizes (the
    level's stride, 8 px at P3; a target's longest side distance is 4-8 of them at its level) and
    initialises the conv's bias to 0, so every box starts as a point inside its target. There the
    GIoU loss reads 1.000 and gives almost no gradient, while the shared regression tower, trained
    by the centerness loss alone, drifts the raw outputs; once they are all below 0 the ReLU passes
    nothing and the run can never learn boxes (docs/studies.md, "The collapse": seed 1 went dead at
    step 23). A bias of 1 starts each box one anchor size a side,
    the prior original FCOS gets from exp(0), so the loss has a gradient from the first step and a
    drift of the size measured (0.27 over a whole run) cannot reach the ReLU's edge."""
    torch.nn.init.constant_(model.head.regression_head.bbox_reg.bias, float(bias))


def _loader_sized(model: torch.nn.Module) -> torch.nn.Module:
    """The model with its transform swapped for a :class:`LoaderSizedTransform` of the same
    sizes, statistics and padding (an SSD's fixed size and size_divisible=1 included)."""
    t = model.transform
    model.transform = LoaderSizedTransform(
        t.min_size, t.max_size, t.image_mean, t.image_std, size_divisible=t.size_divisible, fixed_size=t.fixed_size
    )
    return model


def _replace_head(model: torch.nn.Module, num_classes: int) -> torch.nn.Module:
    """Only the final class layer replaced for ``num_classes`` (initialised as the class
    initialises it), so that every trained layer before it, the class subnet's conv tower
    included, is kept: Faster R-CNN's ``cls_score`` (and its per-class ``bbox_pred``),
    RetinaNet's and FCOS's ``cls_logits``, each SSD level's class convolution."""
    if isinstance(model, tvd.FasterRCNN):
        in_features = model.roi_heads.box_predictor.cls_score.in_features
        model.roi_heads.box_predictor = tvd.faster_rcnn.FastRCNNPredictor(in_features, num_classes)
    elif isinstance(model, (tvd.RetinaNet, tvd.FCOS)):
        head = model.head.classification_head
        old = head.cls_logits
        head.cls_logits = torch.nn.Conv2d(
            old.in_channels, head.num_anchors * num_classes, kernel_size=3, stride=1, padding=1
        )
        torch.nn.init.normal_(head.cls_logits.weight, std=0.01)
        # torchvision's heads start every class at the prior probability 0.01 (focal loss's prior),
        # not at a bias a COCO class learned.
        torch.nn.init.constant_(head.cls_logits.bias, -math.log((1 - PRIOR_PROBABILITY) / PRIOR_PROBABILITY))
        head.num_classes = num_classes
    elif isinstance(model, tvd.ssd.SSD):
        head = model.head.classification_head
        anchors = model.anchor_generator.num_anchors_per_location()
        for k, layer in enumerate(head.module_list):
            last = layer[-1] if isinstance(layer, torch.nn.Sequential) else layer  # SSDlite: depthwise block, then 1x1
            conv = torch.nn.Conv2d(
                last.in_channels, anchors[k] * num_classes, last.kernel_size, last.stride, last.padding
            )
            if isinstance(layer, torch.nn.Sequential):
                torch.nn.init.normal_(conv.weight, mean=0.0, std=0.03)  # ssdlite's _normal_init
                layer[-1] = conv
            else:
                torch.nn.init.xavier_uniform_(conv.weight)  # ssd's _xavier_init
                head.module_list[k] = conv
            torch.nn.init.constant_(conv.bias, 0.0)
        head.num_columns = num_classes
    else:
        raise ValueError(f"cannot replace the head of {type(model).__name__}")
    return model


def seed_model_init(seed: int) -> None:
    """Seed the generators a detector's weight init draws from (call before building it); the
    data never uses them (design §5)."""
    import lightning as L

    L.seed_everything(seed, workers=False, verbose=False)
