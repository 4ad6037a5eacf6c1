"""The read-ahead's object cache and prefetcher (issue 56), driven directly with real threads,
real processes and a real S3 server (moto_server, GETs counted at the server): two claimers of
one object, a worker publishing an object the prefetcher reserved, a claim whose owner died, a
slow fetch older than any timeout, a missing object, a permanent failure, an ETag that is not
an MD5, and the loader's start method."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime

import numpy as np
import pytest
import s3fs  # noqa: F401  (pinned in requirements.txt: missing, it fails here, never skips)
from conftest import REPO
from moto_store import DUMMY_KEYS, moto_server, recorded, s3_client

BUCKET = "objects"
SIZES = [3000 + 700 * k for k in range(12)]
FORK = multiprocessing.get_context("fork")


@pytest.fixture(scope="module")
def store():
    saved = {k: os.environ.get(k) for k in (*DUMMY_KEYS, "MOTO_ENABLE_RECORDING")}
    os.environ.update(DUMMY_KEYS, MOTO_ENABLE_RECORDING="True")
    try:
        with moto_server() as endpoint:
            yield endpoint
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture
def bucket(store, tmp_path):
    """A fresh bucket of 12 objects; (endpoint, urls, bodies), the store configured for them."""
    from cocodet.storage import session

    name = f"{BUCKET}-{os.urandom(4).hex()}"
    client = s3_client(store)
    client.create_bucket(Bucket=name)
    bodies = [np.random.default_rng(k).bytes(size) for k, size in enumerate(SIZES)]
    for k, body in enumerate(bodies):
        client.put_object(Bucket=name, Key=f"img/{k:03d}.jpg", Body=body)
    session.configure({"endpoint_url": store}, timeout_s=5, retries=2, give_up_s=10)
    urls = [f"s3://{name}/img/{k:03d}.jpg" for k in range(len(bodies))]
    recorded(store, reset=True)
    yield store, urls, bodies
    session.configure()


def gets_of(endpoint: str, url: str) -> int:
    key = url.split("://", 1)[1].split("/", 1)[1]
    return sum(1 for r in recorded(endpoint) if r["method"] == "GET" and r["url"].split("?", 1)[0].endswith(key))


def cache_for(tmp_path, urls, budget=1 << 30):
    from cocodet.read_ahead.object_cache import ObjectCache
    from cocodet.storage import store as storage

    return ObjectCache(tmp_path / "copies", storage.listing(urls[0].rsplit("/", 1)[0]), budget)


def copies_match_their_listing(cache) -> None:
    """Every published copy holds exactly the listed object's bytes."""
    for url, meta in cache.objects.items():
        path = cache.path(url)
        if path.exists():
            data = path.read_bytes()
            assert len(data) == meta["size"] and hashlib.md5(data).hexdigest() == meta["etag"], url


