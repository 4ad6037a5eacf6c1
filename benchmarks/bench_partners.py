"""Window partners (the default) against pools, whole-dataset partners and Ultralytics' loader,
side by side in one run (issue 54; docs/benchmarks.md, "Mosaic partners"): mosaic at 640 px,
batch 32, 2 workers, no pixel cache, on 2,400 distinct files made from coco_tiny (no window or
buffer holds the whole set, and every measured batch lies inside one epoch). The four loaders
alternate within each round; the table gives the median of the rounds.

    python -m pip install --target /tmp/ulx --no-deps ultralytics==8.4.190 ultralytics-thop polars
    python benchmarks/bench_partners.py --out /tmp/bench_partners --ultralytics /tmp/ulx
    git worktree add /tmp/before <commit>   # a row for earlier code, run with its own train.py
    python benchmarks/bench_partners.py --out /tmp/bench_partners --ultralytics /tmp/ulx --before /tmp/before

Ultralytics is never a dependency of cocodet: it is installed into a folder outside the project
(``--ultralytics``) and run in its own process with this interpreter (its torch, OpenCV and
NumPy are the project's). It runs with ``cache=False``, its default: that is when it keeps its
buffer of recently loaded images (``cache='ram'`` turns the buffer off, and holds every image
decoded, which cocodet's ``dataset.cache=ram`` is the match for, not these loaders).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from remote_read_ahead import build_dataset  # noqa: E402  (coco_tiny repeated under distinct names)

SETTINGS = {
    "window partners (the default)": [],
    "pools of 8": ["augment.partner_pool=8"],
    "whole-dataset partners": ["augment.partners=dataset"],
}
ULTRALYTICS = "Ultralytics 8.4.190"
BEFORE = "window partners, the code before (its default)"

ULTRALYTICS_RUN = r"""
import json, sys, time
from ultralytics.cfg import get_cfg
from ultralytics.data.build import build_dataloader, build_yolo_dataset
from ultralytics.utils import DEFAULT_CFG
images, (batch, workers, warmup, batches) = sys.argv[1], map(int, sys.argv[2:6])
cfg = get_cfg(DEFAULT_CFG, {"imgsz": 640, "cache": False, "mosaic": 1.0, "workers": workers, "plots": False})
data = {"names": {i: str(i) for i in range(80)}, "nc": 80, "channels": 3}
dataset = build_yolo_dataset(cfg, images, batch, data, mode="train")
loader = build_dataloader(dataset, batch, workers, shuffle=True)
it = iter(loader)
for _ in range(warmup):
    next(it)
t0 = time.perf_counter()
for _ in range(batches):
    next(it)
