"""The read-ahead of a remote root (issue 43): one prefetcher per rank fetches, in the sampler's
own order, what the rank will read, each object once, within a byte budget, counted at the
server (moto_server's request recorder)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import s3fs  # noqa: F401  (pinned: a bucket root reads through it; imported, so its absence fails rather than skips)
from conftest import run_in_process
from moto_store import DUMMY_KEYS, filled_store, recorded

BUCKET = "coco-ahead"


@pytest.fixture(scope="module")
def store(coco_tiny):
    with filled_store(coco_tiny, BUCKET) as (endpoint, _):
        yield endpoint


def image_gets(requests: list[dict]) -> dict[str, int]:
    """GETs per train image key, as the server saw them."""
    counts: dict[str, int] = {}
    for r in requests:
        if r["method"] == "GET" and "/train2017/" in r["url"]:
            key = r["url"].split("/train2017/", 1)[1].split("?", 1)[0]
            counts[key] = counts.get(key, 0) + 1
    return counts


def bench(endpoint: str, cache: Path, *extra: str) -> list[str]:
    return [
        "mode=bench",
        "dataset=coco",
        f"dataset.root=s3://{BUCKET}",
        f"dataset.storage_options.endpoint_url={endpoint}",
        f"dataset.cache_dir={cache}",
        "dataset.image_size=192",
        "loader=explicit",
        "loader.num_workers=2",
        "loader.batch_size=8",
        "bench.batches=20",
        "bench.warmup=0",
        "bench.digest_batches=20",
        "bench.decode_probe=0",
        *extra,
    ]


@pytest.mark.parametrize("partners", ["8", "null"])
def test_the_plan_reads_what_the_samples_read(coco_tiny, partners, monkeypatch):
    """planned_reads replays the sample's own draws: the images a sample reads, in its order."""
    from cocodet.data.dataset import DetectionDataset
    from cocodet.data.image_reader import ImageReader
    from cocodet.datasets.splits import SplitLoader
    from cocodet.loader.epoch_sampler import EpochSampler
    from cocodet.transforms.augment import Mosaic

    train = (
        SplitLoader(
            root=str(coco_tiny),
            train_images="train2017",
            train_ann="annotations/instances_train2017.json",
            val_images="val2017",
            val_ann="annotations/instances_val2017.json",
        )
        .load()
        .train
    )
    pool = None if partners == "null" else int(partners)
    dataset = DetectionDataset(train, Mosaic(image_size=64, partner_pool=pool), seed=3)
    loads: list[int] = []
    real = ImageReader.read
    monkeypatch.setattr(ImageReader, "read", lambda self, k, *a: loads.append(k) or real(self, k, *a))
    for key in list(EpochSampler(len(train), 3, True, pool=pool).epoch_keys(2))[:12]:
        loads.clear()
        dataset[key]
        assert loads == dataset.planned_reads(key), key


def test_the_plan_reads_what_window_partners_read(coco_tiny, monkeypatch):
    """Window partners at or before the sample's position come from the window cache, not the
    store, and so does an image an earlier sample drew ahead of itself (among the epoch's first
    W + 1 positions): read in order, the epoch's plan is its reads exactly."""
    from cocodet.data import image_reader
    from cocodet.data.dataset import DetectionDataset
    from cocodet.data.window_cache import WindowCache
    from cocodet.datasets.splits import SplitLoader
    from cocodet.loader.epoch_sampler import EpochSampler
    from cocodet.loader.rank_share import RankOrder
    from cocodet.transforms.augment import Mosaic

    train = (
        SplitLoader(
            root=str(coco_tiny),
            train_images="train2017",
            train_ann="annotations/instances_train2017.json",
            val_images="val2017",
            val_ann="annotations/instances_val2017.json",
        )
        .load()
        .train
    )
    window = 8
    dataset = DetectionDataset(train, Mosaic(image_size=64, partners="window", partner_window=window), seed=3)
    dataset.use_window(RankOrder(len(train), 3), WindowCache(window + 4, 64))
    loads: list[int] = []
    real = image_reader.load_resized
    monkeypatch.setattr(
        image_reader, "load_resized", lambda index, k, *a, **kw: loads.append(k) or real(index, k, *a, **kw)
    )
    keys = list(EpochSampler(len(train), 3, True, window=window).epoch_keys(2))[:40]
    planned = dataset.planned_epoch_reads(keys)
    assert sum(len(r) for r in planned) < sum(len(dataset.planned_reads(k)) for k in keys)  # some drawn ahead
    for key, plan in zip(keys, planned):
        loads.clear()
        dataset[key]
        assert loads == plan, (key, loads, plan)


