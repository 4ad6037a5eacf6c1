"""The pieces of a run that outlives its processes (design §7.4), each on its own: the run folder
every node composes, the attempts' ledger, the resumed CSV and TensorBoard records, and
checkpoint.every_n_steps=auto. tests/test_ddp.py runs them together under two torchrun agents."""

from __future__ import annotations

import csv
import json
from types import SimpleNamespace

import pytest

from cocodet.elastic.attempts import AttemptLedger, read_attempts
from cocodet.elastic.run_folder import default_run_dir, unshared_folder
from cocodet.models.preemption import AUTO_STEPS, auto_every_n_steps
from cocodet.ranks import read_ranks
from cocodet.tracking.continued_logs import continue_logs

TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "exp1",
    "RANK": "1",
    "LOCAL_RANK": "0",
    "GROUP_RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_WORLD_SIZE": "1",
    "TORCHELASTIC_MAX_RESTARTS": "0",
}


def test_every_node_and_restart_composes_the_rendezvous_ids_folder():
    assert default_run_dir("outputs/2026-12-06/10-00-00", TORCHRUN) == "outputs/torchrun/exp1"
    assert (
        default_run_dir("outputs/2026-12-06/10-00-00", {**TORCHRUN, "TORCHELASTIC_RUN_ID": "none"})
        == "outputs/2026-12-06/10-00-00"
    )  # torchrun's default id names no run
    assert default_run_dir("outputs/x", {}) == "outputs/x"


@pytest.mark.parametrize(
    "env,given,refused",
    [
        (TORCHRUN, False, False),  # the id's folder
        ({**TORCHRUN, "TORCHELASTIC_RUN_ID": "none"}, False, True),  # two nodes, no id, no folder
        ({**TORCHRUN, "TORCHELASTIC_RUN_ID": "none"}, True, False),  # hydra.run.dir given
        (
            {
                **TORCHRUN,
                "TORCHELASTIC_RUN_ID": "none",
                "WORLD_SIZE": "1",
                "GROUP_RANK": "0",
                "RANK": "0",
                "TORCHELASTIC_MAX_RESTARTS": "2",
            },
            False,
            True,
        ),  # one node that may restart
        ({**TORCHRUN, "TORCHELASTIC_RUN_ID": "none", "WORLD_SIZE": "1", "GROUP_RANK": "0", "RANK": "0"}, False, False),
        ({"MASTER_ADDR": "h", "NODE_RANK": "1", "LOCAL_RANK": "0"}, False, True),  # Lightning's variables, 2 nodes
    ],
)
def test_a_launch_that_would_write_to_several_folders_is_refused(env, given, refused):
    ranks = read_ranks(devices=1, num_nodes=2 if "NODE_RANK" in env else 1, environ=env)
    why = unshared_folder(ranks, given, env)
    assert bool(why) == refused, why
    if why:
        assert "hydra.run.dir=" in why and "no run folder that every node and every restart agrees on" in why


def trainer(step: int) -> SimpleNamespace:
    return SimpleNamespace(is_global_zero=True, global_step=step)


def test_an_attempt_after_one_that_never_ended_is_a_restart_and_counts_the_steps_redone(tmp_path):
    first = AttemptLedger(tmp_path)
    first.on_train_start(trainer(0), None)
    for step in (1, 2, 3, 4, 5, 6, 7):
        first.on_train_batch_end(trainer(step), None, None, None, step)
    # SIGKILLed at step 7: nothing more is written; the newest resume point was step 5
    second = AttemptLedger(tmp_path)
    second.on_train_start(trainer(5), None)
    second.on_train_batch_end(trainer(6), None, None, None, 0)
    assert second.close("preempted") == {"count": 2, "restarts": 1, "steps_redone": 2, "resumed_steps": [0, 5]}
    third = AttemptLedger(tmp_path)  # resumed after a preemption, which ended: not a restart
    third.on_train_start(trainer(6), None)
    assert third.close("completed") == {"count": 3, "restarts": 1, "steps_redone": 2, "resumed_steps": [0, 5, 6]}
    assert [a["ended"] for a in read_attempts(tmp_path / "attempts.json")] == [None, "preempted", "completed"]


