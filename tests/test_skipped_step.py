"""A skipped step leaves no trace, and `completed` means usable weights (issue 69, design §12).

A poisoned step is skipped by the health check (a non-finite loss, or finite losses with
non-finite gradients) or by the fp16 GradScaler (inf gradients); either way its forward had
already updated BatchNorm's running statistics, which must be put back. Each run here is a
real train.py run of a few steps (synthetic set, 64 px, batch 4) with a fault put in through a
hook of the model by a test callback (tests/signal_at_step.py), and a probe that compares
every parameter, buffer and EMA tensor bit for bit across the steps around it. One longer run
shows that the poisoned run still learns.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import NARROW_MODEL, REPO, run_in_process, run_train, synthetic_overrides

from cocodet.models.checkpoint_io import nonfinite_tensors

ENV = {"PYTHONPATH": str(REPO / "tests")}


def small(root, *extra: str, batch: int = 4) -> list[str]:
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


def fault(kind: str, step: int, *extra: str) -> list[str]:
    return [
        f"+callbacks.fault._target_=signal_at_step.{kind}",
        f"+callbacks.fault.step={step}",
        *(f"+callbacks.fault.{e}" for e in extra),
    ]


def probe(path: Path, steps: list[int]) -> list[str]:
    return [
        "+callbacks.probe._target_=signal_at_step.StateAcrossSteps",
        f"+callbacks.probe.path={path}",
        f"+callbacks.probe.steps=[{','.join(map(str, steps))}]",
    ]


def rows(path: Path, rank: int = 0) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, Path(f"{path}.rank{rank}").read_text().splitlines())}


def assert_untouched(row: dict) -> None:
    """Every parameter, buffer (BatchNorm's statistics and counters) and EMA tensor bit for bit."""
    assert row["params_changed"] == 0 and row["n_buffers_changed"] == 0 and row["ema_changed"] == 0, row
    assert row["finite"], row


def assert_trained(row: dict) -> None:
    assert row["params_changed"] > 0 and row["n_buffers_changed"] > 0 and row["finite"], row


def assert_usable(s: dict) -> None:
    """Completed, with a finite last checkpoint, and only existing files named."""
    assert s["status"] == "completed", s.get("error")
    assert s["last_ckpt"] and Path(s["last_ckpt"]).is_file(), s["last_ckpt"]
    assert s["best_ckpt"] is None or Path(s["best_ckpt"]).is_file(), s["best_ckpt"]
    state = torch.load(s["last_ckpt"], map_location="cpu", weights_only=True)
    assert not nonfinite_tensors({k: state.get(k) for k in ("state_dict", "current_model_state")})
    assert state["global_step"] == s["steps"]  # the run's own end, not an earlier file


@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_non_finite_forward_is_undone_to_the_last_buffer(tmp_path, synthetic_root, accumulate):
    """NaN into the first convolution's input at step 2 (with accumulation, its first
    micro-batch only): BatchNorm folds that forward into its running statistics. Before issue
    69 the step was skipped but the statistics stayed NaN: every later checkpoint was refused,
    mAP read 0, and the run still said completed with last_ckpt null. Without accumulation the
    run keeps EMA weights, which must not move on the skipped step either."""
    extra = [
        "trainer.max_epochs=1",
        f"trainer.limit_train_batches={4 * accumulate}",
        f"trainer.accumulate_grad_batches={accumulate}",
        *fault("NonFiniteForwardAt", 2),
        *(["+callbacks.fault.first_micro_batch_only=true"] if accumulate > 1 else ["model.ema.decay=0.9"]),
        *probe(tmp_path / "state", [1, 2, 3]),
    ]
    s = run_in_process(small(synthetic_root, *extra), tmp_path / "run")
    assert [e["step"] for e in s["health"]["skipped"]] == [2]
    state = rows(tmp_path / "state")
    assert_untouched(state[2])
    assert s["health"]["skipped"][0]["cause"] == "loss"
    if accumulate == 1:
        assert state[2]["ema"] > 0 and state[3]["ema_changed"] > 0
    assert_trained(state[1])
    assert_trained(state[3])
    assert_usable(s)


def test_a_finite_loss_with_non_finite_gradients_is_skipped(tmp_path, synthetic_root):
    """The loss is finite; the last parameter's gradient is NaN (a backward hook). Under
    32-true no GradScaler looks at gradients: before issue 69 the step was applied, and
    gradient clipping multiplied every gradient by NaN."""
    extra = [
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=4",
        *fault("NonFiniteGradientAt", 2),
        *probe(tmp_path / "state", [2, 3]),
    ]
    s = run_in_process(small(synthetic_root, *extra), tmp_path / "run")
    assert [e["step"] for e in s["health"]["skipped"]] == [2]
    state = rows(tmp_path / "state")
    assert_untouched(state[2])
    assert_trained(state[3])
    [skip] = s["health"]["skipped"]
    assert skip["cause"] == "gradients" and len(skip["samples"]) == 4
    assert skip["losses"] and all(isinstance(v, float) for v in skip["losses"].values()), skip  # finite (else a string)
    assert_usable(s)


@pytest.mark.parametrize("fused", [False, True])
def test_fp16_on_the_cpu_skips_a_poisoned_forward_and_keeps_its_scaler(tmp_path, synthetic_root, fused):
    """trainer.precision=16-mixed on the CPU runs fp16 with a real GradScaler (Lightning alone
    would switch to bf16): a NaN forward is the health check's skip, nothing raises with the
    default or the fused AdamW, the state is untouched, and the scaler saw the NaN gradients
    and backed off."""
    extra = [
        "trainer.precision=16-mixed",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=4",
        *(["+model.optimizer.fused=true", "trainer.gradient_clip_val=0"] if fused else []),
        *fault("NonFiniteForwardAt", 2),
        *probe(tmp_path / "state", [2, 3]),
    ]
    s = run_in_process(small(synthetic_root, *extra), tmp_path / "run")
    assert s["precision"] == "16-mixed"
    assert [e["step"] for e in s["health"]["skipped"]] == [2]
    state = rows(tmp_path / "state")
    assert_untouched(state[2])
    assert state[2]["scale_after"] < state[2]["scale_before"], state[2]
    assert_trained(state[3])
    assert_usable(s)


def test_an_fp16_overflow_is_the_scalers_skip_and_is_undone_too(tmp_path, synthetic_root):
    """A finite loss scaled by 1e30: its fp16 gradients overflow, the GradScaler skips the step
    and halves its scale. That is not a health skip (the scaler's first steps calibrate this
    way), but the forward's buffer updates and the EMA are held back all the same."""
    extra = [
        "trainer.precision=16-mixed",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=4",
        "model.ema.decay=0.9",
        *fault("OverflowAt", 2),
        *probe(tmp_path / "state", [2, 3]),
    ]
    s = run_in_process(small(synthetic_root, *extra), tmp_path / "run")
    assert s["health"]["skipped_nonfinite_steps"] == 0 and s["health"]["amp_skipped_steps"] == 1, s["health"]
    state = rows(tmp_path / "state")
    assert state[2]["ema"] > 0
    assert_untouched(state[2])
    assert state[2]["scale_after"] == state[2]["scale_before"] / 2, state[2]
    assert_trained(state[3])
    assert state[3]["ema_changed"] > 0
    assert_usable(s)


def test_a_model_that_ends_non_finite_is_not_completed(tmp_path, synthetic_root):
    """A BatchNorm statistic set to NaN after step 4, outside any step's verdict: every later
    checkpoint is refused, so the run ends `nonfinite`, exit 2, in one line naming the tensor
    and the last good checkpoint, and the summary names only files that exist (before issue 69:
    `completed`, exit 0, with best_ckpt naming a file that was never written)."""
    extra = ["trainer.max_epochs=2", "trainer.limit_train_batches=3", *fault("PoisonBufferAt", 4)]
    proc, s = run_train(small(synthetic_root, *extra), tmp_path / "run", env=ENV, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    [line] = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert (
        "training ended with a model that is not finite: 1 tensor, the first model.backbone.body.bn1.running_var"
        in line
    ), line
    last_good = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert f"the last good checkpoint is {last_good} (step 3)" in line, line
    assert s["status"] == "nonfinite" and s["error"] in line
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "nonfinite"
    for key in ("last_ckpt", "best_ckpt"):
        assert s[key] is None or Path(s[key]).is_file(), (key, s[key])
    assert torch.load(last_good, map_location="cpu", weights_only=True)["global_step"] == 3


def test_a_fused_optimizer_with_clipping_under_fp16_is_refused_in_one_line(tmp_path, synthetic_root):
    proc, _ = run_train(
        small(synthetic_root, "trainer.precision=16-mixed", "+model.optimizer.fused=true", "trainer.max_epochs=1"),
        tmp_path / "run",
        check=False,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: AdamW with fused=true unscales its fp16 gradients inside its own step, so they cannot be clipped "
        "first (trainer.gradient_clip_val=10, trainer.precision=16-mixed): set trainer.gradient_clip_val=0 to keep "
        "the fused optimizer, or drop model.optimizer.fused"
    )


@pytest.mark.slow
def test_a_run_with_a_poisoned_step_still_learns(tmp_path, synthetic_root):
    """The shared run that learns: 5 epochs of 6 steps with step 2's forward NaN. Before issue
    69 the running statistics stayed NaN, validation read mAP 0 to the end and no checkpoint
    was written; the unpoisoned run reads mAP@0.5 about 0.07 here."""
    extra = ["trainer.max_epochs=5", *fault("NonFiniteForwardAt", 2)]
    s = run_in_process(small(synthetic_root, *extra, batch=8), tmp_path / "run")
    assert s["health"]["skipped_nonfinite_steps"] == 1
    assert s["map50"] > 0, s["map50"]
    assert_usable(s)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("rank", [0, 1])
def test_a_poisoned_forward_on_one_rank_is_undone_on_every_rank(tmp_path, synthetic_root, rank):
    """trainer=ddp_cpu, the NaN forward on one rank only. DDP's broadcast_buffers copies rank
    0's buffers into rank 1 at each forward, so rank 1 poisoned alone would heal by itself at
    the next step; rank 0 poisoned would spread. Both ranks skip, and each rank's parameters and
    buffers are as before the step."""
    extra = [
        "trainer=ddp_cpu",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=4",
        *fault("NonFiniteForwardAt", 2, f"rank={rank}"),
        *probe(tmp_path / "state", [2, 3]),
    ]
    proc, s = run_train(small(synthetic_root, *extra), tmp_path / "run", env=ENV, timeout=800)
    assert s["ddp"]["world_size"] == 2 and [e["step"] for e in s["health"]["skipped"]] == [2]
    if rank == 1:  # rank 0 writes the summary: its own loss was finite, the verdict came from rank 1
        assert s["health"]["skipped"][0]["terms"] == []
        assert "step 2 skipped on every rank: non-finite loss (on another rank)" in proc.stdout  # Hydra logs to stdout
    for r in (0, 1):
        state = rows(tmp_path / "state", r)
        assert_untouched(state[2])
        assert_trained(state[3])
    assert_usable(s)
