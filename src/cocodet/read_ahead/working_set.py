"""The read-ahead's working set: how much it must hold at once to fetch each object once per
epoch, from the planned reads of consecutive epochs (``read_ahead/start.py:epoch_reads``),
in numpy.

An object is *live*, within one epoch, from ``reach`` samples before its first read (the
read-ahead fetches it that early: the lead, which the workers hold, plus its own fetch-ahead)
to its last read (its copy is kept until then). Two epochs are planned together, each object
of each epoch on its own (one life, if its lives in the two overlap: one copy serves both), so
the next epoch's first fetches overlap this one's end. The
working set is the most objects, and the most bytes, live at once. With
``dataset.remote.cache_bytes`` at least the bytes, the read-ahead fetches each object once per
epoch; below them it keeps what it can and fetches some objects again, never more often than
reading directly would.
"""

from __future__ import annotations

import numpy as np


def working_set(epochs: list[tuple[np.ndarray, np.ndarray]], sizes: np.ndarray, reach: int) -> tuple[int, int]:
    """(objects, bytes) live at once at most. ``epochs``: consecutive epochs' ([M] dataset
    indices in read order, [K + 1] where each of the K samples' reads begin); ``sizes``: [N]
    bytes by dataset index; ``reach``: samples between fetching and the first read."""
    n = len(sizes)
    keys, samples_of, total = [], [], 0
    for e, (reads, offsets) in enumerate(epochs):
        samples = len(offsets) - 1
        keys.append(np.asarray(reads, dtype=np.int64) + e * n)  # one object per (epoch, index)
        samples_of.append(np.repeat(np.arange(samples, dtype=np.int64), np.diff(offsets)) + total)
        total += samples
    if total <= 0 or not sum(len(k) for k in keys):
        return 0, 0
    key, sample_of = np.concatenate(keys), np.concatenate(samples_of)
    first = np.full(n * len(epochs), total, dtype=np.int64)
    np.minimum.at(first, key, sample_of)
    last = np.full(n * len(epochs), -1, dtype=np.int64)
    np.maximum.at(last, key, sample_of)
    begin, end = np.maximum(first - int(reach), 0), last + 1  # [E * N]: live on samples [begin, end)
    # One copy serves an object's reads in two epochs when its lives overlap: merged into one.
    for e in range(1, len(epochs)):
        prev, this = slice((e - 1) * n, e * n), slice(e * n, (e + 1) * n)
        overlap = (last[prev] >= 0) & (last[this] >= 0) & (begin[this] <= end[prev])
        begin[this] = np.where(overlap, begin[prev], begin[this])
        last[prev] = np.where(overlap, -1, last[prev])  # the earlier life is part of the merged one
    used = np.flatnonzero(last >= 0)
    begin, end = begin[used], end[used]
    weight = np.tile(np.asarray(sizes, dtype=np.int64), len(epochs))[used]
    live, live_bytes = np.zeros(total + 1, dtype=np.int64), np.zeros(total + 1, dtype=np.int64)
    np.add.at(live, begin, 1)
    np.add.at(live, end, -1)
    np.add.at(live_bytes, begin, weight)
    np.add.at(live_bytes, end, -weight)
    return int(np.cumsum(live).max()), int(np.cumsum(live_bytes).max())


def lead_samples(workers: int, prefetch: int | None, batch_size: int) -> int:
    """Samples between the model and the sampler: each worker's prefetched batches, plus the
    batch the trainer holds and the one it fetched ahead (Lightning checks for the last batch)."""
    return (int(workers) * int(prefetch or 0) + 2) * int(batch_size)


def fetch_ahead(lead: int) -> int:
    """Samples beyond the lead that the read-ahead fetches for: as many as the lead, at least
    64, so its GETs overlap the workers' use; further ahead a copy would only hold the budget
    longer (the working set grows by what is fetched early)."""
    return max(64, int(lead))


def reach(lead: int) -> int:
    """Samples between the read-ahead's fetch of an object and its first read."""
    return int(lead) + fetch_ahead(lead)
