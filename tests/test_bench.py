"""The measurement harness: a real sweep, its report and plot, and the two directions of
docs/benchmarks.md's "Where the loop waits"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, run_in_process, synthetic_overrides

from cocodet.bench.harness import calibrate_spin, measure, spin


def sweep(tmp: Path, root: Path, *overrides: str, prefix: list[str] | None = None) -> dict[tuple, dict]:
    cmd = [
        *(prefix or []),
        sys.executable,
        str(REPO / "train.py"),
        "-m",
        "mode=bench",
        *synthetic_overrides(root),
        f"hydra.sweep.dir={tmp}",
        *overrides,
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = {}
    for summary in tmp.glob("*/summary.json"):
        s = json.loads(summary.read_text())
        rows[(s["producer"], s["num_workers"])] = s
    return rows


def test_harness_counts_returned_examples_and_discards_warmup():
    batches = [list(range(n)) for n in (4, 4, 4, 3)]  # a short last batch
    m = measure(iter(batches), consume=lambda b: None, count=len)
    report = m.report(warmup=1)
    assert report["examples"] == 11 and report["measured_batches"] == 3 and report["batches"] == 4
    assert report["first_batch_s"] == round(m.waits[0], 4) and report["epoch_start_s"] == [report["first_batch_s"]]
    with pytest.raises(ValueError, match="warm-up"):
        m.report(warmup=4)


def test_spin_is_counted_in_iterations(monkeypatch):
    # XOR of 0..n-1 has a closed form: equal only when every one of the n iterations ran.
    for n in (1, 2, 3, 4, 1001, 4096, 99_999):
        last = n - 1
        assert spin(n) == [last, 1, last + 1, 0][last % 4], n
    n = calibrate_spin(1.0)
    assert n > 1000
    # Measured once per process: a sweep's jobs then spin the same work whatever the load.
    monkeypatch.setattr("cocodet.bench.harness.spin", lambda k: pytest.fail("calibrated twice"))
    assert calibrate_spin(1.0) == n


@pytest.mark.slow
def test_sweep_report_and_plot(tmp_path, synthetic_root):
    out = tmp_path / "sweep"
    rows = sweep(
        out, synthetic_root, "loader.num_workers=0,2", "bench.batches=6", "bench.warmup=1", "bench.decode_probe=4"
    )
    assert set(w for _, w in rows) == {0, 2}
    for s in rows.values():
        for key in (
            "examples_per_s",
            "wait_mean_ms",
            "wait_p50_ms",
            "wait_p95_ms",
            "wait_max_ms",
            "work_mean_ms",
            "wait_fraction",
            "first_batch_s",
            "batches",
            "batch_digest",
            "decode_bound",
            "num_workers",
            "shm_budget_bytes",
            "stage_ms_per_sample",
            "peak_rss_mb",
        ):
            assert key in s, key
        assert s["stage_ms_per_sample"]["decode"] > 0
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "sweep_report.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert sum(ln.startswith("| ") for ln in proc.stdout.splitlines()) == 3 and "examples_per_s" in proc.stdout
    import cv2

    image = cv2.imread(str(out / "sweep.png"))
    assert image is not None and image.shape[0] > 100 and image.std() > 10


@pytest.mark.slow
@pytest.mark.serial  # a throughput ratio on one pinned core: nothing else may share it
def test_sleep_scales_spin_does_not_on_one_core(tmp_path, synthetic_root):
    """docs/benchmarks.md's "Where the loop waits" tables, reduced: pinned to one core, 0 vs 4 workers."""
    rows = sweep(
        tmp_path / "s",
        synthetic_root,
        "bench.producer=sleep,spin",
        "loader.num_workers=0,4",
        "bench.producer_ms=2",
        "loader.batch_size=32",
        "bench.consumer=spin",
        "bench.work_ms=8",
        "bench.batches=40",
        "bench.warmup=12",
        "loader.persistent_workers=false",
        prefix=["taskset", "-c", "0"],
    )
    sleep0, sleep4 = rows[("sleep", 0)], rows[("sleep", 4)]
    spin0, spin4 = rows[("spin", 0)], rows[("spin", 4)]
    sleep_gain = sleep4["examples_per_s"] / sleep0["examples_per_s"]
    spin_gain = spin4["examples_per_s"] / spin0["examples_per_s"]
    print(f"4 workers against 0 on one core: sleep {sleep_gain:.2f}x, spin {spin_gain:.2f}x")
    # Sleeping producers overlap (ideally ~4x); spinning ones share the one core, so they cannot
    # add more than the per-batch overhead the main process no longer pays. One CI run read 1.26x
    # for spin (a neighbour slowed the 0-worker job), so the bound is the gap between the two.
    assert sleep_gain >= 2.0, (sleep0, sleep4)
    assert 0.75 <= spin_gain <= 1.5 and spin_gain < sleep_gain - 0.5, (spin0, spin4)
    assert spin4["wait_mean_ms"] < spin0["wait_mean_ms"]  # the wait fell...
    assert spin4["work_mean_ms"] > spin0["work_mean_ms"]  # ...because the work got slower


@pytest.mark.parametrize("persistent", [True, False])
def test_worker_rss_reported_per_epoch(tmp_path, synthetic_root, persistent):
    """Workers are found through the loader's own stream (EpochLoader.worker_pids): torch keeps
    its iterator only for persistent workers, so reading that measured nothing without them."""
    s = run_in_process(
        [
            *synthetic_overrides(synthetic_root),
            "mode=bench",
            "bench.epochs=3",
            "bench.batches=null",
            "loader=explicit",
            "loader.num_workers=2",
            "bench.decode_probe=0",
            f"loader.persistent_workers={str(persistent).lower()}",
        ],
        tmp_path / "rss",
    )
    assert s["persistent_workers"] is persistent
    assert len(s["epochs"]) == 3 and all(e["worker_rss_mb"] for e in s["epochs"])
    assert "worker_rss_growth" in s and np.isfinite(s["worker_rss_growth"])


def test_preloaded_batches_bound_the_loader_fed_rate(tmp_path, synthetic_root):
    """bench.preload=true (the upper bound scripts/gpu_check.sh sets the loader against): the
    batches are read first, then the consumer alone is timed; it crashed on its first epoch
    ('list' object has no attribute 'set_epoch') until the GPU check's CPU rehearsal ran it."""
    common = [
        *synthetic_overrides(synthetic_root),
        "mode=bench",
        "dataset.image_size=64",
        "loader.batch_size=8",
        "bench.consumer=model",
        "model.detector.fpn_channels=64",
        "bench.batches=3",
        "bench.warmup=1",
        "bench.decode_probe=0",
    ]
    s = run_in_process([*common, "bench.preload=true"], tmp_path / "preloaded")
    assert s["preloaded"] is True and s["batches"] == 4 and s["examples_per_s"] > 0, s
