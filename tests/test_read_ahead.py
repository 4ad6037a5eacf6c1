"""The read-ahead of a remote root (issue 43): one prefetcher per rank fetches, in the sampler's
own order, what the rank will read, each object once, within a byte budget, counted at the
server (moto_server's request recorder)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from conftest import run_in_process
from moto_store import DUMMY_KEYS, filled_store, recorded

pytest.importorskip("s3fs")
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
    return ["mode=bench", "dataset=coco", f"dataset.root=s3://{BUCKET}",
            f"dataset.storage_options.endpoint_url={endpoint}", f"dataset.cache_dir={cache}",
            "dataset.image_size=192", "loader=explicit", "loader.num_workers=2", "loader.batch_size=8",
            "bench.batches=20", "bench.warmup=0", "bench.digest_batches=20", "bench.decode_probe=0", *extra]


@pytest.mark.parametrize("partners", ["8", "null"])
def test_the_plan_reads_what_the_samples_read(coco_tiny, partners, monkeypatch):
    """planned_reads replays the sample's own draws: the images _sample loads, in its order."""
    from cocodet.data import dataset as dataset_module
    from cocodet.transforms.augment import Mosaic
    from cocodet.data.dataset import DetectionDataset
    from cocodet.loader.epoch_sampler import EpochSampler
    from cocodet.coco.splits import load_splits

    train, _ = load_splits(str(coco_tiny), "train2017", "annotations/instances_train2017.json", "val2017",
                           "annotations/instances_val2017.json")
    pool = None if partners == "null" else int(partners)
    dataset = DetectionDataset(train, Mosaic(image_size=64, partner_pool=pool), seed=3)
    loads: list[int] = []
    real = dataset_module.load_resized
    monkeypatch.setattr(dataset_module, "load_resized", lambda index, k, *a, **kw: loads.append(k) or real(index, k, *a, **kw))
    for key in list(EpochSampler(len(train), 3, True, pool=pool).epoch_keys(2))[:12]:
        loads.clear()
        dataset._sample(key, lambda k, t, position=None: dataset._read(k, t, position))
        assert loads == dataset.planned_reads(key), key


def test_the_plan_reads_what_window_partners_read(coco_tiny, monkeypatch):
    """Window partners at or before the sample's position come from the window cache, not the
    store: planned_reads leaves them out. Past the epoch's first W + 1 positions the plan is the
    reads exactly; among them a sample's own image may already be in the cache (an earlier sample
    drew it as a partner ahead of itself), so there the plan is an upper bound."""
    from cocodet.coco.splits import load_splits
    from cocodet.data import dataset as dataset_module
    from cocodet.data.dataset import DetectionDataset
    from cocodet.data.window_cache import WindowCache
    from cocodet.loader.epoch_sampler import EpochSampler
    from cocodet.loader.rank_share import RankOrder
    from cocodet.transforms.augment import Mosaic

    train, _ = load_splits(str(coco_tiny), "train2017", "annotations/instances_train2017.json", "val2017",
                           "annotations/instances_val2017.json")
    window = 8
    dataset = DetectionDataset(train, Mosaic(image_size=64, partners="window", partner_window=window), seed=3)
    dataset.use_window(RankOrder(len(train), 3), WindowCache(window + 4, 64))
    loads: list[int] = []
    real = dataset_module.load_resized
    monkeypatch.setattr(dataset_module, "load_resized", lambda index, k, *a, **kw: loads.append(k) or real(index, k, *a, **kw))
    exact = 0
    for key in list(EpochSampler(len(train), 3, True, window=window).epoch_keys(2))[:40]:
        loads.clear()
        dataset._sample(key, lambda k, t, position=None: dataset._read(k, t, position))
        planned = dataset.planned_reads(key)
        if key[2] > window:
            assert loads == planned, key
            exact += 1
        else:
            assert all(loads.count(k) <= planned.count(k) for k in loads), (key, loads, planned)
    assert exact == 40 - window - 1


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
    local = run_in_process(bench(store, tmp_path / "c2", "bench.batches=30", "bench.epochs=3",
                                 f"dataset.root={coco_tiny}"), tmp_path / "local")
    assert s["batch_digest"] == local["batch_digest"]


def test_a_read_ahead_that_breaks_is_said_and_the_run_goes_on(store, tmp_path, monkeypatch, caplog):
    """A plan that raises on the read-ahead thread (epoch 2 is planned there, while epoch 0
    runs) ends the read-ahead with a warning that says what happened; the bench finishes, the
    workers reading what the thread would have fetched."""
    from cocodet.storage import prefetch

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


