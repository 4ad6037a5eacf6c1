"""A store that fails under a training run (issue 43): SeaweedFS killed mid-epoch and restarted
a few seconds later (the run retries through it and ends with the uninterrupted digest), and
killed for good (the run ends within dataset.remote.give_up_s with one line and a checkpoint,
and resumes to the same digest once the store is back). The read-ahead's budget is a quarter
of the split, so the store is read all through each epoch."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import s3fs  # noqa: F401  (pinned in requirements.txt: missing, it fails here, never skips)
from conftest import NARROW_MODEL, run_in_process, run_train
from moto_store import DUMMY_KEYS, upload_folder
from seaweed_store import SeaweedStore

pytestmark = pytest.mark.slow
BUCKET = "coco-outage"


@pytest.fixture(scope="module")
def seaweed(coco_tiny, tmp_path_factory):
    store = SeaweedStore(tmp_path_factory.mktemp("seaweed"))
    store.start()
    try:
        upload_folder(store.endpoint, coco_tiny, BUCKET)
        yield store
    finally:
        store.stop()


def args(root: list[str], cache: Path, *extra: str) -> list[str]:
    return [
        *root,
        "dataset.image_size=64",
        "loader.batch_size=8",
        NARROW_MODEL,
        "trainer.max_epochs=2",
        "trainer.limit_val_batches=2",
        "trainer.deterministic=true",
        "trainer.enable_progress_bar=false",
        "loader=explicit",
        "loader.num_workers=2",
        f"dataset.cache_dir={cache}",
        "dataset.remote.cache_bytes=3000000",
        "dataset.remote.retries=2",
        *extra,
    ]


def bucket(store: SeaweedStore) -> list[str]:
    return ["dataset=coco", f"dataset.root=s3://{BUCKET}", f"dataset.storage_options.endpoint_url={store.endpoint}"]


@pytest.fixture(scope="module")
def uninterrupted(coco_tiny, tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("local")
    s = run_in_process(args(["dataset=coco", f"dataset.root={coco_tiny}"], base / "cache"), base / "run")
    assert s["status"] == "completed" and s["steps"] == 20
    return s


def train_gets(store: SeaweedStore) -> int:
    """The train images the store has served so far (earlier runs of this module included)."""
    return sum("train2017/" in key for _, key in store.gets(BUCKET))


def kill_after_gets(store: SeaweedStore, gets: int, restart_after: float | None) -> tuple[threading.Thread, dict]:
    """Kill the store once it served ``gets`` train images in all (count them with
    ``train_gets``: the same count); restart it ``restart_after`` s later. The dict gets
    ``served_at_restart``: the GETs it had logged when it came back."""
    record: dict = {}

    def run():
        deadline = time.monotonic() + 300
        while train_gets(store) < gets and time.monotonic() < deadline:
            time.sleep(0.05)
        store.kill()
        if restart_after is not None:
            time.sleep(restart_after)
            record["served_at_restart"] = len(store.gets(BUCKET))
            store.start()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, record


def test_a_store_restarted_mid_epoch_costs_retries_not_the_run(seaweed, uninterrupted, tmp_path):
    killer, record = kill_after_gets(seaweed, train_gets(seaweed) + 30, restart_after=4.0)
    _, s = run_train(
        args(bucket(seaweed), tmp_path / "cache", "dataset.remote.give_up_s=120"),
        tmp_path / "run",
        env=DUMMY_KEYS,
        timeout=600,
    )
    killer.join(timeout=60)
    after = seaweed.gets(BUCKET)[record["served_at_restart"] :]
    assert s["status"] == "completed" and s["steps"] == 20
    assert s["remote"]["retries"] > 0, s["remote"]
    assert after, "the server logged no GET after its restart"
    assert s["stream_digest"] == uninterrupted["stream_digest"]


def test_a_store_that_stays_down_ends_the_run_then_it_resumes(seaweed, uninterrupted, tmp_path):
    # 70 of the run's own train GETs: inside epoch 0 (80 distinct images), so steps < 10 whatever
    # the timing, and past what the read-ahead's 3 MB and the workers' first batches hold, so
    # some steps are taken (at 40 none were). It counted every GET served before against train
    # GETs only, so the kill could come after the last train read: steps 20, seen once in CI.
    killer, _ = kill_after_gets(seaweed, train_gets(seaweed) + 70, restart_after=None)
    started = time.monotonic()
    proc, s = run_train(
        args(bucket(seaweed), tmp_path / "cache", "dataset.remote.give_up_s=6"),
        tmp_path / "run",
        env=DUMMY_KEYS,
        timeout=600,
        check=False,
    )
    ended = time.monotonic()
    killer.join(timeout=60)
    try:
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert (
            lines[-1].startswith("error: s3://coco-outage")
            and "gave up after dataset.remote.give_up_s=6 s" in lines[-1]
        )
        assert s["status"] == "store_down" and 0 < s["steps"] < 20, s
        assert Path(s["last_ckpt"]).is_file() and Path(s["last_ckpt"]).name == "resume.ckpt"
        assert ended - started < 180
    finally:
        seaweed.start()
    _, resumed = run_train(
        args(bucket(seaweed), tmp_path / "cache", "ckpt_path=last"), tmp_path / "run", env=DUMMY_KEYS, timeout=600
    )
    assert resumed["status"] == "completed" and resumed["steps"] == 20
    assert resumed["stream_digest"] == uninterrupted["stream_digest"]
