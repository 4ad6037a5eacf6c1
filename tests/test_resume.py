"""Exact mid-epoch resume and preemption, with real processes and real signals (design §5)."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest
import torch
from conftest import NARROW_MODEL, REPO, run_in_process, run_train

from cocodet.loader.stream_position import ResumeError, StreamPosition

STEPS_PER_EPOCH = 10  # coco_tiny: 80 train images, batch 8


def args(coco_tiny: Path, *extra: str) -> list[str]:
    return [
        "dataset=coco",
        f"dataset.root={coco_tiny}",
        "dataset.image_size=64",
        "loader.batch_size=8",
        NARROW_MODEL,
        "trainer.max_epochs=3",
        "trainer.limit_val_batches=2",
        "trainer.deterministic=true",
        "trainer.enable_progress_bar=false",
        *extra,
    ]


def signal_at(step: int, name: str) -> list[str]:
    return [
        "+callbacks.signal_at._target_=signal_at_step.SignalAtStep",
        f"+callbacks.signal_at.step={step}",
        f"+callbacks.signal_at.signal_name={name}",
    ]


ENV = {"PYTHONPATH": str(REPO / "tests")}


def weights(ckpt: str) -> dict[str, torch.Tensor]:
    return torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]


@pytest.fixture(scope="module")
def uninterrupted(coco_tiny, tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("uninterrupted")
    s = run_in_process(
        args(coco_tiny, "loader=explicit", "loader.num_workers=2"), base / "run"
    )  # no signal: this process
    assert s["status"] == "completed" and s["steps"] == 3 * STEPS_PER_EPOCH
    yield s
    shutil.rmtree(
        base, ignore_errors=True
    )  # a module's training runs leave checkpoints (about 0.2 GB each): gone when it ends


@pytest.mark.slow
def test_sigterm_mid_epoch_then_resume_at_other_workers_is_exact(coco_tiny, tmp_path, uninterrupted):
    run_dir = tmp_path / "run"
    proc, first = run_train(
        args(coco_tiny, "loader=explicit", "loader.num_workers=2", *signal_at(15, "SIGTERM")),
        run_dir,
        env=ENV,
        timeout=900,
    )
    assert first["status"] == "preempted" and first["steps"] == 15  # mid-epoch 1
    assert first["stream_position"]["epoch"] == 1 and first["stream_position"]["batches"] == 5
    assert "ckpt_path=last" in proc.stderr and str(run_dir) in proc.stderr
    second = run_in_process(args(coco_tiny, "loader=explicit", "loader.num_workers=0", "ckpt_path=last"), run_dir)
    assert second["status"] == "completed" and second["steps"] == 3 * STEPS_PER_EPOCH
    assert second["stream_digest"] == uninterrupted["stream_digest"]
    resumed, reference = weights(second["last_ckpt"]), weights(uninterrupted["last_ckpt"])
    assert resumed.keys() == reference.keys()
    different = [k for k in reference if not torch.equal(resumed[k], reference[k])]
    assert not different, f"weights differ after an exact resume: {different[:5]}"


@pytest.mark.slow
def test_ctrl_c_in_epoch_0_keeps_the_work_and_resumes_exactly(coco_tiny, tmp_path, uninterrupted):
    """A terminal's Ctrl-C (SIGINT to the run's whole process group, its workers too) in epoch 0:
    resume.ckpt at the step's boundary, a summary that says `interrupted` and holds no numbers of
    a validation that never ran, exit status 130; `ckpt_path=last` in the same folder then ends
    with the uninterrupted run's stream digest."""
    run_dir = tmp_path / "run"
    ctrl_c = ["+callbacks.ctrl_c._target_=signal_at_step.SignalGroupAtStep", "+callbacks.ctrl_c.step=5"]
    proc, first = run_train(
        args(coco_tiny, "loader=explicit", "loader.num_workers=2", *ctrl_c),
        run_dir,
        env=ENV,
        prefix=["setsid", "-w"],
        check=False,
        timeout=900,
    )
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert first["status"] == "interrupted" and first["steps"] == 5, first
    assert first["map"] is None and first["map50"] is None and first["best_map"] is None, first  # never validated
    assert (run_dir / "checkpoints" / "resume.ckpt").is_file()
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    assert "ckpt_path=last" in proc.stderr and "DataLoader worker" not in proc.stderr
    second = run_in_process(args(coco_tiny, "loader=explicit", "loader.num_workers=2", "ckpt_path=last"), run_dir)
    assert second["status"] == "completed" and second["steps"] == 3 * STEPS_PER_EPOCH
    assert second["stream_digest"] == uninterrupted["stream_digest"]