def test_two_claimers_of_one_object_fetch_it_once(bucket, tmp_path):
    """Two processes and two threads of each read one object that no copy holds yet: one GET."""
    endpoint, urls, bodies = bucket
    cache = cache_for(tmp_path, urls)
    start = FORK.Event()

    def readers():
        start.wait()
        got = []
        threads = [threading.Thread(target=lambda: got.append(cache.read(urls[0]))) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        os._exit(0 if got == [bodies[0]] * 2 else 1)

    procs = [FORK.Process(target=readers) for _ in range(2)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0]
    assert gets_of(endpoint, urls[0]) == 1
    copies_match_their_listing(cache)


def test_a_copy_a_worker_published_gives_back_the_prefetchers_reservation(bucket, tmp_path):
    """The prefetcher reserved bytes for an object, and a worker published it first: the held
    count is the copy's size once, not twice (before: twice, for ever)."""
    _, urls, bodies = bucket
    cache = cache_for(tmp_path, urls)
    assert cache.reserve(SIZES[1])  # the prefetcher's reservation, made before its GET
    worker = FORK.Process(target=lambda: os._exit(0 if cache.read(urls[1]) == bodies[1] else 1))
    worker.start()
    worker.join(30)
    assert worker.exitcode == 0 and cache.held(urls[1])
    assert cache.fetch(urls[1], reserved=True) == bodies[1]
    assert cache.held_bytes() == SIZES[1]


def _claim_and_die(cache, url, ready):
    from cocodet.storage.claims import claim_file

    fd = claim_file(cache._part(url))
    os.write(fd, b"half of an object")
    ready.set()
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_claim_whose_owner_died_is_taken_over_at_once(bucket, tmp_path):
    """A worker killed mid-write leaves its .part: the next reader takes the claim over at once
    (no timeout), and the copy it publishes is whole."""
    endpoint, urls, bodies = bucket
    cache = cache_for(tmp_path, urls)
    ready = FORK.Event()
    dying = FORK.Process(target=_claim_and_die, args=(cache, urls[2], ready))
    dying.start()
    dying.join(30)
    assert ready.is_set() and dying.exitcode == -signal.SIGKILL and cache._part(urls[2]).exists()
    t0 = time.monotonic()
    assert cache.read(urls[2]) == bodies[2]
    assert time.monotonic() - t0 < 3
    assert gets_of(endpoint, urls[2]) == 1
    copies_match_their_listing(cache)


def _slow_fetch(cache, url, claimed, result):
    from cocodet.storage import store as storage

    real = storage.get_object

    def slow(u):
        claimed.set()
        time.sleep(4)  # longer than timeout_s + give_up_s below: a fetch that retries for a long time
        return real(u)

    storage.get_object = slow
    try:
        result.value = 1 if cache.fetch(url) == cache.path(url).read_bytes() else 2
    except BaseException:  # noqa: BLE001 - the parent reads the outcome
        result.value = 3


def test_a_slow_fetch_keeps_its_claim_past_every_timeout(bucket, tmp_path):
    """A claimer whose GET takes longer than timeout_s + give_up_s keeps its claim while it
    lives: the waiter waits for its copy instead of deleting the claim and fetching again
    (before: after 0.5 + 1 s the waiter took over, and two writers raced for one name)."""
    from cocodet.storage import session

    endpoint, urls, bodies = bucket
    session.configure({"endpoint_url": endpoint}, timeout_s=0.5, retries=1, give_up_s=1)
    cache = cache_for(tmp_path, urls)
    claimed, result = FORK.Event(), FORK.Value("i", 0)
    slow = FORK.Process(target=_slow_fetch, args=(cache, urls[3], claimed, result))
    slow.start()
    assert claimed.wait(30)
    assert cache.fetch(urls[3]) == bodies[3]  # waits for the slow claimer's copy
    slow.join(30)
    assert result.value == 1
    assert gets_of(endpoint, urls[3]) == 1
    copies_match_their_listing(cache)


def prefetcher_for(cache, urls, reads, budget=1 << 30):
    """A prefetcher over ``urls`` whose every epoch reads ``reads`` (one read per sample)."""
    from cocodet.read_ahead.fetcher import ReadAhead

    plan = (np.asarray(reads, dtype=np.int64), np.arange(len(reads) + 1))
    return ReadAhead(cache, urls, lambda epoch: plan, budget, concurrency=4)


def wait_for(condition, seconds=20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def test_a_missing_object_is_not_planned_and_the_read_ahead_goes_on(bucket, tmp_path, caplog):
    """The annotations name an image the bucket lacks: the read-ahead plans around it and
    fetches everything else (before: KeyError, the thread ended, every later read a miss)."""
    _, urls, _ = bucket
    cache = cache_for(tmp_path, urls)
    missing = urls[0].rsplit("/", 1)[0] + "/not-there.jpg"
    paths = [missing, *urls]
    prefetcher = prefetcher_for(cache, paths, list(range(len(paths))))
    caplog.set_level("WARNING")
    prefetcher.start(0)
    try:
        assert wait_for(lambda: all(cache.held(u) for u in urls))
        assert prefetcher._thread.is_alive()
    finally:
        prefetcher.stop()
    assert not [r for r in caplog.records if "read-ahead stopped" in r.getMessage()]


def test_a_permanent_failure_is_fetched_once(bucket, tmp_path):
    """An object deleted after the listing (a 404): one GET, not one per pass for as long as it
    stays in the plan; the rest are fetched."""
    endpoint, urls, _ = bucket
    cache = cache_for(tmp_path, urls)
    name, key = urls[4].split("://", 1)[1].split("/", 1)
    s3_client(endpoint).delete_object(Bucket=name, Key=key)
    recorded(endpoint, reset=True)
    prefetcher = prefetcher_for(cache, urls, list(range(len(urls))))
    prefetcher.start(0)
    try:
        assert wait_for(lambda: all(cache.held(u) for u in urls if u != urls[4]))
        for _ in range(20):  # batches consumed: each wakes the thread for another pass
            prefetcher.advance(0)
            time.sleep(0.05)
    finally:
        prefetcher.stop()
    assert gets_of(endpoint, urls[4]) == 1
    assert prefetcher.summary()["failed_objects"] == 1


def test_an_etag_that_is_not_the_md5_is_checked_by_size(bucket, tmp_path, monkeypatch):
    """SSE-KMS and SSE-C objects have 32-hex ETags that are not the MD5 of their bytes: the
    copy is kept when the store still lists the same ETag (before: "the object changed", the
    run ended); a different ETag is a change, and refused."""
    from cocodet.storage import store as storage
    from cocodet.storage.errors import StoreError

    _, urls, bodies = bucket
    cache = cache_for(tmp_path, urls)
    kms_etag = "0123456789abcdef" * 2
    for url in urls[5:7]:
        cache.objects[url] = {**cache.objects[url], "etag": kms_etag}
    heads = []
    monkeypatch.setattr(storage, "object_info", lambda url: heads.append(url) or {"size": 0, "etag": kms_etag})
    assert cache.read(urls[5]) == bodies[5] and cache.read(urls[6]) == bodies[6]
    assert heads == [urls[5]]  # one HEAD settles it for this store
    cache.objects[urls[7]] = {**cache.objects[urls[7]], "size": SIZES[7] + 1}
    with pytest.raises(StoreError, match="changed during the run"):
        cache.read(urls[7])  # the size is checked always
    other = cache_for(tmp_path / "other", urls)
    other.objects[urls[8]] = {**other.objects[urls[8]], "etag": kms_etag}
    monkeypatch.setattr(storage, "object_info", lambda url: {"size": 0, "etag": "f" * 32})
    with pytest.raises(StoreError, match="changed during the run"):
        other.read(urls[8])


def test_runs_sharing_a_host_and_a_split_get_folders_of_their_own(tmp_path):
    """A local_parallel sweep: two live runs on one split never share (or evict from) one
    folder; the folder is reused once its run ended. Another split's copies are not counted
    as free space for this one."""
    from cocodet.read_ahead.budget import read_ahead_budget, split_folder

    first, claim = split_folder(str(tmp_path), 0, "s3://b/train2017")
    second, claim2 = split_folder(str(tmp_path), 0, "s3://b/train2017")
    assert first != second and first.parent == second.parent == tmp_path / "local-rank-0"
    os.close(claim)
    again, claim3 = split_folder(str(tmp_path), 0, "s3://b/train2017")
    assert again == first
    (second / "copy").write_bytes(b"x" * (1 << 20))  # the other run's copy
    alone = read_ahead_budget(tmp_path, 1 << 20, 1, {}, 1, own=again)
    counted = read_ahead_budget(tmp_path, 1 << 20, 1, {}, 1, own=second)
    assert counted["free_bytes"] - alone["free_bytes"] == 1 << 20
    os.close(claim2)
    os.close(claim3)


def test_loader_workers_are_forked_whatever_the_default_start_method(tmp_path):
    """Python 3.14 on Linux defaults to forkserver: the store's counters (and the object and
    window caches) reach cocodet's workers only by fork, so the loader asks for fork; counts
    made in the workers reach the main process."""
    script = tmp_path / "forked.py"
    script.write_text("""
import multiprocessing
multiprocessing.set_start_method("forkserver", force=True)
import torch
from cocodet.storage import session
from cocodet.loader.plan.records import BatchGeometry, LoaderRequest
from cocodet.loader.plan.policy import plan_loader
from cocodet.loader.plan.resources import probe

class Counting(torch.utils.data.Dataset):
    def __len__(self):
        return 8
    def __getitem__(self, k):
        session.count("gets")
        return torch.zeros(2)

session.configure()
plan = plan_loader(LoaderRequest("explicit", 2, 2), BatchGeometry(4, 1 << 20), probe(), cuda=False)
loader = torch.utils.data.DataLoader(Counting(), batch_size=4, **plan.dataloader_kwargs())  # as build_loader does
print(loader.multiprocessing_context.get_start_method() if loader.multiprocessing_context else None)
for _ in loader:
    pass
print(int(session.counts()["gets"]))
""")
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    lines = proc.stdout.split()
    assert lines[:1] == ["fork"] and lines[-1] == "8", (proc.stdout, proc.stderr[-2000:])


FULL_DISK = """
import hashlib, json, logging, os, sys
from cocodet.storage import session
from cocodet.storage import store as storage
from cocodet.read_ahead.object_cache import ObjectCache

endpoint, folder, urls = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
session.configure({"endpoint_url": endpoint}, timeout_s=5, retries=2, give_up_s=10)
lines = []
handler = logging.Handler()
handler.emit = lambda record: lines.append(record.getMessage())
logging.getLogger("cocodet").addHandler(handler)
cache = ObjectCache(folder, storage.listing(urls[0].rsplit("/", 1)[0]), 1 << 30)
digests = [hashlib.md5(cache.read(url)).hexdigest() for url in urls[:-1]]  # the workers' misses
last = urls[-1]
size = cache.objects[last]["size"]
assert cache.reserve(size)  # the read-ahead's way: reserved, then fetched
digests.append(hashlib.md5(cache.fetch(last, reserved=True)).hexdigest())
on_disk = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
print(json.dumps({"digests": digests, "held": cache.held_bytes(), "on_disk": on_disk, "copies": len(os.listdir(folder)),
                  "writable": cache.writable(), "log": lines}))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare")
def test_a_full_copies_disk_serves_the_bytes_and_names_the_disk(bucket, tmp_path):
    """The copies' folder is a 16 KiB tmpfs (a private mount namespace): a few copies fit, then
    the disk refuses (ENOSPC). Every read still returns the object's bytes, the budget held is
    what is on the disk (before issue 70: the image became a bad sample, "cannot read: No space
    left on device", and its reservation was never given back), and one warning names the
    folder and its free space, not /dev/shm."""
    endpoint, urls, bodies = bucket
    folder = tmp_path / "copies"
    folder.mkdir()
    (tmp_path / "full_disk.py").write_text(FULL_DISK)
    script = f"{sys.executable} {tmp_path / 'full_disk.py'} {endpoint} {folder} '{json.dumps(urls)}'"
    proc = subprocess.run(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            f"mount -t tmpfs -o size=16k tmpfs {folder} && {script}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["digests"] == [hashlib.md5(b).hexdigest() for b in bodies]
    assert 0 < out["copies"] < len(urls) and not out["writable"], out
    assert out["held"] == out["on_disk"], out
    [warning] = [line for line in out["log"] if "read-ahead copies" in line]
    assert f"on the disk of {folder}" in warning and "No space left on device" in warning and "free of" in warning
    assert "/dev/shm" not in "\n".join(out["log"])


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare")
def test_a_bucket_bench_whose_copies_disk_fills_mid_run_reads_every_image(coco_tiny, tmp_path):
    """mode=bench on an s3:// root with the read-ahead's copies on a 4 MiB tmpfs (a private
    mount namespace) that another process fills once the read-ahead has started: the bench
    reads the local root's batches exactly (its batch digest), skips no image, the budget held
    ends equal to the copies on disk, one warning per refusal names the copies' disk, none
    blames /dev/shm."""
    from conftest import run_in_process
    from moto_store import filled_store

    from cocodet.read_ahead.disk_refusal import DISK_RETRY_S

    args = [
        "mode=bench",
        "dataset=coco",
        "dataset.image_size=128",
        "loader=explicit",
        "loader.num_workers=2",
        "loader.batch_size=4",
        "bench.batches=15",
        "bench.warmup=0",
        "bench.digest_batches=15",
        "bench.decode_probe=0",
    ]
    local = run_in_process([*args, f"dataset.root={coco_tiny}"], tmp_path / "local")
    copies = tmp_path / "copies"
    copies.mkdir()
    with filled_store(coco_tiny, "full-disk") as (endpoint, _):
        bench = [
            sys.executable,
            str(REPO / "train.py"),
            *args,
            "dataset.root=s3://full-disk",
            f"dataset.storage_options.endpoint_url={endpoint}",
            f"dataset.remote.cache_dir={copies}",
            f"hydra.run.dir={tmp_path / 'run'}",
        ]
        # The tmpfs is mounted before the bench starts; the filler waits for the read-ahead's first
        # copy, then takes every byte left. Its output goes nowhere, so that only the bench holds
        # the pipes this test reads, and it is ended with the bench whatever it was doing.
        fill = (
            f'while [ -z "$(find {copies} -mindepth 2 -type f 2>/dev/null | head -1)" ]; do sleep 0.05; done; '
            f"cat /dev/zero > {copies}/filler"
        )
        script = (
            f"mount -t tmpfs -o size=4m tmpfs {copies} || exit 1; ( {fill} ) >/dev/null 2>&1 & filler=$!; "
            f"{' '.join(bench)}; status=$?; kill $filler 2>/dev/null; exit $status"
        )
        proc = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
            env=os.environ,
        )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    s = json.loads(proc.stdout.strip().splitlines()[-1])
    assert s["batch_digest"] == local["batch_digest"] and s["examples"] == local["examples"]
    assert {split: v["skipped"] for split, v in s["bad_samples"].items() if isinstance(v, dict)} == {"train": 0}, s[
        "bad_samples"
    ]
    read_ahead = s["remote"]["read_ahead"]
    assert read_ahead["held_bytes"] == read_ahead["copies_bytes"] and not read_ahead["copies_writable"], read_ahead
    complaints = [line for line in log.splitlines() if "[WARNING]" in line or "[ERROR]" in line or "error" in line]
    disk = [line for line in complaints if "read-ahead copies: writing" in line]
    assert disk and all("No space left on device" in line and f"on the disk of {copies}" in line for line in disk), disk
    # One warning per refusal: copies stop for DISK_RETRY_S after each, so a bench that outlasts
    # that may meet the full disk again, and say so again, but never twice within one pause.
    at = [datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f") for line in disk]
    gaps = [(b - a).total_seconds() for a, b in zip(at, at[1:])]
    assert all(gap >= DISK_RETRY_S - 1 for gap in gaps), (gaps, disk)
    assert not [line for line in complaints if "/dev/shm" in line or "shm" in line.lower()], complaints
