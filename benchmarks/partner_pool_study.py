"""Partner pools against whole-dataset partners: train both settings for several seeds, report the rule.

    python benchmarks/partner_pool_study.py --out /tmp/pool_study            # make train's settings
    python benchmarks/partner_pool_study.py --out /tmp/pool_study --seeds 0 1 2 --settings 8 null \
        -- trainer.max_epochs=30

    python benchmarks/partner_pool_study.py --out /tmp/pool_bench --throughput --coco ../shared/data/coco_tiny

Each run is ``python train.py seed=S augment.partner_pool=P hydra.run.dir=OUT/pool-P/seed-S`` plus
the overrides after ``--``; runs whose summary.json exists are kept, so a stopped study resumes.
``--throughput`` instead measures each setting's loader (``mode=bench``, 2 workers by the auto
plan on 2 CPUs) at make train's settings and at 640 px, batch 32 on ``--coco``, the two
settings alternating, ``--rounds`` times, and prints the medians and their ratio.
The rule (stated in issue #28 before any run): whole-dataset partners become the default only if
their mean mAP@0.5 gain exceeds max(0.01, 2 x the pooled standard deviation of the two sides).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STATS = ("map", "map50")


def run_dir(out: Path, setting: str, seed: int) -> Path:
    return out / f"pool-{setting}" / f"seed-{seed}"


def train(out: Path, setting: str, seed: int, extra: list[str]) -> dict:
    folder = run_dir(out, setting, seed)
    summary = folder / "summary.json"
    if not summary.exists():
        cmd = [
            sys.executable,
            "train.py",
            f"seed={seed}",
            f"augment.partner_pool={setting}",
            f"hydra.run.dir={folder}",
            *extra,
        ]
        print("+", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return json.loads(summary.read_text())


def pooled_std(groups: list[list[float]]) -> float:
    """sqrt of the degrees-of-freedom-weighted mean of the sample variances."""
    dof = sum(len(g) - 1 for g in groups)
    return (sum((len(g) - 1) * statistics.variance(g) for g in groups) / dof) ** 0.5


def report(results: dict[str, list[dict]], pooled_setting: str, whole_setting: str) -> str:
    lines = ["| partners | seeds | mAP mean ± std | mAP@0.5 mean ± std | per seed mAP@0.5 |", "|---|---|---|---|---|"]
    for setting, rows in results.items():
        cells = []
        for stat in STATS:
            values = [r[stat] for r in rows]
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{statistics.mean(values):.4f} ± {spread:.4f}")
        per_seed = ", ".join(f"{r['map50']:.3f}" for r in rows)
        name = "whole dataset" if setting == "null" else f"pool of {setting}"
        lines.append(f"| {name} | {len(rows)} | {cells[0]} | {cells[1]} | {per_seed} |")
    pooled = [r["map50"] for r in results[pooled_setting]]
    whole = [r["map50"] for r in results[whole_setting]]
    gain = statistics.mean(whole) - statistics.mean(pooled)
    spread = pooled_std([pooled, whole]) if min(len(pooled), len(whole)) > 1 else 0.0
    bar = max(0.01, 2 * spread)
    verdict = "change the default to whole-dataset partners" if gain > bar else "keep pools"
    lines += [
        "",
        f"mAP@0.5 gain of whole-dataset partners: {gain:+.4f}; pooled std {spread:.4f}; "
        f"bar max(0.01, 2 x {spread:.4f}) = {bar:.4f}; rule: {verdict}",
    ]
    return "\n".join(lines)


def throughput(out: Path, settings: list[str], coco: Path, rounds: int) -> str:
    scenarios = {
        "make train's settings (synthetic, 128 px, batch 8)": [],
        "coco_tiny, 640 px, batch 32": [
            "dataset=coco",
            f"dataset.root={coco}",
            "dataset.image_size=640",
            "loader.batch_size=32",
            "bench.batches=20",
        ],
    }
    rates: dict[tuple[str, str], list[float]] = {}
    decodes: dict[tuple[str, str], float] = {}
    for r in range(rounds):
        for n, (scenario, extra) in enumerate(scenarios.items()):
            for setting in settings:  # alternating, so both sides see the same background load
                folder = out / f"bench-{n}-pool-{setting}-{r}"
                cmd = [
                    sys.executable,
                    "train.py",
                    "mode=bench",
                    "bench.decode_probe=0",
                    f"augment.partner_pool={setting}",
                    f"hydra.run.dir={folder}",
                    *extra,
                ]
                subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                summary = json.loads((folder / "summary.json").read_text())
                rates.setdefault((scenario, setting), []).append(summary["examples_per_s"])
                decodes[(scenario, setting)] = summary["decodes_per_sample"]
    lines = [
        "| loader benchmark | partners | examples/s (median of %d) | decodes per sample |" % rounds,
        "|---|---|---|---|",
    ]
    for scenario in scenarios:
        medians = {s: statistics.median(rates[(scenario, s)]) for s in settings}
        for setting in settings:
            name = "whole dataset" if setting == "null" else f"pool of {setting}"
            lines.append(f"| {scenario} | {name} | {medians[setting]:.1f} | {decodes[(scenario, setting)]:.2f} |")
        lines.append(f"| {scenario} | ratio pool / whole | {medians[settings[0]] / medians[settings[1]]:.2f} | |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument(
        "--settings",
        nargs=2,
        default=["8", "null"],
        metavar=("POOLED", "WHOLE"),
        help="the pooled setting first, then the one the rule would switch to",
    )
    p.add_argument("extra", nargs="*", help="overrides for every run (after --)")
    p.add_argument("--throughput", action="store_true", help="measure each setting's loader instead of training")
    p.add_argument("--coco", type=Path, default=ROOT.parent / "shared" / "data" / "coco_tiny")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if args.throughput:
        table = throughput(args.out, args.settings, args.coco.resolve(), args.rounds)
        (args.out / "throughput.md").write_text(table + "\n")
        print(table)
        return
    results: dict[str, list[dict]] = {s: [] for s in args.settings}
    for seed in args.seeds:  # seed by seed, so a study stopped early still compares like with like
        for setting in args.settings:
            results[setting].append(train(args.out, setting, seed, args.extra))
    table = report(results, *args.settings)
    (args.out / "study.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