# A random step whose last checkpoint is mid-epoch, and one whose last checkpoint closed an
# epoch (step 20 of 10-step epochs): the resumed stream must start at the right place in both.
KILL_STEPS = [random.Random(7).randint(11, 19), random.Random(8).randint(21, 24)]


@pytest.mark.slow
@pytest.mark.parametrize("kill_step", KILL_STEPS)
def test_sigkill_loses_at_most_every_n_steps_and_repeats_nothing(coco_tiny, tmp_path, uninterrupted, kill_step):
    run_dir = tmp_path / "run"
    proc, _ = run_train(
        args(coco_tiny, "checkpoint.every_n_steps=5", *signal_at(kill_step, "SIGKILL")),
        run_dir,
        env=ENV,
        check=False,
        timeout=900,
    )
    assert proc.returncode == -9
    newest = max((run_dir / "checkpoints").glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    saved = torch.load(newest, map_location="cpu", weights_only=False)
    assert kill_step - 5 <= saved["global_step"] <= kill_step
    resumed = run_in_process(args(coco_tiny, "checkpoint.every_n_steps=5", "ckpt_path=last"), run_dir)
    assert resumed["steps"] == 3 * STEPS_PER_EPOCH
    assert resumed["stream_digest"] == uninterrupted["stream_digest"]  # no batch repeated or skipped


@pytest.mark.slow
def test_a_checkpoint_of_another_model_is_refused_in_one_line(coco_tiny, tmp_path, uninterrupted):
    """Issue: resuming weights of another model died in Lightning's 25-frame size-mismatch
    traceback, exit 1; mode=eval gave one line and exit 2. Training now gives that line too."""
    proc, _ = run_train(
        [*args(coco_tiny, f"ckpt_path={uninterrupted['last_ckpt']}"), "model.detector.fpn_channels=32"],
        tmp_path / "run",
        check=False,
    )
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "does not fit the configured model" in last, proc.stderr[-2000:]
    assert "it was trained with model.detector.fpn_channels=64" in last and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_resume_with_another_rank_count_is_refused(coco_tiny, tmp_path, uninterrupted):
    ckpt = torch.load(uninterrupted["last_ckpt"], map_location="cpu", weights_only=False)
    ckpt["CocoDataModule"]["position"]["world_size"] = 2  # as if 2 ranks wrote it
    edited = tmp_path / "two_ranks.ckpt"
    torch.save(ckpt, edited)
    proc, _ = run_train(args(coco_tiny, "trainer.max_epochs=4", f"ckpt_path={edited}"), tmp_path / "run", check=False)
    assert proc.returncode == 2
    assert "2 rank(s) and this run has 1" in proc.stderr.strip().splitlines()[-1]


def test_stream_position_refuses_what_cannot_continue_exactly():
    position = StreamPosition(batch_size=8, seed=0, world_size=1)
    state = {"epoch": 1, "batches": 5, "batch_size": 8, "seed": 0, "world_size": 4}
    with pytest.raises(ResumeError, match="4 rank\\(s\\) and this run has 1"):
        position.load_state_dict(state)
    with pytest.raises(ResumeError, match="loader.batch_size is 16 and this run's is 8"):
        position.load_state_dict({**state, "world_size": 1, "batch_size": 16})
    position.load_state_dict({**state, "world_size": 1})
    assert (position.epoch, position.batches) == (1, 5)
    position.advance(1)
    position.advance(2)
    assert (position.epoch, position.batches) == (2, 1)


def spec_of(*overrides: str, run_dir: Path, given: bool = False):
    """The run specification of ``python train.py <overrides>`` writing to ``run_dir``."""
    from dataclasses import replace

    from hydra import compose, initialize_config_dir

    from cocodet.run_spec.read import read_spec

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*overrides, f"output_dir={run_dir}"])
    return replace(read_spec(cfg), run_dir_given=given)


