"""Aspect-ratio grouping side by side, in one run (issue 40, docs/benchmarks.md):

1. ``batch_pad_share`` (the share of batch pixels no image covers) ungrouped, grouped as cocodet
   groups (leftovers mixed, each image once) and as torchvision's reference groups (leftovers
   filled by repeats), for ``hflip`` (the model's 800/1333 resize) and ``multiscale`` (each
   sample's own drawn size), on coco_tiny and on the COCO-scale set's size distribution
   (coco_tiny's sizes repeated to COCO 2017's 118,287 train images, as
   ``benchmarks/make_scale_coco.py`` repeats them). Sizes come from the recipes' own arithmetic
   and draws (no decode), batches from the samplers themselves; the padding to 32 is the
   collate's.
2. Examples/s of cocodet's loader (``augment=multiscale``, grouped, uncached) against the data
   path a user writes with torchvision's public API (``bench/torchvision_way.py``): the same
   images, preset, workers and batch size, consumer none, both measured after a warm-up.

    python benchmarks/batch_padding.py --root ../shared/data/coco_tiny --workers 2 --batch 4
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from cocodet.bench.harness import measure
from cocodet.bench.padding import pad_share, sample_sizes
from cocodet.bench.torchvision_way import ReferenceGroupedBatchSampler, torchvision_multiscale_loader
from cocodet.datasets.index import build_index
from cocodet.loader.grouped_sampler import aspect_groups, aspect_ratios, grouped_batches
from cocodet.timing.measurement import Measurement

REPO = Path(__file__).resolve().parents[1]
COCO_TRAIN = 118_287


def padding_table(sizes: np.ndarray, batch: int, epochs: int, seed: int = 0) -> dict:
    groups, aspect = aspect_groups(sizes, 3), aspect_ratios(sizes)
    reference = ReferenceGroupedBatchSampler(groups, batch, seed)
    out = {}
    for preset in ("hflip", "multiscale"):
        rows = {"ungrouped": [], "cocodet_grouped": [], "reference_grouped": []}
        for epoch in range(epochs):
            hw = sample_sizes(preset, sizes, epoch, seed)
            order = np.random.default_rng((seed, epoch, 2**62)).permutation(len(sizes))  # EpochSampler's order
            rows["ungrouped"].append(pad_share([order[s : s + batch] for s in range(0, len(order), batch)], hw))
            rows["cocodet_grouped"].append(pad_share(grouped_batches(order, groups, aspect, batch), hw))
            rows["reference_grouped"].append(pad_share(list(reference), hw))
        out[preset] = {k: round(float(np.mean(v)), 4) for k, v in rows.items()}
        out[preset]["reduction"] = round(out[preset]["ungrouped"] / out[preset]["cocodet_grouped"], 2)
    return out


def ours_examples_per_s(args, out: Path) -> float:
    from hydra import compose, initialize_config_dir

    from cocodet.app import run

    overrides = [
        "mode=bench",
        "dataset=coco",
        f"dataset.root={args.root}",
        "augment=multiscale",
        "model=fasterrcnn_mobilenet_v3_large_fpn",
        "loader.group_aspect_ratio=3",
        "loader=explicit",
        f"loader.num_workers={args.workers}",
        f"loader.batch_size={args.batch}",
        f"bench.batches={args.batches}",
        f"bench.warmup={args.warmup}",
        "bench.digest_batches=0",
        "bench.decode_probe=0",
        f"output_dir={out}",
    ]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        s = run(compose(config_name="config", overrides=overrides))
    return s["examples_per_s"], s["batch_pad_share"]


def torchvision_examples_per_s(args, index, groups) -> float:
    loader = torchvision_multiscale_loader(Path(args.root), index.image_ids.tolist(), groups, args.batch, args.workers)
    m = Measurement()
    while len(m.waits) < args.warmup + args.batches:
        measure(
            loader,
            lambda b: None,
            count=lambda b: len(b[0]),
            into=m,
            max_batches=args.warmup + args.batches - len(m.waits),
        )
    return m.report(args.warmup)["examples_per_s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default="../shared/data/coco_tiny")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=20, help="epochs averaged for the coco_tiny padding shares")
    p.add_argument("--scale-epochs", type=int, default=2, help="the same for the COCO-scale set")
    p.add_argument("--batches", type=int, default=40, help="batches measured for examples/s, after --warmup")
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    root = Path(args.root)
    index = build_index(root / "train2017", root / "annotations" / "instances_train2017.json", keep_empty="reference")
    sizes = np.asarray(index.sizes)
    result = {
        "batch": args.batch,
        "coco_tiny": padding_table(sizes, args.batch, args.epochs),
        "coco_scale": padding_table(np.resize(sizes, (COCO_TRAIN, 2)), args.batch, args.scale_epochs),
    }
    with tempfile.TemporaryDirectory() as tmp:
        ours, ours_pad = ours_examples_per_s(args, Path(tmp))
    theirs = torchvision_examples_per_s(args, index, aspect_groups(sizes, 3))
    result["examples_per_s"] = {
        "cocodet": ours,
        "torchvision": round(theirs, 1),
        "ratio": round(ours / theirs, 2),
        "workers": args.workers,
        "cocodet_batch_pad_share": ours_pad,
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
