"""User errors end with one stderr line naming the key or path, and exit status 2; the entry
point (train.py) is run in-process with the user's argv, so Hydra's own errors are covered too."""

from __future__ import annotations

import runpy
import sys

import pytest
from conftest import REPO


def run_entry(monkeypatch, tmp_path, *overrides: str) -> int:
    """``python train.py mode=plan ...`` in this process; returns the exit status."""
    monkeypatch.setattr(sys, "argv", [str(REPO / "train.py"), "mode=plan", *overrides, f"hydra.run.dir={tmp_path}"])
    try:
        runpy.run_path(str(REPO / "train.py"), run_name="__main__")
    except SystemExit as e:
        return e.code
    return 0


@pytest.mark.parametrize(
    "override, named",
    [
        ("loader.batch_size=-3", "loader.batch_size=-3"),
        ("loader.batch_size=abc", "loader.batch_size='abc'"),
        ("dataset.image_size=0", "dataset.image_size=0"),
        ("loader.prefetch_factor=0", "loader.prefetch_factor=0"),
        ("mode=fit", "mode='fit'"),
        ("loader.no_such_key=1", "loader.no_such_key"),
        ("augment=fancy", "augment/fancy"),
        ("model.optimizer.lr=abc", "model.optimizer.lr"),
        # A closed group's schema (run_spec/schemas.py): a key it lacks, appended with + or not, is
        # refused naming the closest declared key; a choice outside its options names the options.
        ("+loader.batchsize=4", "loader.batchsize (did you mean loader.batch_size?)"),
        ("loader.batchsize=4", "loader.batchsize (did you mean loader.batch_size?)"),
        ("+bench.warmpu=2", "bench.warmpu (did you mean bench.warmup?)"),
        ("+dataset.verfy=true", "dataset.verfy (did you mean dataset.verify?)"),
        ("loader.policy=fast", "loader.policy='fast' is not allowed: expected auto, explicit or inherited"),
        ("export.format=tflite", "export.format='tflite' is not allowed: expected torchscript or onnx"),
    ],
)
def test_bad_value_or_option_exits_2_with_one_line(monkeypatch, tmp_path, capsys, override, named):
    assert run_entry(monkeypatch, tmp_path, override) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0], err
    assert "Traceback" not in err[0]


APPENDED_TYPOS = [  # (override, what the one line names): a constructor's group, checked against its signature
    (["+trainer.max_epoch=1"], "trainer.max_epoch (did you mean trainer.max_epochs?): Lightning's Trainer takes"),
    (
        ["model/optimizer=sgd", "+model.optimizer.momentun=0.9"],
        "model.optimizer.momentun (did you mean model.optimizer.momentum?): torch.optim.SGD takes",
    ),
    (["+loader.batchsize=4"], "loader.batchsize (did you mean loader.batch_size?)"),
]


@pytest.mark.parametrize("mode", ["plan", "verify", "train", "bench", "preview", "eval", "predict", "export"])
@pytest.mark.parametrize("overrides, named", APPENDED_TYPOS)
def test_an_appended_typo_exits_2_in_every_mode(monkeypatch, tmp_path, capsys, mode, overrides, named):
    """Before anything starts: no dataset is read and no model built (dataset.root does not exist)."""
    assert run_entry(monkeypatch, tmp_path, f"mode={mode}", "dataset.root=/nonexistent", *overrides) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0] and "Traceback" not in err[0], err


def test_a_declared_extension_of_an_open_group_still_runs(monkeypatch, tmp_path, capsys):
    from hydra import compose, initialize_config_dir

    from cocodet.run_spec.read import read_spec

    assert run_entry(monkeypatch, tmp_path, "+model.optimizer.fused=false", "+trainer.deterministic=true") == 0
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):  # train: every key checked
        cfg = compose(
            config_name="config",
            overrides=[
                "mode=train",
                "+model.optimizer.fused=false",
                "+trainer.deterministic=true",
                "output_dir=unused",
            ],
        )
    spec = read_spec(cfg)
    assert spec.model.config["optimizer"]["fused"] is False and spec.trainer.args["deterministic"] is True


def test_a_checkpoints_config_never_names_code_to_run(monkeypatch, tmp_path, capsys):
    """mode=eval reads the groups a checkpoint was trained with; a _target_ in them that is not
    cocodet's or torch.optim's is refused under weights_only=true, before anything is built."""
    import torch

    pwned = tmp_path / "pwned"
    hostile = {
        "_target_": "cocodet.models.detector.DetectorModule",
        "detector": {"_target_": "os.system", "command": f"touch {pwned}"},
    }
    torch.save({"state_dict": {}, "cocodet_config": {"model": hostile}}, tmp_path / "hostile.ckpt")
    assert run_entry(monkeypatch, tmp_path, "mode=eval", f"ckpt_path={tmp_path / 'hostile.ckpt'}") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "names model.detector._target_=os.system" in err[0], err
    assert not pwned.exists()


def test_missing_dataset_root_exits_2_naming_the_path(monkeypatch, tmp_path, capsys):
    missing = tmp_path / "nonexistent"
    assert run_entry(monkeypatch, tmp_path, "dataset=coco", f"dataset.root={missing}") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(missing) in err[0], err


def test_malformed_annotations_exit_2_naming_the_file(monkeypatch, tmp_path, capsys):
    root = tmp_path / "ds"
    (root / "annotations").mkdir(parents=True)
    for split in ("train2017", "val2017"):
        (root / split).mkdir()
        (root / "annotations" / f"instances_{split}.json").write_text('{"hello": "world"}')
    assert run_entry(monkeypatch, tmp_path, "dataset=coco", f"dataset.root={root}") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "instances_train2017.json" in err[0] and "not COCO instances format" in err[0], err


def config_groups() -> list[str]:
    """Every config group the user can choose an option of: each folder of conf/ holding YAML
    (nested ones such as model/optimizer and hydra/launcher included)."""
    conf = REPO / "conf"
    return sorted(str(d.relative_to(conf)) for d in conf.rglob("*") if d.is_dir() and any(d.glob("*.yaml")))


def test_the_group_list_covers_the_defaults_list():
    groups = config_groups()
    for group in (
        "experiment",
        "debug",
        "augment",
        "dataset",
        "loader",
        "model",
        "model/optimizer",
        "trainer",
        "callbacks",
        "logger",
        "hydra/launcher",
    ):
        assert group in groups, groups


@pytest.mark.parametrize("group", config_groups())
def test_every_group_refuses_a_missing_option_naming_the_options(monkeypatch, tmp_path, capsys, group):
    """A misspelled option runs nothing: one line with the group's options, exit status 2 (an
    `optional` default would silently run the default configuration instead)."""
    options = sorted(p.stem for p in (REPO / "conf" / group).glob("*.yaml"))
    assert run_entry(monkeypatch, tmp_path, f"{group}={options[0]}x") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"Could not find '{group}/{options[0]}x'" in err[0], err
    assert all(option in err[0] for option in options), err
    assert not (tmp_path / "summary.json").exists()
