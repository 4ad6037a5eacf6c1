"""FlatBatch: exact round trip, and a constant number of storages crossing the worker boundary."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cocodet.bench.harness import storages_in
from cocodet.loader.flat_batch import FlatBatch, flatten, restore, unrestore_uint8
from cocodet.loader.plan.flat_layout import batch_bytes


def make_sample(rng: np.random.Generator, h: int, w: int, n_boxes: int, image_id: int) -> dict:
    x1 = rng.uniform(0, w - 2, n_boxes)
    y1 = rng.uniform(0, h - 2, n_boxes)
    boxes = np.stack([x1, y1, x1 + rng.uniform(1, 20, n_boxes), y1 + rng.uniform(1, 20, n_boxes)], 1)
    return {
        "image": rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8),
        "boxes": boxes.astype(np.float32).reshape(-1, 4),
        "labels": rng.integers(1, 80, n_boxes).astype(np.int64),
        "image_id": image_id,
        "key": (0, image_id),
        "to_original": np.array([h * 2, w * 2, 0.5], np.float32),
        "stage_seconds": np.zeros(4),
        "pad_share": 0.0,
        "skipped": [],
    }


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_round_trip_is_exact(data):
    b = data.draw(st.integers(1, 6), label="batch")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    shapes = [(data.draw(st.integers(8, 70)), data.draw(st.integers(8, 70))) for _ in range(b)]
    counts = [data.draw(st.integers(0, 5)) for _ in range(b)]  # zero-box images included
    samples = [make_sample(rng, h, w, n, 1000 + k) for k, ((h, w), n) in enumerate(zip(shapes, counts))]
    flat = flatten(samples)
    assert flat.images.dtype == torch.uint8
    assert flat.images.shape[2] % 32 == 0 and flat.images.shape[3] % 32 == 0
    images, targets = restore(flat)
    for s, im, uim, t in zip(samples, images, unrestore_uint8(images), targets):
        assert im.dtype == torch.float32 and float(im.max()) <= 1.0
        assert tuple(im.shape) == (3, *s["image"].shape[:2])
        assert torch.equal(uim, torch.from_numpy(s["image"]).permute(2, 0, 1))
        assert torch.equal(t["boxes"], torch.from_numpy(s["boxes"]))
        assert torch.equal(t["labels"], torch.from_numpy(s["labels"]))
        assert int(t["image_id"]) == s["image_id"]
        assert torch.equal(t["to_original"], torch.from_numpy(s["to_original"]))


def test_tensor_count_is_constant():
    rng = np.random.default_rng(0)
    for b in (1, 8, 64):
        flat = flatten([make_sample(rng, 32, 48, int(rng.integers(0, 30)), k) for k in range(b)])
        tensors = [x for x in flat if torch.is_tensor(x)]
        assert len(tensors) == 8


def test_batch_bytes_matches_layout():
    rng = np.random.default_rng(0)
    flat = flatten([make_sample(rng, 64, 64, 0, k) for k in range(4)])
    assert batch_bytes(4, 64, boxes_per_image=0) >= flat.images.numel()
    assert batch_bytes(64, 640) > 64 * 3 * 640 * 640  # uint8 images dominate


class _Samples(torch.utils.data.Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return make_sample(np.random.default_rng(i), 64, 64, 1 + i % 5, i)


def list_of_dicts_collate(samples):
    images = torch.stack([torch.from_numpy(s["image"]).permute(2, 0, 1) for s in samples])
    targets = [
        {
            "boxes": torch.from_numpy(s["boxes"]),
            "labels": torch.from_numpy(s["labels"]),
            "image_id": torch.tensor(s["image_id"]),
            "area": torch.from_numpy(s["boxes"][:, 2] * 1.0),
            "iscrowd": torch.zeros(len(s["labels"])),
            "orig_size": torch.tensor([64, 64]),
            "to_original": torch.from_numpy(s["to_original"]),
        }
        for s in samples
    ]
    return images, targets


@pytest.mark.parametrize("batch", [8, 64, 256])
def test_storages_crossing_worker_boundary(batch):
    loader = torch.utils.data.DataLoader(_Samples(batch), batch_size=batch, num_workers=1, collate_fn=flatten)
    received = next(iter(loader))
    assert isinstance(received, FlatBatch)
    assert 1 <= storages_in(received, shared_only=True) <= 8
    if batch == 8:  # the natural layout grows with the batch; this is what FlatBatch avoids
        natural = next(
            iter(
                torch.utils.data.DataLoader(
                    _Samples(batch), batch_size=batch, num_workers=1, collate_fn=list_of_dicts_collate
                )
            )
        )
        assert storages_in(natural, shared_only=True) >= 6 * batch
