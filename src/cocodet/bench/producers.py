"""Controlled producers and consumers for experiments (docs/benchmarks.md, "Where the loop waits")."""

from __future__ import annotations

import time

import numpy as np
import torch.utils.data

from cocodet import schema
from cocodet.bench.harness import spin
from cocodet.sample import SampleKey, make_sample


class CostDataset(torch.utils.data.Dataset):
    """Synthetic samples with a fixed per-sample cost: ``sleep`` (waits, frees the CPU) or
    ``spin`` (burns a calibrated number of iterations, competes for the CPU)."""

    def __init__(self, size: int, kind: str, cost_ms: float, spin_iters_per_ms: int, image_size: int = 64):
        if schema.check("bench.producer", kind) == "dataset":
            raise ValueError("CostDataset is the sleep and spin producers; bench.producer=dataset is the dataset")
        self.size, self.kind, self.cost_ms = size, kind, cost_ms
        self.iters = int(spin_iters_per_ms * cost_ms)
        self.image_size = image_size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key):
        key = SampleKey.of(key)  # the sampler's key, or a bare index (epoch 0)
        epoch, i = key.epoch, key.index
        t0 = time.perf_counter()
        if self.kind == "sleep":
            time.sleep(self.cost_ms / 1000.0)
        else:
            spin(self.iters)
        rng = np.random.default_rng((epoch, i))
        s = self.image_size
        boxes = rng.uniform(0, s / 2, size=(2, 4)).astype(np.float32) + np.float32([0, 0, s / 2, s / 2])
        return make_sample(
            np.full((s, s, 3), i % 251, dtype=np.uint8),
            boxes,
            np.array([1, 2], dtype=np.int64),
            (epoch, i),
            i,
            np.array([s, s, 1.0, 1.0], dtype=np.float32),
            stage_seconds=np.array([0.0, 0.0, time.perf_counter() - t0, 0.0]),
        )


def make_consumer(kind: str, work_ms: float, spin_iters_per_ms: int, train_step=None):
    """A callable applied to each batch: none, spin (iterations), sleep (ms) or model (a train step)."""
    if kind == "none":
        return lambda batch: None
    if kind == "spin":
        iters = int(spin_iters_per_ms * work_ms)
        return lambda batch: spin(iters)
    if kind == "sleep":
        return lambda batch: time.sleep(work_ms / 1000.0)
    if kind == "model":
        if train_step is None:
            raise ValueError("bench.consumer=model needs the configured model")
        return train_step
    schema.check("bench.consumer", kind)
    raise AssertionError(f"bench.consumer={kind} has no consumer here")  # a choice added to the schema only
