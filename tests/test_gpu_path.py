"""The GPU path where a CPU can check it: precision choice, pinning decision, transfer timing,
and the prepared GPU check script's answer on a host without CUDA."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO

from cocodet.loader.flat_batch import FlatBatch, to_device
from cocodet.loader.plan.policy import plan_loader
from cocodet.loader.plan.records import BatchGeometry, LoaderRequest
from cocodet.loader.plan.resources import HostResources
from cocodet.models.precision import choose_precision
from cocodet.timing.transfer import TransferTimer


@pytest.mark.parametrize(
    "cuda, bf16, expected", [(True, True, "bf16-mixed"), (True, False, "16-mixed"), (False, False, "32-true")]
)
def test_auto_mixed_precision_follows_the_gpu(cuda, bf16, expected):
    assert choose_precision("auto-mixed", cuda, bf16) == expected


def test_explicit_precision_passes_through():
    assert choose_precision("16-mixed", True, True) == "16-mixed"
    assert choose_precision("32-true", True, True) == "32-true"


def test_gpu_trainer_preset_asks_for_auto_mixed():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["trainer=gpu"])
    assert cfg.trainer.precision == "auto-mixed" and cfg.trainer.accelerator == "gpu"


def resources() -> HostResources:
    return HostResources(
        affinity_cpus=4,
        cgroup_cpus=None,
        local_world_size=1,
        usable_cpus=4,
        shm_path="/dev/shm",
        shm_total_bytes=8 << 30,
        shm_free_bytes=8 << 30,
        nofile_soft=65536,
        nofile_hard=65536,
        max_map_count=65530,
        memory_available_bytes=64 << 30,
        memory_source="test",
    )


@pytest.mark.parametrize("cuda", [True, False])
def test_pinning_only_when_batches_go_to_cuda(cuda):
    plan = plan_loader(LoaderRequest("auto"), BatchGeometry(16, 1 << 20), resources(), cuda=cuda)
    assert plan.pin_memory is cuda
    assert plan.dataloader_kwargs()["pin_memory"] is cuda


def flat(b: int = 2) -> FlatBatch:
    return FlatBatch(
        images=torch.zeros(b, 3, 32, 32, dtype=torch.uint8),
        image_sizes=torch.full((b, 2), 32),
        boxes=torch.zeros(0, 4),
        labels=torch.zeros(0, dtype=torch.int64),
        box_counts=torch.zeros(b, dtype=torch.int64),
        sample_keys=torch.zeros(b, 3, dtype=torch.int64),
        to_original=torch.ones(b, 3),
        sample_stats=torch.zeros(b, 7, dtype=torch.float64),
    )


def test_transfer_timer_falls_back_to_the_wall_clock_on_cpu():
    timer = TransferTimer()
    for _ in range(3):
        with timer.timing(torch.device("cpu")):
            moved = to_device(flat(), torch.device("cpu"))
    assert isinstance(moved, FlatBatch) and moved.images.dtype == torch.uint8
    summary = timer.summary()
    assert summary["h2d_mean_ms"] is not None and summary["h2d_mean_ms"] >= 0
    assert timer.summary() == {"h2d_mean_ms": None, "h2d_p95_ms": None}  # summary drains


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pinned_batches_copy_non_blocking_and_are_timed_on_cuda():
    batch = FlatBatch(*(t.pin_memory() for t in flat(4)[:8]))
    assert batch.images.is_pinned()
    timer = TransferTimer()
    with timer.timing(torch.device("cuda")):
        moved = to_device(batch, torch.device("cuda"))
    assert moved.images.is_cuda and timer.summary()["h2d_mean_ms"] > 0


def _other_python() -> tuple[str, str]:
    """(interpreter, version) standing in for a CUDA host's image: Python 3.12 where this
    machine has one, else the local Python."""
    candidates = [
        shutil.which("python3.12"),
        "/usr/bin/python3.12",
        *sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.12*/bin/python3.12")),
    ]
    for path in filter(None, candidates):
        if Path(path).exists() and subprocess.run([path, "-c", "import venv"], capture_output=True).returncode == 0:
            return path, "3.12"
    return sys.executable, f"{sys.version_info.major}.{sys.version_info.minor}"


@pytest.mark.slow
def test_gpu_check_dry_run_on_an_image_that_is_not_ours(tmp_path):
    """scripts/gpu_wheels.sh fills a wheel folder (cached between runs, so CI does not download
    each time); scripts/gpu_check.sh installs it into another interpreter that has only what
    such an image has besides torch (NumPy, PyYAML), composes every mode, and exits 0 with its
    no-CUDA message."""
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA: run scripts/gpu_check.sh for real")
    python, version = _other_python()
    cache = Path(os.environ.get("COCODET_WHEEL_CACHE", Path.home() / ".cache" / "cocodet")) / f"gpu-py{version}"
    wheels, venv = cache / "wheels", cache / "venv"
    if not list(wheels.glob("hydra_core-*.whl")):
        proc = subprocess.run(
            ["bash", str(REPO / "scripts" / "gpu_wheels.sh"), str(wheels)],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=REPO,
            env={**os.environ, "PYTHON_VERSION": version},
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert sum(f.stat().st_size for f in wheels.glob("*.whl")) < 50 << 20  # the folder stays under 50 MiB
    if not (venv / "bin" / "python").exists():
        subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=300)
        subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                "numpy",
                "PyYAML",
                "packaging",
                "typing-extensions",
            ],
            check=True,
            timeout=600,
        )
    env = {
        **os.environ,
        "PYTHON": str(venv / "bin" / "python"),
        "GPU_WHEELS": str(wheels),
        "GPU_CHECK_DIR": str(tmp_path / "check"),
        "CUDA_VISIBLE_DEVICES": "",
    }
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh")], capture_output=True, text=True, timeout=600, env=env, cwd=REPO
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"python {version}" in proc.stdout and "hydra-core 1.3.8" in proc.stdout
    rows = {
        line.split()[0]: line.split()[1]
        for line in proc.stdout.splitlines()
        if line[:1].isalpha() and len(line.split()) > 1
    }
    assert rows.get("wheels") == "ok" and rows.get("compose") == "ok", proc.stdout[-2000:]
    assert "no CUDA device visible" in proc.stdout