def test_each_object_is_fetched_once_per_epoch_and_a_held_split_not_again(store, coco_tiny, tmp_path):
    """Budget above the split: epoch 0 fetches each train image once (counted at the server),
    epochs 1 and 2 fetch nothing; the batches are the local root's."""
    recorded(store, reset=True)
    s = run_in_process(bench(store, tmp_path / "cache", "bench.batches=30", "bench.epochs=3"), tmp_path / "run")
    gets = image_gets(recorded(store))
    assert len(gets) == 80 and set(gets.values()) == {1}, gets  # three epochs, one GET per key
    remote = s["remote"]
    assert remote["gets"] >= 80 and remote["misses"] <= remote["gets"] and remote["read_ahead"]["concurrency"] == 16
    assert remote["gets_per_sample"] <= 80 / 240 + 0.05  # val and annotations aside, a third of a GET per sample
    local = run_in_process(
        bench(store, tmp_path / "c2", "bench.batches=30", "bench.epochs=3", f"dataset.root={coco_tiny}"),
        tmp_path / "local",
    )
    assert s["batch_digest"] == local["batch_digest"]


def test_a_read_ahead_that_breaks_is_said_and_the_run_goes_on(store, tmp_path, monkeypatch, caplog):
    """A plan that raises on the read-ahead thread (epoch 2 is planned there, while epoch 0
    runs) ends the read-ahead with a warning that says what happened; the bench finishes, the
    workers reading what the thread would have fetched."""
    from cocodet.read_ahead import start as prefetch

    real = prefetch.epoch_reads

    def broken(sampler, dataset, epoch):
        if epoch >= 2:
            raise RuntimeError(f"no plan for epoch {epoch}")
        return real(sampler, dataset, epoch)

    monkeypatch.setattr(prefetch, "epoch_reads", broken)
    caplog.set_level("WARNING")
    s = run_in_process(bench(store, tmp_path / "cache", "bench.batches=30", "bench.epochs=3"), tmp_path / "run")
    assert s["batches"] == 30, s
    stopped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("read-ahead stopped")]
    assert len(stopped) == 1 and "RuntimeError: no plan for epoch 2" in stopped[0], stopped


def held_copies(folder: Path) -> int:
    """Bytes of the published copies under the read-ahead's folder, wherever they are (they live
    two levels down, in local-rank-N/<split>-k/), claims and .part files aside."""
    total = 0
    for p in folder.rglob("*"):
        try:
            if p.is_file() and not p.name.endswith(".part") and p.name != ".claim":
                total += p.stat().st_size
        except FileNotFoundError:  # evicted while we looked
            pass
    return total


def fetches_after_the_workers(monkeypatch, log: Path) -> None:
    """Make each read-ahead GET wait until a worker has read the object itself (0.5 s at most):
    the worst case of a plan gone stale before its GET thread takes the claim, as on two cores
    the workers keep busy, where a fetch planned for a read beyond the lead starts after the
    model consumed batches and a worker read that object with no copy kept (the budget full)."""
    from cocodet.read_ahead.fetcher import ReadAhead
    from cocodet.read_ahead.object_cache import ObjectCache

    log.touch()
    real_read, real_fetch = ObjectCache.read, ReadAhead._fetch

    def read(self, url):  # the workers' reads (forked after the patch)
        data = real_read(self, url)
        with open(log, "a") as f:
            f.write(url + "\n")
        return data

    def fetch(self, k, *args):  # the read-ahead's GET threads
        deadline = time.monotonic() + 0.5
        while self.paths[k] not in log.read_text().split() and time.monotonic() < deadline:
            time.sleep(0.005)
        return real_fetch(self, k, *args)

    monkeypatch.setattr(ObjectCache, "read", read)
    monkeypatch.setattr(ReadAhead, "_fetch", fetch)


