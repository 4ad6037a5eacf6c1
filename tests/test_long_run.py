"""No leaks over a long run: 100+ epochs of coco_tiny at 64 px with validation every epoch,
2 workers, one SIGKILLed early (a re-plan), sampling fds, /dev/shm entries and RSS each epoch.
The work per epoch is kept small (two train batches, one val batch); the point is the number of
epochs, validation loaders and re-plans."""

from __future__ import annotations

import json
import shutil
import statistics

import pytest
from conftest import NARROW_MODEL, REPO, is_root, run_train
from test_loader_faults import shm_namespace

EPOCHS = 100
WARM = 10  # epochs of warm-up: the re-plan (epoch 2), allocator and import caches settling


def series(rows: list[dict], key: str) -> list[int]:
    return [r[key] for r in rows]


# /dev/shm entries and bytes are the host's: measured on the shared /dev/shm, another test's
# segments would count as this run's. Given its own tmpfs (root, a mount namespace) the run can
# share the CPUs with other tests; without one it must run alone.
OWN_SHM = is_root() and shutil.which("unshare") is not None


alone_without_own_shm = (lambda test: test) if OWN_SHM else pytest.mark.serial


@pytest.mark.slow
@pytest.mark.timeout(1500)
@alone_without_own_shm
def test_hundred_epochs_leak_no_fds_shm_or_memory(coco_tiny, tmp_path):
    probe = tmp_path / "probe.jsonl"
    args = [
        "dataset=coco",
        f"dataset.root={coco_tiny}",
        "dataset.image_size=64",
        "loader.batch_size=8",
        NARROW_MODEL,
        "loader=explicit",
        "loader.num_workers=2",
        "loader.on_failure=replan",
        f"trainer.max_epochs={EPOCHS}",
        "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1",
        "model.eval_max_images=8",
        "trainer.enable_progress_bar=false",
        "trainer.log_every_n_steps=2",
        "+callbacks.last_checkpoint.every_n_epochs=50",
        "+callbacks.model_checkpoint.every_n_epochs=50",
        "callbacks.prediction_grid.images=4",
        "+callbacks.kill._target_=signal_at_step.KillWorkerAtStep",
        "+callbacks.kill.step=5",
        "+callbacks.probe._target_=signal_at_step.ResourceProbe",
        f"+callbacks.probe.path={probe}",
    ]
    _, s = run_train(
        args,
        tmp_path / "run",
        env={"PYTHONPATH": str(REPO / "tests")},
        timeout=1200,
        prefix=shm_namespace("1g") if OWN_SHM else None,
    )
    assert s["status"] == "completed" and s["epochs"] == EPOCHS
    [replan] = s["replans"]  # the SIGKILL before epoch 5: one re-plan that keeps a worker
    assert replan["epoch"] < 5 and replan["new_workers"] >= 1 and replan["new_val_workers"] >= 1

    rows = [json.loads(line) for line in probe.read_text().splitlines()]
    assert len(rows) == EPOCHS
    settled = rows[WARM:]
    print("fds", series(rows, "fds"))
    print("shm entries", series(rows, "shm"), "shm bytes", series(rows, "shm_used"))
    print("rss MiB", [r["rss"] >> 20 for r in rows])
    # fds and shm entries: back to their level after warm-up. Between samples they move by what
    # is in flight (prefetched batches: 8 fds and shm segments each), never upward for good.
    for key in ("fds", "shm"):
        level = max(series(rows[WARM : WARM + 10], key))
        assert max(series(settled, key)) <= level, (key, series(rows, key))
        assert statistics.mean(series(rows[-10:], key)) <= statistics.mean(series(rows[WARM : WARM + 10], key)) + 1, key
    # /dev/shm bytes: the same, within what a few batches in flight hold (8 images at 64 px are 96 KiB).
    level = max(series(rows[WARM : WARM + 10], "shm_used"))
    assert max(series(settled, "shm_used")) <= level + (1 << 20), series(rows, "shm_used")
    # RSS grows less than 5 % from epoch 10 to the end: the main process and each worker.
    assert settled[-1]["rss"] < 1.05 * settled[0]["rss"], [r["rss"] >> 20 for r in rows]
    for kind in ("train_workers", "val_workers"):
        first, last = settled[0][kind], settled[-1][kind]
        assert first and set(first) == set(last), (kind, first, last)  # the same workers all along
        for pid, rss in first.items():
            assert last[pid] < 1.05 * rss, (kind, pid, rss >> 20, last[pid] >> 20)
