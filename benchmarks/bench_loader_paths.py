"""One run, side by side: the same mosaic recipe loaded the common way, by this project's
loader decoding (dataset.cache=none), and from the pixel cache (ram, disk), with the
decode bound of a naive 4-decode mosaic measured on the same files.

    python benchmarks/bench_loader_paths.py --root ../shared/data/coco_tiny --size 640 --batch 32 \
        --workers 2 --batches 40

Each path: same workers, batch size and measured batches (after a warm-up, across epochs),
consumer none. The cache is built before its path is measured (its build is not timed).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from hydra import compose, initialize_config_dir

from cocodet.app import run
from cocodet.bench.common_way import common_way_loader
from cocodet.bench.harness import measure
from cocodet.datasets.index import build_index
from cocodet.timing.measurement import Measurement
from cocodet.transforms.augment import Mosaic

REPO = Path(__file__).resolve().parents[1]


def ours(args, cache: str, out: Path) -> dict:
    overrides = [
        "mode=bench",
        "dataset=coco",
        f"dataset.root={args.root}",
        f"dataset.image_size={args.size}",
        f"loader.batch_size={args.batch}",
        "loader=explicit",
        f"loader.num_workers={args.workers}",
        f"bench.batches={args.batches}",
        f"bench.warmup={args.warmup}",
        f"dataset.cache={cache}",
        # pools of 8, one decode per sample, as docs/benchmarks.md measured it (the default
        # draws them from a window of the epoch order)
        "augment.partner_pool=8",
        f"augment.colour={args.colour}",
        "bench.digest_batches=0",  # hashing 40 MB batches would take CPU from the workers
        f"dataset.cache_dir={out / 'cache'}",
        f"output_dir={out / cache}",
    ]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return run(compose(config_name="config", overrides=overrides))


def common(args) -> float:
    index = build_index(Path(args.root) / "train2017", Path(args.root) / "annotations" / "instances_train2017.json")
    loader = common_way_loader(index, Mosaic(args.size, colour=args.colour), args.batch, args.workers)
    m, epoch = Measurement(), 0
    while len(m.waits) < args.warmup + args.batches:
        loader.dataset.epoch = epoch
        measure(
            loader,
            lambda b: None,
            count=lambda b: len(b[0]),
            into=m,
            max_batches=args.warmup + args.batches - len(m.waits),
        )
        epoch += 1
    return m.report(args.warmup)["examples_per_s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default="../shared/data/coco_tiny")
    p.add_argument("--size", type=int, default=640)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--colour", default="matrix", help="mosaic's colour jitter in every row (the default: matrix)")
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        rows = {"common way (PIL, 4 decodes, float32, list collate)": {"examples_per_s": common(args)}}
        for cache in ("none", "ram", "disk"):
            rows[f"cocodet, dataset.cache={cache}"] = ours(args, cache, out)
    bound4 = rows["cocodet, dataset.cache=none"]["decode_bound_4"]
    base = rows["common way (PIL, 4 decodes, float32, list collate)"]["examples_per_s"]
    print(
        f"\n{args.workers} workers, batch {args.batch}, {args.size} px, {args.batches} measured batches; "
        f"decode_bound_4 = {bound4} ex/s (naive 4-decode mosaic on {args.workers} cores)\n"
    )
    print("| loader | examples/s | x decode_bound_4 | x common way | decodes/sample |")
    print("|---|---|---|---|---|")
    for name, s in rows.items():
        eps = s["examples_per_s"]
        decodes = s.get("decodes_per_sample", 4.0)
        print(f"| {name} | {eps:.1f} | {eps / bound4:.2f} | {eps / base:.2f} | {decodes} |")
    print(json.dumps({k: {"examples_per_s": v["examples_per_s"]} for k, v in rows.items()}))


if __name__ == "__main__":
    main()
