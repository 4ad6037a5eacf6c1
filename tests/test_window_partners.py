"""Window partners (issue 54): mosaic partners from the W positions of a rank's epoch order before
the sample, their pixels shared between the workers through the window cache. The stream is a
function of (seed, epoch, the rank's order, position, W) alone; the cache changes speed, never
pixels; a slot is never read torn, and a claim is decided by a live process's lock."""

from __future__ import annotations

import collections
import os
import shutil
import signal
import threading
import time

import numpy as np
import pytest
from conftest import is_root, run_in_process, run_train

from cocodet.data.partners import window_position
from cocodet.data.window_cache import WindowCache
from cocodet.errors import ConfigError
from cocodet.loader.stream_position import ResumeError, StreamPosition
from cocodet.transforms.augment import Mosaic
from cocodet.transforms.partner_source import partner_source
from cocodet.window_slot import SLOT_HEADER


def test_a_window_partner_is_one_of_the_w_positions_before_the_sample():
    rng = np.random.default_rng(0)
    n, w = 100, 8
    for p in range(n):
        drawn = {window_position(p, n, w, rng) for _ in range(400)}
        expected = set(range(p - w, p)) if p >= w else set(range(w + 1)) - {p}  # the epoch's start: the first W + 1
        assert drawn == expected, p
    assert window_position(0, 1, w, rng) is None  # an order of one position: no partner to draw
    assert {window_position(1, 3, w, rng) for _ in range(100)} == {0, 2}  # shorter than W: the whole order but p


def test_partner_settings_resolve_one_way():
    assert partner_source("window", 48, None) == "window"
    assert partner_source("window", 48, 8) == "pool"  # augment.partner_pool=8 on the command line still means pools
    assert partner_source(None, None, None) == "dataset"  # Mosaic(partner_pool=None): what it meant before windows
    assert partner_source("dataset", 48, None) == "dataset"
    with pytest.raises(ConfigError, match="partner_pool"):
        partner_source("pool", 48, None)
    with pytest.raises(ConfigError, match="contradict"):
        partner_source("dataset", None, 8)
    with pytest.raises(ConfigError, match="augment.partners"):
        Mosaic(64, partners="windw", partner_window=48)
    m = Mosaic(64, partners="window", partner_window=16)
    assert (m.partner_window, m.partner_pool, m.partners_from) == (16, None, "window")


def image_of(index: int, h: int = 40, w: int = 64) -> np.ndarray:
    return np.full((h, w, 3), index % 251, np.uint8)


def test_the_cache_returns_what_was_published_and_nothing_can_write_into_it():
    cache = WindowCache(4, 64)
    assert cache.get(2, 7) is None
    assert cache.put(2, 7, image_of(7), (480, 768), 0.0833)
    image, orig_hw, scale, token = cache.get(
        6, 7
    )  # position 6 shares slot 2 with position 2: keyed by the dataset index
    assert np.array_equal(image, image_of(7)) and orig_hw == (480, 768) and scale == 0.0833 and cache.intact(token)
    with pytest.raises(ValueError, match="read-only"):
        image[:] = 0  # a recipe writing into what it read raises; nothing shared changes
    copied = cache.get(2, 7, copy=True)[0]
    copied[:] = 0
    assert np.array_equal(cache.get(2, 7)[0], image_of(7))
    assert cache.get(2, 8) is None  # another image in that slot's place: a miss, never the wrong pixels
    cache.put(2, 9, image_of(9), (64, 64), 1.0)
    assert not cache.intact(token)  # the view read before is known stale
    assert not cache.put(3, 9, image_of(9, 80, 80), (80, 80), 1.0)  # larger than a slot: not published
    del image
    cache.close()


def test_a_slot_rewritten_by_other_processes_is_never_read_torn():
    """Four forked writers publish different images into the same two slots as fast as they can;
    every hit the reader gets is one whole image, with the header that belongs to it."""
    cache = WindowCache(2, 256)
    children = []
    for writer in range(4):
        pid = os.fork()
        if pid == 0:
            deadline = time.monotonic() + 1.5
            k = writer
            while time.monotonic() < deadline:
                cache.put(k % 2, k, image_of(k, 200, 256), (k, k + 1), float(k))
                k += 4
            os._exit(0)
        children.append(pid)
    hits = 0
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        for slot in (0, 1):
            index = int(cache.headers[slot]["index"])
            found = cache.get(slot, index)
            if found is not None:  # a view: whole if the slot is still intact after it was read
                image, orig_hw, scale, token = found
                whole = bool((image == index % 251).all())
                if cache.intact(token):
                    assert whole and orig_hw == (index, index + 1) and scale == index
                    hits += 1
    for pid in children:
        assert os.waitpid(pid, 0)[1] == 0
    assert hits > 50 and cache.misses > 0, (hits, cache.misses)


