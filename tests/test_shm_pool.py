"""Workers write batch images into buffers they reuse, never while the main process still holds
the batch: real DataLoader workers, batches held across many later ones, every pixel checked."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest
import torch

from cocodet.loader import flat_batch
from cocodet.loader.flat_batch import Collate, restore
from cocodet.loader.shm_pool import release_expired
from cocodet.sample import make_sample

SIDE = 96


class Filled(torch.utils.data.Dataset):
    """Sample i: an image whose every pixel is i % 251, of a side that varies with i when asked."""

    def __init__(self, n: int, varying: bool = False):
        self.n, self.varying = n, varying

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        side = SIDE - 8 * (i % 3) if self.varying else SIDE
        image = np.full((side, side, 3), i % 251, np.uint8)
        return make_sample(
            image, np.zeros((0, 4), np.float32), np.zeros(0, np.int64), (0, i), i, np.ones(4, np.float32), np.zeros(4)
        )


def counting_alloc(counter):
    original = flat_batch._alloc

    def alloc(shape, dtype):
        if len(shape) == 4:  # an images buffer (not the board, not the small tensors)
            with counter.get_lock():
                counter.value += 1
        return original(shape, dtype)

    return alloc


def all_handed_back(leases) -> bool:
    """Every lease of this test's batches back on its worker's board (other tests of the same
    process may still hold batches of their own, so the process-wide count is not asked)."""
    given = [lease for lease in leases if lease is not None]  # None: built while the board was full
    return len(given) > 0 and all(int(lease.board[lease.slot]) == 0 for lease in given)


def check(batch, images=None):
    """Every valid pixel of every image is its sample's value, and the padding is zero."""
    images = batch.images if images is None else images
    for k, (h, w) in enumerate(batch.image_sizes.tolist()):
        value = int(batch.sample_keys[k, 1]) % 251
        assert bool((images[k, :, :h, :w] == value).all()), f"image {k} was overwritten while held"
        assert int(images[k, :, h:].sum()) == 0 and int(images[k, :, :h, w:].sum()) == 0


@pytest.mark.parametrize("varying", [False, True], ids=["one-size", "varying-sizes"])
def test_buffers_are_reused_only_after_the_batch_is_dropped(monkeypatch, varying):
    allocs = multiprocessing.get_context("fork").Value("i", 0)
    monkeypatch.setattr(flat_batch, "_alloc", counting_alloc(allocs))  # the forked workers inherit it
    loader = torch.utils.data.DataLoader(
        Filled(240, varying),
        batch_size=4,
        num_workers=2,
        prefetch_factor=2,
        collate_fn=Collate(capacity=3),
        multiprocessing_context="fork",
    )
    held, leases = [], []
    for n, batch in enumerate(loader):
        check(batch)
        leases.append(batch.lease)
        if n % 5 == 0:
            held.append(batch)  # a batch the main process keeps while the workers go on
        del batch
    for batch in held:
        check(batch)  # untouched by the 50 batches written after it
    batches = 60
    # 2 workers x 3 pooled buffers, a fresh one for each batch held (12) and some for batches
    # built while every pooled one was out (how many depends on timing); one a batch without reuse.
    assert allocs.value < batches / 2, allocs.value
    del held, batch
    release_expired()
    assert all_handed_back(leases)


def test_a_joined_or_restored_batch_releases_its_buffer():
    loader = torch.utils.data.DataLoader(
        Filled(40),
        batch_size=4,
        num_workers=1,
        prefetch_factor=2,
        collate_fn=Collate(capacity=2),
        multiprocessing_context="fork",
    )
    kept, leases = [], []
    for batch in loader:
        images, _ = restore(batch)  # a float copy: the uint8 buffer may be written again
        leases.append(batch.lease)
        kept.append((batch._replace(images=torch.empty(0), lease=None), images))
        del batch
    release_expired()
    assert all_handed_back(leases)
    for batch, images in kept:
        for k, image in enumerate(images):
            assert bool((image.mul(255).round() == int(batch.sample_keys[k, 1]) % 251).all())


def test_in_process_loading_takes_no_lease():
    batch = Collate(capacity=2)([Filled(4)[i] for i in range(4)])
    assert batch.lease is None
    check(batch)


def test_workers_keep_buffers_only_where_the_shm_budget_has_room_for_them():
    from test_policy import host, plan

    from cocodet.units import MiB

    roomy = plan(batch_size=16, res=host(usable_cpus=2))  # 8 GiB of shm budget, 2 workers a loader
    assert roomy.reused_buffers("train") == roomy.prefetch_factor + 1 == 3
    assert roomy.reused_buffers("val") == roomy.val.prefetch_factor + 1
    # A 200 MiB /dev/shm (100 MiB budget) at 10 MiB a batch: the plan fills it with transfers
    # in flight, so a kept set per worker would not fit: a fresh segment each transfer.
    tight = plan(batch_size=64, res=host(shm_free_bytes=200 * MiB))
    assert tight.num_workers == 3 and tight.reused_buffers("train") == 0 and tight.reused_buffers("val") == 0
    in_process = plan(batch_size=16, res=host(usable_cpus=2), policy="explicit", requested=0)
    assert in_process.reused_buffers("train") == 0


def test_a_batch_received_in_inference_mode_is_handed_back_outside_it():
    """Validation iterates its loader under torch.inference_mode: a lease rebuilt there holds an
    inference tensor, and training's next batch hands it back outside inference mode."""
    loader = torch.utils.data.DataLoader(
        Filled(16),
        batch_size=4,
        num_workers=1,
        prefetch_factor=2,
        collate_fn=Collate(capacity=3),
        multiprocessing_context="fork",
    )
    leases = []
    with torch.inference_mode():
        for batch in loader:
            leases.append(batch.lease)
            del batch
    release_expired()  # outside inference mode
    assert all_handed_back(leases)
