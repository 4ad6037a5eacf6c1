"""Training that cannot silently die (design §12): non-finite losses skipped on every rank and a
run of them ending as diverged; a collapse named; EMA weights that validate, save and resume.

Runs are small (synthetic set, 64 px, batch 8: 6 steps an epoch) and real: train.py processes,
Lightning's DDP with two gloo ranks, NaN put into one rank's loss by a test callback."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import NARROW_MODEL, REPO, run_in_process, run_train, synthetic_overrides

from cocodet.models.checkpoint_io import nonfinite_tensors
from cocodet.models.ema import ramped_ema
from cocodet.models.health import HealthConfig, StepHealth, confident_count

ENV = {"PYTHONPATH": str(REPO / "tests")}


def small(root, *extra: str, batch: int = 8) -> list[str]:
    return [
        *synthetic_overrides(root),
        "dataset.image_size=64",
        f"loader.batch_size={batch}",
        NARROW_MODEL,
        "trainer.enable_progress_bar=false",
        "model.eval_max_images=8",
        "callbacks.prediction_grid.images=2",
        *extra,
    ]


def nan_at(step: int, count: int = 1, rank: int | None = None) -> list[str]:
    return [
        "+callbacks.nan._target_=signal_at_step.NonFiniteLossAt",
        f"+callbacks.nan.step={step}",
        f"+callbacks.nan.count={count}",
        f"+callbacks.nan.rank={'null' if rank is None else rank}",
    ]


def all_finite(ckpt: str) -> bool:
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    return not nonfinite_tensors({"state_dict": state["state_dict"]})


def test_a_learning_rate_that_diverges_ends_the_run_with_a_diagnosis(tmp_path, synthetic_root):
    """lr 1e4 (AdamW): the loss is NaN from the second step. Five skipped steps in a row stop
    the run: one error line naming the terms, steps and learning rate, status diverged, exit 2,
    and every checkpoint written (one each step here) holds finite tensors only."""
    proc, s = run_train(
        small(synthetic_root, "model.optimizer.lr=1e4", "checkpoint.every_n_steps=1", "trainer.max_epochs=3"),
        tmp_path / "run",
        check=False,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    [line] = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert "training diverged: 5 steps in a row had a non-finite loss" in line and "learning rate" in line, line
    assert "model.optimizer.lr" in line and "last checkpoint" in line, line
    assert s["status"] == "diverged" and s["error"] in line
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "diverged"
    health = s["health"]
    assert health["skipped_nonfinite_steps"] == 5 and len(health["skipped"]) == 5
    assert all(e["terms"] and e["samples"] and len(e["samples"][0]) == 3 for e in health["skipped"])
    assert s["steps"] < 18  # it stopped, well before the 3 epochs' 18 steps
    checkpoints = list((tmp_path / "run" / "checkpoints").glob("*.ckpt"))
    assert checkpoints and all(all_finite(str(c)) for c in checkpoints), checkpoints
    if s["last_ckpt"]:
        assert all_finite(s["last_ckpt"])


def test_one_nan_step_is_skipped_and_the_schedule_follows_the_steps_taken(tmp_path, synthetic_root):
    """A NaN loss at step 2 of 6: the optimizer does not step for it (AdamW's own step count is
    one short), the OneCycle schedule advances 5 times, the run completes."""
    s = run_in_process(small(synthetic_root, "trainer.max_epochs=1", *nan_at(2)), tmp_path / "run")
    assert s["status"] == "completed" and s["steps"] == 6
    assert s["health"]["skipped_nonfinite_steps"] == 1 and s["health"]["skipped"][0]["step"] == 2
    saved = torch.load(s["last_ckpt"], map_location="cpu", weights_only=True)
    steps = {int(state["step"]) for state in saved["optimizer_states"][0]["state"].values()}
    assert steps == {5}, steps  # 6 batches, 5 updates
    assert saved["lr_schedulers"][0]["last_epoch"] == 5
    assert saved["cocodet_health"]["skipped"] == 1


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_nan_in_one_micro_batch_skips_its_whole_optimizer_step_on_every_rank(tmp_path, synthetic_root):
    """trainer.accumulate_grad_batches=2 under ddp_cpu: the first micro-batch of optimizer step 3
    is NaN on rank 1 only, the second is finite. The NaN stays in .grad through the window, so
    the step must be skipped as a whole, on both ranks: every parameter unchanged across step 3
    (and changed across step 4), one skip counted, the run completes with a finite last.ckpt.
    (Before issue 57 only the last micro-batch's verdict counted: the NaN step was applied.)"""
    probe = tmp_path / "params"
    extra = [
        "trainer=ddp_cpu",
        "trainer.max_epochs=2",
        "trainer.accumulate_grad_batches=2",
        *nan_at(3, rank=1),
        "+callbacks.nan.first_micro_batch_only=true",
        "+callbacks.probe._target_=signal_at_step.ParametersAcrossSteps",
        f"+callbacks.probe.path={probe}",
        "+callbacks.probe.steps=[3,4]",
    ]
    proc, s = run_train(small(synthetic_root, *extra, batch=4), tmp_path / "run", env=ENV, timeout=500)
    # 48 images, 2 ranks, batch 4: 6 micro-batches a rank an epoch, 3 steps; step 3 opens epoch 1
    assert s["status"] == "completed" and s["steps"] == 6 and s["ddp"]["world_size"] == 2
    assert s["health"]["skipped_nonfinite_steps"] == 1 and [e["step"] for e in s["health"]["skipped"]] == [3]
    for rank in (0, 1):
        rows = {r["step"]: r for r in map(json.loads, (tmp_path / f"params.rank{rank}").read_text().splitlines())}
        assert rows[3]["changed"] == 0 and rows[4]["changed"] > 0, (rank, rows)
    assert all_finite(s["last_ckpt"])


def test_a_collapsed_run_is_warned_and_can_be_stopped(tmp_path, synthetic_root):
    """Forced collapse, the study's mechanism made certain: FCOS's box-regression bias at -50
    puts every box output behind its ReLU from step 0, so every box is a point, the GIoU loss
    reads exactly 1.000 and passes no gradient: the box loss term is frozen, the evidence the
    warning needs (model.health.flat_steps=5 to see it in one short run). This replaced a run at
    lr 0.3 warned for predicting nothing confident at its first validation: a detector trained
    from scratch also predicts nothing confident that early, so that was not evidence (issue 57)."""
    collapse = ["model.detector.regression_bias=-50", "model.health.flat_steps=5", "trainer.max_epochs=2"]
    s = run_in_process(small(synthetic_root, *collapse), tmp_path / "warn")
    [warning] = s["health"]["warnings"]
    assert warning["kind"] == "flat_loss" and warning["term"] == "bbox_regression" and warning["step"] == 4
    assert "has stayed at 1.000000" in warning["message"] and s["status"] == "completed" and s["map50"] == 0.0
    proc, stopped = run_train(
        small(synthetic_root, *collapse, "model.health.on_collapse=stop"), tmp_path / "stop", check=False
    )
    assert proc.returncode == 2 and stopped["status"] == "collapsed" and stopped["steps"] == 4  # stopped at that step
    assert "loss term bbox_regression has stayed at 1.000000" in proc.stderr.splitlines()[-1]


def test_no_confident_prediction_from_the_start_is_not_a_collapse():
    """A from-scratch detector predicts nothing confident in its first validations (a healthy
    3-epoch coco_tiny run warned at step 10 before issue 57): no warning. Confident predictions
    that fall to none after the warm-up are the evidence, once a run."""
    health = StepHealth(HealthConfig())
    for step, confident in ((10, 0), (20, 0), (30, 0)):
        health.watch_predictions(confident, step, warmup_end=5)
    assert health.warnings == []
    for step, confident in ((40, 12), (50, 0), (60, 0)):
        health.watch_predictions(confident, step, warmup_end=5)
    [warning] = health.warnings
    assert (
        warning["kind"] == "no_predictions"
        and warning["step"] == 50
        and "an earlier one found 12" in warning["message"]
    )
    early = StepHealth(HealthConfig())
    early.watch_predictions(3, 2, warmup_end=20)
    early.watch_predictions(0, 4, warmup_end=20)  # still in the warm-up: the rate is still rising
    assert early.warnings == []
    resumed = StepHealth(HealthConfig())
    resumed.load_state_dict(health.state_dict())  # a resumed run remembers what it had predicted
    assert resumed.most_confident == 12


def test_the_diverged_message_names_the_steps_in_a_row_after_many_earlier_skips():
    """20 isolated skips fill the summary's list; the run of 5 that stops the run is steps
    100-104, term bbox_ctrness: the message names those, not the old ones."""
    health = StepHealth(HealthConfig(max_nonfinite_steps=5))
    for step in range(20):
        health.window.note(["classification"], {"classification": float("nan")}, [])
        health.end_window(step * 2, 0, 0.01)
        health.end_window(step * 2 + 1, 0, 0.01)  # a finite step between: the count starts again
    for step in range(100, 105):
        health.window.note(["bbox_ctrness"], {"bbox_ctrness": float("inf")}, [])
        health.end_window(step, 3, 0.01)
    assert health.consecutive == 5 and health.skipped == 25 and len(health.skipped_steps) == 20
    message = health.diverged_message(0.01)
    assert "5 steps in a row" in message and "terms bbox_ctrness;" in message and "steps 100-104;" in message, message


def built_schedule(scheduler, **kwargs):
    """A DetectorModule's optimizer and schedule as a run builds them (configure_optimizers),
    for a 10-epoch run of 10 steps an epoch at loader.batch_size 8 on one rank."""
    from functools import partial
    from types import SimpleNamespace

    from cocodet.models.detector import DetectorModule
    from cocodet.models.zoo import build_detector

    module = DetectorModule(
        partial(build_detector, name="fcos_resnet18_fpn", fpn_channels=64),
        64,
        partial(torch.optim.SGD, lr=0.02, momentum=0.9),
        "unused.json",
        [1, 2, 3],
        scheduler,
        **kwargs,
    )
    trainer = SimpleNamespace(
        estimated_stepping_batches=100,
        max_epochs=10,
        world_size=1,
        accumulate_grad_batches=1,
        datamodule=SimpleNamespace(batch_size=8),
    )
    module._trainer = trainer  # what Lightning attaches: the fields configure_optimizers reads
    built = module.configure_optimizers()
    trainer.lr_scheduler_configs = [SimpleNamespace(scheduler=built["lr_scheduler"]["scheduler"])]
    return module, built["optimizer"], built["lr_scheduler"]["scheduler"]


def test_the_warm_up_ends_where_the_schedule_says():
    """The reference schedule (a LambdaLR) says where its warm-up ends, min(1000, steps per epoch
    - 1); before issue 57 it read as 0, so predictions were judged during the reference's ramp."""
    from functools import partial

    from cocodet.models.reference_schedule import reference_schedule

    assert built_schedule(partial(reference_schedule, milestones=[6, 8]))[0].warmup_end() == 9
    onecycle = built_schedule(partial(torch.optim.lr_scheduler.OneCycleLR, max_lr=0.02, pct_start=0.25))[0]
    assert onecycle.warmup_end() == 24  # OneCycle's peak, step pct_start x total_steps - 1


def test_lr_scaling_scales_onecycles_peak_and_effective_lr_is_that_peak():
    """model.lr_scaling with the default OneCycle: the schedule peaks at the scaled rate and
    effective_lr is that peak (before issue 57 OneCycle peaked at the unscaled max_lr while
    effective_lr said the scaled rate)."""
    from functools import partial

    module, optimizer, scheduler = built_schedule(
        partial(torch.optim.lr_scheduler.OneCycleLR, max_lr=0.02, pct_start=0.25),
        lr_scaling={"reference_lr": 0.08, "reference_batch": 16},
    )
    rates = []
    for _ in range(100):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert max(rates) == pytest.approx(0.04) and module.lr_record["effective_lr"] == pytest.approx(
        0.04
    )  # 0.08 x 8 / 16
    assert rates.index(max(rates)) == 24


def test_a_loss_term_frozen_at_one_value_is_named_once():
    health = StepHealth(HealthConfig(flat_steps=5))
    for step in range(12):
        health.watch_flat_terms({"bbox_regression": 1.0, "classification": 1.0 / (step + 1)}, step)
    [warning] = health.warnings
    assert (
        warning["term"] == "bbox_regression" and warning["step"] == 4 and "from step 0 to step 4" in warning["message"]
    )
    assert health.stop_reason is None  # warn is the default
    stopping = StepHealth(HealthConfig(flat_steps=5, on_collapse="stop"))
    for step in range(5):
        stopping.watch_flat_terms({"bbox_regression": 1.0 + 1e-7 * step}, step)  # within the 1e-6 tolerance
    assert stopping.stop_reason and "bbox_regression" in stopping.stop_reason


def test_confident_predictions_need_a_box_of_a_pixel():
    detections = [
        {"score": 0.9, "bbox": [0, 0, 5, 5]},
        {"score": 0.9, "bbox": [3, 3, 0, 0]},  # zero-area: FCOS keeps them
        {"score": 0.9, "bbox": [3, 3, 4, 0.5]},
        {"score": 0.2, "bbox": [0, 0, 9, 9]},
    ]
    assert confident_count(detections, 0.3) == 1


def test_the_ema_ramp_starts_at_the_model_and_reaches_the_decay():
    averaged, current = [torch.zeros(3)], [torch.ones(3)]
    ramped_ema(0.999)(averaged, current, torch.tensor(0))  # n=0: decay 1/10, the average moves 90 % of the way
    assert torch.allclose(averaged[0], torch.full((3,), 0.9))
    averaged = [torch.zeros(3)]
    ramped_ema(0.999)(averaged, current, torch.tensor(10**6))  # far along: the decay itself
    assert torch.allclose(averaged[0], torch.full((3,), 0.001))


@pytest.mark.slow
def test_ema_weights_validate_save_and_resume_exactly(tmp_path, synthetic_root):
    """model.ema.decay=0.9: the checkpoint's state_dict is the average (mode=eval on it gives
    the last validation's mAP), the raw weights travel beside it, and a run SIGTERMed at step 8
    (mid-epoch 1) then resumed ends with the uninterrupted run's stream digest, EMA tensors and
    raw weights, bit for bit."""
    base = small(
        synthetic_root,
        "model.ema.decay=0.9",
        "trainer.max_epochs=2",
        "trainer.deterministic=true",
        "loader=explicit",
        "loader.num_workers=0",
    )
    whole = run_in_process(base, tmp_path / "whole")  # no signal: this process
    saved = torch.load(whole["last_ckpt"], map_location="cpu", weights_only=True)
    assert {"state_dict", "current_model_state", "averaging_state"} <= set(saved)
    differs = [
        k
        for k, v in saved["state_dict"].items()
        if v.is_floating_point() and not torch.equal(v, saved["current_model_state"][k])
    ]
    assert differs  # the average is not the raw weights
    evaluated = run_in_process([*base, "mode=eval", f"ckpt_path={whole['last_ckpt']}"], tmp_path / "eval")
    assert evaluated["map"] == whole["map"]

    run_dir = tmp_path / "resumed"
    signal = ["+callbacks.signal_at._target_=signal_at_step.SignalAtStep", "+callbacks.signal_at.step=8"]
    _, first = run_train([*base, *signal], run_dir, env=ENV, timeout=600)
    assert first["status"] == "preempted" and first["steps"] == 8
    second = run_in_process([*base, "ckpt_path=last"], run_dir)
    assert second["stream_digest"] == whole["stream_digest"] and second["steps"] == whole["steps"]
    resumed = torch.load(second["last_ckpt"], map_location="cpu", weights_only=True)
    for key in ("state_dict", "current_model_state", "averaging_state"):
        different = [k for k in saved[key] if not torch.equal(saved[key][k], resumed[key][k])]
        assert not different, (key, different[:5])


def test_a_non_finite_state_is_never_written_over_the_last_checkpoint(tmp_path, caplog):
    from cocodet.models.checkpoint_io import AtomicCheckpointIO

    io, path = AtomicCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "global_step": 4}, path)
    io.save_checkpoint(
        {
            "state_dict": {"w": torch.ones(3)},
            "current_model_state": {"bn.running_var": torch.tensor([1.0, float("nan")])},
            "global_step": 5,
        },
        path,
    )
    assert torch.load(path, weights_only=True)["global_step"] == 4  # the finite one stays
    assert "not writing checkpoint" in caplog.text and "bn.running_var" in caplog.text