def test_a_writer_killed_mid_write_leaves_a_miss_and_loses_its_claim():
    cache = WindowCache(4, 64)
    cache.put(1, 5, image_of(5), (64, 64), 1.0)
    pid = os.fork()
    if pid == 0:  # claim the slot, mark it being written, write half an image, die
        assert cache.claims.try_claim(1)
        gen = int(cache.headers[1]["gen"])
        os.pwrite(cache.fd, np.int64(gen + 1).tobytes(), 1 * SLOT_HEADER.itemsize)
        os.kill(os.getpid(), signal.SIGKILL)
    os.waitpid(pid, 0)
    assert cache.get(1, 5) is None  # a half-written slot is a miss
    assert cache.put(1, 6, image_of(6), (64, 64), 1.0)  # the dead writer's claim went with it: no clock involved
    assert np.array_equal(cache.get(1, 6, copy=True)[0], image_of(6))
    cache.close()


def test_a_live_claim_is_held_however_long_it_takes():
    cache = WindowCache(4, 64)
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            with cache.publishing(3, 99):  # a slow writer of image 99: holds its claim until told
                os.write(ready_w, b"x")
                os.read(go_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"x"
    try:
        t0 = time.monotonic()
        assert not cache.put(3, 1, image_of(1), (64, 64), 1.0)  # the other process is writing this slot
        assert time.monotonic() - t0 < 1.0  # with another image: not waited for
        assert cache.put(2, 1, image_of(1), (64, 64), 1.0)  # other slots are free
    finally:
        os.write(go_w, b"x")
        os.waitpid(pid, 0)
    assert cache.put(3, 1, image_of(1), (64, 64), 1.0)
    cache.close()


def test_a_resume_with_another_window_is_refused_naming_both():
    saved = StreamPosition(8, 0, 1, None, 48).state_dict()
    with pytest.raises(
        ResumeError, match=r"augment.partner_window is 48 and this run's is 32.*augment.partner_window=48"
    ):
        StreamPosition(8, 0, 1, None, 32).load_state_dict(saved)
    with pytest.raises(ResumeError, match="is None and this run's is 48"):
        StreamPosition(8, 0, 1, None, 48).load_state_dict(StreamPosition(8, 0, 1).state_dict())
    StreamPosition(8, 0, 1, None, 48).load_state_dict(saved)


def bench_args(coco_tiny, *extra):
    return [
        "mode=bench",
        "dataset=coco",
        f"dataset.root={coco_tiny}",
        "dataset.image_size=192",
        "loader.batch_size=8",
        "bench.batches=25",
        "bench.warmup=0",
        "bench.digest_batches=25",
        "bench.decode_probe=0",
        "augment.partners=window",
        "augment.partner_window=16",
        *extra,
    ]


def test_window_partners_keep_the_stream_contract(coco_tiny, tmp_path):
    """0, 1, 2 and 4 workers, parts that split batches, and the pixel cache (which turns the
    window cache off): one stream over three epochs. With the window cache a sample costs about
    one decode; the whole-dataset stream is another one."""
    digests, decodes = {}, {}
    for name, extra in {
        "w0": ["loader.num_workers=0"],
        "w1": ["loader.num_workers=1"],
        "w2": ["loader.num_workers=2"],
        "w4": ["loader.num_workers=4"],
        "parts3": ["loader.num_workers=2", "loader.part_images=3"],
        "ram": ["loader.num_workers=2", "dataset.cache=ram"],
    }.items():
        s = run_in_process(bench_args(coco_tiny, "loader=explicit", *extra), tmp_path / name)
        assert s["digest_batches"] == 25 and len(s["epochs"]) == 3, name
        digests[name], decodes[name] = s["batch_digest"], s["decodes_per_sample"]
    assert len(set(digests.values())) == 1, digests
    assert decodes["w0"] < 1.4 and decodes["w2"] < 1.6 and decodes["ram"] == 0, decodes
    whole = run_in_process(
        bench_args(coco_tiny, "loader=explicit", "loader.num_workers=2", "augment.partners=dataset"), tmp_path / "whole"
    )  # the later override wins
    assert whole["batch_digest"] != digests["w2"] and whole["decodes_per_sample"] > 2.5


@pytest.mark.slow
@pytest.mark.skipif(not is_root() or not shutil.which("unshare"), reason="needs root and unshare")
def test_window_partners_in_a_64mb_shm_match_an_unconstrained_run(coco_tiny, tmp_path):
    """Docker's default /dev/shm at batch 64 and 640 px: the window cache lives in anonymous
    shared memory, not there; the plan says so, and the stream is the unconstrained run's."""
    prefix = [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$@"',
        "sh",
    ]
    # Batches of 64 at 640 px: 79 MB each as a FlatBatch, more than the whole /dev/shm, so the plan ships parts.
    args = bench_args(
        coco_tiny, "dataset.image_size=640", "loader.batch_size=64", "bench.batches=3", "bench.digest_batches=3"
    )
    _, small = run_train(args, tmp_path / "small", prefix=prefix)
    _, free = run_train(args, tmp_path / "free")
    assert small["shm_free_bytes"] <= 64 << 20 and small["window_slots"] > 16 and small["batches"] == 3
    assert small["batch_digest"] == free["batch_digest"]


def test_a_sample_built_from_a_slot_rewritten_meanwhile_is_built_again(coco_tiny):
    """The dataset reads partners as views into the cache and checks them once the sample is
    built: a slot another worker rewrote while the recipe read it makes the sample be built
    again, with the pixels a decode gives."""
    from cocodet.data.dataset import DetectionDataset
    from cocodet.datasets.splits import SplitLoader
    from cocodet.loader.epoch_sampler import EpochSampler
    from cocodet.loader.rank_share import RankOrder

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
    keys = list(EpochSampler(len(train), 5, True, window=8).epoch_keys(1))[:24]

    def dataset(cache):
        d = DetectionDataset(train, Mosaic(image_size=96, partners="window", partner_window=8), seed=5)
        d.use_window(RankOrder(len(train), 5), cache)
        return d

    expected = dataset(None).__getitems__(keys)
    cache = WindowCache(16, 96)
    cached = dataset(cache)
    cached.__getitems__(keys[:20])  # fills the cache: the next keys' partners are hits
    real, calls = cached.recipe.__call__, []

    class Rewriting(Mosaic):  # another worker rewrites every slot while the first build reads it
        def __call__(self, raw, rng, partner_raws, out=None):
            calls.append(1)
            if len(calls) == 1:
                for slot in range(16):
                    cache.put(slot, 10**6, np.zeros((96, 96, 3), np.uint8), (96, 96), 1.0)
            return real(raw, rng, partner_raws, out)

    cached.recipe.__class__ = Rewriting
    got = cached.__getitems__(keys[20:21])
    assert len(calls) == 2  # built, found stale, built again
    assert np.array_equal(got[0]["image"], expected[20]["image"])
    assert np.array_equal(got[0]["boxes"], expected[20]["boxes"])


def window_dataset(train, cache, seed=5, window=8):
    from cocodet.data.dataset import DetectionDataset
    from cocodet.loader.rank_share import RankOrder

    d = DetectionDataset(train, Mosaic(image_size=96, partners="window", partner_window=window), seed=seed)
    d.use_window(RankOrder(len(train), seed), cache)
    return d


def a_sample_and_its_partner(train, seed=5, window=8, epoch=1):
    """(the keys of ``epoch``, p, q): the sample at position p draws the image at position q < p
    as a partner, and the sample at q does not draw p's image."""
    from cocodet.loader.epoch_sampler import EpochSampler

    keys = list(EpochSampler(len(train), seed, True, window=window).epoch_keys(epoch))
    uncached = window_dataset(train, None, seed, window)  # every partner planned: none is a cache read
    for p in range(window + 1, len(keys)):
        reads = uncached.planned_reads(keys[p])
        for q in range(p - window, p):
            if keys[q].index in reads[1:] and keys[p].index not in uncached.planned_reads(keys[q]):
                return keys, p, q
    raise AssertionError("no sample draws a partner in this epoch")


def test_a_partner_another_worker_is_decoding_is_waited_for_not_decoded_again(coco_tiny, tmp_path, monkeypatch):
    """Two DataLoader workers: worker 0 builds the sample at position q, whose image takes a
    second to decode; worker 1 builds the sample at p, which draws that image as a partner
    while worker 0 still decodes it. Worker 1 waits for worker 0's pixels: every image is
    decoded once, and the samples are those of a build without the cache (before: the image
    was decoded by both)."""
    import torch.utils.data

    from cocodet.data import image_reader
    from cocodet.datasets.splits import SplitLoader

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
    keys, p, q = a_sample_and_its_partner(train)
    slow = keys[q].index
    expected = window_dataset(train, None).__getitems__([keys[q], keys[p]])
    log, real = tmp_path / "decodes", image_reader.load_resized

    def logged(index, k, *args, **kwargs):  # in the workers (forked after the patch)
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {k}\n")
        if k == slow:
            time.sleep(1.0)  # below the wait's bound (WAIT_S)
        return real(index, k, *args, **kwargs)

    monkeypatch.setattr(image_reader, "load_resized", logged)
    cache = WindowCache(32, 96)  # waits up to WAIT_S (2 s)
    loader = torch.utils.data.DataLoader(
        window_dataset(train, cache),
        batch_sampler=[[keys[q]], [keys[p]]],
        num_workers=2,
        collate_fn=lambda samples: samples,
        multiprocessing_context="fork",
    )
    got = [sample for batch in loader for sample in batch]  # batch i goes to worker i
    decodes = [line.split() for line in log.read_text().splitlines()]
    per_image = collections.Counter(int(k) for _, k in decodes)
    assert per_image[slow] == 1 and set(per_image.values()) == {1}, per_image
    assert len({pid for pid, _ in decodes}) == 2  # both workers decoded something of their own
    assert sum(s["decodes"] for s in got) == len(per_image)
    for mine, theirs in zip(got, expected):
        assert np.array_equal(mine["image"], theirs["image"]) and np.array_equal(mine["boxes"], theirs["boxes"])
    cache.close()


def hold_a_slot(cache, position: int, index: int):
    """Fork a writer that claims the slot of ``position`` for image ``index`` and stops there,
    mid-decode, until killed; its pid once it holds the claim."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            with cache.publishing(position, index):
                os.write(ready_w, b"x")
                time.sleep(120)
        finally:
            os._exit(0)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"x", "the writer died before it held its claim"
    os.close(ready_r)
    return pid


def read_timed(dataset, key) -> tuple[float, int, object]:
    """(seconds, decodes, the source) of the reader's read of ``key``'s own image at its position."""
    from cocodet.data.image_reader import DECODES, CallReads

    timings = np.zeros(DECODES + 1)
    t0 = time.monotonic()
    source = dataset.reader.read(key.index, key.position, CallReads(), timings)
    return time.monotonic() - t0, int(timings[DECODES]), source


def test_a_writer_killed_mid_decode_releases_its_claim_and_the_waiter_decodes_itself(coco_tiny):
    """A writer holds a slot for the image a reader wants, then is SIGKILLed half a second
    later: the reader waits until then, not for the bound, then claims the slot, decodes the
    image itself and publishes it (before: it decoded at once, beside the live writer, and
    published nothing)."""
    from cocodet.datasets.splits import SplitLoader

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
    keys, p, _ = a_sample_and_its_partner(train)
    cache = WindowCache(32, 96)  # waits up to WAIT_S (2 s)
    dataset = window_dataset(train, cache)
    pid = hold_a_slot(cache, p, keys[p].index)
    killer = threading.Timer(0.5, os.kill, (pid, signal.SIGKILL))
    killer.start()
    try:
        waited, decodes, source = read_timed(dataset, keys[p])
    finally:
        killer.cancel()
        os.kill(pid, signal.SIGKILL)  # a zombie by now, unless the read failed first
        os.waitpid(pid, 0)
    assert 0.4 < waited < 1.5, waited  # until the writer died (the kernel released its claim), not the 2 s bound
    published = cache.get(p, keys[p].index, copy=True)
    _, _, expected = read_timed(window_dataset(train, None), keys[p])
    assert decodes == 1 and published is not None and np.array_equal(published[0], expected.image)
    assert np.array_equal(source.image, expected.image)
    assert cache.waits == 1 and cache.waits_timed_out == 0
    cache.close()


def test_a_stuck_writer_is_waited_for_at_most_the_bound_and_another_images_not_at_all(coco_tiny):
    """A live writer that never finishes the image a reader wants holds it up for ``wait_s``,
    then the reader decodes that image itself, publishing nothing (the slot is still claimed);
    a writer of another image in the slot is not waited for."""
    from cocodet.datasets.splits import SplitLoader

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
    keys, p, q = a_sample_and_its_partner(train)
    cache = WindowCache(32, 96)
    cache.wait_s = 0.5
    dataset = window_dataset(train, cache)
    pid = hold_a_slot(cache, p, keys[p].index)
    try:
        waited, decodes, _ = read_timed(dataset, keys[p])
        assert 0.5 <= waited < 1.5 and decodes == 1, (waited, decodes)
        assert cache.get(p, keys[p].index) is None and cache.waits_timed_out == 1
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    pid = hold_a_slot(cache, q, keys[p].index)  # q's slot, being written with another image than q's
    try:
        waited, decodes, _ = read_timed(dataset, keys[q])
        assert waited < 0.4 and decodes == 1 and cache.waits == 1, (waited, decodes)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    cache.close()
