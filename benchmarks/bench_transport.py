"""Transport benchmark (issue 3): the same pre-decoded samples through three batch layouts.

    python benchmarks/bench_transport.py                # batch 16, 64, 128 at 640 px, 2 workers
    python benchmarks/bench_transport.py --nofile 256   # also under a soft fd limit of 256

Layouts: (a) stacked uint8 images + list of per-image target dicts, (b) the torchvision
references collate ``tuple(zip(*batch))`` (one tensor per image), (c) FlatBatch.
Printed per layout: examples/s, main-process wait p50/p95, storages per batch (shared
segments received), and fds/mmaps the main process holds per received batch.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys

import numpy as np
import torch

from cocodet.bench.harness import measure, storages_in
from cocodet.loader.flat_batch import flatten


class PreDecoded(torch.utils.data.Dataset):
    """Samples already decoded: what crosses the boundary is the only cost that varies."""

    def __init__(self, n: int, size: int, boxes: int):
        rng = np.random.default_rng(0)
        self.pool = [rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8) for _ in range(8)]
        self.n, self.size, self.boxes = n, size, boxes

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        k = int(rng.integers(1, 2 * self.boxes))
        xy = rng.uniform(0, self.size / 2, size=(k, 2)).astype(np.float32)
        return {
            "image": self.pool[i % 8],
            "boxes": np.concatenate([xy, xy + 20], 1),
            "labels": rng.integers(1, 80, k).astype(np.int64),
            "image_id": i,
            "key": (0, i),
            "to_original": np.array([self.size, self.size, 1], np.float32),
            "stage_seconds": np.zeros(4),
            "pad_share": 0.0,
            "skipped": [],
        }


def _target(s):
    boxes = torch.from_numpy(s["boxes"])
    return {
        "boxes": boxes,
        "labels": torch.from_numpy(s["labels"]),
        "image_id": torch.tensor(s["image_id"]),
        "area": (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]),
        "iscrowd": torch.zeros(len(boxes), dtype=torch.int64),
        "orig_size": torch.tensor([640, 640]),
        "to_original": torch.from_numpy(s["to_original"]),
    }


def list_of_dicts(samples):
    images = torch.stack([torch.from_numpy(s["image"]).permute(2, 0, 1) for s in samples])
    return images, [_target(s) for s in samples]


def references_zip(samples):
    return tuple(zip(*[(torch.from_numpy(s["image"]).permute(2, 0, 1).contiguous(), _target(s)) for s in samples]))


LAYOUTS = {"list_of_dicts": list_of_dicts, "references_zip": references_zip, "flat_batch": flatten}


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def open_maps() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def run_one(
    layout: str, batch: int, size: int, workers: int, prefetch: int, batches: int, boxes: int, timeout_s: float
) -> dict:
    dataset = PreDecoded(batch * (batches + 4), size, boxes)
    # The timeout turns a silent hang (a batch lost in a worker's queue feeder thread when it
    # cannot be shared) into a row of the table.
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=batch,
        num_workers=workers,
        prefetch_factor=prefetch,
        collate_fn=LAYOUTS[layout],
        timeout=timeout_s,
    )
    counts = {}
    fds0, maps0 = open_fds(), open_maps()

    def on_batch(b):
        if not counts:
            counts["storages"] = storages_in(b)
            counts["fds"] = open_fds() - fds0  # this batch alive, in-flight ones too
            counts["maps"] = open_maps() - maps0

    try:
        m = measure(
            loader,
            lambda b: None,
            count=lambda b: len(b[0]) if layout != "flat_batch" else b.images.shape[0],
            max_batches=batches,
            on_batch=on_batch,
        )
        rep = m.report(warmup=2)
        out = {
            "layout": layout,
            "batch": batch,
            "examples_per_s": rep["examples_per_s"],
            "wait_p50_ms": rep["wait_p50_ms"],
            "wait_p95_ms": rep["wait_p95_ms"],
            "batches": rep["batches"],
            "storages_per_batch": counts.get("storages"),
            "fds_first_batch": counts.get("fds"),
            "maps_first_batch": counts.get("maps"),
            "error": None,
        }
    except Exception as e:  # the point of the comparison: some layouts die under limits
        out = {
            "layout": layout,
            "batch": batch,
            "examples_per_s": 0.0,
            "error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}",
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, nargs="+", default=[16, 64, 128])
    p.add_argument("--size", type=int, default=640)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--steps", type=int, default=20, help="batches measured per configuration")
    p.add_argument("--boxes", type=int, default=7, help="mean boxes per image")
    p.add_argument("--nofile", type=int, default=None, help="set the soft RLIMIT_NOFILE first (e.g. 256)")
    p.add_argument("--layouts", nargs="+", default=list(LAYOUTS))
    p.add_argument("--timeout", type=float, default=60.0, help="seconds without a batch before a layout counts as hung")
    p.add_argument("--json", action="store_true", help="print one JSON object per row instead of a table")
    args = p.parse_args()
    if args.nofile:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, hard))
    rows = []
    for batch in args.batches:
        for layout in args.layouts:
            row = run_one(layout, batch, args.size, args.workers, args.prefetch, args.steps, args.boxes, args.timeout)
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
    if args.json:
        return
    print(
        f"# {args.size} px, {args.workers} workers, prefetch {args.prefetch}, RLIMIT_NOFILE "
        f"{resource.getrlimit(resource.RLIMIT_NOFILE)[0]}, "
        f"sharing strategy {torch.multiprocessing.get_sharing_strategy()}"
    )
    print(
        "| batch | layout | examples/s | vs list_of_dicts | wait p50 ms | wait p95 ms | storages/batch | fds held "
        "| maps held | error |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        base = next(r for r in rows if r["batch"] == row["batch"] and r["layout"] == "list_of_dicts")
        ratio = row["examples_per_s"] / base["examples_per_s"] if base["examples_per_s"] else float("nan")
        print(
            f"| {row['batch']} | {row['layout']} | {row['examples_per_s']:.1f} | {ratio:.2f}x | "
            f"{row.get('wait_p50_ms', '-')} | {row.get('wait_p95_ms', '-')} | {row.get('storages_per_batch', '-')} | "
            f"{row.get('fds_first_batch', '-')} | {row.get('maps_first_batch', '-')} | {row['error'] or ''} |"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