@pytest.mark.parametrize("partners", ["augment.partners=dataset", "augment.partner_pool=8", "augment.partners=window"])
def test_a_quarter_of_the_split_is_never_exceeded_and_costs_no_more_gets_than_reading_directly(
    store, coco_tiny, tmp_path, partners, monkeypatch
):
    """dataset.remote.cache_bytes at a quarter of the split, batch 8, 2 workers, one epoch,
    each read-ahead GET made only after a worker read that object itself: the copies never
    exceed the budget, and the server sees no more GETs than with no read-ahead at all. Before
    a fetch looked, at its claim, for a worker's GET since it was planned: 83 GETs against 80,
    for pools of 8 and for window partners alike; and before the read-ahead fetched only beyond
    the lead, with partners from the whole dataset, 4.79 GETs per sample against 3.88."""
    fetches_after_the_workers(monkeypatch, tmp_path / "worker-reads")
    sizes = sorted(p.stat().st_size for p in (coco_tiny / "train2017").iterdir())
    budget = sum(sizes) // 4
    folder = tmp_path / "cache" / "objects"
    peak, stop = [0], threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], held_copies(folder))
            time.sleep(0.002)

    one_epoch = ["bench.batches=10", "bench.digest_batches=10", partners]  # the stream ends with the epoch
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    recorded(store, reset=True)
    try:
        s = run_in_process(
            bench(store, tmp_path / "cache", f"dataset.remote.cache_bytes={budget}", *one_epoch), tmp_path / "run"
        )
    finally:
        stop.set()
        watcher.join()
    with_read_ahead = sum(image_gets(recorded(store)).values())
    recorded(store, reset=True)
    direct = run_in_process(bench(store, tmp_path / "c0", "dataset.remote.cache_bytes=0", *one_epoch), tmp_path / "r0")
    reading_directly = sum(image_gets(recorded(store)).values())
    assert 0 < peak[0] <= budget, (peak[0], budget)
    assert s["remote"]["read_ahead"]["peak_held_bytes"] <= budget
    assert with_read_ahead <= reading_directly, (with_read_ahead, reading_directly)
    assert s["batch_digest"] == direct["batch_digest"]
    # The watcher sees copies where they live: one written past the budget by hand is caught.
    (next(folder.glob("local-rank-0/*")) / "written-by-hand").write_bytes(b"x" * (budget + 1))
    assert held_copies(folder) > budget


def test_a_run_reads_nothing_past_its_last_batch(store, tmp_path):
    """Workers stream on across epochs, but not past the run's last batch: one epoch of pools of
    8 in batches of 8 (each image decoded once) with no read-ahead is exactly one GET per image
    (before: the workers' prefetched batches of the next epoch were GETs too)."""
    recorded(store, reset=True)
    s = run_in_process(
        bench(
            store,
            tmp_path / "cache",
            "dataset.remote.cache_bytes=0",
            "bench.batches=10",
            "bench.digest_batches=10",
            "augment.partner_pool=8",
        ),
        tmp_path / "run",
    )
    gets = image_gets(recorded(store))
    assert s["batches"] == 10 and len(gets) == 80 and set(gets.values()) == {1}, sorted(gets.values())


def test_the_working_set_counts_what_is_live_at_once():
    """An object is live from ``reach`` samples before its first read to its last; a copy that
    serves it in two epochs (lives that overlap) is one copy."""
    import numpy as np

    from cocodet.read_ahead.working_set import working_set

    sizes = np.array([10, 20, 30, 40])
    reads, offsets = np.array([0, 1, 2, 0, 3]), np.array([0, 2, 3, 4, 5])  # samples read {0,1} {2} {0} {3}
    assert working_set([(reads, offsets)], sizes, 0) == (2, 40)  # {0, 2} at sample 1; {3} alone at 3
    assert working_set([(reads, offsets)], sizes, 1) == (3, 60)  # fetched a sample early: {0, 1, 2} at sample 0
    again = (np.array([3, 1]), np.array([0, 1, 2]))  # the next epoch reads 3 first: its copy is still held
    assert working_set([(reads, offsets), again], sizes, 1) == (3, 60)
    assert working_set([(reads, offsets), again], sizes, 3) == (4, 100)  # reaching back to sample 1: 0, 2, 3, 1