def test_a_budget_of_a_quarter_of_the_split_is_never_exceeded(store, coco_tiny, tmp_path):
    sizes = sorted(p.stat().st_size for p in (coco_tiny / "train2017").iterdir())
    budget = sum(sizes) // 4
    folder = tmp_path / "cache" / "objects"
    peak, stop = [0], threading.Event()

    def watch():
        while not stop.is_set():
            if folder.is_dir():
                held = 0
                for p in folder.iterdir():
                    try:
                        held += p.stat().st_size if not p.name.endswith(".part") else 0
                    except FileNotFoundError:
                        pass
                peak[0] = max(peak[0], held)
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    recorded(store, reset=True)
    try:
        # Batches of 2 from pools of 8: the workers' 5 batches in flight (10 samples, their pools'
        # partners among them) fit in the quarter's 20 images, so the read-ahead window covers what
        # workers read. (Whole-dataset partners would need up to 40 images for the same window.)
        s = run_in_process(bench(store, tmp_path / "cache", f"dataset.remote.cache_bytes={budget}",
                                 "loader.batch_size=2", "bench.batches=80", "bench.digest_batches=80",
                                 "bench.epochs=2", "augment.partner_pool=8"), tmp_path / "run")
    finally:
        stop.set()
        watcher.join()
    gets = image_gets(recorded(store))
    assert 0 < peak[0] <= budget, (peak[0], budget)
    assert s["remote"]["read_ahead"]["peak_held_bytes"] <= budget
    # At most one GET per key per epoch: two whole epochs, and the head of the third that the
    # read-ahead (and the workers, which stream across epochs) fetched before the bench stopped.
    from cocodet.loader.epoch_sampler import EpochSampler
    from cocodet.coco.splits import load_splits

    train, _ = load_splits(str(coco_tiny), "train2017", "annotations/instances_train2017.json", "val2017",
                           "annotations/instances_val2017.json")
    head = [Path(str(train.paths[k[1]])).name for k in list(EpochSampler(80, 0, True, pool=8).epoch_keys(2))[:24]]
    third = {key for key, n in gets.items() if n == 3}
    assert len(third - set(head)) <= s["remote"]["misses"], (sorted(gets.values()), third - set(head))
    # A worker that outran the read-ahead fetched for itself (a miss); with the budget full its
    # copy is not kept, and the read-ahead may fetch that object again: every GET beyond one per
    # key per epoch is such a counted miss.
    extra = sum(max(0, n - (3 if key in head else 2)) for key, n in gets.items())
    assert extra <= s["remote"]["misses"] and sum(gets.values()) <= 160 + len(third) + s["remote"]["misses"]
    local = run_in_process(bench(store, tmp_path / "c2", "loader.batch_size=2", "bench.batches=80",
                                 "bench.digest_batches=80", "bench.epochs=2", "augment.partner_pool=8",
                                 f"dataset.root={coco_tiny}"),
                           tmp_path / "local")
    assert s["batch_digest"] == local["batch_digest"]


def rank_of(request: dict) -> int | None:
    agent = request.get("headers", {}).get("User-Agent", "")
    return int(agent.split("cocodet/rank-", 1)[1].split()[0]) if "cocodet/rank-" in agent else None


@pytest.mark.slow
def test_under_ddp_each_rank_fetches_its_own_indices_with_the_local_digests(store, coco_tiny, tmp_path):
    """trainer=ddp_cpu, 2 ranks: the server's log (each GET's User-Agent names the rank) shows
    each rank's prefetcher fetching its own share of epoch 0 first, then what its next epochs
    add (the train loader streams on across the epoch's end), each key once; the per-rank
    digests are the local root's."""
    from cocodet.loader.epoch_sampler import EpochSampler
    from cocodet.coco.splits import load_splits
    from conftest import NARROW_MODEL, run_train

    common = ["dataset.image_size=64", "loader.batch_size=8", NARROW_MODEL, "trainer.max_epochs=1",
              "trainer.limit_val_batches=1", "trainer.enable_progress_bar=false", "trainer=ddp_cpu", "loader=explicit",
              "loader.num_workers=1", f"dataset.cache_dir={tmp_path / 'cache'}",
              # pools: a rank's partners then come from its own share (whole-dataset partners
              # would read from every rank's, each object still once per rank)
              "augment.partner_pool=8"]
    recorded(store, reset=True)
    _, remote = run_train(["dataset=coco", f"dataset.root=s3://{BUCKET}", f"dataset.storage_options.endpoint_url={store}",
                           *common], tmp_path / "remote", env=DUMMY_KEYS, timeout=900)
    requests = [r for r in recorded(store) if r["method"] == "GET" and "/train2017/" in r["url"]]
    _, local = run_train(["dataset=coco", f"dataset.root={coco_tiny}", *common], tmp_path / "local", timeout=900)
    assert remote["ddp"]["stream_digests"] == local["ddp"]["stream_digests"]
    train, _ = load_splits(str(coco_tiny), "train2017", "annotations/instances_train2017.json", "val2017",
                           "annotations/instances_val2017.json")
    name = [Path(str(p)).name for p in train.paths]
    for rank in (0, 1):
        mine = [r["url"].split("/train2017/", 1)[1] for r in requests if rank_of(r) == rank]
        share = [{name[k[1]] for k in EpochSampler(80, 0, True, rank, 2, pool=8).epoch_keys(e)} for e in (0, 1, 2)]
        assert len(mine) == len(set(mine)), f"rank {rank} fetched a key twice"
        # Its epoch-0 share first (in the order it reads them, up to the 16 GETs in flight that
        # arrive in any order), then what its next epochs add.
        assert share[0] <= set(mine[:len(share[0]) + 16]) and set(mine) <= share[0] | share[1] | share[2], rank
    assert all(rank_of(r) in (0, 1) for r in requests)