def fake_run(folder: Path, mtime: int, dataset_root: str | None, fpn: int = 256) -> Path:
    """A run folder with a checkpoint of ``mtime`` and Hydra's saved config (none when ``dataset_root`` is None)."""
    (folder / "checkpoints").mkdir(parents=True)
    ckpt = folder / "checkpoints" / "last.ckpt"
    torch.save({"global_step": mtime}, ckpt)  # its step tells which one was read
    os.utime(ckpt, (mtime, mtime))
    if dataset_root is not None:
        (folder / ".hydra").mkdir()
        (folder / ".hydra" / "config.yaml").write_text(
            f"dataset:\n  root: {dataset_root}\n  train_images: train2017\n"
            "  train_ann: annotations/instances_train2017.json\n"
            f"  val_images: val2017\n  val_ann: annotations/instances_val2017.json\n  synthetic: null\n"
            f"model:\n  detector:\n    name: fcos_resnet18_fpn\n    regression_bias: 1.0\n    fpn_channels: {fpn}\n"
            f"    pretrained: true\n"
        )
    return ckpt


def test_ckpt_path_last_takes_only_a_run_of_this_dataset_and_model(tmp_path, monkeypatch, capsys):
    """Issue: ckpt_path=last took the newest run under outputs/, of another dataset, and died in a
    25-frame size-mismatch traceback. It now passes over runs of another dataset or model and says so."""

    from cocodet.errors import UserError
    from cocodet.modes import last_run

    monkeypatch.chdir(tmp_path)
    mine = str(tmp_path / "coco")
    fake_run(tmp_path / "outputs" / "a", 1000, mine)  # this dataset and model (pretrained: not the model)
    fake_run(tmp_path / "outputs" / "b", 1001, str(tmp_path / "other"))  # another dataset, newer
    fake_run(tmp_path / "outputs" / "c", 1002, mine, fpn=64)  # another model width, newer
    fake_run(tmp_path / "outputs" / "d", 1003, None)  # no saved config: cannot tell, newest
    spec = spec_of("dataset=coco", f"dataset.root={mine}", "ckpt_path=last", run_dir=tmp_path / "new")
    path, checkpoint = last_run.resume_checkpoint(spec)
    assert path == str(Path("outputs") / "a" / "checkpoints" / "last.ckpt") and checkpoint["global_step"] == 1000
    line = capsys.readouterr().err.strip()
    assert line.startswith("ckpt_path=last: resuming run outputs/a from last.ckpt") and "passed over 3 newer" in line
    assert f"dataset.root '{tmp_path / 'other'}'" in line and "model.detector.fpn_channels 64" in line, line

    other = spec_of("dataset=coco", f"dataset.root={tmp_path / 'third'}", "ckpt_path=last", run_dir=tmp_path / "new")
    with pytest.raises(
        UserError, match="none of the 4 runs under outputs with a checkpoint was trained on this dataset"
    ):
        last_run.resume_checkpoint(other)
    given = spec_of("dataset=coco", f"dataset.root={mine}", "ckpt_path=last", run_dir=tmp_path / "empty", given=True)
    with pytest.raises(UserError, match="no checkpoint in .*empty/checkpoints .checkpoint.dir."):
        last_run.resume_checkpoint(given)
    here = fake_run(tmp_path / "requeued", 999, None)  # this run's own folder first, whatever its age
    requeued = spec_of(
        "dataset=coco", f"dataset.root={mine}", "ckpt_path=last", run_dir=tmp_path / "requeued", given=True
    )
    assert last_run.resume_checkpoint(requeued)[0] == str(here)
