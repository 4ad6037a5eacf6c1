"""One pass of the read-ahead's planning at COCO scale (issue 56): a made-up listing of 118,287
objects (COCO train2017's count, ~160 KB each), two epochs of whole-dataset mosaic reads (4 per
sample), half the objects held, a 4 GiB budget. Times what runs under the lock that the
training thread's ``advance()`` also takes (the snapshot) and what runs outside it (the plan:
next reads in numpy, candidates, victims).

    python benchmarks/prefetch_pass.py
"""

from __future__ import annotations

import statistics
import tempfile
import time

import numpy as np

from cocodet.read_ahead.fetcher import ReadAhead
from cocodet.read_ahead.object_cache import ObjectCache

OBJECTS, READS_PER_SAMPLE, BUDGET = 118_287, 4, 4 * 2**30


def main() -> None:
    rng = np.random.default_rng(0)
    urls = [f"s3://coco/train2017/{k:012d}.jpg" for k in range(OBJECTS)]
    sizes = rng.integers(60_000, 260_000, OBJECTS)
    listing = {u: {"size": int(s), "etag": "noetag"} for u, s in zip(urls, sizes)}

    def plan_epoch(epoch: int):
        order = np.random.default_rng(epoch).permutation(OBJECTS)
        partners = np.random.default_rng(epoch + 100).integers(0, OBJECTS, (OBJECTS, READS_PER_SAMPLE - 1))
        reads = np.concatenate([order[:, None], partners], axis=1).ravel()
        return reads, np.arange(0, len(reads) + 1, READS_PER_SAMPLE)

    with tempfile.TemporaryDirectory() as folder:
        cache = ObjectCache(folder, listing, BUDGET)
        p = ReadAhead(cache, urls, plan_epoch, BUDGET, concurrency=16, lead=48)
        p.epochs = [(0, *plan_epoch(0)), (1, *plan_epoch(1))]
        held = rng.random(OBJECTS) < 0.5
        p.held_mask[:] = held
        cache.reserve(int(sizes[held].sum()))  # the budget is full: every fetch has to evict
        locked, planned = [], []
        for step in range(10):
            p.advance(32)
            t0 = time.perf_counter()
            with p._changed:
                future, lead_at, ahead_at, start = p._reads_left()
                snapshot, unpinned = p.held_mask.copy(), p.pinned_until < start
            t1 = time.perf_counter()
            fetches = list(p._plan(future, lead_at, ahead_at, start, snapshot, unpinned, 16))
            t2 = time.perf_counter()
            locked.append((t1 - t0) * 1e3)
            planned.append((t2 - t1) * 1e3)
            p.inflight.clear()
    reads = sum(len(e[1]) for e in p.epochs)
    print(f"{OBJECTS} objects, {reads} planned reads (two epochs), {len(fetches)} fetches planned in the last pass")
    print(f"under the lock (snapshot): median {statistics.median(locked):.1f} ms, max {max(locked):.1f} ms")
    print(f"outside the lock (plan):   median {statistics.median(planned):.1f} ms, max {max(planned):.1f} ms")


if __name__ == "__main__":
    main()
