"""GETs per sample of the read-ahead at every budget, counted at the server (issue 56;
docs/benchmarks.md, "A read-ahead that never costs more than it saves").

coco_tiny's 80 train images in a moto_server bucket; ``mode=bench``, 2 workers, one epoch,
for each partner setting and batch size, at ``dataset.remote.cache_bytes`` of 1/8, 1/4 and 1/2
of the split, the whole split, the working set the read-ahead reports for that row, and 0 (no
read-ahead: every read is a GET). Each cell: GETs per sample, and the distinct objects read
per sample beside it (what a read-ahead that fetches each object once per epoch would cost).

    python benchmarks/read_ahead_gets.py                 # about 10 minutes on 2 CPUs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the test helpers that start a store and fill it

from moto_store import DUMMY_KEYS, filled_store, recorded  # noqa: E402

BUCKET = "coco-gets"
PARTNERS = {
    "whole dataset (`augment.partners=dataset`)": ["augment.partners=dataset"],
    "pools of 8 (`augment.partner_pool=8`)": ["augment.partner_pool=8"],
    "window of 48 (`augment.partners=window`, the default)": ["augment.partners=window", "augment.partner_window=48"],
}
FRACTIONS = {"1/8": 1 / 8, "1/4": 1 / 4, "1/2": 1 / 2, "split": 1.0}


def bench(endpoint: str, out: Path, batch: int, budget: int, extra: list[str]) -> dict:
    cmd = [
        sys.executable,
        str(REPO / "train.py"),
        "mode=bench",
        "dataset=coco",
        f"dataset.root=s3://{BUCKET}",
        f"dataset.storage_options.endpoint_url={endpoint}",
        "dataset.image_size=256",
        "loader=explicit",
        "loader.num_workers=2",
        f"loader.batch_size={batch}",
        f"bench.batches={80 // batch}",
        f"bench.digest_batches={80 // batch}",
        "bench.warmup=0",
        "bench.decode_probe=0",
        f"dataset.cache_dir={out / 'cache'}",
        f"dataset.remote.cache_bytes={budget}",
        f"hydra.run.dir={out / 'run'}",
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **DUMMY_KEYS}, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"bench failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def train_gets(endpoint: str) -> list[str]:
    return [
        r["url"].split("/train2017/", 1)[1].split("?", 1)[0]
        for r in recorded(endpoint)
        if r["method"] == "GET" and "/train2017/" in r["url"]
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=REPO.parent / "shared" / "data" / "coco_tiny")
    parser.add_argument("--batches", type=int, nargs="+", default=[2, 8])
    args = parser.parse_args()
    split = sum(p.stat().st_size for p in (args.src / "train2017").iterdir())
    print(
        f"coco_tiny, {split / 2**20:.1f} MiB split, 2 workers, one epoch (80 samples); "
        "each cell: GETs per sample (distinct objects per sample)\n"
    )
    print("| partners | batch | " + " | ".join(FRACTIONS) + " | working set | 0 |")
    print("|---|---|" + "---|" * (len(FRACTIONS) + 2))
    with filled_store(args.src, BUCKET) as (endpoint, _), tempfile.TemporaryDirectory() as tmp:
        for name, extra in PARTNERS.items():
            for batch in args.batches:
                cells, working = {}, None
                budgets = {label: int(split * f) for label, f in FRACTIONS.items()}
                for label in [*budgets, "working set", "0"]:
                    budget = 0 if label == "0" else budgets.get(label, working)
                    recorded(endpoint, reset=True)
                    s = bench(endpoint, Path(tmp) / f"{len(cells)}-{batch}-{abs(hash(name))}", batch, budget, extra)
                    gets = train_gets(endpoint)
                    cells[label] = (len(gets) / 80, len(set(gets)) / 80)
                    if working is None:
                        working = int(s["remote"]["read_ahead"]["working_set_bytes"])
                row = [f"{g:.2f} ({d:.2f})" for g, d in cells.values()]
                print(
                    f"| {name} | {batch} | " + " | ".join(row) + f" |  <!-- working set {working / 2**20:.1f} MiB -->",
                    flush=True,
                )


if __name__ == "__main__":
    main()
