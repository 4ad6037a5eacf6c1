"""cocodet's loader and Ultralytics' on one YOLO-layout folder and its data.yaml, side by side
(issue 73; docs/benchmarks.md, "The same folder as Ultralytics"): mosaic at 640 px, batch 32,
2 workers, uncached, on 2,400 distinct image files (coco_tiny's train images under new names:
Ultralytics' buffer of recent images cannot hold the set, and every measured batch lies inside
one epoch). The two loaders alternate within each round; the table gives the median.

    python -m pip install --target /tmp/ulx --no-deps ultralytics==8.4.190 ultralytics-thop polars
    python benchmarks/bench_yolo_layout.py --out /tmp/bench_yolo --ultralytics /tmp/ulx

cocodet reads the folder with ``dataset=yolo dataset.yaml=<data.yaml>`` (its default recipe:
mosaic with window partners); Ultralytics with its own ``check_det_dataset`` on the same
data.yaml and its ``build_yolo_dataset``, ``cache=False`` (its default). Ultralytics is never a
dependency: it is installed into a folder outside the project and run with this interpreter.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_partners import ultralytics  # noqa: E402  (Ultralytics run in its own process)
from yolo_index_start import write_layout  # noqa: E402  (coco_tiny under numeric names, as YOLO)

ULTRALYTICS = "Ultralytics 8.4.190"
ULTRALYTICS_RUN = r"""
import json, sys, time
from ultralytics.cfg import get_cfg
from ultralytics.data.build import build_dataloader, build_yolo_dataset
from ultralytics.data.utils import check_det_dataset
from ultralytics.utils import DEFAULT_CFG
data_yaml, (batch, workers, warmup, batches) = sys.argv[1], map(int, sys.argv[2:6])
data = check_det_dataset(data_yaml, autodownload=False)
cfg = get_cfg(DEFAULT_CFG, {"imgsz": 640, "cache": False, "mosaic": 1.0, "workers": workers, "plots": False})
dataset = build_yolo_dataset(cfg, data["train"], batch, data, mode="train")
loader = build_dataloader(dataset, batch, workers, shuffle=True)
it = iter(loader)
for _ in range(warmup):
    next(it)
t0 = time.perf_counter()
for _ in range(batches):
    next(it)
print(json.dumps({"examples_per_s": batches * batch / (time.perf_counter() - t0)}))
"""


def cocodet(data_yaml: Path, folder: Path, warmup: int, batches: int) -> dict:
    cmd = [
        sys.executable,
        "train.py",
        "mode=bench",
        "dataset=yolo",
        f"dataset.yaml={data_yaml}",
        "dataset.image_size=640",
        "dataset.cache=none",
        "loader=explicit",
        "loader.num_workers=2",
        "loader.batch_size=32",
        f"bench.warmup={warmup}",
        f"bench.batches={batches}",
        "bench.decode_probe=0",
        f"hydra.run.dir={folder}",
    ]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads((folder / "summary.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--coco", type=Path, default=ROOT.parent / "shared" / "data" / "coco_tiny")
    parser.add_argument("--ultralytics", type=Path, required=True, help="the folder Ultralytics was installed into")
    parser.add_argument("--files", type=int, default=2400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batches", type=int, default=40)
    args = parser.parse_args()
    assert (args.warmup + args.batches) * 32 <= args.files, "every measured batch must lie inside one epoch"
    data_yaml = write_layout(args.coco.resolve(), args.out.resolve(), args.files)
    layout = yaml.safe_load(data_yaml.read_text())
    data_yaml.write_text(
        yaml.safe_dump({**layout, "path": str(data_yaml.parent)})
    )  # Ultralytics' rule for a relative path differs
    rates: dict[str, list[float]] = {"cocodet, dataset=yolo (its default recipe)": [], ULTRALYTICS: []}
    for r in range(args.rounds):
        rate = cocodet(data_yaml, args.out / f"round{r}-cocodet", args.warmup, args.batches)["examples_per_s"]
        rates["cocodet, dataset=yolo (its default recipe)"].append(rate)
        print(f"round {r}: cocodet: {rate:.1f} examples/s", flush=True)
        rate = ultralytics(args.ultralytics.resolve(), data_yaml, args.warmup, args.batches, ULTRALYTICS_RUN)[
            "examples_per_s"
        ]
        rates[ULTRALYTICS].append(rate)
        print(f"round {r}: {ULTRALYTICS}: {rate:.1f} examples/s", flush=True)
    medians = {name: statistics.median(v) for name, v in rates.items()}
    print(
        f"\n{args.files} distinct files, one data.yaml, mosaic 640 px, batch 32, 2 workers, uncached; {args.rounds} "
        f"rounds, {args.batches} batches each after {args.warmup} of warm-up\n\n"
        "| loader | examples/s per round | median | cocodet / this |\n|---|---|---|---|"
    )
    first = next(iter(medians.values()))
    for name, values in rates.items():
        print(
            f"| {name} | {', '.join(f'{v:.0f}' for v in values)} | {medians[name]:.1f} | {first / medians[name]:.2f}x |"
        )


if __name__ == "__main__":
    main()
