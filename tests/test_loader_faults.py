"""Real fault conditions with real DataLoader workers: a 64 MB /dev/shm, low fd limits,
inherited counts, dead workers. Needs root for mount namespaces (CI runs as root)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from conftest import NARROW_MODEL, REPO, is_root, run_in_process, run_train, synthetic_overrides

MB64 = 64 * 1024 * 1024

needs_root = pytest.mark.skipif(not is_root() or not shutil.which("unshare"), reason="needs root and unshare")


def shm_namespace(size: str = "64m") -> list[str]:
    """Prefix: run the command in a private mount namespace with a tmpfs of ``size`` on /dev/shm."""
    return [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        f'mount -t tmpfs -o size={size} tmpfs /dev/shm && exec "$@"',
        "sh",
    ]


def coco640(coco_tiny, batch: int = 64) -> list[str]:
    return ["dataset=coco", f"dataset.root={coco_tiny}", "dataset.image_size=640", f"loader.batch_size={batch}"]


@pytest.mark.slow
@needs_root
def test_plan_in_64mb_shm_fits_budget(coco_tiny, tmp_path):
    _, s = run_train([*coco640(coco_tiny), "mode=plan"], tmp_path / "plan", prefix=shm_namespace())
    assert s["shm_free_bytes"] <= MB64 and s["shm_budget_bytes"] <= MB64 // 2
    # One batch (64 x 640 px, ~75 MiB) exceeds the budget: workers ship it in parts that fit.
    assert s["num_workers"] >= 1 and s["part_images"] and s["part_images"] < 64
    part_bytes = s["batch_bytes"] * s["part_images"] // 64
    inflight = s["num_workers"] * s["prefetch_factor"] * part_bytes
    assert inflight <= s["shm_budget_bytes"] and abs(inflight - s["inflight_bytes"]) <= s["num_workers"]
    shm_cap = next(c for c in s["caps"] if c["name"] == "shm")
    assert shm_cap["applied"] and "--shm-size" in shm_cap["reason"] and "parts of" in shm_cap["reason"]


@pytest.mark.slow
@needs_root
def test_auto_run_completes_in_64mb_shm(coco_tiny, tmp_path):
    args = [*coco640(coco_tiny), "mode=bench", "bench.batches=3", "bench.warmup=0", "bench.decode_probe=0"]
    _, s = run_train(args, tmp_path / "bench", prefix=shm_namespace())
    # Whole batches of 64 arrive (80 images: 64 + 16 per epoch), built by workers in parts.
    assert s["num_workers"] >= 1 and s["part_images"] and s["batches"] == 3 and s["examples_per_s"] > 0
    assert s["examples"] == 64 + 16 + 64 and s["peak_shm_mb"] <= s["shm_budget_bytes"] / 2**20 + 8


@needs_root
@pytest.mark.slow
def test_auto_training_in_64mb_shm_validates_without_running_out(coco_tiny, tmp_path):
    """Train and val loaders both alive (persistent workers, the train stream running ahead
    across epochs): the parts they hold together still fit, validation included, with no
    re-plan. A joined part once stayed referenced while its batch was out, 9.4 MiB more per
    loader, and the second validation ran out of shm."""
    args = [
        *coco640(coco_tiny),
        "+model.detector.min_size=64",
        "+model.detector.max_size=64",
        NARROW_MODEL,
        "trainer.max_epochs=3",
        "trainer.enable_progress_bar=false",
    ]
    _, s = run_train(args, tmp_path / "run", prefix=shm_namespace(), timeout=900)
    assert s["status"] == "completed" and s["steps"] == 6 and s["plan"]["part_images"]
    assert s["replans"] == [] and s["on_failure"] == "replan"


@needs_root
@pytest.mark.slow
def test_replan_in_64mb_shm_leaves_room_for_validation(coco_tiny, tmp_path):
    """Explicit 2 workers at prefetch 4 overcommit a 64 MB /dev/shm: one re-plan, against the
    budget train and val share, and validation then runs on its own worker without a second.
    Planned for the train loader alone, validation found 7.5 MiB free and died of shm too."""
    args = [
        *coco640(coco_tiny, batch=16),
        NARROW_MODEL,
        "loader=explicit",
        "loader.num_workers=2",
        "loader.prefetch_factor=4",
        "loader.on_failure=replan",
        "+model.detector.min_size=128",
        "+model.detector.max_size=128",
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=2",
        "trainer.enable_progress_bar=false",
        "callbacks.prediction_grid.images=2",
    ]
    _, s = run_train(args, tmp_path / "run", prefix=shm_namespace(), timeout=900)
    assert s["status"] == "completed" and s["steps"] == 6
    assert len(s["replans"]) == 1, s["replans"]
    (replan,) = s["replans"]
    assert replan["cause"] == "shm" and replan["new_val_workers"] >= 1, replan
    split = replan["shm_split"]
    assert split["train"] > 0 and split["val"] > 0 and split["train"] + split["val"] <= split["budget"]


@pytest.mark.slow
@needs_root
def test_explicit_overcommit_warns_then_fails_with_shm_diagnosis(coco_tiny, tmp_path):
    """A 16 MB /dev/shm is smaller than one batch (64 x 640 px, 75 MiB): the first batch a
    worker ships cannot fit, so the failure is certain, never a matter of timing."""
    args = [
        *coco640(coco_tiny),
        "mode=bench",
        "loader=explicit",
        "loader.num_workers=2",
        "loader.prefetch_factor=2",
        "bench.batches=3",
        "bench.warmup=0",
        "bench.decode_probe=0",
    ]
    proc, s = run_train(args, tmp_path / "x", prefix=shm_namespace("16m"), check=False, timeout=900)
    out = proc.stdout + proc.stderr
    warn_at = out.find("expect 'Bus error'")
    assert warn_at >= 0, out[-3000:]
    assert "2 workers x prefetch 2" in out and "MiB of shm" in out  # the warning gives the numbers
    assert proc.returncode != 0 and s is None, out[-3000:]
    assert "LoaderFailure" in out and "/dev/shm ran out" in out and "16.0 MiB in all" in out, out[-4000:]
    assert "--shm-size" in out and "loader.num_workers=0" in out
    assert out.find("DataLoader failure") > warn_at


def test_inherited_env_count_is_capped_to_cpus(tmp_path, synthetic_root, monkeypatch):
    monkeypatch.setenv("COCODET_NUM_WORKERS", "64")
    args = [*synthetic_overrides(synthetic_root), "mode=plan", "loader=inherited", "loader.batch_size=64"]
    s = run_in_process(args, tmp_path / "inh")
    assert s["source"] == "inherited" and s["requested"] == 64
    assert s["num_workers"] == s["usable_cpus"] < 64
    assert next(c for c in s["caps"] if c["name"] == "cpu")["applied"]


@pytest.mark.slow
@needs_root
def test_inherited_count_is_capped_by_shm(coco_tiny, tmp_path):
    args = [*coco640(coco_tiny, batch=8), "mode=plan", "loader=inherited"]
    _, s = run_train(args, tmp_path / "inh", env={"SLURM_CPUS_PER_TASK": "64"}, prefix=shm_namespace())
    shm_cap = next(c for c in s["caps"] if c["name"] == "shm")
    assert s["requested"] == 64 and shm_cap["applied"] and s["num_workers"] <= shm_cap["limit"] + 1
    assert s["inflight_bytes"] <= s["shm_budget_bytes"]


@pytest.mark.slow
def test_explicit_twelve_is_honoured_with_numbers(tmp_path, synthetic_root):
    args = [*synthetic_overrides(synthetic_root), "mode=plan", "loader=explicit", "loader.num_workers=12"]
    proc, s = run_train(args, tmp_path / "exp", prefix=["taskset", "-c", "0,1"])
    assert s["num_workers"] == 12 and s["source"] == "explicit"
    assert any("12 workers on 2 usable CPUs" in w for w in s["warnings"])
    assert "12 workers on 2 usable CPUs" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_num_workers_on_command_line_is_explicit_and_preset_is_inherited(tmp_path, synthetic_root):
    _, s = run_train([*synthetic_overrides(synthetic_root), "mode=plan", "loader.num_workers=1"], tmp_path / "a")
    assert s["source"] == "explicit" and s["num_workers"] == 1


def test_host_without_shm_is_not_capped(tmp_path, synthetic_root, caplog):
    caplog.set_level("INFO")
    args = [*synthetic_overrides(synthetic_root), "mode=plan", f"loader.shm_path={tmp_path / 'no_shm_here'}"]
    s = run_in_process(args, tmp_path / "noshm")
    shm_cap = next(c for c in s["caps"] if c["name"] == "shm")
    assert s["shm_free_bytes"] is None and not shm_cap["applied"] and "not capped" in shm_cap["reason"]
    out = caplog.text
    assert "host preflight" in out and "no_shm_here: none free of none" in out and "RLIMIT_NOFILE" in out


@pytest.mark.parametrize("sig,expected", [(signal.SIGKILL, "memory"), (signal.SIGBUS, "/dev/shm ran out")])
def test_dead_worker_is_explained(sig, expected, synthetic_root, tmp_path):
    """A worker killed mid-epoch ends the loop with the diagnosis, not a bare 'exited unexpectedly'."""
    from cocodet.datamodule import CocoDataModule
    from cocodet.loader.failures.diagnose import LoaderFailure, explained_loader_failures
    from cocodet.loader.plan.policy import plan_loader
    from cocodet.loader.plan.records import BatchGeometry, LoaderRequest
    from cocodet.loader.plan.resources import probe
    from cocodet.transforms.augment import Mosaic

    root = synthetic_root
    plan = plan_loader(LoaderRequest("explicit", 2, 2), BatchGeometry(2, 1 << 20), probe(), cuda=False)
    dm = CocoDataModule(
        root=str(root),
        train_images="train",
        train_ann="annotations/instances_train.json",
        val_images="val",
        val_ann="annotations/instances_val.json",
        image_size=64,
        recipe=Mosaic(64),
        batch_size=2,
        seed=0,
        plan=plan,
    )
    dm.setup()
    loader = dm.train_dataloader()
    try:
        with pytest.raises(LoaderFailure) as e:
            with explained_loader_failures(plan):
                for k, _ in enumerate(loader):
                    if k == 1:
                        os.kill(loader._iterator._workers[0].pid, sig)
    finally:  # unregister the dead worker so torch's SIGCHLD handler does not fire later in pytest
        iterator = loader._iterator
        with contextlib.suppress(Exception):
            torch.utils.data._utils.signal_handling._remove_worker_pids(id(iterator))
        with contextlib.suppress(Exception):
            iterator._shutdown_workers()
    text = str(e.value)
    assert expected in text and "loader.num_workers=0" in text
    assert f"ended by {sig.name}" in text
    assert isinstance(e.value.__cause__, (RuntimeError, OSError, EOFError))  # the original stays attached


@pytest.mark.slow
def test_flat_batch_survives_256_fds_where_list_of_dicts_does_not():
    cmd = [
        "prlimit",
        "--nofile=256:",
        sys.executable,
        str(REPO / "benchmarks" / "bench_transport.py"),
        "--json",
        "--batches",
        "64",
        "--size",
        "96",
        "--workers",
        "4",
        "--prefetch",
        "4",
        "--steps",
        "50",
        "--layouts",
        "flat_batch",
        "list_of_dicts",
        "--timeout",
        "20",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    rows = {r["layout"]: r for r in map(json.loads, proc.stdout.strip().splitlines())}
    assert rows["flat_batch"]["error"] is None and rows["flat_batch"]["batches"] == 50
    assert rows["flat_batch"]["storages_per_batch"] <= 8
    # Shown, not required: what the natural layout does under the same limit.
    print("list_of_dicts under 256 fds:", rows["list_of_dicts"])
