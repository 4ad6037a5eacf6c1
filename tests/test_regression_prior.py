"""FCOS's box-regression prior (issue 45): torchvision's bias 0 starts every box as a point, where
the GIoU loss reads 1.000 with almost no gradient; once the shared regression tower drifts every
raw output below 0, the ReLU passes nothing and the run never learns boxes (the collapsed
seed-1 run of docs/studies.md went dead at step 23). cocodet starts each side at one anchor size.

The state is driven, not waited for: the same downward shift of the raw outputs (just past the
largest output of torchvision's initialisation, as the collapsed run's drift did) is applied to
both initialisations, and the same fixed batch is trained for a few steps."""

from __future__ import annotations

import pytest
import torch

from cocodet.models.zoo import build_detector


def fixed_batch():
    g = torch.Generator().manual_seed(0)
    images = [torch.rand(3, 128, 128, generator=g) for _ in range(2)]
    targets = [
        {"boxes": torch.tensor([[10.0, 20.0, 70.0, 90.0], [60.0, 50.0, 120.0, 110.0]]), "labels": torch.tensor([1, 2])},
        {"boxes": torch.tensor([[30.0, 30.0, 100.0, 80.0]]), "labels": torch.tensor([3])},
    ]
    return images, targets


def detector(bias: float):
    torch.manual_seed(0)  # the same weights for both biases: only the constant differs
    model = build_detector("fcos_resnet18_fpn", num_classes=4, image_size=128, fpn_channels=64, regression_bias=bias)
    return model.train(), model.head.regression_head.bbox_reg


def raw_outputs(conv, run) -> list[torch.Tensor]:
    """bbox_reg's outputs before the ReLU, every level, during ``run()``."""
    seen = []
    handle = conv.register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    try:
        result = run()
    finally:
        handle.remove()
    return seen, result


def train(bias: float, shift: float, steps: int = 8) -> list[tuple[float, float]]:
    """(bbox_regression loss, bbox_reg weight-gradient norm) per step, outputs shifted by -shift."""
    model, conv = detector(bias)
    with torch.no_grad():
        conv.bias -= shift
    images, targets = fixed_batch()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)  # make train's lr at step 26
    history = []
    for _ in range(steps):
        losses = model(images, targets)
        optimizer.zero_grad()
        sum(losses.values()).backward()
        history.append((losses["bbox_regression"].item(), conv.weight.grad.norm().item()))
        optimizer.step()
    return history


@pytest.fixture(scope="module")
def dead_shift() -> float:
    """Just past torchvision's largest initial output: every output of bias 0 below 0."""
    model, conv = detector(0.0)
    seen, _ = raw_outputs(conv, lambda: model(*fixed_batch()))
    return max(float(o.max()) for o in seen) + 0.01


def test_torchvision_init_starts_with_points_and_no_gradient():
    """At bias 0 the loss is already 1.000 before any step, and its gradient is a twentieth of
    the fixed head's (measured: 0.045 against 0.94)."""
    ((loss0, grad0),) = train(0.0, 0.0, steps=1)
    ((loss1, grad1),) = train(1.0, 0.0, steps=1)
    assert loss0 > 0.999 and loss1 < 0.97
    assert grad1 > 10 * grad0, (grad0, grad1)


def test_drifted_torchvision_head_collapses_and_fixed_head_trains(dead_shift):
    before = train(0.0, dead_shift)
    assert all(loss == 1.0 and grad == 0.0 for loss, grad in before), before  # dead: no step can revive it
    after = train(1.0, dead_shift)
    print(f"shift {dead_shift:.3f}; bias 0: {before[-1]}; bias 1: {after[0]} -> {after[-1]}")
    assert after[0][1] > 0 and after[-1][0] < 0.8 * after[0][0], after


def test_regression_bias_is_fcos_only():
    with pytest.raises(ValueError, match="regression_bias is FCOS's"):
        build_detector("retinanet_resnet50_fpn", num_classes=4, image_size=128, regression_bias=1.0)
