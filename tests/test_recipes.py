"""torchvision's published recipes as experiments (experiment=tv_*): each builds its model,
optimizer and the reference's schedule and takes a step on the CPU at reduced size (a
mode=plan builds none of them), with the learning rate scaled to the run's global batch."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import run_in_process

from cocodet.models.reference_schedule import reference_schedule, scaled_lr

RECIPES = {  # experiment: (reference lr, reference global batch)
    "tv_fasterrcnn_resnet50_fpn": (0.02, 16),
    "tv_fcos_resnet50_fpn": (0.01, 16),
    "tv_retinanet_resnet50_fpn": (0.01, 16),
    "tv_ssd300_vgg16": (0.002, 32),
    "tv_ssdlite320_mobilenet_v3_large": (0.15, 192),
}
# On this CPU: one process, fp32, 2 images per step, one train and one val batch; the R-CNN
# family's 800/1333 resize reduced to 96/160 (the SSDs keep their fixed 300 and 320).
REDUCED = [
    "trainer=cpu",
    "trainer.precision=32-true",
    "loader.batch_size=2",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=1",
    "trainer.limit_val_batches=1",
    "model.eval_max_images=2",
    "trainer.enable_progress_bar=false",
    "loader=explicit",
    "loader.num_workers=0",
]
SMALL = ["+model.detector.min_size=96", "+model.detector.max_size=160"]


@pytest.mark.slow
@pytest.mark.parametrize("experiment", list(RECIPES))
def test_each_recipe_takes_a_step(experiment, coco_tiny, tmp_path):
    extra = [] if "ssd" in experiment else SMALL
    accumulate = (
        ["trainer.accumulate_grad_batches=2", "trainer.limit_train_batches=2"]
        if experiment == "tv_fasterrcnn_resnet50_fpn"
        else []
    )
    s = run_in_process(
        [f"experiment={experiment}", f"dataset.root={coco_tiny}", *REDUCED, *extra, *accumulate], tmp_path
    )
    assert s["status"] == "completed" and s["steps"] == 1 and s["plan"]["group_aspect_ratio"] == 3
    ref_lr, ref_batch = RECIPES[experiment]
    global_batch = 2 * (2 if accumulate else 1)  # 1 rank x loader.batch_size 2 x accumulate_grad_batches
    assert s["global_batch"] == global_batch
    assert s["effective_lr"] == pytest.approx(ref_lr * global_batch / ref_batch)


def test_the_schedule_is_the_references():
    """Warm-up from lr/1000 over min(1000, steps per epoch - 1) steps of epoch 0, then x0.1 at
    each milestone epoch, or a cosine over the epochs; the two multiply."""

    def rates(**kwargs):
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        sched = reference_schedule(opt, **kwargs)
        out = []
        for _ in range(kwargs["steps_per_epoch"] * kwargs["epochs"]):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return out

    r = rates(steps_per_epoch=11, epochs=26, milestones=[16, 22])
    assert r[0] == pytest.approx(1e-3) and r[5] == pytest.approx(1e-3 + (1 - 1e-3) * 5 / 10) and r[10] == 1.0
    assert r[11 * 15] == 1.0 and r[11 * 16] == pytest.approx(0.1) and r[11 * 22] == pytest.approx(0.01)
    assert len(rates(steps_per_epoch=2000, epochs=1, milestones=[])) == 2000  # warm-up capped at 1000 steps
    c = rates(steps_per_epoch=3, epochs=8, cosine=True)
    assert c[3 * 4] == pytest.approx(0.5) and c[3 * 7 + 2] == pytest.approx((1 + math.cos(math.pi * 7 / 8)) / 2)
    assert scaled_lr(0.02, 16, 4) == pytest.approx(0.005)


@pytest.mark.parametrize("augment,square", [("mosaic", True), ("basic", True), ("none", True), ("hflip", False)])
def test_each_recipe_answers_its_own_geometry(augment, square):
    """The plan asks the recipe's class, not a family check: the letterbox family (mosaic, basic,
    none) outputs image_size squares, so an explicit grouping is ignored; a reference preset's
    sides come from the model's resize."""
    from hydra import compose, initialize_config_dir

    from cocodet.run_spec.read import read_spec

    model = ["model=fasterrcnn_resnet50_fpn"] if augment == "hflip" else []
    with initialize_config_dir(config_dir=str(Path(__file__).parents[1] / "conf"), version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=[f"augment={augment}", "loader.group_aspect_ratio=2", *model, "output_dir=unused"],
        )
    spec = read_spec(cfg)
    assert spec.recipe.shape.square_outputs is square
    assert (spec.loader.batches.group_aspect_ratio is None) is square
    assert (spec.recipe.shape.train_side == spec.dataset.image_size) is square
    assert (spec.recipe.shape.partners_from is not None) is (augment == "mosaic")