print(json.dumps({"examples_per_s": batches * batch / (time.perf_counter() - t0)}))
"""


def yolo_copy(data: Path, out: Path) -> Path:
    """The same files as a YOLO dataset: images/train (links to them) and labels/train (one line
    a box: contiguous class, centre and size over the image's width and height; crowd dropped)."""
    ann = json.loads((data / "annotations" / "instances_train2017.json").read_text())
    classes = {c["id"]: k for k, c in enumerate(sorted(ann["categories"], key=lambda c: c["id"]))}
    images, labels = out / "images" / "train", out / "labels" / "train"
    images.mkdir(parents=True, exist_ok=True)
    labels.mkdir(parents=True, exist_ok=True)
    boxes: dict[int, list[str]] = {}
    by_id = {im["id"]: im for im in ann["images"]}
    for a in ann["annotations"]:
        im, (x, y, w, h) = by_id[a["image_id"]], a["bbox"]
        if not a.get("iscrowd") and w > 1 and h > 1:
            boxes.setdefault(a["image_id"], []).append(
                f"{classes[a['category_id']]} {(x + w / 2) / im['width']:.6f} {(y + h / 2) / im['height']:.6f} "
                f"{w / im['width']:.6f} {h / im['height']:.6f}"
            )
    for im in ann["images"]:
        link = images / im["file_name"]
        if not link.exists():
            link.symlink_to(data / "train2017" / im["file_name"])
        (labels / (Path(im["file_name"]).stem + ".txt")).write_text("\n".join(boxes.get(im["id"], [])) + "\n")
    return images


def cocodet(data: Path, folder: Path, extra: list[str], warmup: int, batches: int, code: Path = ROOT) -> dict:
    """One bench of ``code``'s train.py (its own ``src`` first on the path: another checkout's
    code, not this one's editable install)."""
    cmd = [
        sys.executable,
        "train.py",
        "mode=bench",
        "dataset=coco",
        f"dataset.root={data}",
        "dataset.image_size=640",
        "dataset.cache=none",
        "loader=explicit",
        "loader.num_workers=2",
        "loader.batch_size=32",
        f"bench.warmup={warmup}",
        f"bench.batches={batches}",
        "bench.decode_probe=0",
        f"hydra.run.dir={folder}",
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(code / "src")}
    subprocess.run(cmd, cwd=code, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads((folder / "summary.json").read_text())


def ultralytics(target: Path, images: Path, warmup: int, batches: int, script: str = ULTRALYTICS_RUN) -> dict:
    """``script`` run with Ultralytics from ``target`` on its first argument (``images``: a folder,
    or a data.yaml for benchmarks/bench_yolo_layout.py), batch 32, 2 workers."""
    env = {**os.environ, "PYTHONPATH": str(target), "YOLO_OFFLINE": "1", "YOLO_VERBOSE": "False"}
    proc = subprocess.run(
        [sys.executable, "-c", script, str(images), "32", "2", str(warmup), str(batches)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd="/tmp",
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--coco", type=Path, default=ROOT.parent / "shared" / "data" / "coco_tiny")
    parser.add_argument("--ultralytics", type=Path, help="the folder Ultralytics was installed into (--target)")
    parser.add_argument("--files", type=int, default=2400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--before", type=Path, help="a checkout of earlier code: one more row, its default loader")
    parser.add_argument(
        "--with",
        dest="overrides",
        nargs="*",
        default=[],
        help="overrides for every row of this code (e.g. augment.colour=matrix)",
    )
    args = parser.parse_args()
    assert (args.warmup + args.batches) * 32 <= args.files, "every measured batch must lie inside one epoch"
    data = args.out / "data"
    build_dataset(args.coco.resolve(), data, args.files)
    images = yolo_copy(data.resolve(), args.out / "yolo") if args.ultralytics else None
    rates: dict[str, list[float]] = {}
    last: dict[str, dict] = {}
    rows = {name: (extra + args.overrides, ROOT) for name, extra in SETTINGS.items()}
    if args.before is not None:
        rows[BEFORE] = ([], args.before.resolve())
    for r in range(args.rounds):
        for name, (extra, code) in rows.items():
            slug = "-".join("".join(c if c.isalnum() else " " for c in name).split())  # one folder per row and round
            summary = cocodet(data.resolve(), args.out / f"round{r}-{slug}", extra, args.warmup, args.batches, code)
            rates.setdefault(name, []).append(summary["examples_per_s"])
            last[name] = summary
            print(f"round {r}: {name}: {summary['examples_per_s']:.1f} examples/s", flush=True)
        if images is not None:
            rate = ultralytics(args.ultralytics.resolve(), images, args.warmup, args.batches)["examples_per_s"]
            rates.setdefault(ULTRALYTICS, []).append(rate)
            print(f"round {r}: {ULTRALYTICS}: {rate:.1f} examples/s", flush=True)
    print(report(rates, last, args))


def report(rates: dict[str, list[float]], last: dict[str, dict], args) -> str:
    medians = {name: statistics.median(v) for name, v in rates.items()}
    default = medians["window partners (the default)"]
    lines = [
        f"{args.files} distinct files, mosaic 640 px, batch 32, 2 workers, uncached; {args.rounds} rounds, "
        f"{args.batches} batches each after {args.warmup} of warm-up"
        + (f"; this code's rows with {' '.join(args.overrides)}" if args.overrides else ""),
        "",
        "| loader | examples/s per round | median | window / this | decodes per sample | reads served without a decode "
        "per sample | ms per sample (last round) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, values in rates.items():
        s = last.get(name)
        stages = ", ".join(f"{k} {v:.2f}" for k, v in s["stage_ms_per_sample"].items()) if s else "—"
        decodes = f"{s['decodes_per_sample']:.2f}" if s else "—"
        # A mosaic reads 4 images (mosaic_p 1.0); what a decode did not serve came from the window
        # cache or from an image the same batch had decoded already.
        served = f"{4 - s['decodes_per_sample']:.2f}" if s else "—"
        per_round = ", ".join(f"{v:.0f}" for v in values)
        lines.append(
            f"| {name} | {per_round} | {medians[name]:.1f} | {default / medians[name]:.2f}x | {decodes} | "
            f"{served} | {stages} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