def test_the_plan_prints_the_working_set_and_the_budget_that_holds_it(store, coco_tiny, tmp_path, caplog):
    """mode=plan names this rank's working set in objects and MiB; below it, one warning with the
    number to set; at that number, none. The auto default holds it where the disk can."""

    def plan(*extra):
        caplog.clear()
        s = run_in_process(
            [
                "mode=plan",
                "dataset=coco",
                f"dataset.root=s3://{BUCKET}",
                f"dataset.storage_options.endpoint_url={store}",
                f"dataset.cache_dir={tmp_path / 'c'}",
                "loader=explicit",
                "loader.num_workers=2",
                "loader.batch_size=8",
                *extra,
            ],
            tmp_path / "plan",
        )
        warnings = [
            r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "working set" in r.getMessage()
        ]
        return s["remote"]["read_ahead"], warnings

    caplog.set_level("INFO")
    auto, warnings = plan()
    objects, needed = auto["working_set_objects"], auto["working_set_bytes"]
    assert 0 < objects <= 80 and 0 < needed <= auto["split_bytes"] and not warnings
    assert auto["rank_budget_bytes"] >= needed
    assert any(f"working set {objects} objects" in r.getMessage() for r in caplog.records)
    tight, warnings = plan(f"dataset.remote.cache_bytes={needed // 2}")
    [warning] = warnings
    number = int(warning.split("dataset.remote.cache_bytes=", 1)[1].split()[0])
    assert number >= needed and f"{objects} objects" in warning
    held, warnings = plan(f"dataset.remote.cache_bytes={number}")
    assert not warnings and held["working_set_bytes"] == needed


def rank_of(request: dict) -> int | None:
    agent = request.get("headers", {}).get("User-Agent", "")
    return int(agent.split("cocodet/rank-", 1)[1].split()[0]) if "cocodet/rank-" in agent else None


@pytest.mark.slow
def test_under_ddp_each_rank_fetches_its_own_indices_with_the_local_digests(store, coco_tiny, tmp_path):
    """trainer=ddp_cpu, 2 ranks: the server's log (each GET's User-Agent names the rank) shows
    each rank fetching its own share of epoch 0 and what its next epochs add (the train loader
    streams on across the epoch's end), each key once; the per-rank digests are the local root's."""
    from conftest import NARROW_MODEL, run_train

    from cocodet.datasets.splits import SplitLoader
    from cocodet.loader.epoch_sampler import EpochSampler

    common = [
        "dataset.image_size=64",
        "loader.batch_size=8",
        NARROW_MODEL,
        "trainer.max_epochs=1",
        "trainer.limit_val_batches=1",
        "trainer.enable_progress_bar=false",
        "trainer=ddp_cpu",
        "loader=explicit",
        "loader.num_workers=1",
        f"dataset.cache_dir={tmp_path / 'cache'}",
        # pools: a rank's partners then come from its own share (whole-dataset partners
        # would read from every rank's, each object still once per rank)
        "augment.partner_pool=8",
    ]
    recorded(store, reset=True)
    _, remote = run_train(
        ["dataset=coco", f"dataset.root=s3://{BUCKET}", f"dataset.storage_options.endpoint_url={store}", *common],
        tmp_path / "remote",
        env=DUMMY_KEYS,
        timeout=900,
    )
    requests = [r for r in recorded(store) if r["method"] == "GET" and "/train2017/" in r["url"]]
    _, local = run_train(["dataset=coco", f"dataset.root={coco_tiny}", *common], tmp_path / "local", timeout=900)
    assert remote["ddp"]["stream_digests"] == local["ddp"]["stream_digests"]
    train = (
        SplitLoader(
            root=str(coco_tiny),
            train_images="train2017",
            train_ann="annotations/instances_train2017.json",
            val_images="val2017",
            val_ann="annotations/instances_val2017.json",
        )
        .load()
        .train
    )
    name = [Path(str(p)).name for p in train.paths]
    for rank in (0, 1):
        mine = [r["url"].split("/train2017/", 1)[1] for r in requests if rank_of(r) == rank]
        share = [{name[k[1]] for k in EpochSampler(80, 0, True, rank, 2, pool=8).epoch_keys(e)} for e in (0, 1, 2)]
        assert len(mine) == len(set(mine)), f"rank {rank} fetched a key twice"
        # Its epoch-0 share, and what its next epochs add, nothing else. (Not in order: the
        # samples in flight at the start are the worker's own reads, while the read-ahead
        # fetches from the first sample not yet handed out.)
        assert share[0] <= set(mine) <= share[0] | share[1] | share[2], rank
    assert all(rank_of(r) in (0, 1) for r in requests)