def test_the_ledger_is_rewritten_at_checkpoints_and_the_step_record_at_every_step(tmp_path):
    """steps_redone needs the step reached to the step (any step may be a kill's last), so that
    record is written at every step, as one fixed-width pwrite; the JSON ledger only when an
    attempt starts, at each checkpoint and at the end."""
    ledger = AttemptLedger(tmp_path)
    ledger.on_train_start(trainer(0), None)
    for step in (1, 2, 3):
        ledger.on_train_batch_end(trainer(step), None, None, None, step)
    assert json.loads((tmp_path / "attempts.json").read_text())[-1]["reached_step"] == 0
    assert (tmp_path / "attempts.step").read_text().split() == ["0", "3"]
    assert read_attempts(tmp_path / "attempts.json")[-1]["reached_step"] == 3
    ledger.on_save_checkpoint(trainer(3), None, {})
    assert json.loads((tmp_path / "attempts.json").read_text())[-1]["reached_step"] == 3
    for step in range(4, 12):
        ledger.on_train_batch_end(trainer(step), None, None, None, step)
    assert (tmp_path / "attempts.step").read_text().split() == ["0", "11"]  # the record replaced whole


def test_only_rank_zero_keeps_the_ledger(tmp_path):
    ledger = AttemptLedger(tmp_path)
    ledger.on_train_start(SimpleNamespace(is_global_zero=False, global_step=0), None)
    assert ledger.close("completed") is None and not (tmp_path / "attempts.json").exists()


def test_a_ledger_that_cannot_be_written_never_stops_the_run(tmp_path, caplog):
    (tmp_path / "attempts.json").mkdir()  # os.replace onto a folder fails, as a full disk would
    ledger = AttemptLedger(tmp_path)
    ledger.on_train_start(trainer(0), None)
    ledger.on_train_batch_end(trainer(1), None, None, None, 0)
    assert ledger.close("completed")["count"] == 1
    assert caplog.text.count("not written") == 1


def test_a_resumed_run_continues_its_csv_and_tensorboard_folders_without_the_redone_steps(tmp_path):
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    old = CSVLogger(tmp_path, name="csv")
    for step in range(6):
        old.log_metrics({"train/loss": float(step)}, step=step)
    old.log_metrics({"val/map": 0.5}, step=5)
    old.save()
    TensorBoardLogger(tmp_path, name="tensorboard").experiment.close()
    csv_logger, tb = CSVLogger(tmp_path, name="csv"), TensorBoardLogger(tmp_path, name="tensorboard")
    continue_logs([csv_logger, tb], resumed_step=4)
    assert csv_logger.version == 0 and tb.version == 0 and tb._kwargs["purge_step"] == 4
    csv_logger.log_metrics({"train/loss": 40.0, "train/lr": 0.1}, step=4)  # a new key: the header grows
    csv_logger.save()
    rows = list(csv.DictReader(open(tmp_path / "csv" / "version_0" / "metrics.csv")))
    assert [(r["step"], r["train/loss"]) for r in rows] == [
        ("0", "0.0"),
        ("1", "1.0"),
        ("2", "2.0"),
        ("3", "3.0"),
        ("4", "40.0"),
    ]
    assert rows[-1]["train/lr"] == "0.1" and sorted(p.name for p in (tmp_path / "csv").iterdir()) == ["version_0"]


def test_a_fresh_folder_starts_its_own_records(tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    logger = CSVLogger(tmp_path, name="csv")
    continue_logs([logger], resumed_step=10)  # resumed from another run's checkpoint, into a new folder
    assert logger._version is None and logger.version == 0


@pytest.mark.parametrize(
    "nodes,restarts,steps,why",
    [
        (1, "0", 0, "resume.ckpt on SIGTERM only (one node, no restarts); last.ckpt at every epoch end"),
        (2, "0", AUTO_STEPS, f"resume.ckpt every {AUTO_STEPS} steps (2 nodes: a lost node costs at most that many)"),
        (
            1,
            "3",
            AUTO_STEPS,
            f"resume.ckpt every {AUTO_STEPS} steps (torchrun --max-restarts=3: a lost node costs at most that many)",
        ),
    ],
)
def test_auto_resume_points_where_a_node_can_be_lost(monkeypatch, nodes, restarts, steps, why):
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", restarts)
    assert auto_every_n_steps(nodes) == (steps, why)  # the reason is the run's log line
