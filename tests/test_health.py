"""Training that cannot silently die (design §12): non-finite losses skipped on every rank and a
run of them ending as diverged; a collapse named; EMA weights that validate, save and resume.

Runs are small (synthetic set, 64 px, batch 8: 6 steps an epoch) and real: train.py processes,
Lightning's DDP with two gloo ranks, NaN put into one rank's loss by a test callback."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import NARROW_MODEL, REPO, run_in_process, run_train, synthetic_overrides
from cocodet.models.ema import ramped_ema
from cocodet.models.health import HealthConfig, StepHealth, confident_count, nonfinite_tensors

ENV = {"PYTHONPATH": str(REPO / "tests")}


def small(root, *extra: str) -> list[str]:
    return [*synthetic_overrides(root), "dataset.image_size=64", "loader.batch_size=8", NARROW_MODEL,
            "trainer.enable_progress_bar=false",
            "model.eval_max_images=8", "callbacks.prediction_grid.images=2", *extra]


def nan_at(step: int, count: int = 1, rank: int | None = None) -> list[str]:
    return ["+callbacks.nan._target_=signal_at_step.NonFiniteLossAt", f"+callbacks.nan.step={step}",
            f"+callbacks.nan.count={count}", f"+callbacks.nan.rank={'null' if rank is None else rank}"]


def all_finite(ckpt: str) -> bool:
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    return not nonfinite_tensors({"state_dict": state["state_dict"]})


def test_a_learning_rate_that_diverges_ends_the_run_with_a_diagnosis(tmp_path, synthetic_root):
    """lr 1e4 (AdamW): the loss is NaN from the second step. Five skipped steps in a row stop
    the run: one error line naming the terms, steps and learning rate, status diverged, exit 2,
    and every checkpoint written (one each step here) holds finite tensors only."""
    proc, s = run_train(small(synthetic_root, "model.optimizer.lr=1e4", "checkpoint.every_n_steps=1",
                              "trainer.max_epochs=3"), tmp_path / "run", check=False)
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
    assert all(all_finite(str(c)) for c in checkpoints), checkpoints
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
def test_a_nan_on_rank_one_is_skipped_by_both_ranks_without_a_hang(tmp_path, synthetic_root):
    proc, s = run_train(small(synthetic_root, "trainer=ddp_cpu", "trainer.max_epochs=1", *nan_at(1, rank=1)),
                        tmp_path / "run", env=ENV, timeout=500)
    assert s["status"] == "completed" and s["ddp"]["world_size"] == 2
    # Rank 0's own loss was finite: its record says the verdict came from another rank.
    [skipped] = s["health"]["skipped"]
    assert skipped["step"] == 1 and skipped["terms"] == [], skipped
    assert "step 1 skipped on every rank: non-finite loss (on another rank)" in proc.stdout  # Hydra logs to stdout
    assert all_finite(s["last_ckpt"])


def test_a_collapsed_run_is_warned_and_can_be_stopped(tmp_path, synthetic_root):
    """Forced collapse: lr 0.3 (thirty times the default's peak) on the 64 px synthetic set leaves
    the detector predicting nothing above 0.3 after the warm-up (mAP 0). With on_collapse=stop
    the first such validation ends the run. (lr 0.1 was enough before FCOS's regression prior,
    issue 45: with it, that run still predicted something at its first validation, step 6.)"""
    s = run_in_process(small(synthetic_root, "model.optimizer.lr=0.3", "trainer.max_epochs=2"), tmp_path / "warn")
    [warning] = [w for w in s["health"]["warnings"] if w["kind"] == "no_predictions"]
    assert warning["step"] == 6 and s["status"] == "completed" and s["map50"] < 0.05
    proc, stopped = run_train(small(synthetic_root, "model.optimizer.lr=0.3", "trainer.max_epochs=2",
                                    "model.health.on_collapse=stop"), tmp_path / "stop", check=False)
    assert proc.returncode == 2 and stopped["status"] == "collapsed" and stopped["epochs"] == 0
    assert "found no prediction scoring at least 0.3" in proc.stderr.splitlines()[-1]


def test_a_loss_term_frozen_at_one_value_is_named_once():
    health = StepHealth(HealthConfig(flat_steps=5))
    for step in range(12):
        health.watch_flat_terms({"bbox_regression": 1.0, "classification": 1.0 / (step + 1)}, step)
    [warning] = health.warnings
    assert warning["term"] == "bbox_regression" and warning["step"] == 4 and "from step 0 to step 4" in warning["message"]
    assert health.stop_reason is None  # warn is the default
    stopping = StepHealth(HealthConfig(flat_steps=5, on_collapse="stop"))
    for step in range(5):
        stopping.watch_flat_terms({"bbox_regression": 1.0 + 1e-7 * step}, step)  # within the 1e-6 tolerance
    assert stopping.stop_reason and "bbox_regression" in stopping.stop_reason


def test_confident_predictions_need_a_box_of_a_pixel():
    detections = [{"score": 0.9, "bbox": [0, 0, 5, 5]}, {"score": 0.9, "bbox": [3, 3, 0, 0]},  # zero-area: FCOS keeps them
                  {"score": 0.9, "bbox": [3, 3, 4, 0.5]}, {"score": 0.2, "bbox": [0, 0, 9, 9]}]
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
    base = small(synthetic_root, "model.ema.decay=0.9", "trainer.max_epochs=2", "trainer.deterministic=true",
                 "loader=explicit", "loader.num_workers=0")
    whole = run_in_process(base, tmp_path / "whole")  # no signal: this process
    saved = torch.load(whole["last_ckpt"], map_location="cpu", weights_only=True)
    assert {"state_dict", "current_model_state", "averaging_state"} <= set(saved)
    differs = [k for k, v in saved["state_dict"].items() if v.is_floating_point()
               and not torch.equal(v, saved["current_model_state"][k])]
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
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "current_model_state": {"bn.running_var": torch.tensor(
        [1.0, float("nan")])}, "global_step": 5}, path)
    assert torch.load(path, weights_only=True)["global_step"] == 4  # the finite one stays
    assert "not writing checkpoint" in caplog.text and "bn.running_var" in caplog.text
